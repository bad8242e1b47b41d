-- Idempotency-Key replay for POST user_message. Scoped to the tenant, kept 24 h. The row is
-- written in the same transaction as the run it created, so a key never points at a run that
-- was rolled back, and concurrent duplicates serialize on the primary key.
CREATE TABLE idempotency_keys (
    tenant_id      text NOT NULL,
    key            text NOT NULL,
    -- SHA-256 of the caller, path and canonical body: the same key with another request is 422.
    request_hash   text NOT NULL,
    status_code    integer NOT NULL,
    response       jsonb NOT NULL,
    workflow_id    uuid,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);

CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);
