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
