-- The agent spec a run executes, as it was when the run was enqueued: editing or deleting the
-- agent later changes nothing for runs already queued, running or paused. NULL: the worker's
-- default agent (or a run enqueued before this column existed, which reads the agent's row).
ALTER TABLE runs ADD COLUMN agent_spec jsonb;
