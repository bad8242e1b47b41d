//! Usage: the tokens and runs of a tenant's runs that ended in a window, grouped by user, agent,
//! provider or model. By user, agent and provider it sums `runs.usage`; by model it sums each
//! step's model call (`run_steps.data` and the run's `final_step`: `model_call.model`, `usage`,
//! read through the `step_usage` view), so a run whose steps used several models counts under
//! each; steps saved before model calls were recorded (or naming no model) count as `unknown`
//! (never as '', which the roll-up keeps for the runs' own totals).
//!
//! Provider: a run's, as its agent snapshot (`runs.agent_spec`, taken at enqueue) names it:
//! `tenant:<name>` for one of the tenant's providers (`/v1/providers`; the name it had then, so
//! the key outlives the provider's deletion), `operator:<name>` for one of the operator's
//! (`SPOOL_PROVIDERS`), `unknown` for a run whose agent names none (the server's default agent,
//! an agent served by whichever provider lists its model) and for runs rolled up before the
//! provider was recorded. Every model call of a run that names a provider (fallbacks, summaries
//! and graph nodes included) goes to that one provider, so the run's own totals are its.
//!
//! Cost: each group's `cost_usd` sums the same figures' dollars (`usage.cost_usd`), and is
//! unknown (`None`) once any of them is: tokens of a model with no price are never counted as
//! free. The group names those models (`unpriced_models`, from the per-model rows).
//!
//! Why a roll-up: a report over a year must not read every run and every step's jsonb, and step
//! payloads expire (`SPOOL_RETENTION_STEPS_DAYS`) while usage must not. Housekeeping rolls each
//! ended run up ([`roll_up`]) into `usage_daily` (per tenant, UTC day, user, agent and model),
//! `usage_daily_providers` (per tenant, UTC day, provider and model) and `usage_detail` (per
//! run and model, with the run's provider), in the one statement that marks the run
//! (`runs.usage_rolled_up_at`). So a run is counted either from itself (not rolled up yet) or
//! from the roll-up, never both and never neither, whatever crashes: the mark and the sums
//! commit together or not at all, and a run's detail row is unique, so even a second roll-up
//! could only fail. Only a rolled-up run may lose its steps.
//!
//! The report ([`report`]) reads whole UTC days of its window from `usage_daily`, the parts of
//! the window that are not whole days (its edges) from `usage_detail`, and the runs not rolled
//! up yet from `runs` (and their steps), all in one statement (one snapshot). By provider, whole
//! days also read the detail rows that a binary of the previous release rolled up without a
//! provider (`unknown`, until the roll-up adopts them into `usage_daily_providers`; see the
//! migration `usage_by_provider`). `usage_detail` expires (`SPOOL_RETENTION_USAGE_DETAIL_DAYS`,
//! [`purge_detail`]); a window whose edges are older than that cannot be answered to the
//! second, and the API says so.

use chrono::{DateTime, Duration, NaiveDate, NaiveTime, Utc};
use sqlx::PgExecutor;

// The report: whole days from the roll-up, the edges from the per-run rows, and the runs not
// rolled up yet, summed per group. Each branch gives a group `g`, tokens `i` and `o`, runs `n`,
// dollars `c` (NULL: not known) and `m`, a model whose cost is not known (unpriced) to name in
// the group. The group's dollars are NULL as soon as one of its rows' is.
macro_rules! report_sql {
    ($($branch:expr),+ $(,)?) => {
        concat!(
            "SELECT g AS \"group\", sum(i)::bigint AS input_tokens,
                    sum(o)::bigint AS output_tokens, sum(n)::bigint AS runs,
                    CASE WHEN bool_and(c IS NOT NULL) THEN sum(c) END AS cost_usd,
                    coalesce(array_agg(DISTINCT m ORDER BY m) FILTER (WHERE m IS NOT NULL),
                             '{}') AS unpriced_models
               FROM (",
            report_sql!(@union $($branch),+),
            ") t (g, i, o, n, c, m)
              GROUP BY g"
        )
    };
    (@union $first:expr $(, $rest:expr)*) => {
        concat!($first $(, "\n UNION ALL\n", $rest)*)
    };
}

// Whole days of the roll-up (`usage_daily`, or `$table`): `$cols` of its rows that pass
// `$filter`.
macro_rules! daily {
    ($key:literal, $cols:literal, $filter:literal) => {
        daily!("usage_daily", $key, $cols, $filter)
    };
    ($table:literal, $key:literal, $cols:literal, $filter:literal) => {
        concat!(
            "SELECT ",
            $key,
            " AS g, ",
            $cols,
            " FROM ",
            $table,
            "
              WHERE tenant_id = $1 AND day >= $6 AND day < $7 AND ",
            $filter
        )
    };
}

// By provider, the whole days' detail rows that no roll-up of this release has adopted yet
// (written without a provider: `usage_detail_unattributed_idx`), as `unknown`.
macro_rules! unattributed {
    ($cols:literal, $filter:literal) => {
        concat!(
            "SELECT 'unknown', ",
            $cols,
            " FROM usage_detail
              WHERE tenant_id = $1 AND provider IS NULL AND ",
            $filter,
            "
                AND finished_at >= $3 AND finished_at < $4"
        )
    };
}

// A run's provider (see the module's docs), from the agent snapshot of `runs` (`$run`: the
// table's alias and a dot, or nothing).
macro_rules! provider_of {
    ($run:literal) => {
        concat!(
            "CASE WHEN ",
            $run,
            "agent_spec->>'provider_id' IS NOT NULL
                  THEN 'tenant:' || coalesce(",
            $run,
            "agent_spec->>'provider', ",
            $run,
            "agent_spec->>'provider_id')
                  WHEN coalesce(",
            $run,
            "agent_spec->>'provider', '') <> ''
                  THEN 'operator:' || (",
            $run,
            "agent_spec->>'provider')
                  ELSE 'unknown' END"
        )
    };
}

// The window's edges, from the per-run rows (`usage_detail`).
macro_rules! detail {
    ($key:literal, $cols:literal, $filter:literal) => {
        concat!(
            "SELECT ",
            $key,
            ", ",
            $cols,
            " FROM usage_detail
              WHERE tenant_id = $1 AND ",
            $filter,
            "
                AND ((finished_at >= $2 AND finished_at < $3)
                     OR (finished_at >= $4 AND finished_at < $5))"
        )
    };
}

// Runs not rolled up yet, read from themselves (`runs_usage_pending_idx`).
macro_rules! pending_runs {
    ($key:expr) => {
        concat!(
            "SELECT ",
            $key,
            ", coalesce((usage->>'input_tokens')::bigint, 0),
                    coalesce((usage->>'output_tokens')::bigint, 0), 1,
                    CASE WHEN coalesce((usage->>'input_tokens')::bigint, 0) = 0
                          AND coalesce((usage->>'output_tokens')::bigint, 0) = 0 THEN 0
                         ELSE (usage->>'cost_usd')::float8 END,
                    NULL::text
               FROM runs
              WHERE tenant_id = $1 AND finished_at IS NOT NULL AND usage_rolled_up_at IS NULL
                AND finished_at >= $2 AND finished_at < $5"
        )
    };
}

// By model: each pending run's steps on each model, one run per (run, model).
macro_rules! pending_by_model {
    () => {
        "SELECT coalesce(nullif(u.model, ''), 'unknown'), sum(u.input_tokens),
                sum(u.output_tokens), 1,
                CASE WHEN bool_and(u.cost_usd IS NOT NULL) THEN sum(u.cost_usd) END,
                CASE WHEN NOT bool_and(u.cost_usd IS NOT NULL)
                     THEN coalesce(nullif(u.model, ''), 'unknown') END
           FROM runs r JOIN step_usage u ON u.workflow_id = r.id
          WHERE r.tenant_id = $1 AND r.finished_at IS NOT NULL AND r.usage_rolled_up_at IS NULL
            AND r.finished_at >= $2 AND r.finished_at < $5
          GROUP BY r.id, coalesce(nullif(u.model, ''), 'unknown')"
    };
}

// By user, agent or provider: the unpriced models of each pending run's steps (no figures: the
// run's own totals count those).
macro_rules! pending_unpriced {
    ($key:expr) => {
        concat!(
            "SELECT DISTINCT ",
            $key,
            ", 0::bigint, 0::bigint, 0::bigint, 0::float8,
                    coalesce(nullif(u.model, ''), 'unknown')
               FROM runs r JOIN step_usage u ON u.workflow_id = r.id
              WHERE r.tenant_id = $1 AND r.finished_at IS NOT NULL
                AND r.usage_rolled_up_at IS NULL
                AND r.finished_at >= $2 AND r.finished_at < $5 AND u.cost_usd IS NULL"
        )
    };
}

/// What usage is grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    /// The run's user.
    User,
    /// The run's agent (`default` for the server's default agent).
    Agent,
    /// The run's provider: `tenant:<name>`, `operator:<name>` or `unknown`.
    Provider,
    /// The model of each model call.
    Model,
}

/// One group's usage.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct UsageRow {
    /// The user id, agent id (or `default`), provider, or model name.
    pub group: String,
    /// Prompt tokens.
    pub input_tokens: i64,
    /// Generated tokens.
    pub output_tokens: i64,
    /// Runs that ended in the window.
    pub runs: i64,
    /// What the tokens cost in US dollars; `None` when some of them were on a model with no
    /// price (or recorded before costs were): never counted as free.
    pub cost_usd: Option<f64>,
    /// The models of the group whose calls have no known cost (unpriced), by name.
    pub unpriced_models: Vec<String>,
}

/// A report's window `[from, to)` split into the whole UTC days the roll-up answers and the
/// edges before and after them that only per-run figures can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Start (inclusive).
    pub from: DateTime<Utc>,
    /// End (exclusive).
    pub to: DateTime<Utc>,
    /// First whole day's midnight (`to` when there is none).
    days_from: DateTime<Utc>,
    /// Midnight after the last whole day (`to` when there is none).
    days_to: DateTime<Utc>,
}

impl Window {
    /// The window `[from, to)`, which must not be empty.
    pub fn new(from: DateTime<Utc>, to: DateTime<Utc>) -> Self {
        let midnight = |day: NaiveDate| day.and_time(NaiveTime::MIN).and_utc();
        let first = midnight(from.date_naive());
        let days_from = if first == from {
            first
        } else {
            first + Duration::days(1)
        };
        let days_to = midnight(to.date_naive());
        if days_from < days_to {
            Self {
                from,
                to,
                days_from,
                days_to,
            }
        } else {
            Self {
                from,
                to,
                days_from: to,
                days_to: to,
            }
        }
    }

    /// The oldest instant the window needs per-run figures for (`None`: whole days only).
    pub fn oldest_edge(&self) -> Option<DateTime<Utc>> {
        if self.from < self.days_from {
            Some(self.from)
        } else if self.days_to < self.to {
            Some(self.days_to)
        } else {
            None
        }
    }
}

/// The tenant's usage in the window, largest total first.
pub async fn report(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    window: Window,
    group_by: GroupBy,
) -> sqlx::Result<Vec<UsageRow>> {
    let mut rows: Vec<UsageRow> = sqlx::query_as(report_sql(group_by))
        .bind(tenant_id)
        .bind(window.from)
        .bind(window.days_from)
        .bind(window.days_to)
        .bind(window.to)
        .bind(window.days_from.date_naive())
        .bind(window.days_to.date_naive())
        .fetch_all(executor)
        .await?;
    rows.sort_by(|a, b| {
        (b.input_tokens + b.output_tokens)
            .cmp(&(a.input_tokens + a.output_tokens))
            .then_with(|| a.group.cmp(&b.group))
    });
    Ok(rows)
}

/// The report's statement for `group_by`. (Over 80 lines: one arm per grouping, each one
/// whole SQL statement assembled at compile time; splitting them would only move the arms.)
fn report_sql(group_by: GroupBy) -> &'static str {
    // The roll-up's two kinds of rows (see its migration): '' holds the runs' own totals.
    match group_by {
        GroupBy::User => report_sql!(
            daily!(
                "owner_id",
                "input_tokens, output_tokens, runs, cost_usd, NULL::text",
                "model = ''"
            ),
            detail!(
                "owner_id",
                "input_tokens, output_tokens, 1, cost_usd, NULL::text",
                "model = ''"
            ),
            pending_runs!("owner_id"),
            daily!(
                "owner_id",
                "0::bigint, 0::bigint, 0::bigint, 0::float8, model",
                "model <> '' AND cost_usd IS NULL"
            ),
            detail!(
                "owner_id",
                "0::bigint, 0::bigint, 0::bigint, 0::float8, model",
                "model <> '' AND cost_usd IS NULL"
            ),
            pending_unpriced!("r.owner_id"),
        ),
        GroupBy::Agent => report_sql!(
            daily!(
                "agent_id",
                "input_tokens, output_tokens, runs, cost_usd, NULL::text",
                "model = ''"
            ),
            detail!(
                "agent_id",
                "input_tokens, output_tokens, 1, cost_usd, NULL::text",
                "model = ''"
            ),
            pending_runs!("coalesce(agent_id::text, 'default')"),
            daily!(
                "agent_id",
                "0::bigint, 0::bigint, 0::bigint, 0::float8, model",
                "model <> '' AND cost_usd IS NULL"
            ),
            detail!(
                "agent_id",
                "0::bigint, 0::bigint, 0::bigint, 0::float8, model",
                "model <> '' AND cost_usd IS NULL"
            ),
            pending_unpriced!("coalesce(r.agent_id::text, 'default')"),
        ),
        GroupBy::Provider => report_sql!(
            daily!(
                "usage_daily_providers",
                "provider",
                "input_tokens, output_tokens, runs, cost_usd, NULL::text",
                "model = ''"
            ),
            unattributed!(
                "input_tokens, output_tokens, 1, cost_usd, NULL::text",
                "model = ''"
            ),
            detail!(
                "coalesce(provider, 'unknown')",
                "input_tokens, output_tokens, 1, cost_usd, NULL::text",
                "model = ''"
            ),
            pending_runs!(provider_of!("")),
            daily!(
                "usage_daily_providers",
                "provider",
                "0::bigint, 0::bigint, 0::bigint, 0::float8, model",
                "model <> '' AND cost_usd IS NULL"
            ),
            unattributed!(
                "0::bigint, 0::bigint, 0::bigint, 0::float8, model",
                "model <> '' AND cost_usd IS NULL"
            ),
            detail!(
                "coalesce(provider, 'unknown')",
                "0::bigint, 0::bigint, 0::bigint, 0::float8, model",
                "model <> '' AND cost_usd IS NULL"
            ),
            pending_unpriced!(provider_of!("r.")),
        ),
        GroupBy::Model => report_sql!(
            daily!(
                "model",
                "input_tokens, output_tokens, runs, cost_usd,
                             CASE WHEN cost_usd IS NULL THEN model END",
                "model <> ''"
            ),
            detail!(
                "model",
                "input_tokens, output_tokens, 1, cost_usd,
                              CASE WHEN cost_usd IS NULL THEN model END",
                "model <> ''"
            ),
            pending_by_model!(),
        ),
    }
}

// The roll-up of a batch (`$1` runs): see [`roll_up`]. Also adopts up to `$1` detail rows that
// a binary of the previous release rolled up without a provider: `unknown`, and counted in
// `usage_daily_providers` in the same statement that marks them.
const ROLL_UP: &str = concat!(
    "WITH batch AS (
         SELECT id FROM runs
          WHERE finished_at IS NOT NULL AND usage_rolled_up_at IS NULL
          LIMIT $1 FOR NO KEY UPDATE SKIP LOCKED),
     rolled AS (
         UPDATE runs r SET usage_rolled_up_at = now()
           FROM batch WHERE r.id = batch.id
         RETURNING r.id, r.tenant_id, r.owner_id,
                   coalesce(r.agent_id::text, 'default') AS agent_id, r.finished_at,
                   ",
    provider_of!("r."),
    " AS provider,
                   coalesce((r.usage->>'input_tokens')::bigint, 0) AS input_tokens,
                   coalesce((r.usage->>'output_tokens')::bigint, 0) AS output_tokens,
                   CASE WHEN coalesce((r.usage->>'input_tokens')::bigint, 0) = 0
                         AND coalesce((r.usage->>'output_tokens')::bigint, 0) = 0 THEN 0
                        ELSE (r.usage->>'cost_usd')::float8 END AS cost_usd),
     detail AS (
         SELECT id AS workflow_id, '' AS model, tenant_id, owner_id, agent_id, provider,
                finished_at, input_tokens, output_tokens, cost_usd
           FROM rolled
         UNION ALL
         SELECT r.id, coalesce(nullif(u.model, ''), 'unknown'), r.tenant_id, r.owner_id,
                r.agent_id, r.provider, r.finished_at, sum(u.input_tokens)::bigint,
                sum(u.output_tokens)::bigint,
                CASE WHEN bool_and(u.cost_usd IS NOT NULL) THEN sum(u.cost_usd) END
           FROM rolled r JOIN step_usage u ON u.workflow_id = r.id
          GROUP BY r.id, coalesce(nullif(u.model, ''), 'unknown'), r.tenant_id, r.owner_id,
                   r.agent_id, r.provider, r.finished_at),
     kept AS (
         INSERT INTO usage_detail (workflow_id, model, tenant_id, owner_id, agent_id, provider,
                                   finished_at, input_tokens, output_tokens, cost_usd)
         SELECT workflow_id, model, tenant_id, owner_id, agent_id, provider, finished_at,
                input_tokens, output_tokens, cost_usd
           FROM detail),
     summed AS (
         INSERT INTO usage_daily AS d (tenant_id, day, owner_id, agent_id, model,
                                       input_tokens, output_tokens, runs, cost_usd)
         SELECT tenant_id, (finished_at AT TIME ZONE 'UTC')::date, owner_id, agent_id,
                model, sum(input_tokens), sum(output_tokens), count(*),
                CASE WHEN bool_and(cost_usd IS NOT NULL) THEN sum(cost_usd) END
           FROM detail
          GROUP BY 1, 2, 3, 4, 5
          ORDER BY 1, 2, 3, 4, 5
         ON CONFLICT (tenant_id, day, owner_id, agent_id, model) DO UPDATE
            SET input_tokens = d.input_tokens + EXCLUDED.input_tokens,
                output_tokens = d.output_tokens + EXCLUDED.output_tokens,
                runs = d.runs + EXCLUDED.runs,
                -- Unknown once any part is.
                cost_usd = d.cost_usd + EXCLUDED.cost_usd),
     adopted AS (
         UPDATE usage_detail d SET provider = 'unknown'
           FROM (SELECT workflow_id, model FROM usage_detail WHERE provider IS NULL
                  LIMIT $1 FOR UPDATE SKIP LOCKED) a
          WHERE d.workflow_id = a.workflow_id AND d.model = a.model
         RETURNING d.tenant_id, d.model, d.provider, d.finished_at, d.input_tokens,
                   d.output_tokens, d.cost_usd),
     by_provider AS (
         INSERT INTO usage_daily_providers AS d (tenant_id, day, provider, model,
                                                 input_tokens, output_tokens, runs, cost_usd)
         SELECT tenant_id, (finished_at AT TIME ZONE 'UTC')::date, provider, model,
                sum(input_tokens), sum(output_tokens), count(*),
                CASE WHEN bool_and(cost_usd IS NOT NULL) THEN sum(cost_usd) END
           FROM (SELECT tenant_id, model, provider, finished_at, input_tokens, output_tokens,
                        cost_usd
                   FROM detail
                 UNION ALL
                 SELECT * FROM adopted) x
          GROUP BY 1, 2, 3, 4
          ORDER BY 1, 2, 3, 4
         ON CONFLICT (tenant_id, day, provider, model) DO UPDATE
            SET input_tokens = d.input_tokens + EXCLUDED.input_tokens,
                output_tokens = d.output_tokens + EXCLUDED.output_tokens,
                runs = d.runs + EXCLUDED.runs,
                cost_usd = d.cost_usd + EXCLUDED.cost_usd)
     SELECT count(*) FROM rolled"
);

/// Rolls up to `limit` ended runs that are not rolled up yet into `usage_daily`,
/// `usage_daily_providers` and `usage_detail`, marking them, in one statement; returns how many
/// runs. The same statement adopts up to `limit` detail rows rolled up without a provider by a
/// binary of the previous release (see [`ROLL_UP`]). Two workers rolling
/// up at once take different runs (`SKIP LOCKED`).
pub async fn roll_up(executor: impl PgExecutor<'_>, limit: i64) -> sqlx::Result<u64> {
    let (rolled,): (i64,) = sqlx::query_as(ROLL_UP)
        .bind(limit)
        .fetch_one(executor)
        .await?;
    Ok(rolled.unsigned_abs())
}

// The purge of a batch of per-run rows (`$1` the window, `$2` the batch). Rows not adopted yet
// (no provider) stay until the roll-up has counted them by provider.
const PURGE_DETAIL: &str = "DELETE FROM usage_detail WHERE (workflow_id, model) IN (
         SELECT workflow_id, model FROM usage_detail
          WHERE finished_at < now() - $1::interval AND provider IS NOT NULL
          ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// Deletes up to `limit` per-run usage rows of runs that ended more than `window` ago, oldest
/// first; returns how many. The days' totals stay in `usage_daily`.
pub async fn purge_detail(
    executor: impl PgExecutor<'_>,
    window: Duration,
    limit: i64,
) -> sqlx::Result<u64> {
    let result = sqlx::query(PURGE_DETAIL)
        .bind(window)
        .bind(limit)
        .execute(executor)
        .await?;
    Ok(result.rows_affected())
}

#[cfg(test)]
mod tests;
