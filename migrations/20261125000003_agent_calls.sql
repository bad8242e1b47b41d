-- Agents as tools (DESIGN §9): a tool call of an agent tool starts a child run of that agent on
-- the parent's thread, and the parent waits for it without a worker (status `waiting`).
--
-- * A child run is a run like any other (claimed, leased, fenced, checkpointed, resumed after
--   a crash); `parent_workflow_id` and `parent_tool_call_id` say which call started it,
--   `depth` how deep it is (a thread's own runs are at 0). Its messages are on the parent's
--   thread but marked with its depth: thread listings and the history of later turns leave
--   them out.
-- * The one-active-run rule is about the thread's own runs: children are active beside their
--   parent.
-- * When a child ends, the transaction that ends it re-queues its parent if no other child of
--   the parent is still active (the trigger below), and wakes idle workers. The parent's next attempt reads each
--   child's answer from the child's run and message: the child writes nothing of the parent's.

ALTER TABLE runs
    ADD COLUMN parent_workflow_id uuid REFERENCES runs (id) ON DELETE CASCADE,
    ADD COLUMN parent_tool_call_id text,
    ADD COLUMN depth smallint NOT NULL DEFAULT 0;

ALTER TABLE messages ADD COLUMN depth smallint NOT NULL DEFAULT 0;

ALTER TABLE runs DROP CONSTRAINT runs_status_check;
ALTER TABLE runs ADD CONSTRAINT runs_status_check CHECK (status IN (
    'queued', 'running', 'requires_action', 'awaiting_approval', 'waiting',
    'completed', 'failed', 'cancelled'));

DROP INDEX runs_one_active_per_thread;
CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (thread_id)
    WHERE status IN ('queued', 'running', 'requires_action', 'awaiting_approval', 'waiting')
      AND parent_workflow_id IS NULL;

CREATE INDEX runs_children_idx ON runs (parent_workflow_id) WHERE parent_workflow_id IS NOT NULL;

-- Re-queues the parent of a child that has just ended, once none of its children is active.
-- The parent's row is locked first: of two children ending at once, the second to take the
-- lock sees the first's end committed (each statement of a plpgsql function reads a fresh
-- snapshot under READ COMMITTED), so one of them always re-queues the parent.
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

-- A child is not admitted (its parent was; the call is the parent's work): it carries only its
-- parent's token budgets, so its tokens are charged to them and it stops when one is spent.
DROP TRIGGER runs_quota_admit ON runs;
CREATE CONSTRAINT TRIGGER runs_quota_admit
    AFTER INSERT ON runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.quota IS NOT NULL AND NEW.parent_workflow_id IS NULL)
    EXECUTE FUNCTION spool_quota_admit();

-- A waiting run is active: ending it (a cancel) or deleting it gives its room back.
DROP TRIGGER runs_quota_release ON runs;
CREATE CONSTRAINT TRIGGER runs_quota_release
    AFTER UPDATE OF status ON runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.quota IS NOT NULL
          AND OLD.status IN ('queued', 'running', 'requires_action', 'awaiting_approval',
                             'waiting')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION spool_quota_release();

DROP TRIGGER runs_quota_release_deleted ON runs;
CREATE CONSTRAINT TRIGGER runs_quota_release_deleted
    AFTER DELETE ON runs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.quota IS NOT NULL
          AND OLD.status IN ('queued', 'running', 'requires_action', 'awaiting_approval',
                             'waiting'))
    EXECUTE FUNCTION spool_quota_release();

-- Webhook payloads name a child run's parent.
CREATE OR REPLACE FUNCTION spool_run_status_changed() RETURNS trigger LANGUAGE plpgsql AS $$
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
