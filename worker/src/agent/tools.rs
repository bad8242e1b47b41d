//! Tools the model may call: HTTP endpoints, MCP servers, and (later) client tools.
//!
//! Every tool call ends as a [`ToolOutput`]: text the model sees, flagged as an error or not.
//! A tool failing is not the run failing: the model sees the error and can work around it.

pub mod http;
pub mod mcp;
pub mod ssrf;

/// What a tool call returned, as the model will see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    /// The text given to the model.
    pub content: String,
    /// Whether the call failed.
    pub is_error: bool,
}

impl ToolOutput {
    /// A successful result.
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
        }
    }

    /// A failure the model should see.
    pub fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
        }
    }
}
