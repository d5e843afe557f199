package maintenance

// The Redis keys of the maintenance jobs, under redis.prefix.

// sweepLockKey is held by the one worker sweeping this interval.
func sweepLockKey(prefix string) string { return prefix + "sweep:lock" }

// downKey is the set of subjects (a tier, the provider of a route) whose
// "down" alert was sent and whose recovery is not announced yet.
func downKey(prefix string) string { return prefix + "alerts:down" }
