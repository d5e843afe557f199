-- +goose Up
CREATE EXTENSION IF NOT EXISTS vector;

-- requests is the history of every request Bulwark accepted. The live state
-- of a request is in Redis (so PostgreSQL may be down without losing work);
-- this table is written at submission and at the end, for reports and for
-- status look-ups after the Redis record expired.
CREATE TABLE requests (
    id              text PRIMARY KEY,
    tenant          text        NOT NULL,
    priority        smallint    NOT NULL,            -- 1 critical .. 4 low
    status          text        NOT NULL,            -- queued|running|waiting|completed|failed|cancelled
    provider        text        NOT NULL,            -- asked for
    model_tier      text        NOT NULL,            -- asked for
    served_provider text,                            -- who answered (after fallback)
    served_tier     text,
    key_id          text,                            -- pool key id, never the key
    attempts        integer     NOT NULL DEFAULT 0,
    cached          text        NOT NULL DEFAULT 'none', -- none|exact|semantic|coalesced
    case_id         text,
    cache_layer     text,
    input_tokens    integer     NOT NULL DEFAULT 0,
    output_tokens   integer     NOT NULL DEFAULT 0,
    cost_usd        double precision NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    queue_wait_ms   bigint,
    error           text,
    response        jsonb
);
CREATE INDEX requests_tenant_created ON requests (tenant, created_at DESC);
CREATE INDEX requests_created ON requests (created_at);

-- semantic_cache holds final answers keyed by scope (tier + layer +
-- tool-results hash [+ tenant]) and the SHA-256 of the normalised prompt,
-- with the prompt's embedding for similarity look-ups. The embedding column
-- has no fixed dimension: each embedder gets its own partial HNSW index on
-- a cast to its dimension (see pkg/cache).
CREATE TABLE semantic_cache (
    id           bigserial PRIMARY KEY,
    scope        text        NOT NULL,
    prompt_hash  text        NOT NULL,
    embedder     text        NOT NULL,
    embedding    vector      NOT NULL,
    tenant       text        NOT NULL DEFAULT '',
    case_id      text,
    layer        text        NOT NULL,
    prompt       text        NOT NULL,
    response     jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    hit_count    bigint      NOT NULL DEFAULT 0,
    last_hit_at  timestamptz,
    UNIQUE (scope, prompt_hash)
);
CREATE INDEX semantic_cache_case ON semantic_cache (case_id) WHERE case_id IS NOT NULL;
CREATE INDEX semantic_cache_expires ON semantic_cache (expires_at);

-- +goose Down
DROP TABLE semantic_cache;
DROP TABLE requests;
