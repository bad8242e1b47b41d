-- Spool's schema as it is live: every table with its final columns, constraints and indexes,
-- then each trigger function once with its trigger, then the view. Nothing of Spool had been
-- released when the 22 migrations of its development (20261122000001 .. 20261126000003, in git
-- history up to edeac4b) were squashed into this one, so no database needs them; a database
-- made from this file is the same, object for object and name for name, as one made by them.
-- Changes from here on are new files; see README.md in this directory.
--
-- Each table's columns keep the order those migrations gave them (a column a later change
-- added comes last), so code that reads rows by position (`SELECT *`) sees no difference.

-- =============================================================================================
-- threads
-- =============================================================================================

-- A conversation. Owned by one user of one tenant: every query filters on both, so another
-- tenant's or user's thread is indistinguishable from one that does not exist.
--
-- Erasure (shared/src/db/threads.rs `erase`): an erased thread keeps only its id and
-- `erased_at`: its tenant, owner, agent, title and metadata are cleared, and its messages,
-- runs (with their steps), idempotency keys, webhook deliveries and summaries deleted. The
-- primary key stays taken, so the id is 404 for everyone forever and a `user_message` cannot
-- create it again (the enqueue's `INSERT ... ON CONFLICT` meets the row and finds it erased).
CREATE TABLE threads (
    id               uuid PRIMARY KEY,
    tenant_id        text NOT NULL,
    owner_id         text NOT NULL,
    -- The agent that answers; NULL means the server's configured default agent.
    agent_id         uuid,
    metadata         jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- Set by PATCH.
    title            text,
    -- The time of the thread's last user message, set by the enqueue.
    last_message_at  timestamptz,
    -- Set when the thread is erased (above).
    erased_at        timestamptz
);

-- Lists are newest first, keyed by (created_at, id): a user's own, or the tenant's (admin).
CREATE INDEX threads_owner_list_idx ON threads (tenant_id, owner_id, created_at DESC, id DESC)
    WHERE erased_at IS NULL;
CREATE INDEX threads_tenant_list_idx ON threads (tenant_id, created_at DESC, id DESC)
    WHERE erased_at IS NULL;

-- =============================================================================================
-- messages
-- =============================================================================================

-- User and assistant messages. The assistant message of a run is inserted (status `queued`) in
-- the same transaction as its run, so the id clients stream is known at once and the final
-- content is written exactly once, by an UPDATE fenced on the run's attempt.
CREATE TABLE messages (
    id           uuid PRIMARY KEY,
    thread_id    uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    -- Insertion order within the thread; timestamps can tie.
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    role         text NOT NULL CHECK (role IN ('user', 'assistant')),
    content      text NOT NULL DEFAULT '',
    -- Structured content: text blocks, tool steps, citations (assistant messages).
    parts        jsonb NOT NULL DEFAULT '[]'::jsonb,
    status       text NOT NULL
                     CHECK (status IN ('queued', 'streaming', 'completed', 'failed', 'cancelled')),
    -- Token usage summed over the model calls that produced the message.
    usage        jsonb,
    metadata     jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- The run that produced (assistant) or was started by (user) this message.
    workflow_id  uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- The final answer parsed as JSON, when the agent has a `response_format` (it validated
    -- against the schema).
    output       jsonb,
    -- Set when a `pre_response` hook denied the answer and its text replaced it.
    blocked      boolean NOT NULL DEFAULT false,
    -- The depth of the run that wrote it (runs.depth): a child run's messages are on its
    -- parent's thread, and thread listings and the history of later turns leave out those
    -- with depth > 0.
    depth        smallint NOT NULL DEFAULT 0
);

CREATE UNIQUE INDEX messages_thread_seq_idx ON messages (thread_id, seq);

-- =============================================================================================
-- runs
-- =============================================================================================

-- The durable jobs. A run moves queued -> running -> (requires_action | awaiting_approval |
-- waiting -> queued -> running)* -> completed | failed | cancelled, and never leaves a terminal
-- status.
--
-- Durable pauses: a run that waits for client tool outputs (requires_action), a person's
-- approval (awaiting_approval) or its child runs (waiting) holds no worker and no lease; what
-- it waits for is stored on the row (`pending_action`).
--
-- Agents as tools (docs/agents.md): a tool call of an agent tool starts a child run of that agent
-- on the parent's thread, and the parent waits for it without a worker (status `waiting`). A child
-- run is a run like any other (claimed, leased, fenced, checkpointed, resumed after a crash);
-- `parent_workflow_id` and `parent_tool_call_id` say which call started it, `depth` how deep it is
-- (a thread's own runs are at 0). When a child ends, the transaction that ends it re-queues its
-- parent if no other child of the parent is still active (`runs_child_ended`, below), and wakes
-- idle workers. The parent's next attempt reads each child's answer from the child's run and
-- message: the child writes nothing of the parent's.
CREATE TABLE runs (
    id                     uuid PRIMARY KEY,
    thread_id              uuid NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    tenant_id              text NOT NULL,
    owner_id               text NOT NULL,
    agent_id               uuid,
    user_message_id        uuid NOT NULL REFERENCES messages (id),
    assistant_message_id   uuid NOT NULL REFERENCES messages (id),
    status                 text NOT NULL DEFAULT 'queued',
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
    updated_at             timestamptz NOT NULL DEFAULT now(),
    -- What a paused run waits for: {type: "submit_tool_outputs", tool_calls: [...]} or
    -- {type: "approval", tool_call_id, tool_name, arguments, expires_at}.
    pending_action         jsonb,
    -- Every pause has a deadline, set from the database clock when the run pauses (so no
    -- worker's or API process's clock decides it): an approval nobody answers in time counts
    -- as denied, and a client tool whose outputs never come fails the run with
    -- `human_timeout`. Each approval of a step gets its own deadline, from the moment it is
    -- presented. The claim picks up expired pauses of both kinds by itself
    -- (`runs_pause_expiry_idx`).
    pause_expires_at       timestamptz,
    -- Set when a pause is answered: the next attempt continues, it does not restart.
    resumed                boolean NOT NULL DEFAULT false,
    -- Overrides given with tool outputs: {tool_choice, active_tools} for the next step,
    -- step_rules for later steps.
    overrides              jsonb,
    -- The agent spec the run executes, as it was when the run was enqueued: editing or
    -- deleting the agent later changes nothing for runs already queued, running or paused.
    -- NULL: the worker's default agent. (worker/src/agent.rs `load_spec` and the API's
    -- tool-output check still read the agent's row when this is NULL and `agent_id` is set,
    -- for runs enqueued before the column existed; the enqueue always sets it for an agent.)
    agent_spec             jsonb,
    -- Set by `GET /v1/workflows/{id}?wait=` (an UPDATE that also reads the run, so a run
    -- ending at the same moment either sees the flag or is seen ended). Only a watched run's
    -- end or pause is NOTIFYed (`spool_run_status_changed`, below).
    watched                boolean NOT NULL DEFAULT false,
    -- The step that answered without tool calls (the `SavedStep` of shared/src/db/steps.rs),
    -- kept on the run by the finishing statement for the timeline, rather than as a
    -- `run_steps` row: an extra row per run cost a fifth of the lifecycle's throughput.
    final_step             jsonb,
    -- The quota counters the run is admitted against, with the limits that applied at enqueue
    -- (`{"counters": [{"owner_id", "agent_id", "limits": {...}}]}`, shared/src/quota.rs);
    -- NULL when none applied. A counter is keyed by (tenant_id, owner_id, agent_id), `owner_id`
    -- '' for the whole tenant, `agent_id` '' for every agent. Admission counts in Redis
    -- (shared/src/quota/admission.rs) and rebuilds a counter it does not hold from the runs'
    -- `quota` (shared/src/db/quota.rs `account`); the worker charges tokens to the counters
    -- with a `daily_token_budget` (`quota_counters`) and stops the run when one is spent. A
    -- child run is not admitted (its parent was; the call is the parent's work): it carries
    -- only its parent's token budgets.
    quota                  jsonb,
    -- The run whose agent tool call started this child run; NULL for a thread's own runs.
    parent_workflow_id     uuid REFERENCES runs (id) ON DELETE CASCADE,
    -- The tool call of the parent that started it.
    parent_tool_call_id    text,
    -- 0 for a thread's own runs, the parent's depth + 1 for a child.
    depth                  smallint NOT NULL DEFAULT 0,
    CONSTRAINT runs_status_check CHECK (status IN (
        'queued', 'running', 'requires_action', 'awaiting_approval', 'waiting',
        'completed', 'failed', 'cancelled'))
);

-- Invariant 2: at most one active run per thread, enforced by the database. The rule is about
-- the thread's own runs: children are active beside their parent.
CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (thread_id)
    WHERE status IN ('queued', 'running', 'requires_action', 'awaiting_approval', 'waiting')
      AND parent_workflow_id IS NULL;

CREATE INDEX runs_thread_idx ON runs (thread_id, created_at);

-- Run lists are newest first, keyed by (created_at, id): a user's own, or the tenant's (admin).
CREATE INDEX runs_owner_list_idx ON runs (tenant_id, owner_id, created_at DESC, id DESC);
CREATE INDEX runs_tenant_list_idx ON runs (tenant_id, created_at DESC, id DESC);

-- Fair claiming (docs/operations.md): the claim walks the tenants that have queued runs (a loose
-- index scan over `runs_queued_tenant_idx`), takes each one's oldest, and prefers the tenant with
-- the fewest running runs (counted on `runs_running_tenant_idx`, at most the workers' concurrency
-- rows per tenant). One tenant's backlog of 10,000 runs does not starve another's single run.
CREATE INDEX runs_queued_tenant_idx ON runs (tenant_id, queued_at) WHERE status = 'queued';
CREATE INDEX runs_running_tenant_idx ON runs (tenant_id) WHERE status = 'running';
-- The claim's first look: expired leases and expired pauses, each by its own deadline, without
-- walking the queue.
CREATE INDEX runs_lease_expiry_idx ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_pause_expiry_idx ON runs (pause_expires_at)
    WHERE status IN ('awaiting_approval', 'requires_action');

-- Deliberately absent: an index of every claimable run, (queued_at) WHERE status IN ('queued',
-- 'running', 'awaiting_approval', 'requires_action'). The claim has no query of its own for
-- it, but the planner used one for the claim's `candidate` step (which re-checks the picked
-- runs' status): a bitmap scan of it ANDed with the others instead of a primary-key probe per
-- pick. A bitmap scan cannot mark an index entry dead, so it read every entry left behind by
-- each claimed and finished run since the last vacuum (6,882 of them for 7 queued runs, in one
-- EXPLAIN ANALYZE after ten seconds of load), and each claim and enqueue wrote one more. The
-- claim writes that re-check so that no partial index matches it (shared/src/db/runs.rs) and
-- probes the primary key. Without the index, the run lifecycle's SQL (tests/bench/
-- lifecycle.sql, pgbench, 16 clients) ran 1,069-1,364 lifecycles/s against 841-1,017 with it
-- (docs/benchmarks-history.md).

-- Usage (GET /v1/usage, docs/operations.md): tokens and runs of the runs that ended in a window, by
-- user, agent or model, read from the runs (and, by model, from their steps: `step_usage`).
CREATE INDEX runs_tenant_finished_idx ON runs (tenant_id, finished_at)
    WHERE finished_at IS NOT NULL;

-- A parent's children: their answers (shared/src/db/runs.rs `children`), a cancel's cascade
-- (`active_descendants`), `spool_child_ended`'s check for active siblings.
CREATE INDEX runs_children_idx ON runs (parent_workflow_id) WHERE parent_workflow_id IS NOT NULL;

-- =============================================================================================
-- run_steps
-- =============================================================================================

-- Checkpoints: each step of a run (the model's output, the tool calls and their results), saved
-- by statements fenced on the attempt: once with the tool calls before they run, once more with
-- their results, before the next model call. A new attempt rebuilds the conversation from these
-- rows: a step with results is not repeated; a step without them repeats only its tool calls,
-- with the same tool_call_ids (so the same idempotency keys); no completed model call is
-- repeated. The step that answers without tool calls is kept on the run instead
-- (`runs.final_step`).
CREATE TABLE run_steps (
    workflow_id  uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step         integer NOT NULL,
    -- The attempt that completed it.
    attempt      integer NOT NULL,
    -- The `SavedStep` type of shared/src/db/steps.rs (the model's text and tool calls, one
    -- result with its state per call, usage, citations); only that type reads it (and the
    -- `step_usage` view, below).
    data         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- The model's text of the step, as a column of its own: a run cancelled while no worker
    -- holds it gets the text of its steps as its partial message, without reading inside
    -- `data`.
    text         text NOT NULL DEFAULT '',
    PRIMARY KEY (workflow_id, step)
);

-- =============================================================================================
-- idempotency_keys
-- =============================================================================================

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

-- The purge of expired keys (worker/src/housekeeping.rs).
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);

-- =============================================================================================
-- agents
-- =============================================================================================

-- Stored agent configurations, per tenant. `spec` holds the validated JSON the API accepted
-- (instructions, model, tools, limits); the enqueue copies it onto each run (`runs.agent_spec`).
CREATE TABLE agents (
    id          uuid PRIMARY KEY,
    tenant_id   text NOT NULL,
    name        text NOT NULL,
    spec        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX agents_tenant_idx ON agents (tenant_id, created_at);

-- =============================================================================================
-- webhooks, webhook_deliveries, webhook_attempts
-- =============================================================================================

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

-- The outbox: one row per (event, endpoint), written by `spool_run_status_changed` (below) in
-- the transaction that changes the run's status, so no event is lost whoever changed it (a
-- worker, the API, a crash's reclaim). Workers deliver them (worker/src/webhooks.rs): claimed
-- with a lease like runs, retried with backoff.
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

-- =============================================================================================
-- quota_counters
-- =============================================================================================

-- Quotas (docs/operations.md): runs per hour, concurrent runs and daily tokens, per user and per
-- tenant (from configuration), and per user and tenant for one agent's runs (its `governance`).
-- Admission counts in Redis (shared/src/quota/admission.rs), not here: in Postgres every enqueue
-- under a quota updated counter rows that all of a tenant's enqueues share (and every run's end
-- updated them again), and whatever the layout (one row per counter, 8 or 32 shards, a trigger
-- deferred to COMMIT) those updates cost the enqueue about a quarter of its throughput with every
-- quota set (docs/benchmarks-history.md). Postgres stays the truth Redis's counters are made from:
-- `runs.quota` names the counters each run was admitted under, and this table keeps the day's
-- tokens.
--
-- Daily token budgets: the tokens (prompt + generated) of the UTC day `day` per counter,
-- charged by the workers after each model call of a run under a budget and read by the run
-- before its next (shared/src/db/quota.rs `charge`); a charge on a later day starts the count
-- again. Keyed like `runs.quota`'s counters: `owner_id` '' for the whole tenant, `agent_id` ''
-- for every agent.
CREATE TABLE quota_counters (
    tenant_id  text   NOT NULL,
    owner_id   text   NOT NULL,
    agent_id   text   NOT NULL,
    day        date   NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')::date,
    day_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, owner_id, agent_id)
);

-- =============================================================================================
-- thread_summaries
-- =============================================================================================

-- Summaries of a thread's oldest turns, written when a prompt would not fit the agent's
-- `context_window_tokens` (or the provider said it was too long). A run's history starts from
-- the newest summary that covers messages before its own, then the messages after it; a
-- summary is written once and reused by every later run, never recomputed per call. Erasing
-- the thread deletes them (no ON DELETE CASCADE: threads rows are never deleted).
CREATE TABLE thread_summaries (
    thread_id   uuid        NOT NULL REFERENCES threads (id),
    -- The last message (by `messages.seq`) the summary covers.
    through_seq bigint      NOT NULL,
    content     text        NOT NULL,
    -- The model that wrote it.
    model       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, through_seq)
);

-- =============================================================================================
-- Triggers
-- =============================================================================================

-- runs_status_changed: when a run ends or pauses for a client or a person (completed, failed,
-- cancelled, requires_action, awaiting_approval: the webhook events), a NOTIFY on
-- `spool_run_status` (payload: the run's id) if the run is `watched`, for the API processes
-- holding `?wait=` requests (api/src/watch.rs, one LISTEN per process); and the outbox rows of
-- the endpoints that asked for the event. Both belong to the changing transaction: a rollback
-- sends and writes nothing. Webhook payloads name a child run's parent.
--
-- Why only watched runs, and only ends and pauses: a NOTIFY serializes committing transactions
-- on the notification queue's lock. On every run's end it halved the throughput of the run
-- lifecycle's SQL (pgbench, tests/bench/lifecycle.sql: 727 against 1,082 transactions/s
-- without it, 16 clients on 2 cores). A claim (queued -> running), a resume (paused -> queued)
-- or a wait for children (-> waiting) makes no plpgsql call.
CREATE FUNCTION spool_run_status_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.watched THEN
        PERFORM pg_notify('spool_run_status', NEW.id::text);
    END IF;
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
                   'pending_action', NEW.pending_action,
                   'parent_workflow_id', NEW.parent_workflow_id))
      FROM webhooks w
     WHERE w.tenant_id = NEW.tenant_id AND ('run.' || NEW.status) = ANY (w.events);
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_status_changed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'requires_action',
                             'awaiting_approval'))
    EXECUTE FUNCTION spool_run_status_changed();

-- runs_child_ended: re-queues the parent of a child that has just ended, once none of its
-- children is active, and wakes idle workers (NOTIFY `spool_runs`). The parent's row is locked
-- first: of two children ending at once, the second to take the lock sees the first's end
-- committed (each statement of a plpgsql function reads a fresh snapshot under READ
-- COMMITTED), so one of them always re-queues the parent.
CREATE FUNCTION spool_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs WHERE id = NEW.parent_workflow_id FOR UPDATE;
    UPDATE runs p
       SET status = 'queued', pending_action = NULL, pause_expires_at = NULL, resumed = true,
           queued_at = now(), updated_at = now()
     WHERE p.id = NEW.parent_workflow_id AND p.status = 'waiting'
       AND NOT EXISTS (SELECT 1 FROM runs c
                        WHERE c.parent_workflow_id = p.id AND c.id <> NEW.id
                          AND c.status NOT IN ('completed', 'failed', 'cancelled'));
    -- Idle workers wake for it, as for every other way a run becomes claimable.
    IF FOUND THEN
        PERFORM pg_notify('spool_runs', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_child_ended
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (NEW.parent_workflow_id IS NOT NULL
          AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION spool_child_ended();

-- =============================================================================================
-- Views
-- =============================================================================================

-- Each step's model call and tokens as columns, for the usage report grouped by model
-- (shared/src/db/usage.rs). `run_steps.data` and `runs.final_step` hold a `SavedStep`
-- (shared/src/db/steps.rs), whose serde names are the definition: this view is the one place
-- SQL reads its fields, so the report does not depend on them by string keys.
CREATE VIEW step_usage AS
SELECT s.workflow_id,
       s.data->'model_call'->>'model' AS model,
       coalesce((s.data->'usage'->>'input_tokens')::bigint, 0) AS input_tokens,
       coalesce((s.data->'usage'->>'output_tokens')::bigint, 0) AS output_tokens
  FROM run_steps s
UNION ALL
SELECT r.id,
       r.final_step->'model_call'->>'model',
       coalesce((r.final_step->'usage'->>'input_tokens')::bigint, 0),
       coalesce((r.final_step->'usage'->>'output_tokens')::bigint, 0)
  FROM runs r
 WHERE r.final_step IS NOT NULL;
