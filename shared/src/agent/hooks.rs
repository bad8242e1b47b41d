//! Hooks: what an agent runs on its runs' events (`on_run_start`, before and after tool calls,
//! `pre_response`, `on_run_complete`, `on_run_failed`, `on_run_cancelled`): an HTTP call whose answer decides, a rule that denies
//! matching tool calls, or an approval, optionally only for tools whose whole name matches a
//! regex. The worker runs them (`worker/src/agent/hooks.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::RuleCondition;

/// When a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookEvent {
    /// Before the first step; may block the run.
    OnRunStart,
    /// Before a tool call; may block it, hold it for approval, or rewrite its arguments.
    PreToolUse,
    /// After a tool call; may rewrite its result.
    PostToolUse,
    /// Before the final answer is shown; may block or rewrite it.
    PreResponse,
    /// After the run completes; fire and forget.
    OnRunComplete,
    /// After the run fails; fire and forget.
    OnRunFailed,
    /// After the run is cancelled; fire and forget.
    OnRunCancelled,
}

/// A hook: an event, an optional tool-name matcher (a regex matching the whole name, for tool
/// events), and what it does.
// No `deny_unknown_fields` here: serde cannot combine it with `flatten`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HookSpec {
    /// When it runs.
    pub event: HookEvent,
    /// Which tools it applies to (tool events only; default all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    /// What the failure of an HTTP guard hook (`on_run_start`, `pre_tool_use`,
    /// `pre_response`) means: an error, a timeout, an answer that is not JSON. `open` (the
    /// default) allows; `closed` denies, so a guard cannot be passed by making it slow.
    #[serde(default, skip_serializing_if = "HookFailure::is_open")]
    pub fail: HookFailure,
    /// What it does.
    #[serde(flatten)]
    pub kind: HookKind,
}

/// What a guard hook's failure means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookFailure {
    /// The guarded action goes ahead (the run is not held hostage by a dead hook).
    #[default]
    Open,
    /// The guarded action is denied: the run is blocked, the call refused, the answer replaced.
    Closed,
}

impl HookFailure {
    /// Whether a failure allows (the default).
    pub fn is_open(&self) -> bool {
        *self == Self::Open
    }
}

impl HookEvent {
    /// Whether a hook of this event guards something (may deny it): the run's start, a tool
    /// call, the final answer.
    pub fn guards(self) -> bool {
        matches!(
            self,
            Self::OnRunStart | Self::PreToolUse | Self::PreResponse
        )
    }
}

/// What a hook does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HookKind {
    /// POSTs the event to a URL; the JSON answer `{decision: allow|deny|modify, reason?,
    /// arguments?, output?, text?}` decides. Errors and timeouts allow (fail-open), unless the
    /// hook says `fail: closed`.
    Http {
        /// Where to POST.
        url: String,
        /// Extra headers.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// Seconds to wait (default 5).
        #[serde(default = "default_hook_timeout")]
        timeout_secs: u32,
    },
    /// Denies a tool call whose arguments meet every condition (the first matching deny wins).
    Rule {
        /// Conditions on the call's arguments, all of which must hold.
        conditions: Vec<RuleCondition>,
        /// The reason the model sees.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Holds the tool call for a person's approval.
    Approval {
        /// Seconds before no decision counts as a denial (default: the agent's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u32>,
    },
}

fn default_hook_timeout() -> u32 {
    5
}

impl HookSpec {
    /// The matcher as the regex it stands for: the whole tool name must match. `None` without a
    /// matcher (the hook applies to every tool).
    pub fn matcher_regex(&self) -> Option<Result<regex::Regex, regex::Error>> {
        let matcher = self.matcher.as_ref()?;
        Some(regex::Regex::new(&format!("^(?:{matcher})$")))
    }
}
