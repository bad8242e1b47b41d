//! The enqueue: a user's message becomes a queued run (invariant 1).
//!
//! In the caller's transaction: the thread on first use (if the id is a UUID no one else owns),
//! the user message, the assistant message that will stream (status `queued`, so its id is
//! known at once and its content is written exactly once, when the run ends), the run with the
//! spec of its agent as it is now (the run executes that spec, whatever happens to the agent
//! later), and a NOTIFY that wakes the workers when the transaction commits: the thread in one
//! statement, the rest in a second ([`runs::insert_with_messages`]). A `202` therefore means
//! all of it is committed, and any error before the commit leaves nothing behind. The partial unique index
//! on active runs refuses a second one on the thread (invariant 2). When quotas apply, the run
//! carries its counters and the COMMIT counts it in them (`db::quota`): commit with
//! [`commit`], which answers a run over a limit with [`EnqueueError::Refused`], everything
//! rolled back.

use serde_json::Value;
use sqlx::PgConnection;

use crate::agent::{AgentSpec, FieldError, RunOverrides};
use crate::db::quota::{self, Refusal};
use crate::db::runs::{self, NewRun};
use crate::db::threads::{self, Owner};
use crate::db::{agents, is_unique_violation, messages};
use crate::ids::{AgentId, MessageId, ThreadId, WorkflowId};
use crate::quota::{Quotas, counters};
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
    /// What the message posts to steer its run (checked against the agent that answers).
    pub overrides: Option<&'a RunOverrides>,
    /// Earlier turns stored before the message, completed and without a run (a thread seeded
    /// with a conversation the client kept, as `POST /v1/chat/completions` sends it).
    pub history: &'a [(Role, String)],
}

/// What the enqueue made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The run that will answer.
    pub workflow_id: WorkflowId,
    /// The stored user message.
    pub user_message_id: MessageId,
    /// The assistant message that will stream.
    pub message_id: MessageId,
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
    /// The message's overrides do not fit the agent that answers (by field).
    #[error("the overrides do not fit the agent")]
    InvalidOverrides(Vec<FieldError>),
    /// Postgres failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Enqueues `message` in the caller's transaction (see the module doc).
pub async fn enqueue(
    tx: &mut PgConnection,
    message: &NewMessage<'_>,
) -> Result<Enqueued, EnqueueError> {
    let thread_id = message.thread_id;
    let thread_agent = threads::ensure_owned(tx, thread_id, message.owner, message.agent_id)
        .await?
        .ok_or(EnqueueError::ThreadNotFound)?;
    let agent_id = message.agent_id.or(thread_agent);
    let agent_spec = match agent_id {
        Some(id) => {
            let spec = agents::find(&mut *tx, id, &message.owner.tenant_id)
                .await?
                .ok_or(EnqueueError::AgentNotFound)?
                .spec
                .0;
            if !spec.status.is_active() {
                return Err(EnqueueError::AgentDisabled);
            }
            Some(spec)
        }
        None => None,
    };
    if let Some(overrides) = message.overrides {
        // The server's default agent has no tools: only tool choices that name none fit it.
        let agent = agent_spec
            .clone()
            .unwrap_or_else(|| AgentSpec::default_agent("default", ""));
        let mut problems = overrides.validate(&agent, 1);
        problems.extend(overrides.clashes(&agent, 1));
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
    let enqueued = Enqueued {
        workflow_id: WorkflowId::new(),
        user_message_id: MessageId::new(),
        message_id: MessageId::new(),
    };
    let workflow_id = enqueued.workflow_id;
    let governance = agent_id.zip(agent_spec.as_ref().map(|spec| &spec.governance));
    let quota = counters(message.quotas, governance, &message.owner.user_id);
    for (role, content) in message.history {
        messages::insert_turn(&mut *tx, MessageId::new(), thread_id, *role, content).await?;
    }
    let run = NewRun {
        id: workflow_id,
        thread_id,
        owner: message.owner,
        agent_id,
        agent_spec: agent_spec.as_ref(),
        user_message_id: enqueued.user_message_id,
        assistant_message_id: enqueued.message_id,
        idempotency_key: message.idempotency_key,
        trace_context: message.trace_context,
        quota: quota.as_ref(),
        overrides: message.overrides,
    };
    let inserted =
        runs::insert_with_messages(&mut *tx, &run, message.input_text, message.metadata).await;
    if let Err(err) = inserted {
        if is_unique_violation(&err, runs::ONE_ACTIVE_PER_THREAD) {
            return Err(EnqueueError::ThreadBusy);
        }
        return Err(err.into());
    }
    Ok(enqueued)
}

/// Commits an enqueue's transaction: quotas are checked here (see the module doc).
pub async fn commit(tx: sqlx::Transaction<'_, sqlx::Postgres>) -> Result<(), EnqueueError> {
    tx.commit().await.map_err(|err| match quota::refusal(&err) {
        Some(refusal) => EnqueueError::Refused(refusal),
        None => EnqueueError::Db(err),
    })
}
