//! Redis and Postgres restarted under load: clients post messages throughout, two workers
//! run them, the server goes down for a few seconds and comes back. Every message that got a
//! 202 must be in Postgres and its run must end (completed, with the demo model's exact
//! reply), whatever was in flight when the server went down.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::PgPool;

use spool_tests::process::{Backing, Process};
use spool_tests::servers::{OwnPostgres, OwnRedis, free_port};
use spool_tests::{poll_until, token};

use crate::SERIAL;
use crate::stack::{Stack, TIMEOUT, demo_reply};

/// Clients posting at once.
pub(crate) const CLIENTS: usize = 6;
/// Deltas of a demo reply, and the pause between them: runs of about 200 ms.
pub(crate) const TOKENS: usize = 20;
pub(crate) const WORKER: [(&str, &str); 5] = [
    ("SPOOL_DEMO_TOKENS", "20"),
    ("SPOOL_DEMO_DELAY_MS", "10"),
    ("SPOOL_WORKER_CONCURRENCY", "8"),
    ("SPOOL_POLL_INTERVAL_MS", "100"),
    ("SPOOL_DB_MAX_CONNECTIONS", "8"),
];
/// When the server goes down and comes back, and when the clients stop, from the start.
pub(crate) const DOWN_AT: Duration = Duration::from_secs(2);
pub(crate) const UP_AT: Duration = Duration::from_secs(5);
pub(crate) const LOAD_FOR: Duration = Duration::from_secs(8);

/// What the clients sent: the acknowledged messages (202 body and input) and the others.
#[derive(Default)]
pub(crate) struct Load {
    pub(crate) acknowledged: Vec<(Value, String)>,
    pub(crate) refused: usize,
}

/// `CLIENTS` clients posting a message to a new thread every 40 ms each, until `until`.
pub(crate) async fn drive(base: String, until: Instant) -> Load {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .expect("client");
    let alice = token("alice", "acme");
    let clients = (0..CLIENTS).map(|c| {
        let (http, base, alice) = (http.clone(), base.clone(), alice.clone());
        async move {
            let mut load = Load::default();
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let input = format!("load {c}-{n}");
                let thread = uuid::Uuid::new_v4();
                let sent = http
                    .post(format!("{base}/v1/threads/{thread}/user_message"))
                    .bearer_auth(&alice)
                    .json(&json!({"input_text": input}))
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status() == reqwest::StatusCode::ACCEPTED => {
                        let body: Value = response.json().await.expect("202 body");
                        load.acknowledged.push((body, input));
                    }
                    _ => load.refused += 1,
                }
                // Pacing, not waiting for anything.
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            load
        }
    });
    let mut total = Load::default();
    for load in futures::future::join_all(clients).await {
        total.acknowledged.extend(load.acknowledged);
        total.refused += load.refused;
    }
    total
}

/// The API and two workers on a private Postgres that a test crashes under load.
pub(crate) struct OnOwnPostgres {
    /// The private server.
    pub(crate) postgres: OwnPostgres,
    /// Its database the processes use.
    pub(crate) database_url: String,
    /// The API's base URL.
    pub(crate) base: String,
    _processes: (Process, Process, Process),
}

impl OnOwnPostgres {
    /// Starts a private Postgres, then the API with `api` settings and two workers with
    /// `worker` settings on its database `database`.
    pub(crate) async fn start(
        database: &str,
        api: &[(&str, &str)],
        worker: &[(&str, &str)],
    ) -> Self {
        let postgres = OwnPostgres::start(free_port()).expect("a private Postgres");
        let database_url = postgres.url(database);
        let prefix = spool_tests::redis_prefix();
        let redis_url = spool_tests::redis_url();
        let backing = Backing {
            database_url: &database_url,
            redis_url: &redis_url,
            redis_prefix: &prefix,
        };
        let (api, base) = backing.start_api(api, TIMEOUT).await.expect("spool-api");
        let first = backing.start_worker(worker, TIMEOUT).await.expect("worker");
        let second = backing.start_worker(worker, TIMEOUT).await.expect("worker");
        Self {
            postgres,
            database_url,
            base,
            _processes: (api, first, second),
        }
    }

    /// [`drive`]s the load for [`LOAD_FOR`], with Postgres crashed at [`DOWN_AT`] and started
    /// again at [`UP_AT`]; what the clients sent.
    pub(crate) async fn crash_under_load(&self) -> Load {
        let start = Instant::now();
        let load = tokio::spawn(drive(self.base.clone(), start + LOAD_FOR));
        tokio::time::sleep_until((start + DOWN_AT).into()).await;
        self.postgres.crash().expect("crash");
        tokio::time::sleep_until((start + UP_AT).into()).await;
        self.postgres.start_server().expect("start again");
        load.await.expect("load")
    }
}

/// Waits until every acknowledged run has ended, then checks that each completed once with
/// the exact reply; returns (runs, reclaims, longest attempt count, seconds to settle).
pub(crate) async fn settled(pool: &PgPool, load: &Load) -> (usize, i64, i32, f64) {
    let ids: Vec<uuid::Uuid> = load
        .acknowledged
        .iter()
        .map(|(body, _)| crate::stack::workflow_id(body))
        .collect();
    let started = Instant::now();
    let rows: Vec<(uuid::Uuid, String, i32, i32)> = poll_until(
        "every acknowledged run to end",
        Duration::from_secs(90),
        || async {
            let rows: Vec<(uuid::Uuid, String, i32, i32)> =
                sqlx::query_as("SELECT id, status, attempt, reclaims FROM runs WHERE id = ANY($1)")
                    .bind(&ids)
                    .fetch_all(pool)
                    .await
                    .ok()?;
            let ended = rows.iter().all(|(_, status, ..)| {
                matches!(status.as_str(), "completed" | "failed" | "cancelled")
            });
            (rows.len() == ids.len() && ended).then_some(rows)
        },
    )
    .await;
    let settle = started.elapsed().as_secs_f64();
    assert_eq!(
        rows.len(),
        ids.len(),
        "every acknowledged message is in Postgres"
    );
    let not_completed: Vec<_> = rows.iter().filter(|(_, s, ..)| s != "completed").collect();
    assert!(
        not_completed.is_empty(),
        "runs that did not complete: {not_completed:?}"
    );
    let replies: Vec<(uuid::Uuid, String, String)> = sqlx::query_as(
        "SELECT r.id, m.status, m.content FROM runs r
           JOIN messages m ON m.id = r.assistant_message_id WHERE r.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await
    .expect("replies");
    for (body, input) in &load.acknowledged {
        let id = crate::stack::workflow_id(body);
        let (_, status, content) = replies
            .iter()
            .find(|(run, ..)| *run == id)
            .expect("the run's message");
        assert_eq!(status, "completed", "{id}");
        assert_eq!(content, &demo_reply(input, TOKENS), "{id}: the reply, once");
    }
    let reclaims = rows.iter().map(|(.., r)| i64::from(*r)).sum();
    let attempts = rows.iter().map(|(_, _, a, _)| *a).max().unwrap_or(0);
    (rows.len(), reclaims, attempts, settle)
}

#[tokio::test]
async fn redis_restarted_under_load_loses_no_acknowledged_message_and_every_run_ends() {
    let _turn = SERIAL.lock().await;
    let mut redis = OwnRedis::start(free_port());
    redis.ready(TIMEOUT).await;
    let stack = Stack::start_with_redis(&redis.url()).await;
    let _workers = (stack.worker(&WORKER).await, stack.worker(&WORKER).await);

    let start = Instant::now();
    let load = tokio::spawn(drive(stack.base.clone(), start + LOAD_FOR));
    tokio::time::sleep_until((start + DOWN_AT).into()).await;
    redis.kill();
    tokio::time::sleep_until((start + UP_AT).into()).await;
    redis.restart();
    redis.ready(TIMEOUT).await;
    let load = load.await.expect("load");

    let (runs, reclaims, attempts, settle) = settled(&stack.db.pool, &load).await;
    assert!(runs > 100, "the load was real: {runs} runs");
    // Redis came back empty; what was published after it did is replayable.
    let (last, _) = load.acknowledged.last().expect("a message");
    let events = stack.stored(&last["thread_id"]).await;
    assert_eq!(
        events.last().map(|(_, e)| e["type"].clone()),
        Some(json!("done")),
        "a run after the restart streamed to its done"
    );
    println!(
        "redis restart: {runs} acknowledged runs ({} refused), all completed once; \
         Redis down {:?} from {:?}; {reclaims} reclaims, at most {attempts} attempts; \
         settled {settle:.1} s after the load",
        load.refused,
        UP_AT - DOWN_AT,
        DOWN_AT
    );
}

#[tokio::test]
async fn postgres_crashed_under_load_loses_no_acknowledged_message_and_every_run_ends() {
    let _turn = SERIAL.lock().await;
    let lease = [("SPOOL_LEASE_SECS", "3"), ("SPOOL_HEARTBEAT_SECS", "0.5")];
    let settings = [&WORKER[..], &lease[..]].concat();
    let deployment = OnOwnPostgres::start(
        "spool_faults",
        &[("SPOOL_DB_MAX_CONNECTIONS", "8")],
        &settings,
    )
    .await;
    let load = deployment.crash_under_load().await;

    let pool = PgPool::connect(&deployment.database_url)
        .await
        .expect("pool");
    let (runs, reclaims, attempts, settle) = settled(&pool, &load).await;
    assert!(runs > 100, "the load was real: {runs} runs");
    assert!(load.refused > 0, "some requests met the outage");
    println!(
        "postgres crash: {runs} acknowledged runs ({} refused during the outage), all \
         completed once; Postgres down {:?} from {:?}; {reclaims} reclaims, at most \
         {attempts} attempts; settled {settle:.1} s after the load",
        load.refused,
        UP_AT - DOWN_AT,
        DOWN_AT
    );
}
