-- +goose Up

-- The protected entities of a stored prompt (DTCs, ECU ids, versions, in a
-- canonical form; see pkg/cache guard). A semantic lookup filters on them
-- rather than checking them after the nearest neighbours were found:
-- many near-identical prompts that differ only in a DTC would otherwise
-- crowd the true match out of an approximate HNSW result, and the live
-- count of (scope, entities) is usually small enough for an exact scan.
ALTER TABLE semantic_cache ADD COLUMN entities text NOT NULL DEFAULT '';
CREATE INDEX semantic_cache_entities_live ON semantic_cache (scope, entities, embedder, expires_at);
DROP INDEX semantic_cache_scope_live;

-- +goose Down
CREATE INDEX semantic_cache_scope_live ON semantic_cache (scope, embedder, expires_at);
DROP INDEX semantic_cache_entities_live;
ALTER TABLE semantic_cache DROP COLUMN entities;
