-- Stored agent configurations, per tenant. `spec` holds the validated JSON the API accepted
-- (instructions, model, tools, limits); the worker reads it at the start of every attempt.
CREATE TABLE agents (
    id          uuid PRIMARY KEY,
    tenant_id   text NOT NULL,
    name        text NOT NULL,
    spec        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX agents_tenant_idx ON agents (tenant_id, created_at);
