-- Agents as tools, continued: the re-queue of a parent whose last child has ended wakes idle
-- workers (as every other way a run becomes claimable does), rather than waiting for their
-- next poll; and webhook payloads name a child run's parent.

CREATE OR REPLACE FUNCTION spool_child_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs WHERE id = NEW.parent_workflow_id FOR UPDATE;
    UPDATE runs p
       SET status = 'queued', pending_action = NULL, pause_expires_at = NULL, resumed = true,
           queued_at = now(), updated_at = now()
     WHERE p.id = NEW.parent_workflow_id AND p.status = 'waiting'
       AND NOT EXISTS (SELECT 1 FROM runs c
                        WHERE c.parent_workflow_id = p.id AND c.id <> NEW.id
                          AND c.status NOT IN ('completed', 'failed', 'cancelled'));
    IF FOUND THEN
        PERFORM pg_notify('spool_runs', '');
    END IF;
    RETURN NULL;
END
$$;

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
