//! The Responses API: `POST /v1/responses`, `GET /v1/responses/{id}` (with `?stream=true` and
//! `starting_after`), `POST /v1/responses/{id}/cancel`.
//!
//! A response is a run: its `id` is the `workflow_id`. `conversation` names the thread (any
//! UUID: created on first use, as Spool's own route does), `previous_response_id` continues the
//! thread of that response; with neither, a new thread. Input items before the last user
//! message are stored as earlier turns of the thread; `system`/`developer` items and
//! `instructions` replace the agent's system prompt (admin tokens only, as Spool's own
//! `instructions`). Function `tools`, `tool_choice` and `parallel_tool_calls` are the run's
//! client tools ([`functions`]): a response ends at their calls, and `function_call_output`
//! items answer them (the same run goes on as a new response). `temperature`, `top_p`,
//! `max_output_tokens` and `reasoning.effort` apply to the run's model calls ([`sampling`]);
//! `text.format` is the answer's form ([`format`](mod@crate::openai::format)). `store`, `user`, `prompt_cache_key`,
//! `safety_identifier` and `stream_options` are accepted and change nothing (every run is
//! stored); parameters Spool cannot honour are refused ([`params`]).
//!
//! The three routes stay together: they share the request's translation and the response
//! object's assembly from the run, and the stream replays that same object event by event.
//! Its pieces that stand alone live beside it (`create`, `functions`, `sampling`, `params`,
//! `format`, `translate`).

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use spool_shared::db::runs;
use spool_shared::db::runs::Run;
use spool_shared::status::Role;
use spool_shared::{ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::gateway;
use crate::openai::conversations::parse_conversation;
use crate::openai::create::{self, Create};
use crate::openai::echo;
use crate::openai::feed::{Feed, Followed};
use crate::openai::format;
use crate::openai::functions::{self, Api, Functions, ResponseRef};
use crate::openai::params;
use crate::openai::sampling;
use crate::openai::translate::ResponseEvents;
use crate::openai::{find_run as find, resolve_model, response_not_found, wait_for_run};
use crate::runs::cancel::cancel;
use spool_shared::event::transcript::{Pause, Shown};
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/responses...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_response))
        .routes(routes!(get_response))
        .routes(routes!(cancel_response))
}

/// `input`: a string, or a list of items.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// `conversation`: an id, or `{id}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ConversationRef {
    Id(String),
    Object { id: String },
}

/// The body of `POST /v1/responses` (parameters not named here are accepted and ignored).
#[derive(Debug, Deserialize)]
struct CreateResponse {
    model: String,
    #[serde(default)]
    input: Option<Input>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    conversation: Option<ConversationRef>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    background: Option<bool>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

/// The user's text, earlier turns and system prompt an `input` holds.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Turns {
    /// The last user message: what the run answers.
    pub input_text: String,
    /// The items before it (user and assistant text).
    pub history: Vec<(Role, String)>,
    /// `system` and `developer` text.
    pub instructions: Option<String>,
}

/// The text of an item's `content`: a string, or the text of its text parts.
pub(crate) fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match part["type"].as_str() {
                    Some("input_text" | "output_text" | "text") => {
                        text.push_str(part["text"].as_str()?);
                    }
                    _ => return None,
                }
            }
            Some(text)
        }
        _ => None,
    }
}

/// Splits message items (`{role, content}`, `type` `message` or absent) into [`Turns`].
pub(crate) fn turns(items: &[Value], param: &'static str) -> Result<Turns, ApiError> {
    let unsupported = |index: usize, why: &str| {
        ApiError::bad_request(
            "unsupported_input",
            format!("{param}[{index}]: {why}; Spool takes text messages (roles user, assistant, system, developer)"),
        )
        .with("param", param)
    };
    let mut turns = Turns::default();
    let mut messages: Vec<(Role, String)> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        if !matches!(item["type"].as_str(), None | Some("message")) {
            return Err(unsupported(index, "not a message item"));
        }
        let text = content_text(&item["content"])
            .ok_or_else(|| unsupported(index, "content is not text"))?;
        match item["role"].as_str() {
            Some("user") => messages.push((Role::User, text)),
            Some("assistant") => messages.push((Role::Assistant, text)),
            Some("system" | "developer") => {
                let instructions = turns.instructions.get_or_insert_with(String::new);
                if !instructions.is_empty() {
                    instructions.push_str("\n\n");
                }
                instructions.push_str(&text);
            }
            _ => return Err(unsupported(index, "an unknown role")),
        }
    }
    let last_user = messages
        .iter()
        .rposition(|(role, _)| *role == Role::User)
        .ok_or_else(|| {
            ApiError::bad_request("invalid_input", format!("{param} has no user message"))
                .with("param", param)
        })?;
    if last_user + 1 != messages.len() {
        return Err(ApiError::bad_request(
            "invalid_input",
            format!("{param} must end with a user message"),
        )
        .with("param", param));
    }
    turns.input_text = messages.pop().map(|(_, text)| text).unwrap_or_default();
    turns.history = messages
        .into_iter()
        .filter(|(_, text)| !text.trim().is_empty())
        .collect();
    Ok(turns)
}

/// Creates a response: a run on the conversation's thread. `background`: answers at once
/// (`queued`); `stream`: streams its events on this request (resume a dropped stream with
/// `GET /v1/responses/{id}?stream=true&starting_after=N`); neither: waits for its end (at most
/// 10 minutes, then answers the response as it is).
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    security(("bearer" = ["runs:create"])),
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
        description = "A retry with the same key and body gets the first response, not a second run; a retried function-call follow-up gets the response it went on as (`extra_headers=` in the SDKs).")),
    request_body = crate::openai::schema::CreateResponseRequest,
    responses(
        (status = 200, description = "The response (JSON), or its events (`stream: true`).",
            content(
                (crate::openai::schema::ResponseObject = "application/json"),
                (crate::openai::schema::ResponseStreamEvent = "text/event-stream"),
            )),
        (status = 400, description = "`invalid_body`, `invalid_json`, `invalid_input`, `unsupported_input`, `ambiguous_model`; `unsupported_parameter` (a parameter, hosted tool or tool choice Spool does not apply), `invalid_value` (`temperature`, `top_p`, an output limit or a reasoning effort out of range), `instructions_not_allowed` (`instructions`, `system` or `developer` input without an admin token); function calling: `invalid_tools`, `no_pending_call`, `unknown_call_id`, `missing_function_call_outputs` (with `missing`); `param` names the parameter", body = crate::openai::schema::OpenAiErrorBody),
        crate::openai::schema::OpenAiUnauthenticated,
        (status = 403, description = "`forbidden`: the token lacks `runs:create` (`permission` says which); `agent_disabled`: the agent (the `model`) is disabled", body = crate::openai::schema::OpenAiErrorBody),
        (status = 404, description = "`model_not_found`, `response_not_found` (`previous_response_id`), `conversation_not_found`, `thread_not_found`", body = crate::openai::schema::OpenAiErrorBody),
        (status = 409, description = "`thread_busy` (the conversation has a run in progress); a follow-up: `run_not_waiting`, `idempotency_key_in_use`", body = crate::openai::schema::OpenAiErrorBody),
        crate::openai::schema::OpenAiEnqueueRefusals,
    )
)]
pub(crate) async fn create_response(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(raw): ApiJson<Value>,
) -> Result<Response, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let request: CreateResponse = serde_json::from_value(raw.clone())
        .map_err(|err| ApiError::bad_request("invalid_body", err.to_string()))?;
    params::check_responses(&raw)?;
    let functions = Functions::parse(&raw, Api::Responses)?;
    let sampling = sampling::parse(&raw, Api::Responses)?;
    let agent_id = resolve_model(&state, &caller, &request.model).await?;
    let create = Create {
        state: &state,
        caller: &caller,
        headers: &headers,
        raw: &raw,
        route: b"responses",
        stream: request.stream == Some(true),
    };
    if let Some(Input::Items(items)) = &request.input
        && let Some(outputs) = answers(items)?
    {
        // The outputs of the calls a response ended with: the same run goes on.
        let previous = request.previous_response_id.as_deref();
        let (slot, run, segment) = create
            .follow_up(previous, outputs, &functions, &sampling, "input")
            .await?;
        return respond(&state, &caller, slot, run, segment, request.background).await;
    }
    let turns = input_turns(request.input.as_ref())?;
    if request.instructions.is_some() {
        params::check_instructions(&caller, "instructions")?;
    }
    if turns.instructions.is_some() {
        params::check_instructions(&caller, &instructions_param(&request.input, "input"))?;
    }
    if !functions.tools.is_empty() {
        functions.check_names(&agent_tool_names(&state, &caller, agent_id).await?)?;
    }
    let thread_id = thread_of(&state, &caller, &request).await?;
    let instructions = match (request.instructions.clone(), turns.instructions) {
        (Some(a), Some(b)) => Some(format!("{a}\n\n{b}")),
        (a, b) => a.or(b),
    };
    let message = create::message(
        turns.input_text,
        agent_id,
        request.metadata.clone(),
        instructions,
        &functions,
        &sampling,
        format::from_text(raw.get("text"))?,
    );
    let (slot, id) = create.enqueue(thread_id, &message, &turns.history).await?;
    let agent = agent_spec(&state, &caller, agent_id).await?;
    let mut echoed = echo::of_request(&raw);
    for (field, value) in sampling::echoed(&sampling, agent.as_ref()) {
        echoed[field] = value;
    }
    echo::save(&state.db, id, &echoed).await?;
    respond(&state, &caller, slot, id, 0, request.background).await
}

/// The turns of a request's `input`: its text, or its items (without the function calls of
/// earlier turns); 400 without one.
fn input_turns(input: Option<&Input>) -> Result<Turns, ApiError> {
    match input {
        Some(Input::Text(text)) => Ok(Turns {
            input_text: text.clone(),
            ..Turns::default()
        }),
        Some(Input::Items(items)) => turns(&without_calls(items), "input"),
        None => {
            Err(ApiError::bad_request("invalid_input", "input is required").with("param", "input"))
        }
    }
}

/// The answer of a create: segment `segment` of the run streamed (with a `slot`), as it is
/// (`background`), or once the run has ended or paused.
async fn respond(
    state: &AppState,
    caller: &Caller,
    slot: Option<gateway::StreamSlot>,
    id: WorkflowId,
    segment: u32,
    background: Option<bool>,
) -> Result<Response, ApiError> {
    if let Some(slot) = slot {
        let run = find(state, caller, id).await?;
        return stream(state, caller, slot, run, segment, None).await;
    }
    let run = if background == Some(true) {
        find(state, caller, id).await?
    } else {
        // Ended, or paused or still running: answered as it is.
        wait_for_run(state, caller, id).await?
    };
    Ok(Json(functions::segment_response(state, &run, segment).await?).into_response())
}

/// The names of the agent's own tools (none for the server's default agent).
pub(crate) async fn agent_tool_names(
    state: &AppState,
    caller: &Caller,
    agent_id: Option<spool_shared::ids::AgentId>,
) -> Result<Vec<String>, ApiError> {
    Ok(agent_spec(state, caller, agent_id)
        .await?
        .map(|spec| spec.tools.iter().map(|t| t.name().to_owned()).collect())
        .unwrap_or_default())
}

/// The agent's spec (none for the server's default agent).
async fn agent_spec(
    state: &AppState,
    caller: &Caller,
    agent_id: Option<spool_shared::ids::AgentId>,
) -> Result<Option<spool_shared::agent::AgentSpec>, ApiError> {
    let Some(agent_id) = agent_id else {
        return Ok(None);
    };
    let agent =
        spool_shared::db::agents::find(&state.db, agent_id, &caller.owner.tenant_id).await?;
    Ok(agent.map(|agent| agent.spec.0))
}

/// The function call outputs that end `items` (after its last user message), if any:
/// `(call_id, output)`. Malformed outputs are a 400 naming the item.
fn answers(items: &[Value]) -> Result<Option<functions::Outputs>, ApiError> {
    let last_user = items
        .iter()
        .rposition(|item| item["role"] == "user")
        .map_or(0, |i| i + 1);
    let mut outputs = Vec::new();
    for (index, item) in items.iter().enumerate().skip(last_user) {
        let malformed = |why: &str| {
            ApiError::bad_request("invalid_input", format!("input[{index}]: {why}"))
                .with("param", format!("input[{index}]"))
        };
        match item["type"].as_str() {
            Some("function_call_output") => {
                let call_id = item["call_id"]
                    .as_str()
                    .filter(|id| !id.is_empty())
                    .ok_or_else(|| malformed("a function_call_output needs its call_id"))?;
                let output = match &item["output"] {
                    Value::String(text) => text.clone(),
                    Value::Array(_) => content_text(&item["output"]).ok_or_else(|| {
                        malformed("a function_call_output's output is text (or text parts)")
                    })?,
                    _ => return Err(malformed("a function_call_output needs its output")),
                };
                outputs.push((call_id.to_owned(), output));
            }
            // The calls themselves and the text before them, resent: already in the run.
            Some("function_call") | Some("message") | None => {}
            Some(other) => {
                return Err(ApiError::bad_request(
                    "unsupported_input",
                    format!("input[{index}]: items of type {other:?} are not supported"),
                )
                .with("param", format!("input[{index}].type")));
            }
        }
    }
    if outputs.is_empty() {
        return Ok(None);
    }
    if let Some(index) = items
        .iter()
        .rposition(|item| item["type"] == "function_call_output")
        && items[index + 1..]
            .iter()
            .any(|item| item["role"].is_string())
    {
        return Err(ApiError::bad_request(
            "unsupported_input",
            "messages after function_call_output items: send the outputs, then the next message \
             once the response has answered",
        )
        .with("param", "input"));
    }
    Ok(Some(outputs))
}

/// Where `input` gives instructions: its first `system` or `developer` item.
fn instructions_param(input: &Option<Input>, param: &str) -> String {
    match input {
        Some(Input::Items(items)) => instructions_item(items, param),
        _ => param.to_owned(),
    }
}

/// `{param}[i]` of the first `system` or `developer` message of `items`.
pub(crate) fn instructions_item(items: &[Value], param: &str) -> String {
    items
        .iter()
        .position(|item| matches!(item["role"].as_str(), Some("system" | "developer")))
        .map_or_else(|| param.to_owned(), |i| format!("{param}[{i}]"))
}

/// `items` without the function calls and outputs of earlier turns (the thread keeps the
/// text of those turns).
fn without_calls(items: &[Value]) -> Vec<Value> {
    items
        .iter()
        .filter(|item| {
            !matches!(
                item["type"].as_str(),
                Some("function_call" | "function_call_output")
            )
        })
        .cloned()
        .collect()
}

/// The thread a request continues: its `conversation`, the thread of its
/// `previous_response_id`, or a new one.
async fn thread_of(
    state: &AppState,
    caller: &Caller,
    request: &CreateResponse,
) -> Result<ThreadId, ApiError> {
    match (&request.conversation, &request.previous_response_id) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "invalid_body",
            "give conversation or previous_response_id, not both",
        )
        .with("param", "conversation")),
        (Some(ConversationRef::Id(id) | ConversationRef::Object { id }), None) => {
            parse_conversation(id).ok_or_else(|| {
                ApiError::not_found(
                    "conversation_not_found",
                    "a conversation is `conv_...` or a thread id (a UUID)",
                )
            })
        }
        (None, Some(previous)) => Ok(functions::find_response(state, caller, previous)
            .await?
            .thread_id),
        (None, None) => Ok(ThreadId::new()),
    }
}

/// Query of `GET /v1/responses/{id}` (others, such as `include`, are accepted and ignored).
#[derive(Debug, Deserialize)]
pub(crate) struct GetResponseQuery {
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    starting_after: Option<u64>,
}

/// A response as stored; with `?stream=true`, its events from the start (or after
/// `starting_after`), then live to its end, exactly once and in order. A `starting_after` beyond
/// the last event follows live from the end; events Redis no longer holds give one `error`
/// event (`stream_expired`) and the stored response stays here without `stream`.
#[utoipa::path(
    get,
    path = "/v1/responses/{response_id}",
    tag = "openai",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(
        ("response_id" = WorkflowId, Path, description = "The response (its run's `workflow_id`)."),
        ("stream" = Option<bool>, Query, description = "Stream its events."),
        ("starting_after" = Option<u64>, Query, description = "Only the events after this `sequence_number`."),
    ),
    responses(
        (status = 200, description = "The response (JSON), or its events (`stream=true`).",
            content(
                (crate::openai::schema::ResponseObject = "application/json"),
                (crate::openai::schema::ResponseStreamEvent = "text/event-stream"),
            )),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`response_not_found` (also another owner's)", body = crate::openai::schema::OpenAiErrorBody),
        (status = 422, description = "`invalid_query`", body = crate::openai::schema::OpenAiErrorBody),
        (status = 429, description = "`too_many_streams` (`stream=true` while the caller holds `SPOOL_SSE_MAX_STREAMS_PER_USER` streams open on this server)", body = crate::openai::schema::OpenAiErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
        (status = 503, description = "`stream_unavailable` (Redis is down); `server_stream_capacity` (`stream=true` while this server holds `SPOOL_SSE_MAX_STREAMS` streams)", body = crate::openai::schema::OpenAiErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
    )
)]
pub(crate) async fn get_response(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<GetResponseQuery>,
) -> Result<Response, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let reference = ResponseRef::parse(&id)?;
    let run = find(&state, &caller, reference.workflow_id).await?;
    // 404 for a segment the run does not have.
    let response = functions::segment_response(&state, &run, reference.segment).await?;
    if query.stream == Some(true) {
        let slot = gateway::stream_slot(&state, &caller)?;
        let segment = reference.segment;
        return stream(&state, &caller, slot, run, segment, query.starting_after).await;
    }
    Ok(Json(response).into_response())
}

/// Cancels a response's run (idempotent: an ended response is returned as it is) and returns
/// the response.
#[utoipa::path(
    post,
    path = "/v1/responses/{response_id}/cancel",
    tag = "openai",
    security(("bearer" = ["runs:create"])),
    params(("response_id" = WorkflowId, Path, description = "The response.")),
    responses(
        (status = 200, description = "The response, cancelled or being cancelled.", body = crate::openai::schema::ResponseObject),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`response_not_found`", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn cancel_response(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let reference = ResponseRef::parse(&id)?;
    let id = reference.workflow_id;
    // Cancel is the owner's (as on Spool's own route), admins included.
    runs::find(&state.db, id, &caller.owner)
        .await?
        .ok_or_else(response_not_found)?;
    let run = cancel(&state, &caller, id, Some("cancelled through /v1/responses")).await?;
    Ok(Json(
        functions::segment_response(&state, &run, reference.segment).await?,
    ))
}

/// The response's events as SSE, after `starting_after`.
async fn stream(
    state: &AppState,
    caller: &Caller,
    slot: gateway::StreamSlot,
    run: Run,
    segment: u32,
    starting_after: Option<u64>,
) -> Result<Response, ApiError> {
    let events = ResponseStream::open(state, caller, slot, run, segment, starting_after).await?;
    Ok(gateway::sse_without_retry(events.into_sse()))
}

/// A run's Responses events (see [`crate::openai::translate`]): the same for every client and
/// every reconnect, filtered to those after `starting_after`.
struct ResponseStream {
    state: AppState,
    feed: Feed,
    events: ResponseEvents,
    after: Option<u64>,
    queue: VecDeque<Value>,
    finished: bool,
    /// The run's segment this response is (see [`functions`]).
    segment: u32,
    /// The client-tool pauses seen so far.
    pauses: u32,
    /// The run's index of the segment's first item (its items are numbered from it), once
    /// the segment has begun.
    base: Option<usize>,
    /// The run's index after the last item seen.
    next_index: usize,
    run: Run,
    caller: Caller,
}

impl ResponseStream {
    /// The events of `run` after `starting_after`.
    async fn open(
        state: &AppState,
        caller: &Caller,
        slot: gateway::StreamSlot,
        run: Run,
        segment: u32,
        starting_after: Option<u64>,
    ) -> Result<Self, ApiError> {
        let feed = Feed::open(state, caller, slot, &run).await?;
        let mut head = functions::segment_response(state, &run, segment).await?;
        head["status"] = json!("queued");
        head["output"] = json!([]);
        if let Some(head) = head.as_object_mut() {
            head.remove("usage");
        }
        head["error"] = Value::Null;
        head["completed_at"] = Value::Null;
        let mut events = ResponseEvents::new(head);
        let mut queue = VecDeque::new();
        if feed.retained() {
            queue.push_back(events.created());
        }
        Ok(Self {
            state: state.clone(),
            feed,
            events,
            after: starting_after,
            queue,
            finished: false,
            segment,
            pauses: 0,
            base: (segment == 0).then_some(0),
            next_index: 0,
            run,
            caller: caller.clone(),
        })
    }

    /// The events of a transcript item for this segment: none before it, its items numbered
    /// from its first; the segment's end at the pause that ends it.
    async fn segment_events(&mut self, shown: Shown) -> Vec<Value> {
        if let Shown::Paused(Pause::RequiresAction(action)) = &shown {
            self.pauses += 1;
            if self.pauses == self.segment + 1 {
                // Ended at function calls: the calls are done, the response completed, while
                // the run waits.
                self.finished = true;
                let run = match find(&self.state, &self.caller, self.run.id).await {
                    Ok(run) => run,
                    Err(err) => {
                        tracing::warn!(error = %err, "reading a response's end failed");
                        return Vec::new();
                    }
                };
                let response =
                    match functions::segment_response(&self.state, &run, self.segment).await {
                        Ok(response) => response,
                        Err(err) => {
                            tracing::warn!(error = %err, "reading a response's end failed");
                            return Vec::new();
                        }
                    };
                let waiting: Vec<&str> = action
                    .tool_calls
                    .iter()
                    .map(|call| call.tool_call_id.as_str())
                    .collect();
                let mut events = Vec::new();
                let output = response["output"].as_array().cloned().unwrap_or_default();
                for (index, item) in output.into_iter().enumerate() {
                    if item["call_id"]
                        .as_str()
                        .is_some_and(|id| waiting.contains(&id))
                    {
                        events.push(self.events.item_done(index, item));
                    }
                }
                events.push(self.events.terminal(response));
                return events;
            }
            if self.pauses == self.segment {
                // The answered pause: this response starts, with the items after it.
                self.base = Some(self.next_index);
                return self.events.shown(&Shown::Started);
            }
            return Vec::new();
        }
        let index = shown_index(&shown);
        if let Some(index) = index {
            self.next_index = self.next_index.max(index + 1);
        }
        let Some(base) = self.base else {
            return Vec::new();
        };
        if index.is_some_and(|index| index < base) {
            // An item of an earlier response (a call's end, once answered).
            return Vec::new();
        }
        let mut events = self.events.shown(&shown);
        for event in &mut events {
            if let Some(index) = event["output_index"].as_u64() {
                event["output_index"] = json!(index.saturating_sub(base as u64));
            }
        }
        events
    }

    fn into_sse(self) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
        futures::stream::unfold(self, |mut stream| async move {
            let event = stream.next().await?;
            let kind = event["type"].as_str().unwrap_or("error").to_owned();
            Some((
                Ok(SseEvent::default().event(kind).data(event.to_string())),
                stream,
            ))
        })
    }

    /// The next event to send, or `None` at the end.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                let sequence = event["sequence_number"].as_u64().unwrap_or(0);
                let unnumbered = event["type"] == "error";
                if self.after.is_none_or(|after| sequence > after) || unnumbered {
                    return Some(event);
                }
                continue;
            }
            if self.finished {
                return None;
            }
            let Some(followed) = self.feed.next().await else {
                self.finished = true;
                continue;
            };
            match followed {
                Followed::Expired => {
                    // Its events are gone (the retention window passed): say so; the stored
                    // response is over REST.
                    let mut error = self.events.error(
                        "stream_expired",
                        "the events of this response are no longer retained; GET the response without stream",
                    );
                    error["sequence_number"] = json!(self.after.map_or(0, |n| n.saturating_add(1)));
                    self.queue.push_back(error);
                    self.finished = true;
                }
                Followed::Shown(shown) => {
                    let events = self.segment_events(shown).await;
                    self.queue.extend(events);
                }
                Followed::Live => {
                    // A `starting_after` beyond the last event: follow live from the end.
                    let next = self.events.next_sequence();
                    if let Some(after) = self.after
                        && after >= next
                    {
                        self.after = next.checked_sub(1);
                    }
                }
                Followed::Reset => {
                    let error = self.events.error(
                        "stream_reset",
                        "events of this response were lost; GET the response without stream",
                    );
                    self.queue.push_back(error);
                    self.finished = true;
                }
                Followed::Ended(run) => {
                    match functions::segment_response(&self.state, &run, self.segment).await {
                        Ok(response) => {
                            let event = self.events.terminal(response);
                            self.queue.push_back(event);
                        }
                        Err(err) => tracing::warn!(error = %err, "reading a response's end failed"),
                    }
                }
            }
        }
    }
}

/// The run's index of the item a transcript item shows, if it shows one.
fn shown_index(shown: &Shown) -> Option<usize> {
    match shown {
        Shown::TextStarted { index }
        | Shown::TextDelta { index, .. }
        | Shown::TextEnded { index, .. }
        | Shown::CallMade { index, .. }
        | Shown::CallEnded { index, .. } => Some(*index),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
