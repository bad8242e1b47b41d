-- Usage by provider (`GET /v1/usage?group_by=provider`, shared/src/db/usage.rs): the roll-up
-- keeps each run's provider, as the run's agent snapshot names it at enqueue
-- (`runs.agent_spec`: `tenant:<name>` for one of the tenant's providers, `operator:<name>` for
-- one of the operator's, `unknown` when the agent names none).
--
-- Why a table of its own rather than a column in `usage_daily`: a provider column there would
-- have to join its key, and the roll-up of a binary one version older writes `usage_daily`
-- with `ON CONFLICT (tenant_id, day, owner_id, agent_id, model)`, which needs a unique index on
-- exactly those columns: with the key widened, that binary's roll-up would fail until it is
-- replaced. So `usage_daily` stays as it is (both binaries write it alike), and the days by
-- provider go to `usage_daily_providers`, written only by the new roll-up.
--
-- A run the older binary rolls up reaches `usage_daily` and `usage_detail` but not
-- `usage_daily_providers`: its detail rows carry no provider (NULL, the column has no default
-- for new rows). The report reads such rows as `unknown` until the new roll-up adopts them
-- (sets `provider` to `unknown` and adds them to `usage_daily_providers`, in one statement), so
-- a run is counted once by provider whichever binary rolled it up, and none is lost when its
-- detail expires (the purge leaves rows not adopted yet).

-- First, so that its lock waits for a roll-up under way and holds off the next until this
-- commits: the backfill below then reads every day's totals, and every detail row written
-- before it reads `unknown`.
--
-- The rows already there read `unknown` (their days are backfilled as `unknown` below): the
-- constant default is kept for them without rewriting the table, and dropped for rows written
-- after, which the older binary leaves NULL.
ALTER TABLE usage_detail ADD COLUMN provider text DEFAULT 'unknown';
ALTER TABLE usage_detail ALTER COLUMN provider DROP DEFAULT;

-- Tokens and runs per (tenant, UTC day the runs ended, provider, model), with the same two
-- kinds of `model` as `usage_daily`: '' for the runs' own totals (`runs` counts each run once),
-- any other for their steps on that model (read for the group's unpriced models).
CREATE TABLE usage_daily_providers (
    tenant_id      text   NOT NULL,
    day            date   NOT NULL,
    provider       text   NOT NULL,
    model          text   NOT NULL,
    input_tokens   bigint NOT NULL DEFAULT 0,
    output_tokens  bigint NOT NULL DEFAULT 0,
    runs           bigint NOT NULL DEFAULT 0,
    -- NULL when any part is not known (as `usage_daily.cost_usd`).
    cost_usd       double precision,
    -- The report's read (one tenant, a range of days) and the roll-up's ON CONFLICT.
    PRIMARY KEY (tenant_id, day, provider, model)
);

-- The days rolled up before this release, as `unknown`.
INSERT INTO usage_daily_providers (tenant_id, day, provider, model, input_tokens,
                                   output_tokens, runs, cost_usd)
SELECT tenant_id, day, 'unknown', model, sum(input_tokens), sum(output_tokens), sum(runs),
       CASE WHEN bool_and(cost_usd IS NOT NULL) THEN sum(cost_usd) END
  FROM usage_daily
 GROUP BY tenant_id, day, model;

-- Detail rows the older binary wrote (no provider): the report's read of a tenant's in a
-- window, and the adoption's batches. Empty once every binary is new.
CREATE INDEX usage_detail_unattributed_idx ON usage_detail (tenant_id, finished_at)
    WHERE provider IS NULL;
