//! A worker driven one run at a time ([`spool_worker::run_next`]), on a database and a Redis
//! key prefix of its own, against a fake upstream speaking the OpenAI wire format. Runs are
//! enqueued by the enqueue itself ([`spool_shared::db::enqueue`]); there is no HTTP between the
//! test and the agent loop.

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use spool_shared::agent::AgentSpec;
use spool_shared::db::enqueue::{NewMessage, enqueue};
use spool_shared::db::runs::Run;
use spool_shared::db::threads::{self, Owner};
use spool_shared::db::{agents, messages};
use spool_shared::quota::Quotas;
use spool_shared::stream::{self, EntryId, StreamKeys};
use spool_shared::{AgentId, ThreadId, WorkflowId};
use spool_tests::TestDb;
use spool_tests::fake_llm::FakeLlm;
use spool_tests::sse::Frame;
use spool_worker::lease::LeaseKeeper;
use spool_worker::{Worker, WorkerArgs};

/// How long a run may take to finish in these tests.
const TIMEOUT: Duration = Duration::from_secs(30);

/// One worker, its database and its Redis keys.
pub(crate) struct Harness {
    pub(crate) db: TestDb,
    worker: Worker,
    keeper: LeaseKeeper,
    keys: StreamKeys,
}

/// The user every test acts as.
fn alice() -> Owner {
    Owner {
        tenant_id: "acme".into(),
        user_id: "alice".into(),
    }
}

impl Harness {
    /// A worker whose provider is `fake`, allowed to reach tools on loopback, with a 5 s lease
    /// renewed every second.
    pub(crate) async fn start(fake: &FakeLlm) -> Self {
        Self::start_at(&fake.base_url).await
    }

    /// The same, with the provider at `llm_base_url`.
    pub(crate) async fn start_at(llm_base_url: &str) -> Self {
        Self::start_with(llm_base_url, &[]).await
    }

    /// The same, with these flags on top.
    pub(crate) async fn start_with(llm_base_url: &str, extra: &[&str]) -> Self {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            worker: WorkerArgs,
        }
        let args = <Command as clap::Parser>::parse_from(
            [
                &[
                    "worker",
                    "--llm-base-url",
                    llm_base_url,
                    "--tools-allow-networks",
                    "127.0.0.1/32",
                    "--demo-tokens",
                    "1",
                    "--demo-delay-ms",
                    "0",
                    "--lease-secs",
                    "5",
                    "--heartbeat-secs",
                    "1",
                ][..],
                extra,
            ]
            .concat(),
        )
        .worker;
        let db = TestDb::new().await.expect("test database");
        let keys = StreamKeys::new(spool_tests::redis_prefix());
        let streams = spool_worker::Streams::connect(
            &spool_tests::redis_url(),
            keys.clone(),
            Duration::from_secs(3600),
        )
        .expect("redis");
        let timeouts = spool_shared::db::Timeouts::default();
        let keeper = LeaseKeeper::start(
            &db.url,
            timeouts,
            args.lease.lease(),
            args.lease.heartbeat(),
        )
        .expect("lease keeper");
        let worker =
            Worker::new(db.pool.clone(), db.url.clone(), timeouts, args, streams).expect("worker");
        Self {
            db,
            worker,
            keeper,
            keys,
        }
    }

    /// Stores an agent of tenant `acme` (validated, as the API would); returns its id.
    pub(crate) async fn create_agent(&self, spec: &Value) -> String {
        let spec: AgentSpec = serde_json::from_value(spec.clone()).expect("a spec");
        assert_eq!(spec.validate(), [], "a valid spec");
        let agent = agents::insert(&self.db.pool, AgentId::new(), "acme", &spec)
            .await
            .expect("insert");
        agent.id.to_string()
    }

    /// A thread of alice's answered by `agent`.
    pub(crate) async fn thread_with(&self, agent: &str) -> Uuid {
        let id = ThreadId::new();
        let agent: AgentId = agent.parse().expect("agent id");
        threads::create(&self.db.pool, id, &alice(), Some(agent), &json!({}))
            .await
            .expect("thread");
        id.0
    }

    /// Enqueues alice's message to a new thread, answered by `agent`; returns the thread and
    /// the enqueue as the API's 202 body shows it.
    pub(crate) async fn ask(&self, agent: &str, text: &str) -> (Uuid, Value) {
        let thread = Uuid::new_v4();
        let accepted = self.send(thread, Some(agent), text).await;
        (thread, accepted)
    }

    /// Enqueues alice's message to `thread` (its own agent if `agent` is `None`).
    pub(crate) async fn send(&self, thread: Uuid, agent: Option<&str>, text: &str) -> Value {
        self.send_under(thread, agent, text, &Quotas::default())
            .await
    }

    /// The same, under the server quotas `quotas`.
    pub(crate) async fn send_under(
        &self,
        thread: Uuid,
        agent: Option<&str>,
        text: &str,
        quotas: &Quotas,
    ) -> Value {
        let owner = alice();
        let message = NewMessage {
            thread_id: ThreadId(thread),
            owner: &owner,
            agent_id: agent.map(|a| a.parse().expect("agent id")),
            input_text: text,
            metadata: &json!({}),
            idempotency_key: None,
            trace_context: None,
            quotas,
            admission: &self.worker.admission,
            overrides: None,
            history: &[],
            in_transaction: true,
            client: None,
            may_instruct: false,
            problems: &[],
        };
        let mut tx = self.db.pool.begin().await.expect("begin");
        let enqueued = enqueue(&mut spool_shared::db::LazyConn::Held(&mut tx), &message)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        json!({"workflow_id": enqueued.workflow_id, "thread_id": thread,
            "message_id": enqueued.message_id})
    }

    /// Executes attempts until the run of `accepted` has completed or failed; returns it as
    /// `GET /v1/workflows/{id}` shows it.
    pub(crate) async fn finished(&self, accepted: &Value) -> Value {
        self.run_until(accepted, |s| matches!(s, "completed" | "failed"))
            .await
    }

    /// Executes attempts until the run's status is one `until` accepts; returns the run.
    pub(crate) async fn run_until(&self, accepted: &Value, until: impl Fn(&str) -> bool) -> Value {
        let id: WorkflowId = serde_json::from_value(accepted["workflow_id"].clone()).expect("id");
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let run = self.run(id).await;
            if run["status"].as_str().is_some_and(&until) {
                return run;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the run did not finish: {run}"
            );
            let executed = spool_worker::run_next(&self.worker, &self.keeper)
                .await
                .expect("an attempt");
            if executed.is_none() {
                // Nothing claimable yet (a lease still running out, say): poll again.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Claims and executes the next attempt (dropping the future mid-way is a crash: the
    /// lease is no longer renewed and nothing more is written).
    pub(crate) async fn attempt(&self) -> Option<spool_worker::Executed> {
        spool_worker::run_next(&self.worker, &self.keeper)
            .await
            .expect("an attempt")
    }

    /// The run as `GET /v1/workflows/{id}` shows it.
    async fn run(&self, id: WorkflowId) -> Value {
        let run: Run = sqlx::query_as("SELECT * FROM runs WHERE id = $1")
            .bind(id)
            .fetch_one(&self.db.pool)
            .await
            .expect("the run");
        json!({"workflow_id": run.id, "status": run.status, "agent_id": run.agent_id,
            "attempt": run.attempt, "error": run.error.map(|e| e.0),
            "usage": run.usage.map(|u| u.0), "pending_action": run.pending_action.map(|a| a.0)})
    }

    /// The thread's messages as `GET /v1/threads/{id}/messages` shows them.
    pub(crate) async fn messages(&self, thread: Uuid) -> Value {
        let list = messages::list(&self.db.pool, ThreadId(thread), 50, None)
            .await
            .expect("messages");
        let messages: Vec<Value> = list
            .into_iter()
            .map(|m| {
                json!({"id": m.id, "role": m.role, "content": m.content, "parts": m.parts.0,
                    "status": m.status, "usage": m.usage.map(|u| u.0),
                    "output": m.output.map(|o| o.0), "blocked": m.blocked})
            })
            .collect();
        json!({ "messages": messages })
    }

    /// Every event the thread's stream holds, as SSE frames (the stream's marker left out).
    pub(crate) async fn events(&self, thread: Uuid) -> Vec<Frame> {
        let key = self.keys.events(ThreadId(thread));
        let mut conn = self.worker.streams.conn.clone();
        stream::read_after(&mut conn, &key, EntryId::default(), 100_000)
            .await
            .expect("xrange")
            .into_iter()
            .filter(|entry| !entry.is_marker())
            .map(|entry| Frame {
                id: Some(entry.id.to_string()),
                event: entry.kind,
                data: entry.json,
            })
            .collect()
    }
}
