package job

// Keys for redisconn.WaitReplicas (redis.min_replicas_acked): the API
// confirms a stored request on the replicas before it answers 202.

// RecordKey is the Redis key of request id's record.
func (s *Store) RecordKey(id string) string { return s.jobKey(id) }

// ReplicatedKey is the counter written before each WAIT, in the records'
// hash slot, so that in a cluster it lives on the records' master.
func (s *Store) ReplicatedKey() string { return s.prefix + "replicated" }
