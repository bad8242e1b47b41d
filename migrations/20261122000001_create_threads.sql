-- A conversation. Owned by one user of one tenant: every query filters on both, so another
-- tenant's or user's thread is indistinguishable from one that does not exist.
CREATE TABLE threads (
    id          uuid PRIMARY KEY,
    tenant_id   text NOT NULL,
    owner_id    text NOT NULL,
    -- The agent that answers; NULL means the server's configured default agent.
    agent_id    uuid,
    metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX threads_owner_idx ON threads (tenant_id, owner_id, created_at);
