-- +goose Up

-- Estimated input tokens prompt compression took off a request before its
-- provider call (0: compression off, opted out, or nothing to compress).
-- The daily report sums it.
ALTER TABLE requests ADD COLUMN tokens_saved integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE requests DROP COLUMN tokens_saved;
