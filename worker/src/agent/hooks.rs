//! Hooks: an agent's checks and rewrites around its run.
//!
//! Events: `on_run_start` (may block the run), `pre_tool_use` (may block a call, hold it for
//! approval, or rewrite its arguments), `post_tool_use` (may rewrite a result), `pre_response`
//! (may rewrite the final answer, or deny it: its `text` then answers instead), `on_run_complete`
//! (fire and forget). Kinds: `http` (POST the event; the JSON answer decides; an error, a
//! timeout or an unreadable answer allows: fail-open, logged; a guard hook with `fail: closed`
//! denies instead), `rule` (deny a call whose arguments meet every condition; the first
//! matching deny wins), `approval` (hold the call for a person). Hooks run in the order the
//! agent lists them; an optional `matcher` (a regex over the whole tool name) limits tool hooks.
//!
//! HTTP hooks go through the tools' guarded clients, so they obey the same network policy.
//! Each call carries an `Idempotency-Key` unique to the call, the event and the hook:
//! `{workflow_id}:{step}:{tool_call_id}:{event}:{hook}` for tool events,
//! `{workflow_id}:{step}:pre_response:{hook}` and `{workflow_id}:{event}:{hook}` for the
//! run's events; a repeat after a crash carries the same key. Logs name a failing hook by its
//! index and host, never its URL (which may carry a credential).

use std::time::Duration;

use serde_json::{Value, json};

use spool_shared::agent::{
    AgentSpec, HookEvent, HookFailure, HookKind, HookSpec, RuleCondition, RuleOperator,
};
use spool_shared::db::runs::Run;
use spool_shared::status::RunStatus;

use super::engine::Engine;
use super::llm::ToolCall;
use super::tools::http::{self, HttpTool};
use super::tools::identity::Identity;
use spool_shared::egress::GuardedClients;

/// The answer a `pre_response` hook's denial gives when the hook sends no `text`.
pub(crate) const BLOCKED_TEXT: &str = "Sorry, I can't help with that.";

/// What `pre_tool_use` hooks decided for one call.
#[derive(Debug, PartialEq)]
pub(crate) enum ToolDecision {
    /// Run it, with rewritten arguments if a hook changed them.
    Allow(Option<Value>),
    /// Do not run it; the model sees the reason.
    Deny(String),
    /// Hold it for approval (a hook's timeout, else the agent's).
    Approval(Option<u32>),
}

/// The hooks of one run.
pub(crate) struct Hooks<'a> {
    hooks: Vec<Hook>,
    clients: &'a GuardedClients,
    context: Value,
    /// The run's workflow id, the start of every idempotency key.
    workflow: String,
    /// Who the calls act for.
    identity: Identity,
}

impl<'a> Hooks<'a> {
    /// The agent's hooks for one run, calling out through the engine's guarded clients; the
    /// run's workflow, thread and agent go into every HTTP hook's body.
    pub(crate) fn for_run(spec: &AgentSpec, engine: &'a Engine, run: &Run) -> Self {
        Self {
            hooks: spec.hooks.iter().map(Hook::new).collect(),
            clients: &engine.http,
            context: json!({"workflow_id": run.id, "thread_id": run.thread_id,
                "agent": spec.name}),
            workflow: run.id.to_string(),
            identity: engine.identity(run),
        }
    }

    /// Whether any hook listens to `event`.
    pub(crate) fn has(&self, event: HookEvent) -> bool {
        self.hooks.iter().any(|h| h.spec.event == event)
    }

    /// The hooks of `event` (for `tool`, if a tool event), with their places in the agent.
    fn for_event(
        &self,
        event: HookEvent,
        tool: Option<&str>,
    ) -> impl Iterator<Item = (usize, &HookSpec)> {
        self.hooks
            .iter()
            .enumerate()
            .filter(move |(_, h)| h.spec.event == event && h.applies_to(tool))
            .map(|(i, h)| (i, &h.spec))
    }

    /// `on_run_start`: `Some(reason)` blocks the run.
    pub(crate) async fn on_run_start(&self, input: &str) -> Option<String> {
        let scope = &self.workflow;
        for (i, hook) in self.for_event(HookEvent::OnRunStart, None) {
            let event = json!({"input_text": input});
            match self.call(i, hook, event, scope).await {
                Answer::Decided(answer) if answer["decision"] == "deny" => {
                    return Some(reason(&answer, "the run was blocked by a hook"));
                }
                Answer::FailedClosed => return Some(FAILED_CLOSED.to_owned()),
                _ => {}
            }
        }
        None
    }

    /// `pre_tool_use` for one call.
    pub(crate) async fn pre_tool_use(&self, step: u32, call: &ToolCall) -> ToolDecision {
        let tool = call.name.as_str();
        let scope = format!("{}:{step}:{}", self.workflow, call.id);
        let mut arguments = call.parsed_arguments();
        let mut rewritten = false;
        let mut approval = None;
        for (i, hook) in self.for_event(HookEvent::PreToolUse, Some(tool)) {
            match &hook.kind {
                HookKind::Rule {
                    conditions,
                    message,
                } => {
                    if conditions.iter().all(|c| holds(c, &arguments)) {
                        let why = message
                            .clone()
                            .unwrap_or_else(|| "a rule forbids this call".into());
                        return ToolDecision::Deny(why);
                    }
                }
                HookKind::Approval { timeout_secs } => {
                    approval.get_or_insert(*timeout_secs);
                }
                HookKind::Http { .. } => {
                    let event = json!({"tool_name": tool, "arguments": arguments});
                    let answer = match self.call(i, hook, event, &scope).await {
                        Answer::Decided(answer) => answer,
                        Answer::FailedClosed => {
                            return ToolDecision::Deny(FAILED_CLOSED.to_owned());
                        }
                        Answer::FailedOpen => continue,
                    };
                    match answer["decision"].as_str() {
                        Some("deny") => {
                            return ToolDecision::Deny(reason(&answer, "a hook denied this call"));
                        }
                        Some("modify") if answer["arguments"].is_object() => {
                            arguments = answer["arguments"].clone();
                            rewritten = true;
                        }
                        _ => {}
                    }
                }
            }
        }
        match approval {
            Some(timeout) => ToolDecision::Approval(timeout),
            None => ToolDecision::Allow(rewritten.then_some(arguments)),
        }
    }

    /// `post_tool_use`: the result, rewritten if a hook says so.
    pub(crate) async fn post_tool_use(&self, step: u32, call: &ToolCall, output: String) -> String {
        let tool = call.name.as_str();
        let scope = format!("{}:{step}:{}", self.workflow, call.id);
        let arguments = call.parsed_arguments();
        let mut output = output;
        for (i, hook) in self.for_event(HookEvent::PostToolUse, Some(tool)) {
            let event = json!({"tool_name": tool, "arguments": arguments, "output": output});
            if let Answer::Decided(answer) = self.call(i, hook, event, &scope).await
                && answer["decision"] == "modify"
                && let Some(rewritten) = answer["output"].as_str()
            {
                output = rewritten.to_owned();
            }
        }
        output
    }

    /// `pre_response`: the final text (rewritten if a hook says so), or, when a hook denies
    /// it, the text that answers instead (the hook's `text`, else [`BLOCKED_TEXT`]).
    pub(crate) async fn pre_response(&self, step: u32, text: &str) -> Result<String, String> {
        let scope = format!("{}:{step}", self.workflow);
        let mut text = text.to_owned();
        for (i, hook) in self.for_event(HookEvent::PreResponse, None) {
            let answer = match self.call(i, hook, json!({"text": text}), &scope).await {
                Answer::Decided(answer) => answer,
                Answer::FailedClosed => {
                    tracing::info!(
                        hook = i,
                        "a pre_response hook failed closed: the answer is denied"
                    );
                    return Err(BLOCKED_TEXT.to_owned());
                }
                Answer::FailedOpen => continue,
            };
            match answer["decision"].as_str() {
                Some("deny") => {
                    tracing::info!(
                        hook = i,
                        reason = %reason(&answer, "none given"),
                        "a pre_response hook denied the answer"
                    );
                    let instead = answer["text"].as_str().unwrap_or(BLOCKED_TEXT);
                    return Err(instead.to_owned());
                }
                Some("modify") => {
                    if let Some(rewritten) = answer["text"].as_str() {
                        text = rewritten.to_owned();
                    }
                }
                _ => {}
            }
        }
        Ok(text)
    }

    /// The run's end: `on_run_complete` for a completed run, `on_run_failed` for a failed
    /// one, `on_run_cancelled` for a cancelled one; fire and forget (the run's end never waits
    /// for them).
    pub(crate) fn on_run_end(&self, status: RunStatus, content: &str) {
        let event = match status {
            RunStatus::Completed => HookEvent::OnRunComplete,
            RunStatus::Failed => HookEvent::OnRunFailed,
            RunStatus::Cancelled => HookEvent::OnRunCancelled,
            _ => return,
        };
        let name = serde_json::to_value(event).unwrap_or(Value::Null);
        let name = name.as_str().unwrap_or_default().to_owned();
        for (i, hook) in self.for_event(event, None) {
            let HookKind::Http {
                url,
                headers,
                timeout_secs,
            } = &hook.kind
            else {
                continue;
            };
            let clients = self.clients.clone();
            let (url, headers, timeout) = (url.clone(), headers.clone(), *timeout_secs);
            let mut body = self.context.clone();
            body["event"] = json!(name);
            body["status"] = json!(status.as_str());
            body["content"] = json!(content);
            let key = format!("{}:{name}:{i}", self.workflow);
            let identity = self.identity.clone();
            tokio::spawn(async move {
                let tool = HttpTool {
                    url: &url,
                    method: "POST",
                    headers: &headers,
                };
                let call = http::call(&clients, &identity, &tool, &body, &key);
                let _ = tokio::time::timeout(Duration::from_secs(u64::from(timeout)), call).await;
            });
        }
    }

    /// POSTs one event to the HTTP hook at place `index`, keyed `{scope}:{event}:{index}`: its
    /// answer, or its failure as the hook says to take it (open, or closed for a guard).
    async fn call(&self, index: usize, hook: &HookSpec, event: Value, scope: &str) -> Answer {
        let HookKind::Http {
            url,
            headers,
            timeout_secs,
        } = &hook.kind
        else {
            return Answer::FailedOpen;
        };
        let mut body = self.context.clone();
        body["event"] = serde_json::to_value(hook.event).unwrap_or(Value::Null);
        if let (Some(body), Some(event)) = (body.as_object_mut(), event.as_object()) {
            body.extend(event.clone());
        }
        let key = format!("{scope}:{}:{index}", body["event"].as_str().unwrap_or(""));
        let host = reqwest::Url::parse(url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let tool = HttpTool {
            url,
            method: "POST",
            headers,
        };
        let call = http::call(self.clients, &self.identity, &tool, &body, &key);
        let failure =
            match tokio::time::timeout(Duration::from_secs(u64::from(*timeout_secs)), call).await {
                Ok(output) if !output.is_error => {
                    match serde_json::from_str::<Value>(&output.content) {
                        Ok(answer) => return Answer::Decided(answer),
                        Err(_) => "answered something that is not JSON".to_owned(),
                    }
                }
                Ok(output) => format!("failed: {}", output.content),
                Err(_) => "timed out".to_owned(),
            };
        // Only a guard can fail closed (validated at save); any other hook's failure allows.
        let closed = hook.fail == HookFailure::Closed && hook.event.guards();
        let then = if closed { "denying" } else { "allowing" };
        tracing::warn!(hook.index = index, hook.host = %host, failure, "hook failed; {then}");
        if closed {
            Answer::FailedClosed
        } else {
            Answer::FailedOpen
        }
    }
}

/// What a guard that failed closed says to the model or the run.
const FAILED_CLOSED: &str =
    "a guard hook could not decide (it failed or timed out) and fails closed; denied";

/// An HTTP hook's answer, or its failure as the hook takes it.
enum Answer {
    /// It answered this JSON.
    Decided(Value),
    /// It failed, and its failure allows.
    FailedOpen,
    /// It failed, and its failure denies (`fail: closed` on a guard).
    FailedClosed,
}

/// A hook with its matcher compiled once for the run.
struct Hook {
    spec: HookSpec,
    /// `None`: every tool; `Some(None)`: a matcher that does not compile (stored specs are
    /// validated, so only a spec from an older release), which matches nothing.
    matcher: Option<Option<regex::Regex>>,
}

impl Hook {
    fn new(spec: &HookSpec) -> Self {
        Self {
            matcher: spec.matcher_regex().map(Result::ok),
            spec: spec.clone(),
        }
    }

    fn applies_to(&self, tool: Option<&str>) -> bool {
        match (&self.matcher, tool) {
            (Some(matcher), Some(tool)) => matcher.as_ref().is_some_and(|re| re.is_match(tool)),
            _ => true,
        }
    }
}

fn reason(answer: &Value, default: &str) -> String {
    answer["reason"].as_str().unwrap_or(default).to_owned()
}

/// Whether a rule's condition holds for the call's arguments.
fn holds(condition: &RuleCondition, arguments: &Value) -> bool {
    let value = if condition.argument.starts_with('/') {
        arguments.pointer(&condition.argument)
    } else {
        arguments.get(&condition.argument)
    };
    let Some(value) = value else { return false };
    let text = value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned);
    match condition.operator {
        RuleOperator::Contains => condition.value.as_str().is_some_and(|v| text.contains(v)),
        RuleOperator::StartsWith => condition
            .value
            .as_str()
            .is_some_and(|v| text.starts_with(v)),
        RuleOperator::Matches => condition
            .value
            .as_str()
            .and_then(|re| regex::Regex::new(re).ok())
            .is_some_and(|re| re.is_match(&text)),
        RuleOperator::In => condition
            .value
            .as_array()
            .is_some_and(|values| values.contains(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(argument: &str, operator: RuleOperator, value: Value) -> RuleCondition {
        RuleCondition {
            argument: argument.into(),
            operator,
            value,
        }
    }

    #[test]
    fn rule_conditions_compare_arguments_as_the_contract_says() {
        let args = json!({"path": "/etc/passwd", "mode": "read", "opts": {"depth": 3}});
        assert!(holds(
            &rule("path", RuleOperator::StartsWith, json!("/etc")),
            &args
        ));
        assert!(holds(
            &rule("path", RuleOperator::Contains, json!("pass")),
            &args
        ));
        assert!(holds(
            &rule(
                "path",
                RuleOperator::Matches,
                json!("^/etc/(passwd|shadow)$")
            ),
            &args
        ));
        assert!(holds(
            &rule("mode", RuleOperator::In, json!(["read", "list"])),
            &args
        ));
        assert!(holds(
            &rule("/opts/depth", RuleOperator::In, json!([3])),
            &args
        ));
        assert!(!holds(
            &rule("mode", RuleOperator::In, json!(["write"])),
            &args
        ));
        assert!(!holds(
            &rule("missing", RuleOperator::Contains, json!("x")),
            &args
        ));
    }
}
