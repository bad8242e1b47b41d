-- The OpenAI-compatible routes answer a run paused for client tools when a request carries the
-- outputs of its calls without naming the run (Chat Completions' `tool` messages, a Responses
-- input that resends the conversation): the run is found by a pending call's id
-- (shared/src/db/runs.rs `find_waiting_for_call`). Partial: only runs that wait for client
-- outputs are indexed, so the index stays as small as the set of paused runs; built here, in
-- the migration's transaction, for that reason (migrations/README.md).
CREATE INDEX IF NOT EXISTS runs_waiting_calls_idx ON runs
    USING gin ((pending_action -> 'tool_calls') jsonb_path_ops)
    WHERE status = 'requires_action';
