//! Usage: the tokens and runs of a tenant's runs that ended in a window, grouped by user, agent
//! or model. By user and agent it sums `runs.usage`; by model it sums each step's model call
//! (`run_steps.data` and the run's `final_step`: `model_call.model`, `usage`), so a run whose
//! steps used several models counts under each; steps saved before model calls were recorded
//! count as `unknown`.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

// The token and run sums of `runs` rows.
macro_rules! sums {
    () => {
        "coalesce(sum((usage->>'input_tokens')::bigint), 0)::bigint AS input_tokens,
         coalesce(sum((usage->>'output_tokens')::bigint), 0)::bigint AS output_tokens,
         count(*) AS runs"
    };
}

/// What usage is grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    /// The run's user.
    User,
    /// The run's agent (`default` for the server's default agent).
    Agent,
    /// The model of each model call.
    Model,
}

/// One group's usage.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct UsageRow {
    /// The user id, agent id (or `default`), or model name.
    pub group: String,
    /// Prompt tokens.
    pub input_tokens: i64,
    /// Generated tokens.
    pub output_tokens: i64,
    /// Runs that ended in the window.
    pub runs: i64,
}

/// The tenant's usage in `[from, to)`, largest total first.
pub async fn report(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    group_by: GroupBy,
) -> sqlx::Result<Vec<UsageRow>> {
    let sql = match group_by {
        GroupBy::User | GroupBy::Agent => {
            if group_by == GroupBy::User {
                concat!(
                    "SELECT owner_id AS \"group\", ",
                    sums!(),
                    " FROM runs WHERE tenant_id = $1 AND finished_at >= $2 AND finished_at < $3
                     GROUP BY 1"
                )
            } else {
                concat!(
                    "SELECT coalesce(agent_id::text, 'default') AS \"group\", ",
                    sums!(),
                    " FROM runs WHERE tenant_id = $1 AND finished_at >= $2 AND finished_at < $3
                     GROUP BY 1"
                )
            }
        }
        GroupBy::Model => {
            // Each step's model call, from the `step_usage` view over the saved steps (its
            // migration says why a view).
            "SELECT coalesce(u.model, 'unknown') AS \"group\",
                    coalesce(sum(u.input_tokens), 0)::bigint AS input_tokens,
                    coalesce(sum(u.output_tokens), 0)::bigint AS output_tokens,
                    count(DISTINCT r.id) AS runs
               FROM runs r JOIN step_usage u ON u.workflow_id = r.id
              WHERE r.tenant_id = $1 AND r.finished_at >= $2 AND r.finished_at < $3
              GROUP BY 1"
        }
    };
    let rows: Vec<UsageRow> = sqlx::query_as(sql)
        .bind(tenant_id)
        .bind(from)
        .bind(to)
        .fetch_all(executor)
        .await?;
    let mut rows = rows;
    rows.sort_by(|a, b| {
        (b.input_tokens + b.output_tokens)
            .cmp(&(a.input_tokens + a.output_tokens))
            .then_with(|| a.group.cmp(&b.group))
    });
    Ok(rows)
}
