-- +goose Up

-- Live rows of a scope, per embedder. A semantic lookup first counts the
-- scope's live rows (an index-only scan, capped) to choose between an exact
-- scan of the scope (small scopes, which iterative HNSW would walk for up
-- to hnsw.max_scan_tuples) and the HNSW index; the exact scan reads its
-- rows through this index too. The per-embedder partial HNSW indexes are
-- created by pkg/cache (cache.New), since they depend on the configured
-- embedder's name and dimension.
CREATE INDEX semantic_cache_scope_live ON semantic_cache (scope, embedder, expires_at);

-- Leave room on each page for a HOT update of the hit counters: a row with
-- a 384-dim vector is ~1.7 kB, so a full page has no room for the new
-- version and every counter update would otherwise add a tuple to every
-- index, HNSW included. Affects pages written from now on.
ALTER TABLE semantic_cache SET (fillfactor = 75);

-- +goose Down
ALTER TABLE semantic_cache RESET (fillfactor);
DROP INDEX semantic_cache_scope_live;
