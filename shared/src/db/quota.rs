//! The quota counters (`quota_counters`, see its migration): admission at enqueue, the token
//! charge of a model call, and the budget check of a running run.
//!
//! Admission is the `runs_quota_admit` trigger, deferred to the enqueue's COMMIT (see the
//! migration `20261124000005_quotas.sql`): it checks each counter of `runs.quota` and takes
//! room for the run in a shard of it, and fails the COMMIT with SQLSTATE [`REFUSED`] when a
//! budget is spent or a counter has no room, which rolls everything back; [`refusal`] reads
//! why. Quotas therefore cost the enqueue no extra round trip, and enqueues of one tenant do
//! not queue behind each other's commits.

use sqlx::PgExecutor;

use crate::quota::{Counter, QuotaScope, RunQuota};

/// Why a run was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Which limit: `rate_limited`, `concurrency_limited` or `budget_exceeded`.
    pub code: &'static str,
    /// Whom the counter counts.
    pub scope: QuotaScope,
    /// The agent whose runs it counts (its `governance`), if only one's.
    pub agent_id: Option<String>,
    /// The limit.
    pub limit: u64,
    /// Seconds until a retry may pass (the window's or the day's end; a hint for concurrency).
    pub retry_after: u32,
}

impl Refusal {
    /// A sentence for people.
    pub fn message(&self) -> String {
        let whose = whose(self.scope, self.agent_id.as_deref());
        let what = match self.code {
            "rate_limited" => format!("{} runs per hour", self.limit),
            "concurrency_limited" => format!("{} active runs at once", self.limit),
            _ => format!("a budget of {} tokens a day", self.limit),
        };
        format!(
            "{whose} quota of {what} is reached; retry after {} s",
            self.retry_after
        )
    }
}

/// Whose counter it is, for messages: `the user's`, `the tenant's (agent …)`.
fn whose(scope: QuotaScope, agent_id: Option<&str>) -> String {
    match agent_id {
        None => format!("the {}'s", scope.as_str()),
        Some(agent) => format!("the {}'s (agent {agent})", scope.as_str()),
    }
}

/// Seconds a refusal for concurrency suggests waiting: no run's end can be foreseen.
pub const CONCURRENCY_RETRY_SECS: u32 = 5;

/// The SQLSTATE with which `spool_quota_admit` refuses a run at COMMIT.
pub const REFUSED: &str = "SQ429";

/// The refusal JSON `spool_quota_admit` puts in the error's DETAIL.
#[derive(serde::Deserialize)]
struct Detail {
    code: String,
    limit: u64,
    #[serde(default)]
    retry_after: Option<f64>,
    owner_id: String,
    agent_id: String,
}

/// The refusal a failed COMMIT carries, if a quota refused the run.
pub fn refusal(err: &sqlx::Error) -> Option<Refusal> {
    let sqlx::Error::Database(db) = err else {
        return None;
    };
    if db.code().as_deref() != Some(REFUSED) {
        return None;
    }
    let detail = db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?
        .detail()?;
    let detail: Detail = serde_json::from_str(detail).ok()?;
    let code = match detail.code.as_str() {
        "rate_limited" => "rate_limited",
        "concurrency_limited" => "concurrency_limited",
        "budget_exceeded" => "budget_exceeded",
        _ => return None,
    };
    let counter = Counter {
        owner_id: detail.owner_id,
        agent_id: detail.agent_id,
        limits: Default::default(),
    };
    let retry_after = detail.retry_after.map_or(CONCURRENCY_RETRY_SECS, |secs| {
        secs.ceil().clamp(1.0, 86_400.0) as u32
    });
    Some(Refusal {
        code,
        scope: counter.scope(),
        agent_id: counter.agent().map(str::to_owned),
        limit: detail.limit,
        retry_after,
    })
}

/// A counter whose daily budget is spent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spent {
    /// Whom it counts.
    pub scope: QuotaScope,
    /// The agent whose runs it counts, if only one's.
    pub agent_id: Option<String>,
    /// The budget.
    pub budget: u64,
    /// Tokens spent today.
    pub tokens: i64,
}

impl Spent {
    /// A sentence for people.
    pub fn message(&self) -> String {
        let whose = whose(self.scope, self.agent_id.as_deref());
        format!(
            "{whose} daily token budget of {} is spent ({} tokens today)",
            self.budget, self.tokens
        )
    }
}

// The UTC day of a counter's tokens.
macro_rules! today {
    () => {
        "(now() AT TIME ZONE 'UTC')::date"
    };
}

#[derive(sqlx::FromRow)]
struct DayTokens {
    owner_id: String,
    agent_id: String,
    day_tokens: i64,
}

/// Adds `tokens` to today's tokens of `quota`'s budgeted counters of `tenant_id` (with 0, only
/// reads them) and returns the first counter whose budget is spent. Not part of any run
/// transaction: a model call's tokens are spent once it answered, whatever happens next.
pub async fn charge(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    quota: &RunQuota,
    tokens: u64,
) -> sqlx::Result<Option<Spent>> {
    let budgets: Vec<&Counter> = quota.budgets().collect();
    if budgets.is_empty() {
        return Ok(None);
    }
    let owners: Vec<&str> = budgets.iter().map(|c| c.owner_id.as_str()).collect();
    let agents: Vec<&str> = budgets.iter().map(|c| c.agent_id.as_str()).collect();
    let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
    let rows: Vec<DayTokens> = if tokens == 0 {
        sqlx::query_as(concat!(
            "SELECT owner_id, agent_id,
                    CASE WHEN day = ",
            today!(),
            " THEN day_tokens ELSE 0 END AS day_tokens
               FROM quota_counters
              WHERE tenant_id = $1
                AND (owner_id, agent_id) IN (SELECT * FROM unnest($2::text[], $3::text[]))"
        ))
        .bind(tenant_id)
        .bind(&owners)
        .bind(&agents)
        .fetch_all(executor)
        .await?
    } else {
        sqlx::query_as(concat!(
            "INSERT INTO quota_counters AS q (tenant_id, owner_id, agent_id, day, day_tokens)
             SELECT $1, k.o, k.a, ",
            today!(),
            ", $4
               FROM unnest($2::text[], $3::text[]) AS k(o, a)
              ORDER BY k.o, k.a
             ON CONFLICT (tenant_id, owner_id, agent_id) DO UPDATE SET
                day_tokens = CASE WHEN q.day = excluded.day THEN q.day_tokens ELSE 0 END
                             + excluded.day_tokens,
                day = excluded.day
             RETURNING q.owner_id, q.agent_id, q.day_tokens"
        ))
        .bind(tenant_id)
        .bind(&owners)
        .bind(&agents)
        .bind(tokens)
        .fetch_all(executor)
        .await?
    };
    Ok(budgets.into_iter().find_map(|counter| {
        let budget = counter.limits.daily_token_budget?;
        let row = rows
            .iter()
            .find(|r| r.owner_id == counter.owner_id && r.agent_id == counter.agent_id)?;
        (row.day_tokens >= i64::try_from(budget).unwrap_or(i64::MAX)).then(|| Spent {
            scope: counter.scope(),
            agent_id: counter.agent().map(str::to_owned),
            budget,
            tokens: row.day_tokens,
        })
    }))
}

/// One counter as stored, for operators and tests.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct CounterRow {
    /// The user, or `""` for the tenant.
    pub owner_id: String,
    /// The agent, or `""` for every agent.
    pub agent_id: String,
    /// Active runs counted (over its shards).
    pub active_runs: i64,
    /// Tokens of today (UTC).
    pub day_tokens: i64,
}

/// The tenant's counters.
pub async fn counters(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
) -> sqlx::Result<Vec<CounterRow>> {
    sqlx::query_as(concat!(
        "SELECT owner_id, agent_id, coalesce(s.active_runs, 0) AS active_runs,
                coalesce(c.day_tokens, 0) AS day_tokens
           FROM (SELECT owner_id, agent_id, sum(active_runs)::bigint AS active_runs
                   FROM quota_slots WHERE tenant_id = $1 GROUP BY 1, 2) s
           FULL JOIN (SELECT owner_id, agent_id, day_tokens FROM quota_counters
                       WHERE tenant_id = $1 AND day = ",
        today!(),
        ") c USING (owner_id, agent_id)
          ORDER BY owner_id, agent_id"
    ))
    .bind(tenant_id)
    .fetch_all(executor)
    .await
}

#[cfg(test)]
mod tests {
    use spool_tests::TestDb;

    /// Takes room for one run in the counter `(tenant, '', '')`, as the admission trigger does:
    /// `None` when admitted, else the refusal's code.
    async fn take(
        db: &TestDb,
        tenant: &str,
        active: Option<i64>,
        rate: Option<i64>,
    ) -> Option<String> {
        let (refusal,): (Option<serde_json::Value>,) =
            sqlx::query_as("SELECT spool_quota_take($1, '', '', $2, $3)")
                .bind(tenant)
                .bind(active)
                .bind(rate)
                .fetch_one(&db.pool)
                .await
                .expect("take");
        refusal.map(|r| r["code"].as_str().unwrap_or_default().to_owned())
    }

    async fn shards(db: &TestDb, tenant: &str) -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT count(*), sum(active_runs)::bigint, sum(window_runs)::bigint
               FROM quota_slots WHERE tenant_id = $1",
        )
        .bind(tenant)
        .fetch_one(&db.pool)
        .await
        .expect("shards")
    }

    #[tokio::test]
    async fn a_new_counter_has_32_shards_and_admits_exactly_its_limits() {
        let db = TestDb::new().await.expect("db");
        for _ in 0..5 {
            assert_eq!(take(&db, "acme", Some(5), Some(7)).await, None);
        }
        assert_eq!(
            take(&db, "acme", Some(5), Some(7)).await.as_deref(),
            Some("concurrency_limited")
        );
        assert_eq!(shards(&db, "acme").await, (32, 5, 5));
        // Far from a large limit, every take lands at once (no shard's part is 0 or full).
        for _ in 0..100 {
            assert_eq!(take(&db, "big", Some(1_000), None).await, None);
        }
        assert_eq!(shards(&db, "big").await.1, 100);
    }

    #[tokio::test]
    async fn a_counter_made_with_8_shards_keeps_them_and_still_admits_exactly_its_limit() {
        let db = TestDb::new().await.expect("db");
        // As the migration before 32 shards left it (`shards` defaults to 8).
        sqlx::query(
            "INSERT INTO quota_slots (tenant_id, owner_id, agent_id, shard)
             SELECT 'old', '', '', g FROM generate_series(0, 7) g",
        )
        .execute(&db.pool)
        .await
        .expect("old counter");
        let mut admitted = 0;
        for _ in 0..15 {
            match take(&db, "old", Some(10), None).await {
                None => admitted += 1,
                Some(code) => assert_eq!(code, "concurrency_limited"),
            }
        }
        assert_eq!(admitted, 10);
        assert_eq!(shards(&db, "old").await, (8, 10, 0));
    }
}
