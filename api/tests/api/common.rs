//! A Spool API (and optionally workers) in this process, on a database of its own.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use spool_api::auth::JwtKeys;
use spool_api::gateway::Hub;
use spool_api::{ApiConfig, AppState};
use spool_shared::stream::StreamKeys;
use spool_tests::fake_llm::FakeLlm;
use spool_tests::{JWT_SECRET, TestDb, poll_until, token};
use spool_worker::WorkerArgs;

pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) struct TestApp {
    pub(crate) base: String,
    pub(crate) db: TestDb,
    pub(crate) http: reqwest::Client,
    shutdown: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
    worker_shutdown: CancellationToken,
    workers: tokio::task::JoinSet<()>,
    retention: Duration,
    pub(crate) streams: Hub,
    pub(crate) keys: StreamKeys,
}

/// Worker settings as the command line would give them: defaults, a 5 s lease with a 1 s
/// heartbeat, and the demo model's length and pace.
pub(crate) fn worker_args(demo_tokens: usize, demo_delay_ms: u64) -> WorkerArgs {
    worker_args_with(demo_tokens, demo_delay_ms, &[])
}

/// The same with extra flags (`["--llm-base-url", url]`, ...).
pub(crate) fn worker_args_with(
    demo_tokens: usize,
    demo_delay_ms: u64,
    extra: &[&str],
) -> WorkerArgs {
    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        worker: WorkerArgs,
    }
    let tokens = demo_tokens.to_string();
    let delay = demo_delay_ms.to_string();
    let mut args = vec![
        "worker",
        "--jwt-secret",
        JWT_SECRET,
        "--concurrency",
        "8",
        "--poll-interval-ms",
        "100",
        "--shutdown-grace-secs",
        "5",
        "--max-reclaims",
        "3",
        "--demo-tokens",
        &tokens,
        "--demo-delay-ms",
        &delay,
        "--lease-secs",
        "5",
        "--heartbeat-secs",
        "1",
    ];
    args.extend_from_slice(extra);
    <Command as clap::Parser>::parse_from(args).worker
}

impl TestApp {
    /// An API with `workers` in-process workers running the demo model with these settings.
    pub(crate) async fn start(workers: usize, args: WorkerArgs) -> Self {
        Self::start_with_retention(workers, args, 3600).await
    }

    /// The same, with a stream retention window of `retention_secs`.
    pub(crate) async fn start_with_retention(
        workers: usize,
        args: WorkerArgs,
        retention_secs: u64,
    ) -> Self {
        let jwt = JwtKeys::new(&SecretString::from(JWT_SECRET.to_owned()));
        Self::start_with_jwt(workers, args, retention_secs, jwt).await
    }

    /// The same, verifying tokens with `jwt` (an external identity provider, say).
    pub(crate) async fn start_with_jwt(
        workers: usize,
        args: WorkerArgs,
        retention_secs: u64,
        jwt: JwtKeys,
    ) -> Self {
        let db = TestDb::new().await.expect("test database");
        spool_shared::metrics::install();
        let shutdown = CancellationToken::new();
        let keys = StreamKeys::new(spool_tests::redis_prefix());
        let streams = Hub::start(
            &spool_tests::redis_url(),
            keys.clone(),
            64,
            shutdown.clone(),
        )
        .expect("redis");
        let state = AppState {
            db: db.pool.clone(),
            streams: streams.clone(),
            shutdown: shutdown.clone(),
            jwt: Arc::new(jwt),
            config: Arc::new(ApiConfig {
                metrics_token: None,
                max_input_bytes: 32 * 1024,
                max_body_bytes: 1 << 20,
                max_streams_per_user: 100,
                max_streams: 10_000,
                write_timeout: None,
                min_drain_bytes_per_sec: 0,
                cors_origins: vec!["https://app.example".into()],
                // Loopback is the tests' proxy: `X-Forwarded-For` names public sessions' clients.
                trusted_proxies: vec!["127.0.0.0/8".parse().expect("cidr")],
                stream_retention: Duration::from_secs(retention_secs),
                quotas: spool_shared::quota::Quotas::default(),
                providers: args.providers.providers(),
                builtin_tools: args.builtin_tools.clone(),
                // `--secrets-key` in the tests that store providers, as an operator sets it.
                secrets: args
                    .providers
                    .secrets_keys()
                    .expect("secrets key")
                    .map(Arc::new),
                // As `SPOOL_TOOLS_ALLOW_NETWORKS=127.0.0.0/8` would: receivers in the tests
                // listen on loopback.
                network_policy: Arc::new(
                    spool_shared::egress::NetworkPolicy::parse("127.0.0.0/8").expect("policy"),
                ),
                retention: args.retention.clone(),
                max_webhooks_per_tenant: args.webhooks.webhooks_max_per_tenant,
                identity_jwks: args.identity.identity_keys().expect("identity keys").jwks(),
            }),
            runs: spool_api::watch::RunWatch::start(db.pool.clone(), shutdown.clone()),
            wake: spool_api::wake::Wake::start(db.pool.clone(), shutdown.clone()),
            admission: spool_shared::quota::admission::Admission::new(streams.conn(), &keys),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn({
            let shutdown = shutdown.clone();
            async move {
                let _ = spool_api::serve(listener, state, shutdown).await;
            }
        });
        let worker_shutdown = shutdown.child_token();
        let mut app = Self {
            base,
            db,
            http: reqwest::Client::new(),
            shutdown,
            tasks,
            worker_shutdown,
            workers: tokio::task::JoinSet::new(),
            streams,
            keys,
            retention: Duration::from_secs(retention_secs),
        };
        for _ in 0..workers {
            app.spawn_worker(args.clone());
        }
        app
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) async fn get(&self, token: &str, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("request");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn post(&self, token: &str, path: &str, body: &Value) -> (StatusCode, Value) {
        let response = self
            .http
            .post(self.url(path))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("request");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn send_message(
        &self,
        token: &str,
        thread: uuid::Uuid,
        text: &str,
    ) -> (StatusCode, Value) {
        self.post(
            token,
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": text}),
        )
        .await
    }

    /// Waits until the workflow reaches `status`.
    pub(crate) async fn wait_for_status(&self, token: &str, workflow: &str, status: &str) -> Value {
        self.poll_run(token, workflow, status, |s| s == status)
            .await
    }

    /// Waits until alice's run of `accepted` (a 202 body) has a status `until` accepts.
    pub(crate) async fn wait_run(&self, accepted: &Value, until: impl Fn(&str) -> bool) -> Value {
        let workflow = accepted["workflow_id"].as_str().expect("a workflow id");
        self.poll_run(
            &token("alice", "acme"),
            workflow,
            "the awaited status",
            until,
        )
        .await
    }

    async fn poll_run(
        &self,
        token: &str,
        workflow: &str,
        what: &str,
        until: impl Fn(&str) -> bool,
    ) -> Value {
        poll_until(
            &format!("workflow {workflow} to reach {what}"),
            Duration::from_secs(30),
            || async {
                let (code, body) = self.get(token, &format!("/v1/workflows/{workflow}")).await;
                let reached = code == StatusCode::OK && body["status"].as_str().is_some_and(&until);
                reached.then_some(body)
            },
        )
        .await
    }

    /// The OpenAPI document the app serves.
    pub(crate) async fn openapi_document(&self) -> serde_json::Value {
        self.http
            .get(self.url("/openapi.json"))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("the document is JSON")
    }

    /// Adds an in-process worker to a running app.
    pub(crate) async fn with_worker(mut self, args: WorkerArgs) -> Self {
        self.spawn_worker(args);
        self
    }

    fn spawn_worker(&mut self, args: WorkerArgs) {
        let streams = spool_worker::Streams::connect(
            &spool_tests::redis_url(),
            self.keys.clone(),
            self.retention,
        )
        .expect("redis");
        let worker = spool_worker::Worker::new(
            self.db.pool.clone(),
            self.db.url.clone(),
            spool_shared::db::Timeouts::default(),
            args,
            streams,
        )
        .expect("worker");
        let shutdown = self.worker_shutdown.clone();
        self.workers.spawn(async move {
            let _ = spool_worker::run(worker, shutdown).await;
        });
    }

    /// Stops every worker (gracefully) and starts `count` new ones: a restart.
    pub(crate) async fn restart_workers(&mut self, count: usize, args: WorkerArgs) {
        self.worker_shutdown.cancel();
        while self.workers.join_next().await.is_some() {}
        self.worker_shutdown = self.shutdown.child_token();
        for _ in 0..count {
            self.spawn_worker(args.clone());
        }
    }

    pub(crate) async fn stop(mut self) {
        self.shutdown.cancel();
        while self.workers.join_next().await.is_some() {}
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Whether a run status is terminal.
pub(crate) fn terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

/// Waits until alice's run of `accepted` has completed or failed.
pub(crate) async fn finished(app: &TestApp, accepted: &Value) -> Value {
    app.wait_run(accepted, |s| matches!(s, "completed" | "failed"))
        .await
}

/// An API with one in-process worker whose provider is `fake`, allowed to reach tools on
/// loopback.
pub(crate) async fn app_with(fake: &FakeLlm) -> TestApp {
    TestApp::start(
        1,
        worker_args_with(
            1,
            0,
            &[
                "--llm-base-url",
                &fake.base_url,
                "--tools-allow-networks",
                "127.0.0.1/32",
            ],
        ),
    )
    .await
}

/// Posts alice's message, answered by `agent`, to a new thread; returns it and the 202 body.
pub(crate) async fn ask(app: &TestApp, agent: &str, text: &str) -> (Uuid, Value) {
    let thread = Uuid::new_v4();
    let (status, accepted) = app
        .post(
            &token("alice", "acme"),
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": text, "agent_id": agent}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    (thread, accepted)
}
