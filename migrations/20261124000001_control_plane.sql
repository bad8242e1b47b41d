-- The control plane (DESIGN §7): thread titles and activity, erasure, run lists, waits on a
-- run, and the webhook outbox.

-- A thread's title (set by PATCH) and the time of its last user message (set by the enqueue).
-- An erased thread keeps only its id and `erased_at`: its owner, title and metadata are
-- cleared and its messages, runs, steps and idempotency keys deleted, but the primary key
-- stays taken, so the id is 404 for everyone forever and a `user_message` cannot create it
-- again (the enqueue's `INSERT ... ON CONFLICT` meets the row and finds it erased).
ALTER TABLE threads
    ADD COLUMN title text,
    ADD COLUMN last_message_at timestamptz,
    ADD COLUMN erased_at timestamptz;

-- Lists are newest first, keyed by (created_at, id): a user's own, or the tenant's (admin).
DROP INDEX threads_owner_idx;
CREATE INDEX threads_owner_list_idx ON threads (tenant_id, owner_id, created_at DESC, id DESC)
    WHERE erased_at IS NULL;
CREATE INDEX threads_tenant_list_idx ON threads (tenant_id, created_at DESC, id DESC)
    WHERE erased_at IS NULL;
CREATE INDEX runs_owner_list_idx ON runs (tenant_id, owner_id, created_at DESC, id DESC);
CREATE INDEX runs_tenant_list_idx ON runs (tenant_id, created_at DESC, id DESC);

-- Endpoints that receive a tenant's run events, signed per Standard Webhooks with `secret`.
CREATE TABLE webhooks (
    id          uuid PRIMARY KEY,
    tenant_id   text NOT NULL,
    url         text NOT NULL,
    events      text[] NOT NULL,
    secret      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX webhooks_tenant_idx ON webhooks (tenant_id, created_at DESC, id DESC);

-- The outbox: one row per (event, endpoint), written by the trigger below in the transaction
-- that changes the run's status, so no event is lost whoever changed it (a worker, the API, a
-- crash's reclaim). Workers deliver them: claimed with a lease like runs, retried with backoff.
CREATE TABLE webhook_deliveries (
    -- The `webhook-id` header: the same on every retry, so receivers can de-duplicate.
    id                uuid PRIMARY KEY,
    webhook_id        uuid NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    tenant_id         text NOT NULL,
    -- Erasing a thread erases its deliveries.
    thread_id         uuid NOT NULL,
    workflow_id       uuid NOT NULL,
    event             text NOT NULL,
    payload           jsonb NOT NULL,
    attempts          integer NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    lease_expires_at  timestamptz,
    delivered_at      timestamptz,
    -- Set when retries stop (24 h after the event) without a 2xx.
    abandoned_at      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND abandoned_at IS NULL;
CREATE INDEX webhook_deliveries_webhook_idx ON webhook_deliveries (webhook_id, created_at);
CREATE INDEX webhook_deliveries_thread_idx ON webhook_deliveries (thread_id);

-- Each try of a delivery: the status code the receiver answered, or the error.
CREATE TABLE webhook_attempts (
    delivery_id  uuid NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt      integer NOT NULL,
    status_code  integer,
    error        text,
    at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (delivery_id, attempt)
);

-- On every status change of a run: a NOTIFY on `spool_run_status` (payload: the run's id) for
-- API processes holding `?wait=` requests, and the outbox rows of the endpoints that asked for
-- the event. Both belong to the changing transaction: a rollback sends and writes nothing.
CREATE FUNCTION spool_run_status_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('spool_run_status', NEW.id::text);
    IF NEW.status IN ('completed', 'failed', 'cancelled', 'requires_action', 'awaiting_approval') THEN
        INSERT INTO webhook_deliveries
               (id, webhook_id, tenant_id, thread_id, workflow_id, event, payload)
        SELECT gen_random_uuid(), w.id, NEW.tenant_id, NEW.thread_id, NEW.id,
               'run.' || NEW.status,
               jsonb_build_object(
                   'type', 'run.' || NEW.status,
                   'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                   'data', jsonb_build_object(
                       'workflow_id', NEW.id,
                       'thread_id', NEW.thread_id,
                       'user_id', NEW.owner_id,
                       'agent_id', NEW.agent_id,
                       'status', NEW.status,
                       'attempt', NEW.attempt,
                       'error', NEW.error,
                       'usage', NEW.usage,
                       'cancel_reason', NEW.cancel_reason,
                       'pending_action', NEW.pending_action))
          FROM webhooks w
         WHERE w.tenant_id = NEW.tenant_id AND ('run.' || NEW.status) = ANY (w.events);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_status_changed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION spool_run_status_changed();
