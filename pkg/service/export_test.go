package service

// CacheKey is cacheKey for the tests of package service_test: the cache
// key the service looks a job up and stores its answer under.
var CacheKey = cacheKey
