//! What the two create routes (`POST /v1/responses`, `POST /v1/chat/completions`) share once
//! their request is read: the follow-up that answers the function calls a run paused at, the
//! run's message, and its enqueue.
//!
//! Both take a stream's slot before anything is enqueued or goes on, so a refused stream
//! creates nothing; both hash the request (its caller, route and body) for its
//! `Idempotency-Key`, so a retry gets what the first request started, not a second run.

use axum::http::HeaderMap;
use serde_json::{Map, Value};

use spool_shared::agent::{ResponseFormat, Sampling};
use spool_shared::db::idempotency;
use spool_shared::ids::AgentId;
use spool_shared::status::Role;
use spool_shared::{ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::gateway::{self, StreamSlot};
use crate::openai::functions::{self, Functions, Outputs};
use crate::openai::sampling;
use crate::runs::enqueue::{UserMessageRequest, enqueue_message, idempotency_key};

/// A create request, as the parts both routes share see it.
pub(crate) struct Create<'a> {
    pub state: &'a AppState,
    pub caller: &'a Caller,
    pub headers: &'a HeaderMap,
    /// The body as sent.
    pub raw: &'a Value,
    /// The route's name in the request's hash (`responses`, `chat.completions`).
    pub route: &'static [u8],
    /// Whether the answer streams (`stream: true`).
    pub stream: bool,
}

impl<'a> Create<'a> {
    /// Answers the calls of the run `previous` names (else of the caller's run that waits for
    /// them) with `outputs` (`param` names them in errors): the same run goes on. Returns the
    /// stream's slot (taken first), the run and the segment it goes on as.
    pub(crate) async fn follow_up(
        &self,
        previous: Option<&str>,
        outputs: Outputs,
        functions: &Functions,
        sampling: &Sampling,
        param: &'static str,
    ) -> Result<(Option<StreamSlot>, WorkflowId, u32), ApiError> {
        let slot = self.slot()?;
        let key = self.follow_up_key()?;
        let (run, segment) = functions::follow_up(
            self.state,
            self.caller,
            previous,
            outputs,
            functions,
            sampling,
            param,
            key.as_ref(),
        )
        .await?;
        Ok((slot, run, segment))
    }

    /// Enqueues `message` on the thread `thread_id`, after `history` (its earlier turns, stored
    /// first). Returns the stream's slot (taken before the enqueue) and the run. The thread is
    /// not part of the request's identity: a new conversation gets a new id on each try.
    pub(crate) async fn enqueue(
        &self,
        thread_id: ThreadId,
        message: &UserMessageRequest,
        history: &[(Role, String)],
    ) -> Result<(Option<StreamSlot>, WorkflowId), ApiError> {
        let key = idempotency_key(self.headers)?;
        let slot = self.slot()?;
        let hash = self.hash()?;
        let enqueued = enqueue_message(
            self.state,
            self.caller,
            thread_id,
            message,
            key,
            &hash,
            history,
        )
        .await?;
        Ok((slot, enqueued.workflow_id))
    }

    /// A follow-up's `Idempotency-Key`, if it has one, with the request's hash.
    pub(crate) fn follow_up_key(&self) -> Result<Option<functions::FollowUpKey<'a>>, ApiError> {
        let Some(key) = idempotency_key(self.headers)? else {
            return Ok(None);
        };
        let hash = self.hash()?;
        Ok(Some(functions::FollowUpKey { key, hash }))
    }

    /// The stream's slot, if the answer streams.
    fn slot(&self) -> Result<Option<StreamSlot>, ApiError> {
        self.stream
            .then(|| gateway::stream_slot(self.state, self.caller))
            .transpose()
    }

    /// The hash of the request: its caller, route and body.
    fn hash(&self) -> Result<String, ApiError> {
        Ok(idempotency::request_hash(&[
            self.caller.owner.user_id.as_bytes(),
            self.route,
            &serde_json::to_vec(self.raw).map_err(anyhow::Error::from)?,
        ]))
    }
}

/// The run's message an OpenAI request posts: `input_text` for the agent `agent_id`, with
/// `instructions` as its system prompt, the request's function tools and sampling, and the
/// answer's form.
pub(crate) fn message(
    input_text: String,
    agent_id: Option<AgentId>,
    metadata: Option<Map<String, Value>>,
    instructions: Option<String>,
    functions: &Functions,
    sampling: &Sampling,
    response_format: Option<ResponseFormat>,
) -> UserMessageRequest {
    UserMessageRequest {
        input_text,
        agent_id,
        metadata,
        tool_choice: None,
        active_tools: None,
        max_steps: None,
        client: None,
        instructions,
        functions: sampling::add_to(functions.overrides(), sampling),
        response_format,
        // An OpenAI request's instructions are its system prompt.
        replaces_instructions: true,
        ..UserMessageRequest::default()
    }
}
