-- The durable jobs. A run moves queued -> running -> (requires_action | awaiting_approval ->
-- queued -> running)* -> completed | failed | cancelled, and never leaves a terminal status.
CREATE TABLE runs (
    id                     uuid PRIMARY KEY,
    thread_id              uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    tenant_id              text NOT NULL,
    owner_id               text NOT NULL,
    agent_id               uuid,
    user_message_id        uuid NOT NULL REFERENCES messages (id),
    assistant_message_id   uuid NOT NULL REFERENCES messages (id),
    status                 text NOT NULL DEFAULT 'queued' CHECK (status IN (
                               'queued', 'running', 'requires_action', 'awaiting_approval',
                               'completed', 'failed', 'cancelled')),
    -- Fencing token: bumped by every claim; every later write of that attempt says
    -- `WHERE id = $1 AND attempt = $2`, so a worker that lost its lease changes nothing.
    attempt                integer NOT NULL DEFAULT 0,
    -- Claims that took the run from a worker whose lease had expired (a crash, a hang).
    -- Capped: a run that keeps killing workers fails instead of looping forever.
    reclaims               integer NOT NULL DEFAULT 0,
    lease_owner            text,
    -- Set from the database clock only (now() + lease), never from a worker's clock.
    lease_expires_at       timestamptz,
    heartbeat_at           timestamptz,
    cancel_requested_at    timestamptz,
    cancel_reason          text,
    cancelled_by           text,
    -- {code, message} of a failed run.
    error                  jsonb,
    usage                  jsonb,
    idempotency_key        text,
    -- W3C traceparent of the request that enqueued the run.
    trace_context          text,
    -- When the run last became claimable; the queue's order.
    queued_at              timestamptz NOT NULL DEFAULT now(),
    created_at             timestamptz NOT NULL DEFAULT now(),
    started_at             timestamptz,
    finished_at            timestamptz,
    updated_at             timestamptz NOT NULL DEFAULT now()
);

-- Invariant 2: at most one active run per thread, enforced by the database.
CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (thread_id)
    WHERE status IN ('queued', 'running', 'requires_action', 'awaiting_approval');

-- The claim scans this small index: queued runs and running runs whose lease may have expired.
CREATE INDEX runs_claimable_idx ON runs (queued_at) WHERE status IN ('queued', 'running');

CREATE INDEX runs_thread_idx ON runs (thread_id, created_at);
