-- Retention (DESIGN section 15, docs/operations.md "Retention"): operational rows expire on
-- configurable windows, and the usage report keeps its totals after the detail it read is gone.
-- Each worker's housekeeping (worker/src/housekeeping.rs) does it in bounded batches, in this
-- order: roll usage up, delete expired step payloads, delete expired usage detail, delete
-- expired idempotency keys.
--
-- The two indexes on `runs` are built here, in the migration's transaction, rather than
-- concurrently in files of their own (migrations/README.md): both are partial and, in steady
-- state, small (runs not yet rolled up: minutes of runs; runs whose steps are kept: the steps
-- window). Nothing of Spool has been released, so no database holds the millions of ended runs
-- whose first build would block writes to `runs` for long; a deployment that has them should
-- build the two indexes concurrently before applying this file (the same statements with
-- CONCURRENTLY and IF NOT EXISTS).

-- =============================================================================================
-- usage_daily: the roll-up GET /v1/usage reads for whole UTC days
-- =============================================================================================

-- Tokens and runs per (tenant, UTC day the runs ended, user, agent, model). Written only by the
-- roll-up (shared/src/db/usage.rs `roll_up`), in the statement that marks the runs it counts
-- (`runs.usage_rolled_up_at`): a run is counted here once, or not yet, never twice, whatever
-- crashes. Rows of two kinds share the key:
-- - `model` = '': the runs' own totals (`runs.usage`, which also counts model calls outside
--   steps: compaction, structured-output repair); `runs` counts each run once. The report by
--   user and by agent reads these.
-- - any other `model`: the tokens of the runs' steps on that model ('unknown' for steps saved
--   before the model was recorded); `runs` counts the runs with a step on it. The report by
--   model reads these.
CREATE TABLE usage_daily (
    tenant_id      text   NOT NULL,
    day            date   NOT NULL,
    owner_id       text   NOT NULL,
    -- The agent's id, or 'default' for the server's default agent.
    agent_id       text   NOT NULL,
    model          text   NOT NULL,
    input_tokens   bigint NOT NULL DEFAULT 0,
    output_tokens  bigint NOT NULL DEFAULT 0,
    runs           bigint NOT NULL DEFAULT 0,
    -- The report's read: one tenant, a range of days.
    PRIMARY KEY (tenant_id, day, owner_id, agent_id, model)
);

-- =============================================================================================
-- usage_detail: each rolled-up run's figures, for windows that do not start or end at midnight
-- =============================================================================================

-- One row per rolled-up run and model, with the same two kinds of `model` as `usage_daily`,
-- written by the same statement. The report reads them for the parts of a window that are not
-- whole UTC days; housekeeping deletes them `SPOOL_RETENTION_USAGE_DETAIL_DAYS` after the run
-- ended (a window edge older than that is refused, `usage_detail_expired`). No foreign key: the
-- figures outlive the run's thread being erased, as the day's totals do, and name no content.
CREATE TABLE usage_detail (
    workflow_id    uuid        NOT NULL,
    model          text        NOT NULL,
    tenant_id      text        NOT NULL,
    owner_id       text        NOT NULL,
    agent_id       text        NOT NULL,
    finished_at    timestamptz NOT NULL,
    input_tokens   bigint      NOT NULL,
    output_tokens  bigint      NOT NULL,
    -- A second roll-up of the same run could only fail here, never count twice.
    PRIMARY KEY (workflow_id, model)
);

-- The report's read (a tenant's rows in a window's edges) and the purge (oldest first).
CREATE INDEX usage_detail_tenant_idx ON usage_detail (tenant_id, finished_at);
CREATE INDEX usage_detail_finished_idx ON usage_detail (finished_at);

-- =============================================================================================
-- runs: what retention has done to each ended run
-- =============================================================================================

-- When the roll-up counted the run in `usage_daily` and `usage_detail` (NULL: not yet, and the
-- report reads the run itself). Set in the roll-up's statement, so a run's figures are in
-- exactly one of the two places at any moment.
ALTER TABLE runs ADD COLUMN usage_rolled_up_at timestamptz;
-- When its step payloads (`run_steps` rows, `final_step`) were deleted, having ended more than
-- `SPOOL_RETENTION_STEPS_DAYS` before: its timeline says they expired rather than that there
-- were none. Only an ended run whose usage was rolled up loses its steps.
ALTER TABLE runs ADD COLUMN steps_expired_at timestamptz;

-- Ended runs not rolled up yet: the roll-up's batches, and the report's read of them.
CREATE INDEX runs_usage_pending_idx ON runs (tenant_id, finished_at)
    WHERE finished_at IS NOT NULL AND usage_rolled_up_at IS NULL;
-- Ended runs that still have their steps, oldest first: the steps purge's batches.
CREATE INDEX runs_steps_kept_idx ON runs (finished_at)
    WHERE finished_at IS NOT NULL AND steps_expired_at IS NULL;

-- =============================================================================================
-- step_usage, read one run at a time
-- =============================================================================================

-- The same rows as the baseline's view (each step's model and tokens, from `run_steps.data` and
-- `runs.final_step`), written so that a join on `workflow_id` reads each run's rows by key: the
-- baseline's UNION ALL of the two tables took no join condition into its `runs` branch, so the
-- usage report's and the roll-up's joins read every run that has a final step. Here the run is
-- found by its primary key and its steps by theirs.
CREATE OR REPLACE VIEW step_usage AS
SELECT r.id AS workflow_id, x.model, x.input_tokens, x.output_tokens
  FROM runs r
 CROSS JOIN LATERAL (
       SELECT s.data->'model_call'->>'model' AS model,
              coalesce((s.data->'usage'->>'input_tokens')::bigint, 0) AS input_tokens,
              coalesce((s.data->'usage'->>'output_tokens')::bigint, 0) AS output_tokens
         FROM run_steps s
        WHERE s.workflow_id = r.id
       UNION ALL
       SELECT r.final_step->'model_call'->>'model',
              coalesce((r.final_step->'usage'->>'input_tokens')::bigint, 0),
              coalesce((r.final_step->'usage'->>'output_tokens')::bigint, 0)
        WHERE r.final_step IS NOT NULL) x;
