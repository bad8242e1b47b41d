//! Admission against real Redis and Postgres: atomic takes, counters rebuilt after Redis lost
//! them, full sets pruned of runs that ended, tokens copied from Postgres.

use std::time::Duration;

use spool_tests::TestDb;

use super::*;
use crate::db::enqueue::tests::{admission, message, owner};
use crate::db::enqueue::{EnqueueError, Enqueued, enqueue};
use crate::ids::ThreadId;
use crate::quota::{QuotaLimits, Quotas};

fn user_limits(limits: QuotaLimits) -> Quotas {
    Quotas {
        user: limits,
        tenant: QuotaLimits::default(),
        ip: QuotaLimits::default(),
    }
}

/// A run of `user` of tenant `acme` on a new thread, admitted under `quotas`.
async fn enqueue_under(
    db: &TestDb,
    admission: &Admission,
    user: &str,
    quotas: &Quotas,
) -> Result<Enqueued, EnqueueError> {
    enqueue_on(db, admission, user, quotas, ThreadId::new()).await
}

/// The same on `thread`.
async fn enqueue_on(
    db: &TestDb,
    admission: &Admission,
    user: &str,
    quotas: &Quotas,
    thread: ThreadId,
) -> Result<Enqueued, EnqueueError> {
    let owner = owner(user);
    let message = message(thread, &owner, quotas, admission);
    enqueue(&mut LazyConn::pool(&db.pool), &message).await
}

fn code(result: &Result<Enqueued, EnqueueError>) -> &'static str {
    match result {
        Ok(_) => "admitted",
        Err(EnqueueError::Refused(refusal)) => refusal.code,
        Err(_) => "error",
    }
}

/// The one counter `quotas` gives alice's runs.
fn alices(quotas: &Quotas) -> Counter {
    crate::quota::counters(quotas, None, "alice")
        .expect("a counter")
        .counters
        .remove(0)
}

/// Redis forgets the counter, as a restart or a failover without persistence does.
async fn lose(admission: &Admission, counter: &Counter) {
    let (hash, active) = admission.keys("acme", counter);
    redis::cmd("DEL")
        .arg(&hash)
        .arg(&active)
        .query_async::<()>(&mut admission.conn.clone())
        .await
        .expect("del");
}

/// Moves the counter's last prune back past [`PRUNE_EVERY_MS`], as if that time had passed.
async fn age_the_prune(admission: &Admission, counter: &Counter) {
    redis::cmd("HSET")
        .arg(admission.keys("acme", counter).0)
        .arg("p")
        .arg(chrono::Utc::now().timestamp_millis() - PRUNE_EVERY_MS - 1_000)
        .query_async::<()>(&mut admission.conn.clone())
        .await
        .expect("age the prune");
}

async fn members(admission: &Admission, counter: &Counter) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(admission.keys("acme", counter).1)
        .arg(0)
        .arg(-1)
        .query_async(&mut admission.conn.clone())
        .await
        .expect("zrange")
}

#[tokio::test]
async fn racing_takes_for_a_limit_of_one_admit_exactly_one() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        max_concurrent_runs: Some(1),
        ..QuotaLimits::default()
    });
    let results = futures::future::join_all(
        (0..16).map(|_| enqueue_under(&db, &admission, "alice", &quotas)),
    )
    .await;
    let codes: Vec<_> = results.iter().map(code).collect();
    assert_eq!(
        codes.iter().filter(|c| **c == "admitted").count(),
        1,
        "{codes:?}"
    );
    assert_eq!(
        codes
            .iter()
            .filter(|c| **c == "concurrency_limited")
            .count(),
        15,
        "{codes:?}"
    );
    let (runs,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
        .fetch_one(&db.pool)
        .await
        .expect("runs");
    assert_eq!(runs, 1, "a refused run leaves nothing");
    let counter = alices(&quotas);
    assert_eq!(members(&admission, &counter).await.len(), 1);
    // Both keys expire a day and an hour after the counter was made (by the first take), the
    // set a minute after its hash.
    let (hash, active) = admission.keys("acme", &counter);
    let mut ttls = Vec::new();
    for key in [hash, active] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut admission.conn.clone())
            .await
            .expect("pttl");
        ttls.push(ttl);
    }
    let day_and_hour = 25 * 3_600_000;
    assert!(
        (day_and_hour - 60_000..=day_and_hour).contains(&ttls[0]),
        "{ttls:?}"
    );
    assert!(ttls[1] > ttls[0] + 50_000, "{ttls:?}");
}

#[tokio::test]
async fn counters_redis_lost_are_made_again_from_postgres() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        runs_per_hour: Some(3),
        max_concurrent_runs: Some(2),
        ..QuotaLimits::default()
    });
    let first = enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("first");
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("second");
    let counter = alices(&quotas);
    lose(&admission, &counter).await;
    // Both runs are active: the concurrency limit holds after the loss.
    let third = enqueue_under(&db, &admission, "alice", &quotas).await;
    assert_eq!(code(&third), "concurrency_limited");
    // One ends; once the prune interval is over, its room is free (the rebuilt set is
    // pruned), and the hour's third run passes.
    sqlx::query("UPDATE runs SET status = 'cancelled', finished_at = now() WHERE id = $1")
        .bind(first.workflow_id)
        .execute(&db.pool)
        .await
        .expect("cancel");
    age_the_prune(&admission, &counter).await;
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("third of the hour");
    // Lost again: three runs this hour, rebuilt from Postgres, so a fourth is over the rate.
    lose(&admission, &counter).await;
    sqlx::query("UPDATE runs SET status = 'cancelled', finished_at = now()")
        .execute(&db.pool)
        .await
        .expect("cancel all");
    let fourth = enqueue_under(&db, &admission, "alice", &quotas).await;
    let Err(EnqueueError::Refused(refusal)) = &fourth else {
        panic!("not refused: {fourth:?}");
    };
    assert_eq!(refusal.code, "rate_limited");
    assert!(
        (3590..=3600).contains(&refusal.retry_after),
        "{}",
        refusal.retry_after
    );
}

#[tokio::test]
async fn a_full_counter_prunes_ended_runs_and_dead_enqueues_but_not_one_committing() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        max_concurrent_runs: Some(2),
        ..QuotaLimits::default()
    });
    let counter = alices(&quotas);
    let quota = crate::quota::counters(&quotas, None, "alice").expect("quota");
    let mut conn = db.pool.acquire().await.expect("conn");
    // A run that ended on a path that gave nothing back (its worker died after the commit).
    let ended = enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("run");
    sqlx::query("UPDATE runs SET status = 'failed', finished_at = now() WHERE id = $1")
        .bind(ended.workflow_id)
        .execute(&db.pool)
        .await
        .expect("fail");
    // An enqueue that took room and died before its statement, a minute ago.
    let dead = WorkflowId::new();
    admission
        .take(&mut LazyConn::Held(&mut conn), "acme", dead, &quota)
        .await
        .expect("take");
    redis::cmd("ZADD")
        .arg(admission.keys("acme", &counter).1)
        .arg("XX")
        .arg(chrono::Utc::now().timestamp_millis() - 60_000)
        .arg(dead.to_string())
        .query_async::<()>(&mut admission.conn.clone())
        .await
        .expect("age it");
    // Full (2 of 2); both are pruned, and two runs get in.
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("pruned room");
    // One enqueue taking room right now, its run not committed yet: not pruned.
    let committing = WorkflowId::new();
    admission
        .take(&mut LazyConn::Held(&mut conn), "acme", committing, &quota)
        .await
        .expect("take");
    let over = enqueue_under(&db, &admission, "alice", &quotas).await;
    assert_eq!(code(&over), "concurrency_limited");
    let mut held = members(&admission, &counter).await;
    held.sort();
    let (ended, dead) = (ended.workflow_id.to_string(), dead.to_string());
    assert!(!held.contains(&ended) && !held.contains(&dead), "{held:?}");
    assert!(held.contains(&committing.to_string()), "{held:?}");
    // Its enqueue failed after all: it gives the room back, twice without harm.
    admission.release("acme", committing, &quota).await;
    admission.release("acme", committing, &quota).await;
    assert_eq!(members(&admission, &counter).await.len(), 1);
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("released room");
}

#[tokio::test]
async fn a_full_counter_is_pruned_at_most_once_per_interval_and_refused_by_redis_otherwise() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        max_concurrent_runs: Some(2),
        ..QuotaLimits::default()
    });
    let counter = alices(&quotas);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let run = enqueue_under(&db, &admission, "alice", &quotas).await;
        runs.push(run.expect("admitted").workflow_id);
    }
    // Full: the first refusal prunes (nothing has ended), and the next ones do not.
    for _ in 0..10 {
        let over = enqueue_under(&db, &admission, "alice", &quotas).await;
        assert_eq!(code(&over), "concurrency_limited");
    }
    // Both runs end on a path that gave nothing back: within the interval, still refused, since
    // no refusal asks Postgres again.
    sqlx::query("UPDATE runs SET status = 'failed', finished_at = now() WHERE id = ANY($1)")
        .bind(&runs)
        .execute(&db.pool)
        .await
        .expect("fail");
    let over = enqueue_under(&db, &admission, "alice", &quotas).await;
    assert_eq!(code(&over), "concurrency_limited");
    assert_eq!(members(&admission, &counter).await.len(), 2);
    // The interval over (the last prune moved back in time), the next take prunes and gets in.
    age_the_prune(&admission, &counter).await;
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("pruned room");
}

#[tokio::test]
async fn a_spent_budget_refuses_from_the_copied_tokens_and_after_redis_lost_them() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        daily_token_budget: Some(100),
        ..QuotaLimits::default()
    });
    let quota = crate::quota::counters(&quotas, None, "alice").expect("quota");
    let run = enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("nothing spent yet");
    // The worker charges the run's model call in Postgres and copies the total.
    let (spent, counted) = crate::db::quota::charge(&db.pool, "acme", &quota, 120, 0.0)
        .await
        .expect("charge");
    assert!(spent.is_some());
    admission.record_tokens("acme", &counted).await;
    let refused = enqueue_under(&db, &admission, "alice", &quotas).await;
    assert_eq!(code(&refused), "budget_exceeded");
    // An older copy (a charge whose copy arrives late) does not lower it.
    let mut stale = counted.clone();
    stale[0].day_tokens = 10;
    admission.record_tokens("acme", &stale).await;
    assert_eq!(
        code(&enqueue_under(&db, &admission, "alice", &quotas).await),
        "budget_exceeded"
    );
    // Lost: read back from Postgres.
    lose(&admission, &alices(&quotas)).await;
    assert_eq!(
        code(&enqueue_under(&db, &admission, "alice", &quotas).await),
        "budget_exceeded"
    );
    // Bob's counter is his own.
    enqueue_under(&db, &admission, "bob", &quotas)
        .await
        .expect("bob");
    let _ = run;
}

#[tokio::test]
async fn a_spent_budget_in_dollars_refuses_from_the_copied_cost_and_after_redis_lost_it() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        daily_budget_usd: Some(crate::pricing::Usd(0.5)),
        ..QuotaLimits::default()
    });
    let quota = crate::quota::counters(&quotas, None, "alice").expect("quota");
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("nothing spent yet");
    // Tokens of an unpriced model cost nothing known: not counted.
    let (spent, _) = crate::db::quota::charge(&db.pool, "acme", &quota, 1_000, 0.0)
        .await
        .expect("charge");
    assert_eq!(spent, None);
    let (spent, counted) = crate::db::quota::charge(&db.pool, "acme", &quota, 100, 0.25)
        .await
        .expect("charge");
    assert_eq!(spent, None, "half the budget");
    admission.record_tokens("acme", &counted).await;
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("within the budget");
    let (spent, counted) = crate::db::quota::charge(&db.pool, "acme", &quota, 100, 0.25)
        .await
        .expect("charge");
    let spent = spent.expect("spent");
    assert!(spent.message().contains("$0.5"), "{}", spent.message());
    admission.record_tokens("acme", &counted).await;
    let refused = enqueue_under(&db, &admission, "alice", &quotas).await;
    assert_eq!(code(&refused), "budget_exceeded");
    let Err(EnqueueError::Refused(refusal)) = &refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        (refusal.limit, refusal.limit_usd),
        (0, Some(crate::pricing::Usd(0.5)))
    );
    // Lost: read back from Postgres.
    lose(&admission, &alices(&quotas)).await;
    assert_eq!(
        code(&enqueue_under(&db, &admission, "alice", &quotas).await),
        "budget_exceeded"
    );
}

#[tokio::test]
async fn one_copy_carries_the_tokens_of_every_budgeted_counter_each_on_its_own() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let budget = QuotaLimits {
        daily_token_budget: Some(1_000),
        ..QuotaLimits::default()
    };
    let quotas = Quotas {
        user: budget,
        tenant: budget,
        ip: QuotaLimits::default(),
    };
    let quota = crate::quota::counters(&quotas, None, "alice").expect("quota");
    // The take makes both counters in Redis; the worker charges the model call in Postgres.
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("admitted");
    let (_, counted) = crate::db::quota::charge(&db.pool, "acme", &quota, 120, 0.0)
        .await
        .expect("charge");
    assert_eq!(counted.len(), 2, "{counted:?}");
    admission.record_tokens("acme", &counted).await;
    let both = vec![(String::new(), Some(120)), ("alice".to_owned(), Some(120))];
    assert_eq!(day_tokens(&admission, &quota.counters).await, both);
    // A late copy of the user's total beside a newer one of the tenant's: each is judged alone.
    let mut mixed = counted.clone();
    for row in &mut mixed {
        row.day_tokens = if row.owner_id.is_empty() { 130 } else { 10 };
    }
    admission.record_tokens("acme", &mixed).await;
    let after = vec![(String::new(), Some(130)), ("alice".to_owned(), Some(120))];
    assert_eq!(day_tokens(&admission, &quota.counters).await, after);
}

/// Each counter's owner (`""`: the tenant) and the day's tokens its hash holds.
async fn day_tokens(admission: &Admission, counters: &[Counter]) -> Vec<(String, Option<i64>)> {
    let mut held = Vec::new();
    for counter in counters {
        let tokens: Option<i64> = redis::cmd("HGET")
            .arg(admission.keys("acme", counter).0)
            .arg("t")
            .query_async(&mut admission.conn.clone())
            .await
            .expect("hget");
        held.push((counter.owner_id.clone(), tokens));
    }
    held.sort();
    held
}

#[tokio::test]
async fn a_request_that_makes_no_run_gives_back_its_count_in_the_hour() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        runs_per_hour: Some(2),
        ..QuotaLimits::default()
    });
    let thread = ThreadId::new();
    enqueue_on(&db, &admission, "alice", &quotas, thread)
        .await
        .expect("the hour's first run");
    // The thread is busy: three refusals, none of them a run, none counted.
    for _ in 0..3 {
        let busy = enqueue_on(&db, &admission, "alice", &quotas, thread).await;
        assert!(matches!(busy, Err(EnqueueError::ThreadBusy)), "{busy:?}");
    }
    // At the limit, the busy thread still answers busy (as without quotas), not rate_limited.
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("the hour's second run");
    let busy = enqueue_on(&db, &admission, "alice", &quotas, thread).await;
    assert!(matches!(busy, Err(EnqueueError::ThreadBusy)), "{busy:?}");
    assert_eq!(
        code(&enqueue_under(&db, &admission, "alice", &quotas).await),
        "rate_limited"
    );
}

#[tokio::test]
async fn a_counter_made_again_keeps_the_takes_still_committing() {
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        max_concurrent_runs: Some(1),
        ..QuotaLimits::default()
    });
    let quota = crate::quota::counters(&quotas, None, "alice").expect("quota");
    let counter = alices(&quotas);
    let mut conn = db.pool.acquire().await.expect("conn");
    // A take whose enqueue has not committed yet (Postgres has no run for it)...
    let committing = WorkflowId::new();
    admission
        .take(&mut LazyConn::Held(&mut conn), "acme", committing, &quota)
        .await
        .expect("take");
    // ...when the counter's hash expires (it does a day after it was made; its set outlives it).
    redis::cmd("DEL")
        .arg(admission.keys("acme", &counter).0)
        .query_async::<()>(&mut admission.conn.clone())
        .await
        .expect("del");
    // The counter is made again from Postgres, which cannot see that take: it is kept.
    let over = enqueue_under(&db, &admission, "alice", &quotas).await;
    assert_eq!(code(&over), "concurrency_limited");
    assert_eq!(
        members(&admission, &counter).await,
        [committing.to_string()]
    );
}

#[tokio::test]
async fn an_enqueue_holds_no_pooled_connection_while_redis_answers_its_take() {
    let url = spool_tests::redis_url();
    if url.contains(',') {
        // CLIENT PAUSE and CLIENT LIST act on one server; the single-server pass covers it.
        eprintln!("skipped against a Redis Cluster");
        return;
    }
    let db = TestDb::new().await.expect("db");
    let admission = admission();
    let quotas = user_limits(QuotaLimits {
        max_concurrent_runs: Some(10),
        ..QuotaLimits::default()
    });
    // The counter exists first, so the take below needs nothing from Postgres.
    enqueue_under(&db, &admission, "alice", &quotas)
        .await
        .expect("first");
    // A pool of one connection: while the enqueue waits on Redis, it must still be free.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&db.url)
        .await
        .expect("pool");
    let mut control = redis::Client::open(url.as_str())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("control connection");
    // Scripts wait while writes are paused (at most 5 s, should the test die paused).
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(5000)
        .arg("WRITE")
        .query_async::<()>(&mut control)
        .await
        .expect("pause");
    let owner = owner("alice");
    let message = message(ThreadId::new(), &owner, &quotas, &admission);
    let mut lazy = LazyConn::pool(&pool);
    let enqueue = enqueue(&mut lazy, &message);
    let meanwhile = async {
        // The take is in Redis, held by the pause: a blocked EVALSHA (other tests' scripts
        // may be paused too; any of them means the pause holds, and ours is sent by now).
        spool_tests::poll_until(
            "the take to wait on the pause",
            Duration::from_secs(10),
            async || {
                let clients: String = redis::cmd("CLIENT")
                    .arg("LIST")
                    .query_async(&mut control)
                    .await
                    .ok()?;
                clients
                    .lines()
                    .any(|c| c.contains("flags=b ") && c.contains("cmd=evalsha"))
                    .then_some(())
            },
        )
        .await;
        let free = pool.acquire().await.map(drop);
        redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query_async::<()>(&mut control)
            .await
            .expect("unpause");
        free
    };
    let (enqueued, free) = tokio::join!(enqueue, meanwhile);
    free.expect("the pool's one connection was free while the take waited");
    enqueued.expect("admitted once Redis answered");
}
