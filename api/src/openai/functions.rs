//! Function calling on the OpenAI-compatible routes (DESIGN section 11): a request's function
//! `tools` become client tools of its run; a call pauses the run (`requires_action`) and ends
//! the response; the client's outputs answer the pause and the same run goes on.
//!
//! **Responses of one run.** As in OpenAI's API, the answer to a function call is a new
//! response with its own id, while Spool keeps one run. A run is cut into *segments* at its
//! client-tool pauses: segment 0 is the response the create returned (its id is the run's
//! `workflow_id`), segment `k` the response that answered the `k`-th pause (id
//! `{workflow_id}_{k}`). A segment that ends at a pause is `completed`, its output the text and
//! calls up to and including the calls that wait; the last segment follows the run. Segments
//! are derived from the run's saved steps and stored message, so they need no state of their
//! own and survive any crash: a worker killed while the run waits loses nothing, the run waits
//! in Postgres.
//!
//! **Finding the run.** `previous_response_id` names it; without it (OpenAI's guide resends the
//! whole conversation, and Chat Completions has no ids at all) the run is the caller's one that
//! waits for a call of that `call_id` (`tool_call_id`), found through an index on pending calls.

use std::collections::HashSet;

use serde_json::{Value, json};

use spool_shared::WorkflowId;
use spool_shared::agent::{ClientToolSpec, RunOverrides, Sampling, StepRule, ToolChoice};
use spool_shared::db::runs::{self, Run};
use spool_shared::db::steps::{self, AnswerError, CallState, DecidedBy};
use spool_shared::db::{idempotency, messages};
use spool_shared::pricing::Usd;
use spool_shared::run::Usage;
use spool_shared::status::RunStatus;

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::openai::{find_run, load_response, output_items, response_not_found, response_usage};
use crate::routes::workflows::pauses::{AnswerKey, answer_client_tools};

/// Which API's shapes a request uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// `/v1/responses`: `{"type": "function", "name", ...}`.
    Responses,
    /// `/v1/chat/completions`: `{"type": "function", "function": {"name", ...}}`.
    Chat,
}

/// The function tools of a request and how the model may use them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Functions {
    /// The functions, as client tools.
    pub tools: Vec<ClientToolSpec>,
    /// `tool_choice`, if given.
    pub tool_choice: Option<ToolChoice>,
    /// `parallel_tool_calls`, if given.
    pub parallel_tool_calls: Option<bool>,
}

fn unsupported(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("unsupported_parameter", message).with("param", param.into())
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_tools", message).with("param", param.into())
}

impl Functions {
    /// Reads `tools`, `tool_choice` and `parallel_tool_calls` of a request body. Tools that are
    /// not functions (hosted tools: `web_search`, `file_search`, ...) are a 400 naming them.
    pub(crate) fn parse(raw: &Value, api: Api) -> Result<Self, ApiError> {
        let mut functions = Self::default();
        match &raw["tools"] {
            Value::Null => {}
            Value::Array(tools) => {
                let mut names = HashSet::new();
                for (i, tool) in tools.iter().enumerate() {
                    let spec = function_of(tool, i, api)?;
                    if !names.insert(spec.name.clone()) {
                        return Err(invalid(
                            format!("tools[{i}].name"),
                            format!("two functions are named `{}`", spec.name),
                        ));
                    }
                    functions.tools.push(spec);
                }
            }
            _ => return Err(invalid("tools", "tools must be a list")),
        }
        functions.tool_choice = match &raw["tool_choice"] {
            Value::Null => None,
            choice => Some(choice_of(choice, api)?),
        };
        if let Some(ToolChoice::Tool(name)) = &functions.tool_choice
            && !functions.tools.iter().any(|t| &t.name == name)
        {
            return Err(invalid(
                "tool_choice",
                format!("tool_choice names `{name}`, which is not among the request's tools"),
            ));
        }
        functions.parallel_tool_calls = match &raw["parallel_tool_calls"] {
            Value::Null => None,
            Value::Bool(parallel) => Some(*parallel),
            _ => {
                return Err(invalid(
                    "parallel_tool_calls",
                    "parallel_tool_calls must be a boolean",
                ));
            }
        };
        Ok(functions)
    }

    /// What a new run posts with its message: the functions as client tools, the tool choice
    /// for its first model call (as OpenAI applies it to one response), the parallel flag.
    pub(crate) fn overrides(&self) -> Option<RunOverrides> {
        let overrides = RunOverrides {
            client_tools: (!self.tools.is_empty()).then(|| self.tools.clone()),
            parallel_tool_calls: self.parallel_tool_calls,
            step_rules: self.tool_choice.clone().map(|choice| {
                vec![StepRule {
                    step: 1,
                    tool_choice: Some(choice),
                    active_tools: None,
                }]
            }),
            ..RunOverrides::default()
        };
        (overrides != RunOverrides::default()).then_some(overrides)
    }

    /// 400 unless these functions fit the agent's tools: no name used twice.
    pub(crate) fn check_names(&self, agent_tools: &[String]) -> Result<(), ApiError> {
        for (i, tool) in self.tools.iter().enumerate() {
            if agent_tools.contains(&tool.name) {
                return Err(invalid(
                    format!("tools[{i}].name"),
                    format!(
                        "`{}` is the name of one of the agent's own tools: rename the function",
                        tool.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// One `tools` entry as a client tool.
fn function_of(tool: &Value, i: usize, api: Api) -> Result<ClientToolSpec, ApiError> {
    let kind = tool["type"].as_str().unwrap_or_default();
    if kind != "function" {
        return Err(unsupported(
            format!("tools[{i}].type"),
            format!(
                "tools of type {:?} are not supported: Spool offers function tools (its \
                 agents' own tools run server-side)",
                tool["type"]
            ),
        ));
    }
    let (body, prefix) = match api {
        Api::Responses => (tool, format!("tools[{i}]")),
        Api::Chat => (&tool["function"], format!("tools[{i}].function")),
    };
    let Some(object) = body.as_object() else {
        return Err(invalid(
            prefix,
            "a function tool needs its `function` object",
        ));
    };
    let name = object
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(invalid(
            format!("{prefix}.name"),
            "a function's name is 1 to 64 letters, digits, `_` or `-`",
        ));
    }
    let description = match object.get("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(_) => {
            return Err(invalid(
                format!("{prefix}.description"),
                "description must be a string",
            ));
        }
    };
    let parameters = match object.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(Value::Object(schema)) => Value::Object(schema.clone()),
        Some(_) => {
            return Err(invalid(
                format!("{prefix}.parameters"),
                "parameters must be a JSON Schema object",
            ));
        }
    };
    if object
        .get("strict")
        .is_some_and(|s| !(s.is_boolean() || s.is_null()))
    {
        return Err(invalid(
            format!("{prefix}.strict"),
            "strict must be a boolean",
        ));
    }
    Ok(ClientToolSpec {
        name: name.to_owned(),
        description,
        parameters,
        requires_approval: false,
    })
}

/// `tool_choice` as Spool's.
fn choice_of(choice: &Value, api: Api) -> Result<ToolChoice, ApiError> {
    match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(invalid(
                "tool_choice",
                format!("tool_choice {mode:?} is not one of auto, none, required"),
            )),
        },
        Value::Object(object) if object.get("type") == Some(&json!("function")) => {
            let name = match api {
                Api::Responses => object.get("name"),
                Api::Chat => object.get("function").and_then(|f| f.get("name")),
            };
            name.and_then(Value::as_str)
                .map(|name| ToolChoice::Tool(name.to_owned()))
                .ok_or_else(|| invalid("tool_choice", "a function tool_choice names the function"))
        }
        Value::Object(object) => Err(unsupported(
            "tool_choice",
            format!(
                "tool_choice of type {:?} is not supported (auto, none, required, or a function)",
                object.get("type").cloned().unwrap_or(Value::Null)
            ),
        )),
        _ => Err(invalid(
            "tool_choice",
            "tool_choice is a string or an object",
        )),
    }
}

/// A response's id: its run and segment (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ResponseRef {
    /// The run.
    pub workflow_id: WorkflowId,
    /// The segment: 0 for the response the create returned, `k` for the one that answered
    /// the run's `k`-th client-tool pause.
    pub segment: u32,
}

impl ResponseRef {
    /// Parses `{workflow_id}` or `{workflow_id}_{k}` (`k` ≥ 1); 404 `response_not_found`
    /// otherwise.
    pub(crate) fn parse(id: &str) -> Result<Self, ApiError> {
        let (run, segment) = match id.split_once('_') {
            Some((run, text)) => {
                let k: u32 = text.parse().map_err(|_| response_not_found())?;
                if k == 0 || k.to_string() != text {
                    return Err(response_not_found());
                }
                (run, k)
            }
            None => (id, 0),
        };
        Ok(Self {
            workflow_id: run.parse().map_err(|_| response_not_found())?,
            segment,
        })
    }
}

/// The id of a run's segment.
pub(crate) fn segment_id(workflow_id: WorkflowId, segment: u32) -> String {
    if segment == 0 {
        workflow_id.to_string()
    } else {
        format!("{workflow_id}_{segment}")
    }
}

/// One client-tool pause of a run: its step and the calls it waited for.
#[derive(Clone, Debug)]
pub(crate) struct PauseStep {
    /// The calls the client was asked for.
    pub call_ids: Vec<String>,
    /// The tokens of the steps up to it (since the pause before).
    pub usage: Usage,
    /// When the step was saved (Unix seconds).
    pub at: i64,
}

/// A run cut at its client-tool pauses: its output items and where each pause ends a
/// segment.
#[derive(Debug)]
pub(crate) struct Segments {
    /// Every output item of the run so far, with the ids the stream gave them.
    pub items: Vec<Value>,
    /// Its client-tool pauses, in order (the last may be the one the run waits at).
    pub pauses: Vec<PauseStep>,
}

impl Segments {
    /// Loads a run's segments: the stored message's items once it has ended, else the items
    /// of its saved steps.
    pub(crate) async fn load(state: &AppState, run: &Run) -> Result<Self, ApiError> {
        // A run without client tools never pauses for them: one segment, no steps to read.
        let clients = !run_functions(run).is_empty()
            || run.agent_spec.as_ref().is_some_and(|spec| {
                spec.0
                    .tools
                    .iter()
                    .any(|tool| matches!(tool, spool_shared::agent::ToolSpec::Client(_)))
            });
        let saved = if clients {
            steps::load(&state.db, run.id).await?
        } else {
            Vec::new()
        };
        let last = saved.last().map(|s| s.step);
        let mut pauses = Vec::new();
        let mut usage = Usage::default();
        let prefix = run.id.to_string().replace('-', "");
        let mut items = Vec::new();
        for step in &saved {
            let data = &step.data.0;
            usage.add(data.usage);
            if !data.assistant.text.is_empty() {
                let id = format!("msg_{prefix}_{}", items.len());
                items.push(super::translate::message_item(
                    &id,
                    &data.assistant.text,
                    "completed",
                ));
            }
            for call in &data.assistant.tool_calls {
                let result = data.results.iter().find(|r| r.tool_call_id == call.id);
                let arguments = serde_json::from_str::<Value>(&call.arguments)
                    .map_or_else(|_| call.arguments.clone(), |value| value.to_string());
                let output = result
                    .filter(|r| r.state == CallState::Done || r.state == CallState::ClientOutput)
                    .map(|r| r.output.as_str());
                items.push(super::translate::call_item(
                    &format!("fc_{}", call.id),
                    &call.id,
                    &call.name,
                    &arguments,
                    "completed",
                    output,
                ));
            }
            let client = |r: &&steps::CallResult| {
                matches!(r.state, CallState::ClientOutput)
                    || (r.state == CallState::PendingClient
                        && run.status == RunStatus::RequiresAction
                        && Some(step.step) == last)
                    || (r.state == CallState::Done
                        && r.decision
                            .as_ref()
                            .is_some_and(|d| d.by == DecidedBy::Client))
            };
            let call_ids: Vec<String> = data
                .results
                .iter()
                .filter(client)
                .map(|r| r.tool_call_id.clone())
                .collect();
            if !call_ids.is_empty() {
                pauses.push(PauseStep {
                    call_ids,
                    usage: std::mem::take(&mut usage),
                    at: step.created_at.timestamp(),
                });
            }
        }
        if run.status.is_terminal() {
            let message =
                messages::find_in_thread(&state.db, run.assistant_message_id, run.thread_id)
                    .await?;
            if let Some(message) = message {
                items = output_items(&prefix, &message.parts.0);
            }
        }
        Ok(Self { items, pauses })
    }

    /// The range of `items` segment `k` holds (`None`: the run has no such segment).
    fn range(&self, k: usize) -> Option<std::ops::Range<usize>> {
        if k > self.pauses.len() {
            return None;
        }
        let end_of = |pause: &PauseStep| {
            self.items
                .iter()
                .rposition(|item| {
                    item["call_id"]
                        .as_str()
                        .is_some_and(|id| pause.call_ids.iter().any(|c| c == id))
                })
                .map_or(0, |i| i + 1)
        };
        let start = if k == 0 {
            0
        } else {
            end_of(&self.pauses[k - 1])
        };
        let end = self.pauses.get(k).map_or(self.items.len(), end_of);
        Some(start..end.max(start))
    }

    /// How many of the pauses are answered (all but the one `run` waits at, if it waits).
    pub(crate) fn answered(&self, run: &Run) -> usize {
        let waiting = run.status == RunStatus::RequiresAction && !self.pauses.is_empty();
        self.pauses.len() - usize::from(waiting)
    }

    /// The output items of segment `k`.
    pub(crate) fn output(&self, k: usize) -> Vec<Value> {
        self.range(k)
            .map(|range| self.items[range].to_vec())
            .unwrap_or_default()
    }

    /// The calls segment `k` ends waiting for (empty for the last segment).
    pub(crate) fn waiting_calls(&self, k: usize) -> Vec<Value> {
        let Some(pause) = self.pauses.get(k) else {
            return Vec::new();
        };
        self.output(k)
            .into_iter()
            .filter(|item| {
                item["call_id"]
                    .as_str()
                    .is_some_and(|id| pause.call_ids.iter().any(|c| c == id))
            })
            .collect()
    }
}

/// The client tools the run offers (those its request posted).
pub(crate) fn run_functions(run: &Run) -> Vec<ClientToolSpec> {
    run.overrides
        .as_ref()
        .and_then(|o| o.0.client_tools.clone())
        .unwrap_or_default()
}

/// The function tools of a run as a Responses `tools` list.
fn tools_json(run: &Run) -> Value {
    run_functions(run)
        .into_iter()
        .map(|tool| {
            json!({"type": "function", "name": tool.name, "description": tool.description,
                "parameters": tool.parameters, "strict": false})
        })
        .collect()
}

/// The Responses object of segment `k` of `run` (404 if the run has no such segment).
pub(crate) async fn segment_response(
    state: &AppState,
    run: &Run,
    k: u32,
) -> Result<Value, ApiError> {
    let segments = Segments::load(state, run).await?;
    let index = k as usize;
    // A segment exists once the pause before it is answered.
    if index > 0 && index > segments.answered(run) {
        return Err(response_not_found());
    }
    let mut response = load_response(state, run).await?;
    response["id"] = json!(segment_id(run.id, k));
    response["tools"] = tools_json(run);
    if let Some(parallel) = run.overrides.as_ref().and_then(|o| o.0.parallel_tool_calls) {
        response["parallel_tool_calls"] = json!(parallel);
    }
    if k > 0 {
        response["previous_response_id"] = json!(segment_id(run.id, k - 1));
    }
    let earlier: Usage = segments
        .pauses
        .iter()
        .take(index)
        .fold(Usage::default(), |mut sum, p| {
            sum.add(p.usage);
            sum
        });
    if let Some(pause) = segments.pauses.get(index) {
        // Ended at a function call: completed, while the run waits (or has gone on).
        response["status"] = json!("completed");
        response["completed_at"] = json!(pause.at);
        response["error"] = Value::Null;
        response["output"] = json!(segments.output(index));
        response["usage"] = response_usage(&pause.usage);
    } else if run.status.is_terminal() {
        response["output"] = json!(segments.output(index));
        if k > 0 {
            let total = run.usage.as_ref().map(|u| u.0).unwrap_or_default();
            response["usage"] = response_usage(&minus(total, earlier));
        }
    } else if k > 0 && run.status == RunStatus::Queued && run.started_at.is_some() {
        // Answered and waiting for a worker again.
        response["status"] = json!("in_progress");
    }
    Ok(response)
}

/// `total` less `earlier`, counter by counter (the usage of a run's later segments).
pub(crate) fn minus(total: Usage, earlier: Usage) -> Usage {
    Usage {
        input_tokens: total.input_tokens.saturating_sub(earlier.input_tokens),
        output_tokens: total.output_tokens.saturating_sub(earlier.output_tokens),
        cached_input_tokens: total
            .cached_input_tokens
            .saturating_sub(earlier.cached_input_tokens),
        cache_write_tokens: total
            .cache_write_tokens
            .saturating_sub(earlier.cache_write_tokens),
        reasoning_tokens: total
            .reasoning_tokens
            .saturating_sub(earlier.reasoning_tokens),
        cost_usd: if earlier.is_empty() {
            total.cost_usd
        } else {
            total
                .cost_usd
                .zip(earlier.cost_usd)
                .map(|(total, earlier)| Usd((total.0 - earlier.0).max(0.0)))
        },
    }
}

/// The caller's run whose response `id` names, if the run has that response; 404
/// `response_not_found` otherwise (another owner's included).
pub(crate) async fn find_response(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Run, ApiError> {
    let reference = ResponseRef::parse(id)?;
    let run = find_run(state, caller, reference.workflow_id).await?;
    if reference.segment > 0 {
        let segments = Segments::load(state, &run).await?;
        if reference.segment as usize > segments.answered(&run) {
            return Err(response_not_found());
        }
    }
    Ok(run)
}

/// The outputs a request answers calls with: `(call_id, output)`.
pub(crate) type Outputs = Vec<(String, String)>;

/// The run that `outputs` answer: the one `previous` names, else the caller's run that waits
/// for the first output's call. 404 for an unknown (or another owner's) `previous`; 400 when
/// no run of the caller waits for these calls.
pub(crate) async fn waiting_run(
    state: &AppState,
    caller: &Caller,
    previous: Option<&str>,
    outputs: &Outputs,
    param: &'static str,
) -> Result<Run, ApiError> {
    let run = match previous {
        Some(previous) => find_response(state, caller, previous).await?,
        None => {
            let first = outputs
                .first()
                .map(|(id, _)| id.as_str())
                .unwrap_or_default();
            runs::find_waiting_for_call(&state.db, first, caller.scope())
                .await?
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "no_pending_call",
                        format!("no response of yours waits for the output of call `{first}`"),
                    )
                    .with("param", param)
                })?
        }
    };
    if run.status != RunStatus::RequiresAction {
        return Err(ApiError::bad_request(
            "no_pending_call",
            format!(
                "the response's run is {}: it waits for no function call output",
                run.status.as_str()
            ),
        )
        .with("param", param));
    }
    Ok(run)
}

/// A follow-up's `Idempotency-Key`, with the hash of its request.
pub(crate) struct FollowUpKey<'a> {
    /// The key.
    pub key: &'a str,
    /// The hash of the request (its caller, route and body).
    pub hash: String,
}

/// The response a follow-up sent earlier with `key` went on as (its run and segment), if one
/// did; 422 `idempotency_key_reused` if the key came with another request.
async fn replayed(
    state: &AppState,
    caller: &Caller,
    key: &FollowUpKey<'_>,
) -> Result<Option<(WorkflowId, u32)>, ApiError> {
    let window = state.config.retention.idempotency();
    let tenant = &caller.owner.tenant_id;
    let Some(stored) = idempotency::find(&state.db, tenant, key.key, window).await? else {
        return Ok(None);
    };
    if stored.request_hash != key.hash {
        return Err(ApiError::unprocessable(
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different request",
        ));
    }
    let reference = stored.response.0["follow_up"]
        .as_str()
        .map(ResponseRef::parse)
        .transpose()?
        .ok_or_else(|| anyhow::anyhow!("a follow-up's key without its response"))?;
    Ok(Some((reference.workflow_id, reference.segment)))
}

/// A follow-up: answers the calls of the run `previous` names (else of the caller's run that
/// waits for them) with `outputs`; returns the run and the segment it goes on as. With a `key`,
/// a retry gets what the first answered, and answers nothing twice (a concurrent retry
/// included: it waits for the first and replays it).
#[expect(clippy::too_many_arguments)]
pub(crate) async fn follow_up(
    state: &AppState,
    caller: &Caller,
    previous: Option<&str>,
    outputs: Outputs,
    functions: &Functions,
    sampling: &Sampling,
    param: &'static str,
    key: Option<&FollowUpKey<'_>>,
) -> Result<(WorkflowId, u32), ApiError> {
    if let Some(key) = key
        && let Some(replay) = replayed(state, caller, key).await?
    {
        return Ok(replay);
    }
    let answered = async {
        let run = waiting_run(state, caller, previous, &outputs, param).await?;
        let segment = answer(
            state, caller, &run, outputs, functions, sampling, param, key,
        )
        .await?;
        Ok((run.id, segment))
    }
    .await;
    match (answered, key) {
        // A retry that raced the first: the first's answer, once it is recorded.
        (Err(err), Some(key)) => Ok(replayed(state, caller, key).await?.ok_or(err)?),
        (answered, _) => answered,
    }
}

/// Answers `run`'s pause with `outputs` (and the follow-up's tool choice for its next model
/// call); answers the segment the run continues as. Outputs for calls that are not pending,
/// or pending calls without one, are a 400 naming them; nothing changes then.
#[expect(clippy::too_many_arguments)]
pub(crate) async fn answer(
    state: &AppState,
    caller: &Caller,
    run: &Run,
    outputs: Outputs,
    functions: &Functions,
    sampling: &Sampling,
    param: &'static str,
    key: Option<&FollowUpKey<'_>>,
) -> Result<u32, ApiError> {
    if !functions.tools.is_empty() && functions.tools != run_functions(run) {
        return Err(invalid(
            "tools",
            "a follow-up may resend the response's function tools, not a different set",
        ));
    }
    // The follow-up's sampling settings apply from the run's next model call on.
    let overrides = RunOverrides {
        tool_choice: functions.tool_choice.clone(),
        sampling: (*sampling != Sampling::default()).then(|| sampling.clone()),
        ..RunOverrides::default()
    };
    let refuse = |err: AnswerError| match err {
        AnswerError::Unknown(ref id) => ApiError::bad_request(
            "unknown_call_id",
            format!(
                "`{id}` is not a pending function call of this response (or is answered twice)"
            ),
        )
        .with("param", param),
        AnswerError::Missing(ref missing) => ApiError::bad_request(
            "missing_function_call_outputs",
            format!(
                "every pending function call needs its output; missing: {}",
                missing.join(", ")
            ),
        )
        .with("param", param)
        .with("missing", missing),
    };
    // The run waits at its last pause: once answered, it goes on as the segment after it.
    let next = Segments::load(state, run).await?.pauses.len();
    let key = key.map(|key| AnswerKey {
        key: key.key,
        hash: &key.hash,
        replay: json!({"follow_up": segment_id(run.id, u32::try_from(next).unwrap_or(u32::MAX))}),
    });
    answer_client_tools(state, caller, run.id, outputs, overrides, refuse, key).await?;
    // The pauses answered so far: the segment the run goes on as (whether or not a worker has
    // taken it on since, and paused it again).
    let run = find_run(state, caller, run.id).await?;
    let segments = Segments::load(state, &run).await?;
    Ok(u32::try_from(segments.answered(&run)).unwrap_or(u32::MAX))
}

/// The text of a message's output items.
pub(crate) fn text_of(items: &[Value]) -> String {
    items
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|part| part["text"].as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests;
