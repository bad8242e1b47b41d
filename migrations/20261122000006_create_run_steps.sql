-- Checkpoints: each step of a run (the model's output, the tool calls and their results), saved
-- by statements fenced on the attempt: once with the tool calls before they run, once more with
-- their results, before the next model call. A new attempt rebuilds the conversation from these
-- rows: a step with results is not repeated; a step without them repeats only its tool calls,
-- with the same tool_call_ids (so the same idempotency keys); no completed model call is repeated.
CREATE TABLE run_steps (
    workflow_id  uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step         integer NOT NULL,
    -- The attempt that completed it.
    attempt      integer NOT NULL,
    -- {assistant: {text, tool_calls}, results: [{tool_call_id, name, output, is_error}] or null
    --  while the calls are in flight, usage, citations}
    data         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, step)
);
