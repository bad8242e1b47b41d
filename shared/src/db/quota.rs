//! The quotas' truth in Postgres: the day's tokens and cost per counter (`quota_counters`), charged by
//! the workers after each model call and checked by a running run before its next; and the
//! account a counter is rebuilt from when Redis, where admission counts
//! ([`crate::quota::admission`]), does not hold it.

use sqlx::{PgConnection, PgExecutor};

use crate::ids::WorkflowId;
use crate::pricing::Usd;
use crate::quota::{Counter, QuotaScope, RunQuota};
use crate::status::RunStatus;

/// Why a run was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Which limit: `rate_limited`, `concurrency_limited` or `budget_exceeded`.
    pub code: &'static str,
    /// Whom the counter counts.
    pub scope: QuotaScope,
    /// The agent whose runs it counts (its `governance`), if only one's.
    pub agent_id: Option<String>,
    /// The limit (0 for a budget in dollars: `limit_usd`).
    pub limit: u64,
    /// A `budget_exceeded` of a budget in dollars (`daily_budget_usd`): the budget.
    pub limit_usd: Option<Usd>,
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
            _ => match self.limit_usd {
                Some(usd) => format!("a budget of {usd} a day"),
                None => format!("a budget of {} tokens a day", self.limit),
            },
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

/// A counter whose daily budget is spent.
#[derive(Clone, Debug, PartialEq)]
pub struct Spent {
    /// Whom it counts.
    pub scope: QuotaScope,
    /// The agent whose runs it counts, if only one's.
    pub agent_id: Option<String>,
    /// The budget: tokens, or dollars.
    pub budget: Budget,
    /// Tokens spent today.
    pub tokens: i64,
    /// Dollars spent today (on priced models).
    pub cost_usd: f64,
}

/// Which daily budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// `daily_token_budget`.
    Tokens(u64),
    /// `daily_budget_usd`.
    Usd(Usd),
}

impl Spent {
    /// A sentence for people.
    pub fn message(&self) -> String {
        let whose = whose(self.scope, self.agent_id.as_deref());
        match self.budget {
            Budget::Tokens(budget) => format!(
                "{whose} daily token budget of {budget} is spent ({} tokens today)",
                self.tokens
            ),
            Budget::Usd(budget) => format!(
                "{whose} daily budget of {budget} is spent ({} today)",
                Usd(self.cost_usd)
            ),
        }
    }
}

// The UTC day of a counter's tokens.
macro_rules! today {
    () => {
        "(now() AT TIME ZONE 'UTC')::date"
    };
}

/// A counter's tokens and cost of a day, as charged.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct DayTokens {
    /// The user, or `""` for the tenant.
    pub owner_id: String,
    /// The agent, or `""` for every agent.
    pub agent_id: String,
    /// The UTC day, as days since 1970-01-01.
    pub day: i64,
    /// Its tokens.
    pub day_tokens: i64,
    /// Its cost in US dollars (of the calls of priced models).
    pub day_cost_usd: f64,
}

/// Adds `tokens` and `cost_usd` to today's tokens and cost of `quota`'s budgeted counters of
/// `tenant_id` (with no tokens, only reads them) and returns the first counter whose budget
/// (of tokens or of dollars) is spent, with the counters' figures as they are now. Not part of
/// any run transaction: a model call's tokens are spent once it answered, whatever happens
/// next.
pub async fn charge(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    quota: &RunQuota,
    tokens: u64,
    cost_usd: f64,
) -> sqlx::Result<(Option<Spent>, Vec<DayTokens>)> {
    let budgets: Vec<&Counter> = quota.budgets().collect();
    if budgets.is_empty() {
        return Ok((None, Vec::new()));
    }
    let owners: Vec<&str> = budgets.iter().map(|c| c.owner_id.as_str()).collect();
    let agents: Vec<&str> = budgets.iter().map(|c| c.agent_id.as_str()).collect();
    let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
    let rows: Vec<DayTokens> = if tokens == 0 {
        sqlx::query_as(concat!(
            "SELECT owner_id, agent_id, (",
            today!(),
            " - DATE '1970-01-01')::bigint AS day,
                    CASE WHEN day = ",
            today!(),
            " THEN day_tokens ELSE 0 END AS day_tokens,
                    CASE WHEN day = ",
            today!(),
            " THEN day_cost_usd ELSE 0 END AS day_cost_usd
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
            "INSERT INTO quota_counters AS q (tenant_id, owner_id, agent_id, day, day_tokens,
                                              day_cost_usd)
             SELECT $1, k.o, k.a, ",
            today!(),
            ", $4, $5
               FROM unnest($2::text[], $3::text[]) AS k(o, a)
              ORDER BY k.o, k.a
             ON CONFLICT (tenant_id, owner_id, agent_id) DO UPDATE SET
                day_tokens = CASE WHEN q.day = excluded.day THEN q.day_tokens ELSE 0 END
                             + excluded.day_tokens,
                day_cost_usd = CASE WHEN q.day = excluded.day THEN q.day_cost_usd ELSE 0 END
                               + excluded.day_cost_usd,
                day = excluded.day
             RETURNING q.owner_id, q.agent_id, (q.day - DATE '1970-01-01')::bigint AS day,
                       q.day_tokens, q.day_cost_usd"
        ))
        .bind(tenant_id)
        .bind(&owners)
        .bind(&agents)
        .bind(tokens)
        .bind(cost_usd)
        .fetch_all(executor)
        .await?
    };
    let spent = budgets.into_iter().find_map(|counter| {
        let row = rows
            .iter()
            .find(|r| r.owner_id == counter.owner_id && r.agent_id == counter.agent_id)?;
        let budget = spent_budget(&counter.limits, row.day_tokens, row.day_cost_usd)?;
        Some(Spent {
            scope: counter.scope(),
            agent_id: counter.agent().map(str::to_owned),
            budget,
            tokens: row.day_tokens,
            cost_usd: row.day_cost_usd,
        })
    });
    Ok((spent, rows))
}

/// The budget of `limits` that `tokens` and `cost_usd` of a day reached, if any (tokens first).
fn spent_budget(limits: &crate::quota::QuotaLimits, tokens: i64, cost_usd: f64) -> Option<Budget> {
    if let Some(budget) = limits.daily_token_budget
        && tokens >= i64::try_from(budget).unwrap_or(i64::MAX)
    {
        return Some(Budget::Tokens(budget));
    }
    limits
        .daily_budget_usd
        .filter(|budget| cost_usd >= budget.0)
        .map(Budget::Usd)
}

/// One counter's tokens as stored, for operators and tests.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct CounterRow {
    /// The user, or `""` for the tenant.
    pub owner_id: String,
    /// The agent, or `""` for every agent.
    pub agent_id: String,
    /// Tokens of today (UTC).
    pub day_tokens: i64,
    /// Dollars of today (UTC).
    pub day_cost_usd: f64,
}

/// The tenant's counters with tokens charged today.
pub async fn counters(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
) -> sqlx::Result<Vec<CounterRow>> {
    sqlx::query_as(concat!(
        "SELECT owner_id, agent_id, day_tokens, day_cost_usd FROM quota_counters
          WHERE tenant_id = $1 AND day = ",
        today!(),
        " ORDER BY owner_id, agent_id"
    ))
    .bind(tenant_id)
    .fetch_all(executor)
    .await
}

/// What Postgres knows of one counter: what Redis's copy is made from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Account {
    /// The hour window: the first of the runs admitted under the counter's hourly limit in the
    /// last hour (ms since 1970) and how many there are since.
    pub window: Option<(i64, i64)>,
    /// Today (UTC), as days since 1970-01-01.
    pub day: i64,
    /// Tokens charged today.
    pub day_tokens: i64,
    /// Dollars charged today.
    pub day_cost_usd: f64,
    /// The runs admitted under its concurrency limit that are active.
    pub active: Vec<WorkflowId>,
}

#[derive(sqlx::FromRow)]
struct Admitted {
    id: WorkflowId,
    status: RunStatus,
    created_ms: i64,
    limits: sqlx::types::Json<crate::quota::QuotaLimits>,
}

/// The account of `counter` of `tenant`: the runs admitted under it that are active or were
/// created in the last hour (child runs, agents called as tools, take room among the active
/// runs of their root's counters, but carry no hourly rate: the filters on their limits leave
/// them out of the hour), and its tokens of today. Read when Redis does not hold the counter (first use, or lost).
pub async fn account(
    conn: &mut PgConnection,
    tenant: &str,
    counter: &Counter,
) -> sqlx::Result<Account> {
    let runs: Vec<Admitted> = sqlx::query_as(
        "SELECT r.id, r.status, (extract(epoch FROM r.created_at) * 1000)::bigint AS created_ms,
                c.limits
           FROM runs r
          CROSS JOIN LATERAL jsonb_to_recordset(r.quota->'counters')
                AS c(owner_id text, agent_id text, limits jsonb)
          WHERE r.id IN (SELECT id FROM runs WHERE tenant_id = $1 AND finished_at IS NULL
                         UNION
                         SELECT id FROM runs
                          WHERE tenant_id = $1 AND created_at > now() - interval '1 hour')
            AND ($2 = '' OR r.owner_id = $2)
            AND r.quota IS NOT NULL
            AND c.owner_id = $2 AND c.agent_id = $3",
    )
    .bind(tenant)
    .bind(&counter.owner_id)
    .bind(&counter.agent_id)
    .fetch_all(&mut *conn)
    .await?;
    let (day, day_tokens, day_cost_usd): (i64, i64, f64) = sqlx::query_as(concat!(
        "SELECT (",
        today!(),
        " - DATE '1970-01-01')::bigint, coalesce(c.day_tokens, 0)::bigint,
                coalesce(c.day_cost_usd, 0)::float8
           FROM (SELECT 1) one
           LEFT JOIN quota_counters c
             ON c.tenant_id = $1 AND c.owner_id = $2 AND c.agent_id = $3 AND c.day = ",
        today!()
    ))
    .bind(tenant)
    .bind(&counter.owner_id)
    .bind(&counter.agent_id)
    .fetch_one(&mut *conn)
    .await?;
    let hour_ago = chrono::Utc::now().timestamp_millis() - 3_600_000;
    let hourly: Vec<i64> = runs
        .iter()
        .filter(|r| r.limits.runs_per_hour.is_some() && r.created_ms > hour_ago)
        .map(|r| r.created_ms)
        .collect();
    Ok(Account {
        window: hourly
            .iter()
            .min()
            .map(|&first| (first, i64::try_from(hourly.len()).unwrap_or(i64::MAX))),
        day,
        day_tokens,
        day_cost_usd,
        active: runs
            .iter()
            .filter(|r| r.limits.max_concurrent_runs.is_some() && !r.status.is_terminal())
            .map(|r| r.id)
            .collect(),
    })
}

/// Admits a run against every counter of `quota` from Postgres's account alone: the degraded
/// mode for when Redis, where admission counts ([`crate::quota::admission`]), is unreachable.
/// Each counter is locked first (`pg_advisory_xact_lock`, in the counters' order, so two
/// admissions never wait on each other crosswise), then counted ([`account`]) and checked. The
/// locks last to the end of the caller's transaction, which must insert the run before it
/// commits: so two admissions of one counter from Postgres never both pass its limit. Slower
/// than Redis (two queries per counter, and the counter's admissions one at a time), which is
/// why it is only the fallback.
pub async fn admit(
    conn: &mut PgConnection,
    tenant: &str,
    quota: &RunQuota,
) -> sqlx::Result<Result<(), Refusal>> {
    let now_ms = chrono::Utc::now().timestamp_millis();
    for counter in &quota.counters {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!(
                "spool:quota:{tenant}\u{1f}{}\u{1f}{}",
                counter.owner_id, counter.agent_id
            ))
            .execute(&mut *conn)
            .await?;
        let account = account(conn, tenant, counter).await?;
        if let Some(refusal) = check(counter, &account, now_ms) {
            return Ok(Err(refusal));
        }
    }
    Ok(Ok(()))
}

/// What `counter`'s limits say of one more run, given its `account`: `None` if it may run.
fn check(counter: &Counter, account: &Account, now_ms: i64) -> Option<Refusal> {
    let limits = &counter.limits;
    let refusal = |code, limit: u64, retry_after: i64| Refusal {
        code,
        scope: counter.scope(),
        agent_id: counter.agent().map(str::to_owned),
        limit,
        limit_usd: None,
        retry_after: u32::try_from(retry_after.clamp(1, 86_400)).unwrap_or(1),
    };
    if let Some(budget) = spent_budget(limits, account.day_tokens, account.day_cost_usd) {
        let day_ends = (account.day + 1) * 86_400;
        let mut refused = refusal("budget_exceeded", 0, day_ends - now_ms / 1000);
        match budget {
            Budget::Tokens(tokens) => refused.limit = tokens,
            Budget::Usd(usd) => refused.limit_usd = Some(usd),
        }
        return Some(refused);
    }
    if let Some(max) = limits.max_concurrent_runs
        && account.active.len() >= usize::try_from(max).unwrap_or(usize::MAX)
    {
        let retry = i64::from(CONCURRENCY_RETRY_SECS);
        return Some(refusal("concurrency_limited", u64::from(max), retry));
    }
    if let (Some(rate), Some((first_ms, runs))) = (limits.runs_per_hour, account.window)
        && runs >= i64::from(rate)
    {
        let retry = (first_ms + 3_600_000 - now_ms + 999) / 1000;
        return Some(refusal("rate_limited", u64::from(rate), retry));
    }
    None
}

/// The statuses of those of `ids` that exist.
pub async fn statuses(
    conn: &mut PgConnection,
    ids: &[WorkflowId],
) -> sqlx::Result<Vec<(WorkflowId, RunStatus)>> {
    sqlx::query_as("SELECT id, status FROM runs WHERE id = ANY($1)")
        .bind(ids)
        .fetch_all(conn)
        .await
}
