//! Statuses and roles as the database stores them and clients see them.

use serde::{Deserialize, Serialize};

/// Where a run is in its life. Terminal statuses never change again (invariant 3).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum RunStatus {
    /// Waiting for a worker to claim it.
    Queued,
    /// Claimed by a worker that holds its lease.
    Running,
    /// Paused until the client posts tool outputs.
    RequiresAction,
    /// Paused until a person approves or denies a tool call.
    AwaitingApproval,
    /// Paused until the agent runs its tool calls started (agents as tools) have ended.
    Waiting,
    /// Finished with an assistant message.
    Completed,
    /// Finished with an error.
    Failed,
    /// Stopped on request.
    Cancelled,
}

impl RunStatus {
    /// Whether the run can never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The status as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::RequiresAction => "requires_action",
            Self::AwaitingApproval => "awaiting_approval",
            Self::Waiting => "waiting",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A string that is not a run status.
#[derive(Debug, thiserror::Error)]
#[error("not a run status")]
pub struct UnknownStatus;

impl std::str::FromStr for RunStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, UnknownStatus> {
        [
            Self::Queued,
            Self::Running,
            Self::RequiresAction,
            Self::AwaitingApproval,
            Self::Waiting,
            Self::Completed,
            Self::Failed,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|status| status.as_str() == s)
        .ok_or(UnknownStatus)
    }
}

/// The state of a message's content.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum MessageStatus {
    /// An assistant message whose run has not started.
    Queued,
    /// An assistant message being produced.
    Streaming,
    /// Final.
    Completed,
    /// Its run failed; the content is what was produced before the failure.
    Failed,
    /// Its run was cancelled; the content is what was produced before the cancel.
    Cancelled,
}

/// Who wrote a message.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum Role {
    /// The person using the chat product.
    User,
    /// The agent.
    Assistant,
}
