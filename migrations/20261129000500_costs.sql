-- Cost (DESIGN sections 8 and 9): every model call records `cost_usd` in its usage (in
-- `run_steps.data`, `runs.final_step`, `runs.usage` and `messages.usage`, jsonb: no column),
-- priced by the provider's `prices`; null for a model with no price (unpriced), never 0.

-- Daily budgets in dollars (`daily_budget_usd`): the dollars of the UTC day `day` per counter,
-- charged with its tokens (shared/src/db/quota.rs `charge`). Calls of unpriced models add
-- nothing.
ALTER TABLE quota_counters ADD COLUMN day_cost_usd double precision NOT NULL DEFAULT 0;

-- The usage roll-up's dollars: the sum of the rows' costs, NULL when any of them is not known
-- (a model with no price, or usage recorded before costs were), so a report never counts
-- unpriced tokens as free. Rows of runs that used no tokens cost 0.
ALTER TABLE usage_daily ADD COLUMN cost_usd double precision;
ALTER TABLE usage_detail ADD COLUMN cost_usd double precision;
UPDATE usage_daily SET cost_usd = 0 WHERE input_tokens = 0 AND output_tokens = 0;
UPDATE usage_detail SET cost_usd = 0 WHERE input_tokens = 0 AND output_tokens = 0;

-- step_usage gains each step's dollars (NULL: unpriced or not recorded; 0 with no tokens).
CREATE OR REPLACE VIEW step_usage AS
SELECT r.id AS workflow_id, x.model, x.input_tokens, x.output_tokens,
       CASE WHEN x.input_tokens = 0 AND x.output_tokens = 0 THEN 0 ELSE x.cost_usd END
           AS cost_usd
  FROM runs r
 CROSS JOIN LATERAL (
       SELECT s.data->'model_call'->>'model' AS model,
              coalesce((s.data->'usage'->>'input_tokens')::bigint, 0) AS input_tokens,
              coalesce((s.data->'usage'->>'output_tokens')::bigint, 0) AS output_tokens,
              (s.data->'usage'->>'cost_usd')::double precision AS cost_usd
         FROM run_steps s
        WHERE s.workflow_id = r.id
       UNION ALL
       SELECT r.final_step->'model_call'->>'model',
              coalesce((r.final_step->'usage'->>'input_tokens')::bigint, 0),
              coalesce((r.final_step->'usage'->>'output_tokens')::bigint, 0),
              (r.final_step->'usage'->>'cost_usd')::double precision
        WHERE r.final_step IS NOT NULL) x;
