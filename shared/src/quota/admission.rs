//! Admission (docs/operations.md): the quota counters a run is admitted against live in Redis,
//! where one script checks every counter of the run and takes room in each, or in none; Postgres's
//! `runs` and `quota_counters` tables stay the truth they are rebuilt from.
//!
//! Why Redis: in Postgres each enqueue updated a few rows that every enqueue of the tenant shares,
//! and those updates cost the enqueue about a quarter of its throughput whatever the layout
//! (docs/benchmarks-history.md, "Quotas' cost on the enqueue"). A script in Redis costs one round
//! trip, outside the enqueue's transaction, and holds no lock there.
//!
//! Keys, per counter (one hash tag per tenant, so a run's counters share a Cluster slot):
//! `{prefix}:quota:{<tenant, hex>}:<owner, hex>:<agent>` is a hash (`w` the hour window's start
//! in ms, `n` the runs in it, `d` a UTC day as days since 1970, `t` the tokens charged that
//! day, `c` the dollars charged that day) and the same key with `:active` a sorted set of the counter's active runs (id → the
//! take's time in ms). The tenant and owner are hex-encoded: any text they hold stays inside
//! its part of the key.
//!
//! How each count stays right:
//! - A run takes room before its enqueue statement. When that statement (or its transaction)
//!   fails, nothing was made and everything is given back ([`Admission::undo`]: its place among
//!   the active runs and its count in the hour). When the run ends, its place is given back
//!   ([`Admission::release`]): when a worker ends it (every end of a claimed run, time limits
//!   included), when the API cancels it unclaimed, and when its thread is erased. Giving a
//!   place back is removing the run's id, so doing it twice is harmless.
//! - A run whose release was lost (a process killed between the commit and the release, Redis
//!   unreachable then) still holds its id in the set. When a set is full, the take asks
//!   Postgres about its 1,000 oldest members and removes those that ended, or that no run has
//!   [`ORPHAN_AFTER_MS`] after their take (an enqueue that died before its commit), then tries
//!   again; at most once per counter every [`PRUNE_EVERY_MS`], so that refusals repeated in a
//!   loop are answered by Redis alone. A release is retried a few times before it is left to a
//!   prune. A lost release behind 1,000 older active runs holds its room until the counter is
//!   next made from Postgres (below): at most a day.
//! - A counter Redis does not hold (never used, or lost in a restart or failover) is made from
//!   Postgres before the take ([`crate::db::quota::account`]): the active runs under it, the
//!   runs of the last hour, the day's tokens and dollars. Enqueues that took room in the lost counter and
//!   commit while it is being made again are the one thing such a rebuild can miss in the
//!   hour's count (besides runs of threads erased within the hour, which Postgres no longer
//!   has); the set keeps its takes of the last [`ORPHAN_AFTER_MS`], which Postgres cannot see
//!   yet, so active runs are not missed. A counter expires
//!   a day and an hour after it was made (its set a minute after its hash, so a hash never
//!   stands without its set) and is made again the same way when next used: Redis holds only
//!   counters in use, and no drift outlives a day.
//! - Tokens and dollars are charged in Postgres by the worker, which copies the day's totals to the hash
//!   ([`Admission::record_tokens`]); a copy lost with Redis is read back from Postgres.
//!
//! With quotas configured and Redis unreachable, Postgres admits the run
//! ([`crate::db::quota::admit`]: the counters locked in the enqueue's transaction, then counted
//! from the runs): slower, but a Redis outage does not stop the write path, and a quota that
//! cannot be counted in Redis is still not skipped. The counters admitted so are made again
//! from Postgres once Redis answers ([`Admission::stale`]). A caller with no transaction to
//! hold the locks gets [`AdmitError::Unavailable`] (503) and asks again in one (the API does).
//! Redis must not evict these keys (`maxmemory-policy noeviction`, as the streams need too): a
//! set evicted without its hash would count no active runs until the counter is made again.
//!
//! Written here (three short scripts) because no crate does this job: `governor` counts in process
//! memory, which several API processes cannot share, and Redis rate limiters (the `redis-cell`
//! module, or scripts like these) count one window per key, without sets of active runs that can be
//! checked against Postgres, all-or-nothing across a run's counters, or a rebuild from Postgres.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use redis::Script;
use sqlx::PgConnection;

use crate::db::LazyConn;
use crate::db::quota::{self, CONCURRENCY_RETRY_SECS, Refusal};
use crate::ids::WorkflowId;
use crate::quota::{Counter, RunQuota};
use crate::redis_conn::RedisConn;
use crate::stream::StreamKeys;

static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("take.lua")));
static LOAD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("load.lua")));
static TOKENS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("tokens.lua")));
static UNDO: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("undo.lua")));

/// How long after its take a member of a set whose run Postgres does not have is presumed to be
/// an enqueue still committing (afterwards: one that died, whose room is given back).
pub const ORPHAN_AFTER_MS: i64 = 30_000;

/// How often a full counter's set may be pruned: within this time after a prune, a take that
/// finds the set full is refused by Redis alone. Otherwise a client retrying its 429s in a loop
/// would make each refusal ask Postgres about a thousand runs (review B-M5).
pub const PRUNE_EVERY_MS: i64 = 5_000;

/// Why a run was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// A quota refuses it.
    #[error("{}", .0.message())]
    Refused(Refusal),
    /// Redis is unreachable: the counters cannot be read.
    #[error("the quota counters are unavailable: {0}")]
    Unavailable(#[from] redis::RedisError),
    /// Postgres failed while rebuilding or pruning a counter.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The quota counters of a deployment in Redis.
#[derive(Clone)]
pub struct Admission {
    conn: RedisConn,
    prefix: String,
    /// Counters (their hash keys) this process admitted runs under from Postgres while Redis
    /// was unreachable: Redis's copies, if it kept them, miss those runs, so they are deleted
    /// (and made again from Postgres) once Redis answers.
    stale: Arc<Mutex<HashSet<String>>>,
}

/// The most counters [`Admission::stale`] remembers; past it, an outage's later counters are
/// corrected by their sets' prunes and their windows' ends rather than by a rebuild.
const MAX_STALE: usize = 10_000;

/// What one take answered.
enum Answer {
    /// At this time (Redis's, ms).
    Admitted(i64),
    /// These counters (indexes into the run's) must be made first.
    Load(Vec<usize>),
    Refused {
        code: &'static str,
        counter: usize,
        retry_after: u32,
        /// A `budget_exceeded` of the budget in dollars.
        usd: bool,
    },
    /// The counter's set is full: Redis's time and its oldest members with their take times.
    Full {
        counter: usize,
        now_ms: i64,
        members: Vec<(String, i64)>,
    },
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Admission {
    /// The counters under the deployment's key prefix.
    pub fn new(conn: RedisConn, keys: &StreamKeys) -> Self {
        Self {
            conn,
            prefix: format!("{}:quota", keys.prefix()),
            stale: Arc::default(),
        }
    }

    /// Notes that a run was admitted under the counters of `quota` from Postgres (Redis was
    /// unreachable): they are made again from Postgres once Redis answers.
    pub fn stale(&self, tenant: &str, quota: &RunQuota) {
        let mut stale = self.stale.lock().unwrap_or_else(PoisonError::into_inner);
        for counter in &quota.counters {
            if stale.len() < MAX_STALE {
                stale.insert(self.keys(tenant, counter).0);
            }
        }
    }

    /// Deletes the counters noted by [`Admission::stale`], so that the next take makes them
    /// from Postgres; kept for the next try if Redis does not answer.
    async fn forget_stale(&self) -> Result<(), redis::RedisError> {
        let keys: Vec<String> = {
            let mut stale = self.stale.lock().unwrap_or_else(PoisonError::into_inner);
            if stale.is_empty() {
                return Ok(());
            }
            stale.drain().collect()
        };
        let mut pipe = redis::pipe();
        for hash in &keys {
            // A hash and its set share a slot (one hash tag per tenant).
            pipe.cmd("DEL")
                .arg(hash)
                .arg(format!("{hash}:active"))
                .ignore();
        }
        if let Err(err) = pipe.query_async::<()>(&mut self.conn.clone()).await {
            self.stale
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(keys);
            return Err(err);
        }
        tracing::info!(
            counters = keys.len(),
            "quota counters admitted from Postgres during a Redis outage are made again"
        );
        Ok(())
    }

    /// The counter's hash and set of active runs.
    fn keys(&self, tenant: &str, counter: &Counter) -> (String, String) {
        let hash = format!(
            "{}:{{{}}}:{}:{}",
            self.prefix,
            hex::encode(tenant),
            hex::encode(&counter.owner_id),
            counter.agent_id
        );
        let active = format!("{hash}:active");
        (hash, active)
    }

    /// Admits `run` against every counter of `quota` and takes room for it in each (see the
    /// module doc); `db` answers what Redis does not hold (a connection is taken from it only
    /// then). Nothing is taken when it is refused. Returns the take's time (Redis's clock, ms),
    /// which [`Admission::undo`] needs.
    pub async fn take(
        &self,
        db: &mut LazyConn<'_>,
        tenant: &str,
        run: WorkflowId,
        quota: &RunQuota,
    ) -> Result<i64, AdmitError> {
        // Each round either admits, refuses, or makes progress (a counter made, a set pruned);
        // a few rounds cover counters lost and pruned at once. A set that fills again as fast
        // as it is pruned is full.
        self.forget_stale().await?;
        let mut full = None;
        for _ in 0..4 {
            match self.try_take(tenant, run, quota).await? {
                Answer::Admitted(at_ms) => return Ok(at_ms),
                Answer::Load(missing) => {
                    for i in missing {
                        self.load(db.get().await?, tenant, &quota.counters[i])
                            .await?;
                    }
                }
                Answer::Refused {
                    code,
                    counter,
                    retry_after,
                    usd,
                } => {
                    let c = &quota.counters[counter];
                    let mut err = refused(code, c, retry_after);
                    if let (true, AdmitError::Refused(refusal)) = (usd, &mut err) {
                        refusal.limit = 0;
                        refusal.limit_usd = c.limits.daily_budget_usd;
                    }
                    return Err(err);
                }
                Answer::Full {
                    counter,
                    now_ms,
                    members,
                } => {
                    // No members: the set was pruned a moment ago, by this take or another.
                    let ended = if members.is_empty() {
                        Vec::new()
                    } else {
                        ended(db.get().await?, now_ms, &members).await?
                    };
                    if ended.is_empty() {
                        let c = &quota.counters[counter];
                        return Err(refused("concurrency_limited", c, CONCURRENCY_RETRY_SECS));
                    }
                    full = Some(counter);
                    let (_, active) = self.keys(tenant, &quota.counters[counter]);
                    redis::cmd("ZREM")
                        .arg(&active)
                        .arg(&ended)
                        .query_async::<()>(&mut self.conn.clone())
                        .await?;
                }
            }
        }
        if let Some(counter) = full {
            let c = &quota.counters[counter];
            return Err(refused("concurrency_limited", c, CONCURRENCY_RETRY_SECS));
        }
        Err(AdmitError::Unavailable(redis::RedisError::from((
            redis::ErrorKind::Client,
            "the quota counters kept going missing under the take",
        ))))
    }

    async fn try_take(
        &self,
        tenant: &str,
        run: WorkflowId,
        quota: &RunQuota,
    ) -> Result<Answer, redis::RedisError> {
        let mut invocation = TAKE.prepare_invoke();
        invocation.arg(run.to_string());
        for counter in &quota.counters {
            let (hash, active) = self.keys(tenant, counter);
            invocation.key(hash).key(active);
            let limits = &counter.limits;
            invocation
                .arg(
                    limits
                        .runs_per_hour
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                )
                .arg(
                    limits
                        .max_concurrent_runs
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                )
                .arg(
                    limits
                        .daily_token_budget
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                )
                .arg(
                    limits
                        .daily_budget_usd
                        .map(|usd| usd.0.to_string())
                        .unwrap_or_default(),
                );
        }
        invocation.arg(PRUNE_EVERY_MS);
        let answer: Vec<redis::Value> = invocation.invoke_async(&mut self.conn.clone()).await?;
        parse(&answer, quota.counters.len())
    }

    /// Makes a counter Redis does not hold from Postgres's account of it.
    async fn load(
        &self,
        db: &mut PgConnection,
        tenant: &str,
        counter: &Counter,
    ) -> Result<(), AdmitError> {
        let account = quota::account(db, tenant, counter).await?;
        let (hash, active) = self.keys(tenant, counter);
        let mut invocation = LOAD.prepare_invoke();
        invocation.key(hash).key(active);
        match account.window {
            Some((started_ms, runs)) => invocation.arg(started_ms).arg(runs),
            None => invocation.arg("").arg(0),
        };
        invocation
            .arg(account.day)
            .arg(account.day_tokens)
            .arg(ORPHAN_AFTER_MS)
            .arg(account.day_cost_usd.to_string());
        for id in &account.active {
            invocation.arg(id.to_string());
        }
        let made: i64 = invocation.invoke_async(&mut self.conn.clone()).await?;
        if made == 1 {
            tracing::info!(tenant, owner = %counter.owner_id, agent = %counter.agent_id,
                active = account.active.len(), day_tokens = account.day_tokens,
                "quota counter made from Postgres");
        }
        Ok(())
    }

    /// Gives back everything a take at `taken_ms` took for `run`, which was never made (its
    /// statement or transaction failed): its place among the active runs, and its count in
    /// the hour's window if that window is still the one it was counted in. Best effort: a
    /// place not given back is pruned when its counter is full; a count, when the window ends.
    pub async fn undo(&self, tenant: &str, run: WorkflowId, quota: &RunQuota, taken_ms: i64) {
        let mut invocation = UNDO.prepare_invoke();
        invocation.arg(run.to_string()).arg(taken_ms);
        for counter in &quota.counters {
            let (hash, active) = self.keys(tenant, counter);
            invocation.key(hash).key(active);
            invocation.arg(if counter.limits.runs_per_hour.is_some() {
                "1"
            } else {
                ""
            });
        }
        if let Err(err) = invocation.invoke_async::<i64>(&mut self.conn.clone()).await {
            tracing::warn!(error = %err, workflow.id = %run,
                "could not give back the quota room of a run that was not made");
        }
    }

    /// Gives back the room `run` holds in the counters of `quota` with a concurrency limit: the
    /// run has ended (its count in the hour stays: it ran). Tried three times over about half a
    /// second (a failover, a dropped connection); a release that still fails is made up for when
    /// the counter is next full and pruned.
    pub async fn release(&self, tenant: &str, run: WorkflowId, quota: &RunQuota) {
        let mut pipe = redis::pipe();
        for counter in &quota.counters {
            if counter.limits.max_concurrent_runs.is_some() {
                pipe.cmd("ZREM")
                    .arg(self.keys(tenant, counter).1)
                    .arg(run.to_string())
                    .ignore();
            }
        }
        if pipe.is_empty() {
            return;
        }
        let mut wait = std::time::Duration::from_millis(100);
        for attempt in 1..=3 {
            match pipe.query_async::<()>(&mut self.conn.clone()).await {
                Ok(()) => return,
                Err(err) if attempt == 3 => {
                    tracing::warn!(error = %err, workflow.id = %run,
                        "could not give back a run's quota room; it is pruned when its counter \
                         is full");
                }
                Err(_) => {
                    tokio::time::sleep(wait).await;
                    wait *= 4;
                }
            }
        }
    }

    /// Copies the day's tokens and dollars Postgres counted for the counters of `tenant` (`rows` as
    /// [`quota::charge`] returns them) to their hashes, in one round trip. Best effort: a copy
    /// that fails is made up for by the next charge, or by a rebuild.
    pub async fn record_tokens(&self, tenant: &str, rows: &[quota::DayTokens]) {
        if rows.is_empty() {
            return;
        }
        let mut invocation = TOKENS.prepare_invoke();
        for row in rows {
            let counter = Counter {
                owner_id: row.owner_id.clone(),
                agent_id: row.agent_id.clone(),
                limits: Default::default(),
            };
            invocation
                .key(self.keys(tenant, &counter).0)
                .arg(row.day)
                .arg(row.day_tokens)
                .arg(row.day_cost_usd.to_string());
        }
        if let Err(err) = invocation.invoke_async::<i64>(&mut self.conn.clone()).await {
            tracing::warn!(error = %err, "could not copy the counters' tokens to Redis");
        }
    }
}

/// The members of a full set whose runs are not active: ended, or never committed
/// [`ORPHAN_AFTER_MS`] after their take.
async fn ended(
    db: &mut PgConnection,
    now_ms: i64,
    members: &[(String, i64)],
) -> sqlx::Result<Vec<String>> {
    let ids: Vec<WorkflowId> = members
        .iter()
        .filter_map(|(id, _)| id.parse().ok())
        .collect();
    let statuses = quota::statuses(db, &ids).await?;
    Ok(members
        .iter()
        .filter(|(id, taken_ms)| {
            let known = id
                .parse::<WorkflowId>()
                .ok()
                .and_then(|id| statuses.iter().find(|(run, _)| *run == id));
            match known {
                Some((_, status)) => status.is_terminal(),
                None => now_ms - taken_ms > ORPHAN_AFTER_MS,
            }
        })
        .map(|(id, _)| id.clone())
        .collect())
}

fn refused(code: &'static str, counter: &Counter, retry_after: u32) -> AdmitError {
    let limit = match code {
        "rate_limited" => counter.limits.runs_per_hour.map(u64::from),
        "concurrency_limited" => counter.limits.max_concurrent_runs.map(u64::from),
        _ => counter.limits.daily_token_budget,
    };
    AdmitError::Refused(Refusal {
        code,
        scope: counter.scope(),
        agent_id: counter.agent().map(str::to_owned),
        limit: limit.unwrap_or_default(),
        limit_usd: None,
        retry_after: retry_after.clamp(1, 86_400),
    })
}

fn text(value: &redis::Value) -> Option<String> {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn number(value: &redis::Value) -> Option<i64> {
    match value {
        redis::Value::Int(n) => Some(*n),
        other => text(other)?.parse::<f64>().ok().map(|n| n as i64),
    }
}

/// Reads the take script's answer (see take.lua).
fn parse(answer: &[redis::Value], counters: usize) -> Result<Answer, redis::RedisError> {
    let bad = || {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected answer from the quota script",
        ))
    };
    let code = answer.first().and_then(text).ok_or_else(bad)?;
    // The script counts counters from 1.
    let index = |i: usize| {
        answer
            .get(i)
            .and_then(number)
            .and_then(|n| usize::try_from(n - 1).ok())
            .filter(|&n| n < counters)
            .ok_or_else(bad)
    };
    let seconds = |i: usize| -> u32 {
        answer
            .get(i)
            .and_then(number)
            .map_or(0, |n| u32::try_from(n.max(0)).unwrap_or(u32::MAX))
    };
    Ok(match code.as_str() {
        "ok" => Answer::Admitted(answer.get(1).and_then(number).ok_or_else(bad)?),
        "load" => Answer::Load((1..answer.len()).map(index).collect::<Result<_, _>>()?),
        "rate_limited" => Answer::Refused {
            code: "rate_limited",
            counter: index(1)?,
            retry_after: seconds(2),
            usd: false,
        },
        "budget_exceeded" => Answer::Refused {
            code: "budget_exceeded",
            counter: index(1)?,
            retry_after: seconds(2),
            usd: answer.get(3).and_then(text).as_deref() == Some("usd"),
        },
        "concurrency_limited" => Answer::Full {
            counter: index(1)?,
            now_ms: answer.get(3).and_then(number).ok_or_else(bad)?,
            members: answer[4..]
                .chunks(2)
                .filter_map(|pair| Some((text(pair.first()?)?, number(pair.get(1)?)?)))
                .collect(),
        },
        _ => return Err(bad()),
    })
}

#[cfg(test)]
mod tests;
