//! A Spool deployment for one scenario: `spool-api` and `spool-worker` as real processes (the
//! binaries next to `spool-bench`, so a release bench measures release servers) on a fresh
//! database and a fresh Redis key prefix.

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use spool_tests::process::Backing;
use spool_tests::{Process, TestDb};

/// How long a process may take to start.
const START: Duration = Duration::from_secs(30);

/// The bench's one user.
pub(crate) fn bench_token() -> String {
    spool_tests::token("bench-user", "bench")
}

pub(crate) struct Stack {
    pub(crate) db: TestDb,
    pub(crate) redis_url: String,
    pub(crate) prefix: String,
    client: Client,
    api: Process,
    workers: Vec<Process>,
}

impl Drop for Stack {
    /// Stops the processes and removes the scenario's Redis keys: its streams are kept for a
    /// day (the retention window), and P3 alone leaves a gigabyte of them a run (a day of bench
    /// runs got Redis killed by the kernel for want of memory). The processes are gone first, so
    /// that no write of theirs lands after the keys are removed.
    fn drop(&mut self) {
        // One may have exited already (P6 kills a worker): that is no failure here. The API
        // first, then the workers, each given up to 5 s to go.
        for process in std::iter::once(&mut self.api).chain(self.workers.iter_mut()) {
            process.kill_and_reap(Duration::from_secs(5));
        }
        if let Err(err) = forget_keys(&self.redis_url, &self.prefix) {
            eprintln!(
                "could not remove the Redis keys under {}: {err}",
                self.prefix
            );
        }
    }
}

/// Removes every key under `prefix` (a blocking connection: this runs in `drop`).
fn forget_keys(redis_url: &str, prefix: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(redis_url)?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let pattern = format!("{prefix}:*");
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK").arg(&keys).query(&mut conn)?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The API as the bench's user sees it; cheap to clone into client tasks.
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
    pub(crate) token: String,
}

impl std::ops::Deref for Stack {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

fn backing<'a>(db: &'a TestDb, redis_url: &'a str, prefix: &'a str) -> Backing<'a> {
    Backing {
        database_url: &db.url,
        redis_url,
        redis_prefix: prefix,
    }
}

/// Polls `check` every 5 ms until it answers, or fails after `timeout`.
pub(crate) async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    check: impl AsyncFnMut() -> Option<T>,
) -> anyhow::Result<T> {
    spool_tests::try_poll_until(what, timeout, Duration::from_millis(5), check).await
}

impl Stack {
    /// Starts the API (no workers) with `settings` on top of the defaults.
    pub(crate) async fn start(settings: &[(&str, &str)]) -> anyhow::Result<Self> {
        let db = TestDb::new().await.context("bench database")?;
        let prefix = format!(
            "spool_bench_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let redis_url = spool_tests::redis_url();
        let (api, base) = backing(&db, &redis_url, &prefix)
            .start_api(settings, START)
            .await?;
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .build()?;
        Ok(Self {
            db,
            redis_url,
            prefix,
            client: Client {
                base,
                http,
                token: bench_token(),
            },
            api,
            workers: Vec::new(),
        })
    }

    /// A handle on the API for client tasks.
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// A client of its own that speaks HTTP/2 without TLS (prior knowledge): one connection,
    /// many streams.
    pub(crate) fn client_over_http2(&self) -> anyhow::Result<Client> {
        Ok(Client {
            http: reqwest::Client::builder().http2_prior_knowledge().build()?,
            ..self.client.clone()
        })
    }

    pub(crate) fn api_pid(&self) -> u32 {
        self.api.pid
    }

    pub(crate) fn worker_pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.pid).collect()
    }

    /// Starts a worker with `settings` on top of the defaults; returns its index.
    pub(crate) async fn worker(&mut self, settings: &[(&str, &str)]) -> anyhow::Result<usize> {
        let settings = [&[("SPOOL_DEMO_DELAY_MS", "0")], settings].concat();
        let worker = backing(&self.db, &self.redis_url, &self.prefix)
            .start_worker(&settings, START)
            .await?;
        self.workers.push(worker);
        Ok(self.workers.len() - 1)
    }

    /// Stops every worker (`kill -9`, reaped): for measures that must run without them.
    pub(crate) fn stop_workers(&mut self) {
        for mut worker in self.workers.drain(..) {
            worker.kill_and_reap(Duration::from_secs(5));
        }
    }

    /// `kill -9`s worker `index` and reaps it.
    pub(crate) async fn kill_worker(&mut self, index: usize) {
        self.workers[index].kill9().await;
    }

    /// Runs counted by status, from Postgres.
    pub(crate) async fn runs_with_status(&self, status: &str) -> anyhow::Result<i64> {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE status = $1")
            .bind(status)
            .fetch_one(&self.db.pool)
            .await?;
        Ok(n)
    }
}

impl Client {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Posts `text` to `thread`; returns the 202 body.
    pub(crate) async fn post(&self, thread: uuid::Uuid, text: &str) -> anyhow::Result<Value> {
        let response = self
            .http
            .post(self.url(&format!("/v1/threads/{thread}/user_message")))
            .bearer_auth(&self.token)
            .json(&json!({"input_text": text}))
            .send()
            .await?;
        let status = response.status();
        if status != reqwest::StatusCode::ACCEPTED {
            bail!("POST user_message: {status}: {}", response.text().await?);
        }
        Ok(response.json().await?)
    }

    /// Opens the thread's stream, resuming after `cursor` if given.
    pub(crate) async fn stream(
        &self,
        thread: uuid::Uuid,
        cursor: Option<&str>,
    ) -> anyhow::Result<reqwest::Response> {
        let mut request = self
            .http
            .get(self.url(&format!("/v1/threads/{thread}/stream")))
            .bearer_auth(&self.token);
        if let Some(cursor) = cursor {
            request = request.header("Last-Event-ID", cursor);
        }
        let response = request.send().await?;
        if response.status() != reqwest::StatusCode::OK {
            bail!("GET stream: {}", response.status());
        }
        Ok(response)
    }
}
