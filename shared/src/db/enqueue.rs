//! The enqueue: a user's message becomes a queued run (invariant 1).
//!
//! One statement ([`runs::insert_with_thread`]) makes the thread on first use (if the id is a
//! UUID no one else owns), the user message, the assistant message that will stream (status
//! `queued`, so its id is known at once and its content is written exactly once, when the run
//! ends), the run with the spec of its agent as it is now, the tool resources it references
//! resolved into it (the run executes that spec, whatever happens to the agent or its tools
//! later). Once it has committed, the caller wakes the workers
//! ([`crate::db::notify_runs`], or the API's coalescing `wake`): a NOTIFY in the statement
//! would be delivered exactly at the commit, but Postgres commits notifying transactions one at a
//! time (a lock held through the WAL flush), which halved the enqueues a second. On its own
//! (no `Idempotency-Key`, no earlier turns) it needs no transaction: one statement is atomic, so
//! a `POST user_message` to a thread without an agent costs one round trip to Postgres, and a
//! `202` means all of it is committed while any error leaves nothing behind. With a key or
//! earlier turns it runs in the caller's transaction beside them. The partial unique index on
//! active runs refuses a second one on the thread (invariant 2). When quotas apply, the run is
//! admitted first, in Redis ([`Admission::take`]: one round trip, no lock held in Postgres, and
//! outside a transaction no pooled connection either: [`LazyConn`]), and what it took is given
//! back if the statement fails; a caller whose transaction fails after the enqueue gives it back
//! too ([`Enqueued::admitted`]).

use serde_json::Value;
use sqlx::PgConnection;

use crate::agent::{AgentSpec, FieldError, RunOverrides};
use crate::db::quota::{self, Refusal};
use crate::db::runs::{self, NewRun};
use crate::db::threads::{self, Owner};
use crate::db::{LazyConn, agents, is_unique_violation, messages, tools};
use crate::ids::{AgentId, MessageId, ThreadId, WorkflowId};
use crate::quota::admission::{Admission, AdmitError};
use crate::quota::{Quotas, RunQuota, counters};
use crate::status::Role;

/// A user's message to enqueue.
#[derive(Clone, Debug)]
pub struct NewMessage<'a> {
    /// The thread (created on first use).
    pub thread_id: ThreadId,
    /// Who sends it.
    pub owner: &'a Owner,
    /// The agent that answers; else the thread's, else the default.
    pub agent_id: Option<AgentId>,
    /// What the user said.
    pub input_text: &'a str,
    /// Caller-defined metadata of the user message.
    pub metadata: &'a Value,
    /// The request's `Idempotency-Key`, if any.
    pub idempotency_key: Option<&'a str>,
    /// The request's W3C traceparent, so the worker's attempts join its trace.
    pub trace_context: Option<&'a str>,
    /// The server's quotas (`SPOOL_QUOTA_*`).
    pub quotas: &'a Quotas,
    /// Where the quota counters are (used only when a quota applies).
    pub admission: &'a Admission,
    /// What the message posts to steer its run (checked against the agent that answers).
    pub overrides: Option<&'a RunOverrides>,
    /// Earlier turns stored before the message, completed and without a run (a thread seeded
    /// with a conversation the client kept, as `POST /v1/chat/completions` sends it).
    pub history: &'a [(Role, String)],
    /// Whether the enqueue runs in a transaction the caller commits: then, when Redis is
    /// unreachable, Postgres admits the run ([`crate::db::quota::admit`], whose locks must last
    /// to the commit) instead of the enqueue failing with [`EnqueueError::QuotasUnavailable`].
    pub in_transaction: bool,
    /// Whether the caller may post `instructions` to any agent (an admin); others may only
    /// to an agent with `allow_instruction_override`.
    pub may_instruct: bool,
    /// Problems the caller found in the message's overrides itself (its earlier turns), reported
    /// with those found against the agent; any of them refuses the message.
    pub problems: &'a [FieldError],
    /// The client address of a public session's message, counted under its agent's
    /// `governance.ip` (`None` for every other caller).
    pub client: Option<&'a str>,
}

/// What the enqueue made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The run that will answer.
    pub workflow_id: WorkflowId,
    /// The stored user message.
    pub user_message_id: MessageId,
    /// The assistant message that will stream.
    pub message_id: MessageId,
    /// The counters the run took room in, and when: a caller whose transaction does not
    /// commit gives it back ([`Admission::undo`]).
    pub admitted: Option<(RunQuota, i64)>,
}

/// Why a message was not enqueued (the transaction must be rolled back).
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// The thread belongs to someone else.
    #[error("no such thread")]
    ThreadNotFound,
    /// The agent (the message's, or the thread's) does not exist (any more).
    #[error("no such agent")]
    AgentNotFound,
    /// The agent is disabled: it takes no new runs.
    #[error("the agent is disabled")]
    AgentDisabled,
    /// The thread already has an active run.
    #[error("the thread already has an active run")]
    ThreadBusy,
    /// A quota refuses the run.
    #[error("{}", .0.message())]
    Refused(Refusal),
    /// A quota applies and its counters (Redis) cannot be reached.
    #[error("the quota counters are unavailable: {0}")]
    QuotasUnavailable(redis::RedisError),
    /// The message's overrides do not fit the agent that answers (by field).
    #[error("the overrides do not fit the agent")]
    InvalidOverrides(Vec<FieldError>),
    /// Postgres failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Enqueues `message` on `db` (see the module doc): in the caller's transaction, or alone in
/// one statement on a connection outside any, taken from the pool only once the quota take
/// (if any) has admitted the run, so that no pooled connection waits idle on Redis. (A little
/// over 80 lines: the loop that guesses the thread's agent is kept whole, since each of its
/// exits depends on the guess.)
pub async fn enqueue(
    db: &mut LazyConn<'_>,
    message: &NewMessage<'_>,
) -> Result<Enqueued, EnqueueError> {
    let thread_id = message.thread_id;
    // The agent that answers is the message's, else the thread's. When the message names none,
    // guess that the thread has none either (a new thread has none), and look it up only when
    // the insert finds the guess wrong: one round trip in the common case.
    let mut known: Option<Option<AgentId>> = None;
    if !message.history.is_empty() {
        // Earlier turns go in before the message, so the thread must exist first.
        let conn = db.get().await?;
        known = Some(
            threads::ensure_owned(&mut *conn, thread_id, message.owner, message.agent_id)
                .await?
                .ok_or(EnqueueError::ThreadNotFound)?,
        );
        for (role, content) in message.history {
            messages::insert_turn(&mut *conn, MessageId::new(), thread_id, *role, content).await?;
        }
    } else if message.agent_id.is_none() && checks_overrides(message) {
        // Overrides are checked against the agent that answers: know it before.
        known = Some(thread_agent(db.get().await?, message).await?);
    }
    // A guess proved wrong is looked up and tried again; a thread whose agent changes under
    // every try (created by a concurrent message, then erased) is reported missing.
    for _ in 0..3 {
        let agent_id = message.agent_id.or(known.flatten());
        let agent_spec = agent_spec(db, message, agent_id).await?;
        let governance = agent_id.zip(agent_spec.as_ref().map(|spec| &spec.governance));
        let mut quota = counters(message.quotas, governance, &message.owner.user_id);
        if let (Some(client), Some((agent, governance))) = (message.client, governance) {
            quota = crate::quota::with_client(quota, agent, governance.ip, client);
        }
        let mut enqueued = Enqueued {
            workflow_id: WorkflowId::new(),
            user_message_id: MessageId::new(),
            message_id: MessageId::new(),
            admitted: None,
        };
        let tenant = &message.owner.tenant_id;
        if let Some(run_quota) = quota.take() {
            match admit(db, message, enqueued.workflow_id, &run_quota).await? {
                Some(taken_ms) => enqueued.admitted = Some((run_quota, taken_ms)),
                // Admitted by Postgres: nothing taken in Redis to give back.
                None => quota = Some(run_quota),
            }
        }
        let run = NewRun {
            id: enqueued.workflow_id,
            thread_id,
            owner: message.owner,
            agent_id,
            agent_spec: agent_spec.as_ref(),
            user_message_id: enqueued.user_message_id,
            assistant_message_id: enqueued.message_id,
            idempotency_key: message.idempotency_key,
            trace_context: message.trace_context,
            quota: enqueued
                .admitted
                .as_ref()
                .map(|(quota, _)| quota)
                .or(quota.as_ref()),
            overrides: message.overrides,
        };
        let inserted = match db.get().await {
            Ok(conn) => {
                runs::insert_with_thread(
                    conn,
                    &run,
                    message.agent_id,
                    message.input_text,
                    message.metadata,
                )
                .await
            }
            Err(err) => Err(err),
        };
        // Nothing was made (a wrong guess is tried again with a new run): all of it goes back.
        if !matches!(inserted, Ok(true))
            && let Some((quota, taken_ms)) = &enqueued.admitted
        {
            message
                .admission
                .undo(tenant, enqueued.workflow_id, quota, *taken_ms)
                .await;
        }
        match inserted {
            Ok(true) => return Ok(enqueued),
            // The thread is someone else's or erased, or the guess of its agent was wrong.
            Ok(false) => known = Some(thread_agent(db.get().await?, message).await?),
            Err(err) if is_unique_violation(&err, runs::ONE_ACTIVE_PER_THREAD) => {
                return Err(EnqueueError::ThreadBusy);
            }
            Err(err) => return Err(err.into()),
        }
    }
    Err(EnqueueError::ThreadNotFound)
}

/// Takes room for run `id` of `message` in the counters of `quota` (see the module doc); when
/// the room was taken in Redis, or `None` when Postgres admitted the run (Redis unreachable).
async fn admit(
    db: &mut LazyConn<'_>,
    message: &NewMessage<'_>,
    id: WorkflowId,
    quota: &RunQuota,
) -> Result<Option<i64>, EnqueueError> {
    let tenant = &message.owner.tenant_id;
    match message.admission.take(db, tenant, id, quota).await {
        Ok(taken_ms) => Ok(Some(taken_ms)),
        // A message the thread itself refuses gets that answer, as it would without quotas.
        Err(AdmitError::Refused(refusal)) => refuse(db, message, refusal).await,
        // Redis is unreachable: Postgres admits the run, when the enqueue's transaction can
        // hold the counters' locks to its commit (otherwise the caller asks again in one).
        Err(AdmitError::Unavailable(err)) if message.in_transaction => {
            tracing::warn!(error = %err, "quota counters unreachable; admitting from Postgres");
            metrics::counter!("spool_quota_admissions_from_postgres_total").increment(1);
            match quota::admit(db.get().await?, tenant, quota).await? {
                Ok(()) => {
                    message.admission.stale(tenant, quota);
                    Ok(None)
                }
                Err(refusal) => refuse(db, message, refusal).await,
            }
        }
        Err(AdmitError::Unavailable(err)) => Err(EnqueueError::QuotasUnavailable(err)),
        Err(AdmitError::Db(err)) => Err(err.into()),
    }
}

/// A quota's refusal, unless the thread itself refuses the message: a thread of someone
/// else's is not found, a busy one is busy (checked only when a quota refuses, so it costs the
/// enqueue nothing otherwise).
async fn refuse<T>(
    db: &mut LazyConn<'_>,
    message: &NewMessage<'_>,
    refusal: Refusal,
) -> Result<T, EnqueueError> {
    let conn = db.get().await?;
    thread_agent(&mut *conn, message).await?;
    if runs::find_active(&mut *conn, message.thread_id)
        .await?
        .is_some()
    {
        return Err(EnqueueError::ThreadBusy);
    }
    Err(EnqueueError::Refused(refusal))
}

/// The agent of the owner's thread (`None`: the default), the message's for a thread not made
/// yet, or [`EnqueueError::ThreadNotFound`].
async fn thread_agent(
    conn: &mut PgConnection,
    message: &NewMessage<'_>,
) -> Result<Option<AgentId>, EnqueueError> {
    match threads::agent_for(conn, message.thread_id, message.owner).await? {
        threads::ThreadFor::Owned(agent_id) => Ok(agent_id),
        threads::ThreadFor::New => Ok(message.agent_id),
        threads::ThreadFor::Other => Err(EnqueueError::ThreadNotFound),
    }
}

/// The spec of the agent that answers (`None`: the server's default), checked: it exists, is
/// active, and the message's overrides fit it.
async fn agent_spec(
    db: &mut LazyConn<'_>,
    message: &NewMessage<'_>,
    agent_id: Option<AgentId>,
) -> Result<Option<AgentSpec>, EnqueueError> {
    let agent_spec = match agent_id {
        Some(id) => {
            let spec = agents::find(db.get().await?, id, &message.owner.tenant_id)
                .await?
                .ok_or(EnqueueError::AgentNotFound)?
                .spec
                .0;
            if !spec.status.is_active() {
                return Err(EnqueueError::AgentDisabled);
            }
            // The run snapshots the tools it references as they are now (enabled ones only),
            // and the id of the tenant provider it names (never its key).
            let tenant = &message.owner.tenant_id;
            let spec = tools::resolve(db.get().await?, tenant, spec).await?;
            Some(crate::db::providers::resolve(db.get().await?, tenant, spec).await?)
        }
        None => None,
    };
    if checks_overrides(message) {
        let overrides = message.overrides.cloned().unwrap_or_default();
        // The server's default agent has no tools: only tool choices that name none fit it.
        let agent = agent_spec
            .clone()
            .unwrap_or_else(|| AgentSpec::default_agent("default", ""));
        // Choices may name the run's client tools, which the overrides add.
        let mut offered = agent.clone();
        offered.tools.extend(
            overrides
                .client_tools
                .iter()
                .flatten()
                .cloned()
                .map(crate::agent::ToolSpec::Client),
        );
        let mut problems = message.problems.to_vec();
        problems.extend(overrides.validate(&offered, 1));
        problems.extend(overrides.client_tool_collisions(&agent));
        problems.extend(overrides.clashes(&agent, 1));
        if overrides.extra_instructions.is_some()
            && !message.may_instruct
            && !agent.allow_instruction_override
        {
            problems.push(FieldError {
                field: "instructions".into(),
                message: "this agent takes no instructions from a message (it does not set \
                          `allow_instruction_override`; an admin token always may)"
                    .into(),
            });
        }
        if !problems.is_empty() {
            // Named as the message posts them: its tool choice and tools are the run's
            // defaults.
            for problem in &mut problems {
                if problem.field == "defaults" {
                    problem.field = "tool_choice".into();
                } else if let Some(field) = problem.field.strip_prefix("defaults.") {
                    problem.field = field.to_owned();
                }
            }
            return Err(EnqueueError::InvalidOverrides(problems));
        }
    }
    Ok(agent_spec)
}

/// Whether the message's overrides are to be checked against the agent that answers.
fn checks_overrides(message: &NewMessage<'_>) -> bool {
    message.overrides.is_some() || !message.problems.is_empty()
}

/// Test helpers the quota and queue tests share.
#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;
    use spool_tests::TestDb;

    use super::*;
    use crate::quota::QuotaLimits;

    /// User `user` of tenant `acme`.
    pub(crate) fn owner(user: &str) -> Owner {
        Owner {
            tenant_id: "acme".into(),
            user_id: user.into(),
        }
    }

    /// Quota counters under a key prefix of the test's own.
    pub(crate) fn admission() -> Admission {
        let conn = crate::redis_conn::connect(&spool_tests::redis_url()).expect("redis");
        let keys = crate::stream::StreamKeys::new(spool_tests::redis_prefix());
        Admission::new(conn, &keys)
    }

    /// `hi` from `owner` on `thread_id`, under `quotas`.
    pub(crate) fn message<'a>(
        thread_id: ThreadId,
        owner: &'a Owner,
        quotas: &'a Quotas,
        admission: &'a Admission,
    ) -> NewMessage<'a> {
        static METADATA: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| json!({}));
        NewMessage {
            thread_id,
            owner,
            agent_id: None,
            input_text: "hi",
            metadata: &METADATA,
            idempotency_key: None,
            trace_context: None,
            quotas,
            admission,
            overrides: None,
            history: &[],
            in_transaction: false,
            client: None,
            may_instruct: false,
            problems: &[],
        }
    }

    /// Enqueues outside any transaction, on a connection taken from the pool when it writes,
    /// as `POST user_message` does without a key.
    async fn alone(db: &TestDb, message: &NewMessage<'_>) -> Result<Enqueued, EnqueueError> {
        enqueue(&mut LazyConn::pool(&db.pool), message).await
    }

    /// (messages, runs) of the thread.
    async fn rows(db: &TestDb, thread_id: ThreadId) -> (i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM messages WHERE thread_id = $1),
                    (SELECT count(*) FROM runs WHERE thread_id = $1)",
        )
        .bind(thread_id)
        .fetch_one(&db.pool)
        .await
        .expect("rows")
    }

    #[tokio::test]
    async fn one_statement_makes_the_thread_both_messages_in_order_and_the_run() {
        let db = TestDb::new().await.expect("db");
        let admission = admission();
        let (alice, quotas) = (owner("alice"), Quotas::default());
        let thread_id = ThreadId::new();
        let enqueued = alone(&db, &message(thread_id, &alice, &quotas, &admission))
            .await
            .expect("enqueue");
        let order: Vec<(MessageId, String)> =
            sqlx::query_as("SELECT id, status FROM messages WHERE thread_id = $1 ORDER BY seq")
                .bind(thread_id)
                .fetch_all(&db.pool)
                .await
                .expect("messages");
        assert_eq!(
            order,
            [
                (enqueued.user_message_id, "completed".to_owned()),
                (enqueued.message_id, "queued".to_owned()),
            ]
        );
        let run = runs::find(&db.pool, enqueued.workflow_id, &alice)
            .await
            .expect("find")
            .expect("the run");
        assert_eq!((run.thread_id, run.agent_id), (thread_id, None));
        // A second message while the first runs: the busy rule, nothing added.
        let busy = alone(&db, &message(thread_id, &alice, &quotas, &admission)).await;
        assert!(matches!(busy, Err(EnqueueError::ThreadBusy)), "{busy:?}");
        assert_eq!(rows(&db, thread_id).await, (2, 1));
    }

    #[tokio::test]
    async fn another_owners_thread_is_not_found_and_keeps_its_rows_and_time() {
        let db = TestDb::new().await.expect("db");
        let admission = admission();
        let (alice, bob, quotas) = (owner("alice"), owner("bob"), Quotas::default());
        let thread_id = ThreadId::new();
        alone(&db, &message(thread_id, &alice, &quotas, &admission))
            .await
            .expect("alice's message");
        let touched = || async {
            let (at,): (chrono::DateTime<chrono::Utc>,) =
                sqlx::query_as("SELECT last_message_at FROM threads WHERE id = $1")
                    .bind(thread_id)
                    .fetch_one(&db.pool)
                    .await
                    .expect("thread");
            at
        };
        let before = touched().await;
        let refused = alone(&db, &message(thread_id, &bob, &quotas, &admission)).await;
        assert!(
            matches!(refused, Err(EnqueueError::ThreadNotFound)),
            "{refused:?}"
        );
        assert_eq!(rows(&db, thread_id).await, (2, 1));
        assert_eq!(touched().await, before);
    }

    #[tokio::test]
    async fn a_message_naming_no_agent_is_answered_by_its_threads_agent() {
        let db = TestDb::new().await.expect("db");
        let admission = admission();
        let (alice, quotas) = (owner("alice"), Quotas::default());
        let mut spec = AgentSpec::default_agent("gpt-4o-mini", "Be the thread's agent.");
        spec.name = "steady".into();
        let agent_id = AgentId::new();
        agents::insert(&db.pool, agent_id, "acme", &spec)
            .await
            .expect("agent");
        let thread_id = ThreadId::new();
        threads::create(&db.pool, thread_id, &alice, Some(agent_id), &json!({}))
            .await
            .expect("create")
            .expect("a new thread");
        // The guess (no agent) is wrong: the insert declines, the thread is looked up, and the
        // second try carries the thread's agent and its spec.
        let enqueued = alone(&db, &message(thread_id, &alice, &quotas, &admission))
            .await
            .expect("enqueue");
        let run = runs::find(&db.pool, enqueued.workflow_id, &alice)
            .await
            .expect("find")
            .expect("the run");
        assert_eq!(run.agent_id, Some(agent_id));
        assert_eq!(
            run.agent_spec.map(|spec| spec.0.instructions),
            Some("Be the thread's agent.".to_owned())
        );
        assert_eq!(rows(&db, thread_id).await, (2, 1));
    }

    #[tokio::test]
    async fn a_quota_refuses_a_run_enqueued_alone_and_nothing_is_left() {
        let db = TestDb::new().await.expect("db");
        let admission = admission();
        let alice = owner("alice");
        let quotas = Quotas {
            user: QuotaLimits {
                max_concurrent_runs: Some(1),
                ..QuotaLimits::default()
            },
            tenant: QuotaLimits::default(),
            ip: QuotaLimits::default(),
        };
        alone(&db, &message(ThreadId::new(), &alice, &quotas, &admission))
            .await
            .expect("the first run");
        let thread_id = ThreadId::new();
        let refused = alone(&db, &message(thread_id, &alice, &quotas, &admission)).await;
        let Err(EnqueueError::Refused(refusal)) = refused else {
            panic!("not refused: {refused:?}");
        };
        assert_eq!(refusal.code, "concurrency_limited");
        // Not even the thread: nothing is written for a refused run.
        let (threads,): (i64,) = sqlx::query_as("SELECT count(*) FROM threads WHERE id = $1")
            .bind(thread_id)
            .fetch_one(&db.pool)
            .await
            .expect("threads");
        assert_eq!((threads, rows(&db, thread_id).await), (0, (0, 0)));
    }
}
