-- The status trigger fires only where someone listens, and NOTIFYs only runs someone waits on;
-- and the final step moves onto the run.
-- A NOTIFY serializes committing transactions on the notification queue's lock: on every
-- run's end it halved the throughput of the run lifecycle's SQL (pgbench, tests/bench/
-- lifecycle.sql: 727 against 1,082 transactions/s without it, 16 clients on 2 cores).
--
-- * `watched`: set by `GET /v1/workflows/{id}?wait=` (an UPDATE that also reads the run, so
--   a run ending at the same moment either sees the flag or is seen ended). Only a watched
--   run's end or pause is NOTIFYed.
-- * The trigger is called only when a run ends or pauses (the webhook events): a claim
--   (queued -> running) or a resume (paused -> queued) makes no plpgsql call.
ALTER TABLE runs ADD COLUMN watched boolean NOT NULL DEFAULT false;

-- The step that answered without tool calls (the `SavedStep` of shared/src/db/steps.rs), kept
-- on the run by the finishing statement for the timeline, rather than as a `run_steps` row: an
-- extra row per run cost a fifth of the lifecycle's throughput.
ALTER TABLE runs ADD COLUMN final_step jsonb;

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
                   'pending_action', NEW.pending_action))
      FROM webhooks w
     WHERE w.tenant_id = NEW.tenant_id AND ('run.' || NEW.status) = ANY (w.events);
    RETURN NULL;
END
$$;

DROP TRIGGER runs_status_changed ON runs;
CREATE TRIGGER runs_status_changed
    AFTER UPDATE OF status ON runs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'requires_action',
                             'awaiting_approval'))
    EXECUTE FUNCTION spool_run_status_changed();
