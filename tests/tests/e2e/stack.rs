//! An API process and worker processes on a database of their own.

use std::time::Duration;

use serde_json::{Value, json};
use spool_tests::process::Backing;
use spool_tests::{Process, TestDb, poll_until};

pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Stack {
    pub(crate) db: TestDb,
    pub(crate) redis_url: String,
    pub(crate) prefix: String,
    pub(crate) api_pid: u32,
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
    _api: Process,
}

fn backing<'a>(db: &'a TestDb, redis_url: &'a str, prefix: &'a str) -> Backing<'a> {
    Backing {
        database_url: &db.url,
        redis_url,
        redis_prefix: prefix,
    }
}

impl Stack {
    /// Starts the API (no embedded workers) on a fresh database and the test Redis.
    pub(crate) async fn start() -> Self {
        Self::start_with_redis(&spool_tests::redis_url()).await
    }

    /// The same, on the Redis at `redis_url`.
    pub(crate) async fn start_with_redis(redis_url: &str) -> Self {
        Self::start_with(redis_url, &[]).await
    }

    /// The same, with `settings` for the API on top.
    pub(crate) async fn start_with(redis_url: &str, settings: &[(&str, &str)]) -> Self {
        let db = TestDb::new().await.expect("test database");
        Self::start_on(db, redis_url, settings).await
    }

    /// The same, on `db` (a test that changes the database before the API starts).
    pub(crate) async fn start_on(db: TestDb, redis_url: &str, settings: &[(&str, &str)]) -> Self {
        let prefix = spool_tests::redis_prefix();
        // Eight tests run at once, each with an API and workers: keep every process's pool
        // small, or together they exceed Postgres's 100 connections.
        let vars = [&[("SPOOL_DB_MAX_CONNECTIONS", "8")], settings].concat();
        let (api, base) = backing(&db, redis_url, &prefix)
            .start_api(&vars, TIMEOUT)
            .await
            .expect("spool-api");
        let api_pid = api.pid;
        Self {
            db,
            redis_url: redis_url.to_owned(),
            prefix,
            api_pid,
            base,
            http: reqwest::Client::new(),
            _api: api,
        }
    }

    /// What the API process has logged so far.
    pub(crate) fn api_log(&self) -> String {
        self._api.output()
    }

    /// Starts a worker process with these settings on top of the stack's database.
    pub(crate) async fn worker(&self, settings: &[(&str, &str)]) -> Process {
        let defaults = [
            ("SPOOL_POLL_INTERVAL_MS", "100"),
            ("SPOOL_LEASE_SECS", "3"),
            ("SPOOL_HEARTBEAT_SECS", "0.5"),
            ("SPOOL_DB_MAX_CONNECTIONS", "8"),
        ];
        let vars = [&defaults[..], settings].concat();
        backing(&self.db, &self.redis_url, &self.prefix)
            .start_worker(&vars, TIMEOUT)
            .await
            .expect("spool-worker")
    }

    /// Spawns a worker process with exactly `settings` on top of the stack's database, Redis
    /// and prefix, without waiting for it.
    pub(crate) fn spawn_worker(&self, settings: &[(&str, &str)]) -> Process {
        backing(&self.db, &self.redis_url, &self.prefix)
            .spawn_worker(settings)
            .expect("spool-worker")
    }

    /// Posts a message to a new thread; returns the 202 body.
    pub(crate) async fn enqueue(&self, token: &str, text: &str) -> Value {
        let thread = uuid::Uuid::new_v4();
        let response = self
            .http
            .post(format!("{}/v1/threads/{thread}/user_message", self.base))
            .bearer_auth(token)
            .json(&json!({"input_text": text}))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), reqwest::StatusCode::ACCEPTED);
        response.json().await.expect("json")
    }

    /// POSTs `body` to `path` with `token`; returns the status and the JSON answer.
    pub(crate) async fn post(
        &self,
        token: &str,
        path: &str,
        body: &Value,
    ) -> (reqwest::StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("request");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// GETs `path` with `token`; returns the status and the JSON answer.
    pub(crate) async fn get_with(&self, token: &str, path: &str) -> (reqwest::StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .expect("request");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// GETs `path` without credentials; returns the status and the JSON answer.
    pub(crate) async fn get_json(&self, path: &str) -> (reqwest::StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("request");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Alice asks `agent` `input` on a new thread; returns the 202 body.
    pub(crate) async fn ask(&self, agent: &str, input: &str) -> Value {
        let thread = uuid::Uuid::new_v4();
        let (status, accepted) = self
            .post(
                &spool_tests::token("alice", "acme"),
                &format!("/v1/threads/{thread}/user_message"),
                &json!({"input_text": input, "agent_id": agent}),
            )
            .await;
        assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{accepted}");
        accepted
    }

    /// Creates an agent of tenant `acme` (as its admin); returns its id.
    pub(crate) async fn create_agent(&self, spec: &Value) -> String {
        let admin = spool_tests::token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET);
        let (status, agent) = self.post(&admin, "/v1/agents", spec).await;
        assert_eq!(status, reqwest::StatusCode::CREATED, "{agent}");
        agent["id"].as_str().expect("id").to_owned()
    }

    /// The status of an assistant message, read from Postgres.
    pub(crate) async fn message_status(&self, message_id: &Value) -> Option<String> {
        let id: uuid::Uuid = message_id.as_str()?.parse().ok()?;
        sqlx::query_as::<_, (String,)>("SELECT status FROM messages WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await
            .ok()
            .flatten()
            .map(|(s,)| s)
    }

    /// Waits until the assistant message is streaming (a worker is mid-run).
    pub(crate) async fn wait_streaming(&self, accepted: &Value) {
        poll_until("the run to be streaming", TIMEOUT, || async {
            (self
                .message_status(&accepted["message_id"])
                .await
                .as_deref()
                == Some("streaming"))
            .then_some(())
        })
        .await;
    }

    /// Waits until the run has `status`; returns its row.
    pub(crate) async fn wait_run(&self, accepted: &Value, status: &str) -> spool_tests::RunRow {
        let id = workflow_id(accepted);
        poll_until(&format!("run {id} to be {status}"), TIMEOUT, || async {
            spool_tests::run_row(&self.db.pool, id)
                .await
                .filter(|r| r.status == status)
        })
        .await
    }

    /// The thread's messages as `(role, status, content)`, oldest first.
    pub(crate) async fn messages(&self, accepted: &Value) -> Vec<(String, String, String)> {
        let thread: uuid::Uuid = accepted["thread_id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("thread id");
        sqlx::query_as(
            "SELECT role, status, content FROM messages WHERE thread_id = $1 ORDER BY seq",
        )
        .bind(thread)
        .fetch_all(&self.db.pool)
        .await
        .expect("messages")
    }
}

impl Stack {
    /// Opens the thread's stream as a client would.
    pub(crate) async fn stream(
        &self,
        token: &str,
        thread: &Value,
        last_event_id: Option<&str>,
    ) -> reqwest::Response {
        let thread = thread.as_str().expect("thread id");
        let mut request = self
            .http
            .get(format!("{}/v1/threads/{thread}/stream", self.base))
            .bearer_auth(token);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        request.send().await.expect("stream request")
    }

    /// Every stored event of the thread as `(id, envelope)`, straight from Redis.
    pub(crate) async fn stored(&self, thread: &Value) -> Vec<(String, Value)> {
        let thread: spool_shared::ThreadId = thread
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("thread id");
        let keys = spool_shared::stream::StreamKeys::new(self.prefix.clone());
        let mut conn = spool_shared::redis_conn::connect(&self.redis_url).expect("redis");
        let entries = spool_shared::stream::read_after(
            &mut conn,
            &keys.events(thread),
            spool_shared::stream::EntryId::default(),
            100_000,
        )
        .await
        .expect("xrange");
        entries
            .into_iter()
            .filter(|e| !e.is_marker())
            .map(|e| {
                (
                    e.id.to_string(),
                    serde_json::from_str(&e.json).unwrap_or(Value::Null),
                )
            })
            .collect()
    }
}

pub(crate) fn workflow_id(accepted: &Value) -> uuid::Uuid {
    accepted["workflow_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("workflow id")
}

/// The demo reply a run with `tokens` deltas produces for `input`.
pub(crate) fn demo_reply(input: &str, tokens: usize) -> String {
    spool_worker::demo::reply(input, tokens).concat()
}

/// A model that asks the client for a file (call `c1`), then answers slowly: 40 deltas, 100 ms
/// apart (`"word "` 40 times).
pub(crate) async fn slow_reader() -> spool_tests::fake_llm::FakeLlm {
    use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
    FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "read_file", r#"{"path": "/notes"}"#)]),
        _ => fake_llm::paced_text(&"word ".repeat(40), 40, Duration::from_millis(100)),
    })
    .await
}

impl Stack {
    /// Alice's run of a `reader` agent (the client tool `read_file`), paused for call `c1` and
    /// answered, so that a worker resumes it; returns the 202 body.
    pub(crate) async fn answered_client_tool(&self) -> Value {
        let agent = self
            .create_agent(&json!({"name": "reader", "model": "gpt-4o-mini",
                "tools": [{"type": "client", "name": "read_file"}]}))
            .await;
        let alice = spool_tests::token("alice", "acme");
        let thread = uuid::Uuid::new_v4();
        let (_, accepted) = self
            .post(
                &alice,
                &format!("/v1/threads/{thread}/user_message"),
                &json!({"input_text": "read my notes", "agent_id": agent}),
            )
            .await;
        self.wait_run(&accepted, "requires_action").await;
        let workflow = workflow_id(&accepted);
        let (status, _) = self
            .post(
                &alice,
                &format!("/v1/workflows/{workflow}/tool_outputs"),
                &json!({"tool_outputs": [{"tool_call_id": "c1", "output": "the notes"}]}),
            )
            .await;
        assert_eq!(status, reqwest::StatusCode::ACCEPTED);
        accepted
    }
}

/// Reads `reader` until `deltas` text deltas have arrived; returns every frame read.
pub(crate) async fn read_deltas(
    reader: &mut spool_tests::sse::SseReader,
    deltas: usize,
) -> Vec<spool_tests::sse::Frame> {
    let mut frames: Vec<spool_tests::sse::Frame> = Vec::new();
    while frames.iter().filter(|f| f.event == "text_delta").count() < deltas {
        let frame = reader.next(Duration::from_secs(15)).await;
        frames.push(frame.expect("another event"));
    }
    frames
}

/// The text a client shows: deltas since the last `message_start` or `attempt_restarted`.
pub(crate) fn shown_text(frames: &[spool_tests::sse::Frame]) -> String {
    let mut text = String::new();
    for frame in frames {
        match frame.event.as_str() {
            "message_start" | "attempt_restarted" => text.clear(),
            "text_delta" => text.push_str(frame.json()["data"]["delta"].as_str().unwrap_or("")),
            _ => {}
        }
    }
    text
}
