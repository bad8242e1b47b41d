//! The enqueue: `POST user_message`'s work, shared with the OpenAI-compatible routes.
//!
//! The enqueue is atomic: [`enqueue`] (thread on first use, user message, assistant message,
//! run) is one statement, alone when the request has no `Idempotency-Key`; with one it is a
//! transaction: the key, the enqueue, then the key's stored response. A `202` therefore means
//! all of it is committed (invariant 1), and any error before the commit leaves nothing behind
//! (invariant 10); a commit that fails gives back what the run took in its quotas. After the
//! commit the workers are woken (`crate::wake`).

use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use spool_shared::agent::{
    FieldError, RunDefaults, RunOverrides, StepRule, StopCondition, ToolChoice,
};
use spool_shared::db::LazyConn;
use spool_shared::db::enqueue::{EnqueueError, Enqueued, NewMessage, enqueue};
use spool_shared::db::quota::Refusal;
use spool_shared::db::runs;
use spool_shared::db::threads::Owner;
use spool_shared::db::{agents, idempotency};
use spool_shared::ids::AgentId;
use spool_shared::status::Role;
use spool_shared::{MessageId, ThreadId, WorkflowId};

use super::{stream_url, thread_not_found};
use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::ApiError;

const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Body of `POST /v1/threads/{thread_id}/user_message`.
///
/// Beside the text, a message may steer its own run (its overrides): each that has the wrong
/// type, or does not fit the agent that answers, is a 422 `invalid_overrides` naming it.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserMessageRequest {
    /// What the user said (not blank; at most the server's input limit in bytes).
    #[schema(min_length = 1, pattern = "\\S")]
    pub input_text: String,
    /// The agent that answers this message; else the thread's, else the default.
    #[serde(default)]
    pub agent_id: Option<AgentId>,
    /// A public session's client address (never from the body), for `governance.ip`.
    #[serde(skip)]
    pub client: Option<String>,
    /// Caller-defined metadata stored on the user message.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    /// The tool choice of this run's steps (in place of the agent's; step rules still apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// The tools offered in this run's steps (names of the agent's tools; in place of its
    /// `active_tools`; step rules still apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_tools: Option<Vec<String>>,
    /// Model calls of this run at most: from 1 up to the agent's ceiling (its
    /// `limits.max_steps`, else its `max_steps`, which is the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 200)]
    pub max_steps: Option<u32>,
    /// Appended to the agent's system prompt for this run (at most 64 KiB): from an `admin`
    /// token, or from any caller when the agent sets `allow_instruction_override`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Earlier turns stored in the thread before `input_text` (at most 100, each held to the
    /// limits of `input_text`): a conversation to seed or extend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 100)]
    pub messages: Option<Vec<Turn>>,
    /// Rules for steps of this run (ahead of the agent's): `{step, tool_choice?,
    /// active_tools?}`, step 1 to the run's `max_steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_rules: Option<Vec<StepRule>>,
    /// Conditions that end this run after a step, beside the agent's (a `has_tool_call` of one
    /// of its tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_conditions: Option<Vec<StopCondition>>,
    /// Levels of agent calls this run may start below itself: 0 up to the agent's
    /// `limits.max_call_depth` (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 10)]
    pub max_call_depth: Option<u32>,
    /// `instructions` replace the agent's system prompt instead of adding to it (the
    /// OpenAI-compatible routes; admin only); never read from a request body.
    #[serde(skip)]
    pub(crate) replaces_instructions: bool,
    /// What the OpenAI-compatible routes post beside (their function tools, the tool choice of
    /// the first step, the parallel flag); never read from a request body.
    #[serde(skip)]
    pub(crate) functions: Option<RunOverrides>,
    /// The form of the final answer in place of the agent's `response_format` (set by the
    /// OpenAI-compatible routes' `text.format` / `response_format`; not a field of this body).
    #[serde(skip)]
    pub response_format: Option<spool_shared::agent::ResponseFormat>,
}

/// One earlier turn of a message's `messages`.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// Who said it.
    pub role: TurnRole,
    /// What was said (not blank).
    #[schema(min_length = 1)]
    pub content: String,
}

/// The speaker of an earlier turn.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnRole {
    /// The user.
    User,
    /// The assistant.
    Assistant,
}

impl From<TurnRole> for Role {
    fn from(role: TurnRole) -> Self {
        match role {
            TurnRole::User => Role::User,
            TurnRole::Assistant => Role::Assistant,
        }
    }
}

impl UserMessageRequest {
    /// The body of `POST user_message`: a field of the message's overrides with the wrong type
    /// is a 422 `invalid_overrides` naming it (every one of them), anything else wrong a 422
    /// `invalid_body`.
    pub(crate) fn parse(body: Value) -> Result<Self, ApiError> {
        let err = match serde_json::from_value(body.clone()) {
            Ok(request) => return Ok(request),
            Err(err) => err,
        };
        let mut problems = Vec::new();
        if let Value::Object(fields) = &body {
            let mut check = |name: &str, check: fn(&Value) -> Option<(String, String)>| {
                if let Some((at, message)) = fields.get(name).and_then(check) {
                    let field = match at.as_str() {
                        "." => name.to_owned(),
                        at if at.starts_with('[') => format!("{name}{at}"),
                        at => format!("{name}.{at}"),
                    };
                    problems.push(FieldError { field, message });
                }
            };
            check("tool_choice", wrong::<ToolChoice>);
            check("active_tools", wrong::<Vec<String>>);
            check("max_steps", wrong::<u32>);
            check("instructions", wrong::<String>);
            check("messages", wrong::<Vec<Turn>>);
            check("step_rules", wrong::<Vec<StepRule>>);
            check("stop_conditions", wrong::<Vec<StopCondition>>);
            check("max_call_depth", wrong::<u32>);
        }
        if problems.is_empty() {
            return Err(ApiError::unprocessable("invalid_body", err.to_string()));
        }
        Err(ApiError::invalid_fields(
            "invalid_overrides",
            "the message's overrides",
            problems,
        ))
    }

    /// What the message posts to steer its run, if anything.
    fn overrides(&self) -> Option<RunOverrides> {
        let defaults = RunDefaults {
            tool_choice: self.tool_choice.clone(),
            active_tools: self.active_tools.clone(),
        };
        let (instructions, extra_instructions) = if self.replaces_instructions {
            (self.instructions.clone(), None)
        } else {
            (None, self.instructions.clone())
        };
        let functions = self.functions.clone().unwrap_or_default();
        // The message's own rules, then those of the OpenAI routes' functions (`tool_choice`).
        let step_rules: Vec<StepRule> = self
            .step_rules
            .iter()
            .flatten()
            .chain(functions.step_rules.iter().flatten())
            .cloned()
            .collect();
        let overrides = RunOverrides {
            defaults: (defaults != RunDefaults::default()).then_some(defaults),
            max_steps: self.max_steps,
            instructions,
            extra_instructions,
            step_rules: (!step_rules.is_empty()).then_some(step_rules),
            stop_conditions: self.stop_conditions.clone(),
            max_call_depth: self.max_call_depth,
            response_format: self.response_format.clone(),
            ..functions
        };
        (overrides != RunOverrides::default()).then_some(overrides)
    }

    /// The problems of the message's earlier turns (`messages`), by field: too many, blank or
    /// too long ones.
    fn turn_problems(&self, max_bytes: usize) -> Vec<FieldError> {
        let turns = self.messages.as_deref().unwrap_or_default();
        let mut problems = Vec::new();
        if turns.len() > MAX_TURNS {
            problems.push(FieldError {
                field: "messages".into(),
                message: format!("at most {MAX_TURNS} earlier messages"),
            });
            return problems;
        }
        for (i, turn) in turns.iter().enumerate() {
            let message = if turn.content.trim().is_empty() {
                "must not be blank".to_owned()
            } else if turn.content.len() > max_bytes {
                format!("must be at most {max_bytes} bytes")
            } else {
                continue;
            };
            problems.push(FieldError {
                field: format!("messages[{i}].content"),
                message,
            });
        }
        problems
    }
}

/// Where and why `value` is not a `T`, if it is not.
fn wrong<T: serde::de::DeserializeOwned>(value: &Value) -> Option<(String, String)> {
    serde_path_to_error::deserialize::<_, T>(value)
        .err()
        .map(|err| (err.path().to_string(), err.inner().to_string()))
}

/// The `202` body of `POST user_message`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UserMessageResponse {
    /// The run that will answer.
    pub workflow_id: WorkflowId,
    /// The thread.
    pub thread_id: ThreadId,
    /// The stored user message.
    pub user_message_id: MessageId,
    /// The assistant message that will stream.
    pub message_id: MessageId,
    /// Always `queued`.
    #[schema(schema_with = crate::openapi::queued_status)]
    pub status: &'static str,
    /// Where to stream the events.
    pub stream_url: String,
}

/// The most earlier turns a message may bring (`POST /v1/responses` input items, a chat
/// completion's messages), each held to the same limits as the message.
pub(crate) const MAX_TURNS: usize = 100;

/// What [`enqueue_message`] answers: the 202 body, or the first one for a replayed key.
pub(crate) struct Enqueue {
    /// The status of the answer (202, or the stored one).
    pub status: StatusCode,
    /// The [`UserMessageResponse`] as JSON.
    pub body: Value,
    /// The run.
    pub workflow_id: WorkflowId,
    /// Whether an `Idempotency-Key` replayed an earlier request.
    pub replayed: bool,
}

/// Enqueues `request` on the thread as the caller (the transaction of the module doc): the
/// route's work, shared with the OpenAI-compatible routes. `hash` identifies the request under
/// its idempotency `key`; `history` is stored before the user message (a new thread seeded
/// with a conversation's earlier turns).
pub(crate) async fn enqueue_message(
    state: &AppState,
    caller: &Caller,
    thread_id: ThreadId,
    request: &UserMessageRequest,
    key: Option<&str>,
    hash: &str,
    history: &[(Role, String)],
) -> Result<Enqueue, ApiError> {
    check_message(state, caller, request, history)?;
    let overrides = request.overrides();
    let problems = request.turn_problems(state.config.max_input_bytes);
    // The message's own earlier turns, stored before it (none if any is refused).
    let turns = own_turns(request, &problems);
    let history = turns.as_deref().unwrap_or(history);
    let owner = &caller.owner;
    let window = state.config.retention.idempotency();
    // A missing (or private) agent is a 404 before a replay.
    check_agent(state, caller, request.agent_id).await?;
    if let Some(key) = key
        && let Some(stored) = idempotency::find(&state.db, &owner.tenant_id, key, window).await?
    {
        return replay(stored, hash);
    }

    // A transaction only when the run has company (a key, earlier turns): alone, its one
    // statement commits by itself (db::enqueue), on a connection taken only for it.
    let mut conn = if key.is_some() || !history.is_empty() {
        Conn::Tx(state.db.begin().await?)
    } else {
        Conn::Alone
    };
    if let Some(replayed) = taken_meanwhile(state, &mut conn, caller, key, hash).await? {
        return Ok(replayed);
    }
    let metadata = Value::Object(request.metadata.clone().unwrap_or_default());
    // The request's span context rides on the run, so the worker's attempt joins this trace.
    let trace_context = spool_shared::telemetry::inject_traceparent();
    let message = NewMessage {
        thread_id,
        owner,
        agent_id: request.agent_id,
        input_text: &request.input_text,
        metadata: &metadata,
        idempotency_key: key,
        trace_context: trace_context.as_deref(),
        quotas: &state.config.quotas,
        admission: &state.admission,
        overrides: overrides.as_ref(),
        history,
        in_transaction: matches!(conn, Conn::Tx(_)),
        client: request.client.as_deref(),
        may_instruct: caller.holds(Permission::Admin),
        problems: &problems,
    };
    let enqueued = match enqueue_admitted(state, &mut conn, message).await {
        Ok(enqueued) => enqueued,
        Err(EnqueueError::ThreadBusy) => {
            conn.rollback().await?;
            return Err(thread_busy(state, thread_id).await);
        }
        Err(err) => return Err(enqueue_error(err)),
    };
    let workflow_id = enqueued.workflow_id;
    let body = accepted_body(thread_id, &enqueued)?;
    if let Conn::Tx(tx) = conn {
        commit(state, owner, tx, key, &body, &enqueued).await?;
    }
    state.wake.wake();
    tracing::info!(thread.id = %thread_id, workflow.id = %workflow_id, "run enqueued");
    Ok(Enqueue {
        status: StatusCode::ACCEPTED,
        body,
        workflow_id,
        replayed: false,
    })
}

/// The message's own earlier turns (`messages`), unless none are posted or a turn is refused
/// (`problems`), in which case nothing is stored before it.
fn own_turns(request: &UserMessageRequest, problems: &[FieldError]) -> Option<Vec<(Role, String)>> {
    let messages = request.messages.as_ref()?;
    (!messages.is_empty() && problems.is_empty()).then(|| {
        messages
            .iter()
            .map(|turn| (turn.role.into(), turn.content.clone()))
            .collect()
    })
}

/// Takes the request's `Idempotency-Key` in `conn`'s transaction (none without a key). When a
/// concurrent duplicate committed it first (its row was waited on), the transaction is rolled
/// back and that request's answer is replayed.
async fn taken_meanwhile(
    state: &AppState,
    conn: &mut Conn,
    caller: &Caller,
    key: Option<&str>,
    hash: &str,
) -> Result<Option<Enqueue>, ApiError> {
    let (Some(key), Conn::Tx(tx)) = (key, &mut *conn) else {
        return Ok(None);
    };
    let (tenant, window) = (
        &caller.owner.tenant_id,
        state.config.retention.idempotency(),
    );
    if idempotency::reserve(&mut **tx, tenant, key, hash, window).await? {
        return Ok(None);
    }
    std::mem::replace(conn, Conn::Alone).rollback().await?;
    let stored = idempotency::find(&state.db, tenant, key, window)
        .await?
        .ok_or_else(|| anyhow::anyhow!("idempotency key vanished"))?;
    replay(stored, hash).map(Some)
}

/// Runs the enqueue on `conn`. The pooled connection (if one was taken) goes back before an
/// error is looked into, which takes another. When Redis cannot admit a run enqueued alone,
/// Postgres admits it, in a transaction that holds the counters' locks to its commit
/// (docs/operations.md, "Redis outages"), which `conn` then holds.
async fn enqueue_admitted(
    state: &AppState,
    conn: &mut Conn,
    message: NewMessage<'_>,
) -> Result<Enqueued, EnqueueError> {
    let result = enqueue(&mut conn.lazy(&state.db), &message).await;
    if let (Err(EnqueueError::QuotasUnavailable(_)), Conn::Alone) = (&result, &*conn) {
        *conn = Conn::Tx(state.db.begin().await?);
        let message = NewMessage {
            in_transaction: true,
            ..message
        };
        return enqueue(&mut conn.lazy(&state.db), &message).await;
    }
    result
}

/// The `202` body of an enqueued message.
fn accepted_body(thread_id: ThreadId, enqueued: &Enqueued) -> Result<Value, ApiError> {
    let body = UserMessageResponse {
        workflow_id: enqueued.workflow_id,
        thread_id,
        user_message_id: enqueued.user_message_id,
        message_id: enqueued.message_id,
        status: "queued",
        stream_url: stream_url(thread_id),
    };
    Ok(serde_json::to_value(&body).map_err(anyhow::Error::from)?)
}

/// The checks of a message before anything is read or written: its text and earlier turns
/// within the limits, instructions that replace the agent's only from an admin.
fn check_message(
    state: &AppState,
    caller: &Caller,
    request: &UserMessageRequest,
    history: &[(Role, String)],
) -> Result<(), ApiError> {
    check_input(&request.input_text, state.config.max_input_bytes)?;
    if history.len() > MAX_TURNS {
        return Err(ApiError::bad_request(
            "too_many_turns",
            format!("at most {MAX_TURNS} earlier messages are stored with a message"),
        ));
    }
    for (_, text) in history {
        check_input(text, state.config.max_input_bytes)?;
    }
    if request.instructions.is_some() && request.replaces_instructions {
        caller.require(Permission::Admin)?;
    }
    Ok(())
}

/// The answer to an enqueue that failed (a busy thread, which needs the database, aside).
fn enqueue_error(err: EnqueueError) -> ApiError {
    match err {
        EnqueueError::ThreadNotFound => thread_not_found(),
        EnqueueError::AgentNotFound => ApiError::not_found("agent_not_found", "no such agent"),
        EnqueueError::AgentDisabled => ApiError::Forbidden {
            code: "agent_disabled",
            message: "the agent is disabled and takes no new runs".into(),
            details: serde_json::Map::new(),
        },
        EnqueueError::ThreadBusy => ApiError::conflict("thread_busy", "the thread is busy"),
        EnqueueError::Refused(refusal) => refused(&refusal),
        EnqueueError::QuotasUnavailable(err) => {
            tracing::warn!(error = %err, "the quota counters are unavailable");
            ApiError::Unavailable {
                code: "quotas_unavailable",
                message: "the quota counters are unavailable; try again".into(),
                retry_after: 1,
            }
        }
        EnqueueError::InvalidOverrides(errors) => {
            ApiError::invalid_fields("invalid_overrides", "the message's overrides", errors)
        }
        EnqueueError::Db(err) => err.into(),
    }
}

/// Commits an enqueue's transaction with the key's stored answer; if it fails, nothing was
/// made, and what the run took in its quotas goes back.
async fn commit(
    state: &AppState,
    owner: &Owner,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    key: Option<&str>,
    body: &Value,
    enqueued: &Enqueued,
) -> Result<(), ApiError> {
    let workflow_id = enqueued.workflow_id;
    let recorded = match key {
        Some(key) => {
            idempotency::record(&mut *tx, &owner.tenant_id, key, 202, body, workflow_id).await
        }
        None => Ok(()),
    };
    let committed = match recorded {
        Ok(()) => tx.commit().await,
        Err(err) => Err(err),
    };
    if let Err(err) = committed {
        if let Some((quota, taken_ms)) = &enqueued.admitted {
            state
                .admission
                .undo(&owner.tenant_id, workflow_id, quota, *taken_ms)
                .await;
        }
        return Err(err.into());
    }
    Ok(())
}

/// Where an enqueue runs: a transaction (rolled back when dropped uncommitted), or, for an
/// enqueue that is one statement, outside any, on a pooled connection taken when it writes.
enum Conn {
    Tx(sqlx::Transaction<'static, sqlx::Postgres>),
    /// No transaction: the enqueue takes a connection from the pool when it writes.
    Alone,
}

impl Conn {
    fn lazy<'a>(&'a mut self, pool: &'a sqlx::PgPool) -> LazyConn<'a> {
        match self {
            Conn::Tx(tx) => LazyConn::Held(tx),
            Conn::Alone => LazyConn::pool(pool),
        }
    }

    /// Rolls a transaction back now, releasing its locks before the caller reads again (a
    /// failed statement alone has nothing to roll back).
    async fn rollback(self) -> sqlx::Result<()> {
        match self {
            Conn::Tx(tx) => tx.rollback().await,
            Conn::Alone => Ok(()),
        }
    }
}

/// The 429 of a quota's refusal.
fn refused(refusal: &Refusal) -> ApiError {
    let error = ApiError::TooManyRequests {
        code: refusal.code,
        message: refusal.message(),
        retry_after: refusal.retry_after,
        details: serde_json::Map::new(),
    }
    .with("scope", refusal.scope.as_str())
    .with("retry_after", refusal.retry_after);
    let error = match refusal.limit_usd {
        Some(usd) => error.with("limit_usd", usd.0),
        None => error.with("limit", refusal.limit),
    };
    match &refusal.agent_id {
        Some(agent_id) => error.with("agent_id", agent_id),
        None => error,
    }
}

/// The input must not be blank, nor longer than `max_bytes`.
fn check_input(text: &str, max_bytes: usize) -> Result<(), ApiError> {
    if text.trim().is_empty() {
        return Err(ApiError::unprocessable(
            "invalid_input_text",
            "input_text must not be empty",
        ));
    }
    if text.len() > max_bytes {
        return Err(ApiError::invalid(
            StatusCode::PAYLOAD_TOO_LARGE,
            "input_too_large",
            format!("input_text is over {max_bytes} bytes"),
        ));
    }
    Ok(())
}

/// The request's `Idempotency-Key`, if it has a valid one.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key) if (1..=255).contains(&key.len()) => Ok(Some(key)),
        _ => Err(ApiError::bad_request(
            "invalid_idempotency_key",
            "Idempotency-Key must be 1 to 255 visible ASCII characters",
        )),
    }
}

/// The first answer to a request with this key; 422 if the key came with another request.
fn replay(stored: idempotency::Stored, hash: &str) -> Result<Enqueue, ApiError> {
    if stored.request_hash != hash {
        return Err(ApiError::unprocessable(
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request",
        ));
    }
    let status = u16::try_from(stored.status_code)
        .ok()
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| anyhow::anyhow!("stored status {} is not valid", stored.status_code))?;
    let workflow_id: WorkflowId = serde_json::from_value(stored.response.0["workflow_id"].clone())
        .map_err(anyhow::Error::from)?;
    Ok(Enqueue {
        status,
        body: stored.response.0,
        workflow_id,
        replayed: true,
    })
}

/// 404 `agent_not_found` unless the caller's tenant has the agent (if one is named) and the
/// caller may use it (a `private` agent: only with `agents:write`).
pub(crate) async fn check_agent(
    state: &AppState,
    caller: &Caller,
    agent_id: Option<AgentId>,
) -> Result<(), ApiError> {
    if let Some(agent_id) = agent_id
        && !agents::find(&state.db, agent_id, &caller.owner.tenant_id)
            .await?
            .is_some_and(|agent| crate::auth::public::may_use(caller, &agent.spec.0))
    {
        return Err(ApiError::not_found("agent_not_found", "no such agent"));
    }
    Ok(())
}

/// 409 `thread_busy`, naming the thread's active run.
async fn thread_busy(state: &AppState, thread_id: ThreadId) -> ApiError {
    let active = match runs::find_active(&state.db, thread_id).await {
        Ok(active) => active,
        Err(err) => return err.into(),
    };
    ApiError::conflict(
        "thread_busy",
        "the thread already has an active run; wait for it to finish",
    )
    .with("active_workflow_id", active.map(|run| run.id))
    .with("stream_url", stream_url(thread_id))
}
