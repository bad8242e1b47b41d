//! What the loop produces ([`Answer`]) and how it ends ([`LoopEnd`]).

use spool_shared::citation::{self, Source};
use spool_shared::db::steps::SavedStep;
use spool_shared::run::{Citation, FailureCode, MessagePart, RunFailure, Usage};

use crate::stop::Halt;

/// What the run produced: the message's text and parts, the tokens used, the retrieval chunks
/// its steps numbered, and (once it completes) the sources its text cites.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub(crate) content: String,
    pub(crate) parts: Vec<MessagePart>,
    pub(crate) usage: Usage,
    /// The settled steps' retrieval chunks, in the order of their numbers.
    pub(crate) sources: Vec<Source>,
    /// What [`Answer::cite`] resolved.
    pub(crate) citations: Vec<Citation>,
    /// The step whose model call answered without tool calls, saved with the run's end (for
    /// the timeline).
    /// With its number (its `step_end` is published with the run's end).
    pub(crate) final_step: Option<Box<(u32, SavedStep)>>,
    /// The answer as JSON valid against the agent's `response_format`.
    pub(crate) output: Option<Box<serde_json::Value>>,
    /// A `pre_response` hook denied the answer; its text is the content.
    pub(crate) blocked: bool,
}

impl Answer {
    /// Adds a block of text (paragraphs of the message are separated by a blank line).
    pub(crate) fn add_text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if !self.content.is_empty() {
            self.content.push_str("\n\n");
        }
        self.content.push_str(text);
        self.parts.push(MessagePart::Text { text: text.into() });
    }

    /// The number the next retrieval chunk gets.
    pub(crate) fn next_source(&self) -> u32 {
        self.sources
            .last()
            .map_or(1, |s| s.number.saturating_add(1))
    }

    /// Resolves the markers of the finished text into citations (kept, and added as the
    /// message's last part): from saved data only, so every attempt finds the same.
    pub(crate) fn cite(&mut self) {
        self.citations = citation::resolve(&self.content, &self.sources);
        if !self.citations.is_empty() {
            self.parts.push(MessagePart::Citations {
                citations: self.citations.clone(),
            });
        }
    }

    /// Adds a settled step: its text, each tool call followed by its result, its chunks.
    pub(crate) fn add_step(&mut self, step: u32, saved: &SavedStep) {
        self.add_text(&saved.assistant.text);
        for call in &saved.assistant.tool_calls {
            self.parts.push(MessagePart::ToolCall {
                step: Some(step),
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
            let Some(result) = saved.results.iter().find(|r| r.tool_call_id == call.id) else {
                continue;
            };
            self.parts.push(MessagePart::ToolResult {
                step: Some(step),
                tool_call_id: result.tool_call_id.clone(),
                name: result.name.clone(),
                output: result.output.clone(),
                is_error: result.is_error,
            });
        }
        self.sources.extend(saved.sources.iter().cloned());
    }
}

/// How the loop ended.
#[derive(Debug)]
pub(crate) enum LoopEnd {
    /// An answer (or a stop condition).
    Completed(Answer),
    /// A failure to record, and what was produced before it.
    Failed(Box<RunFailure>, Answer),
    /// Cancelled on request: record what was produced.
    Cancelled(Answer),
    /// Paused (client tool outputs or an approval); the run no longer holds a worker.
    Paused,
    /// The lease is gone: write nothing.
    LeaseLost,
    /// Shutdown: give the run back.
    Released,
}

impl LoopEnd {
    /// The end a halt makes, keeping `answer` where it is recorded (a cancel).
    pub(crate) fn halted(halt: Halt, answer: Answer) -> Self {
        match halt {
            Halt::LeaseLost => Self::LeaseLost,
            Halt::Released => Self::Released,
            Halt::Cancelled => Self::Cancelled(answer),
            Halt::TimedOut => {
                let message = "the run took longer than its time limit (limits.timeout_secs, \
                               counted from enqueue)";
                Self::Failed(
                    Box::new(RunFailure::new(FailureCode::Timeout, message)),
                    answer,
                )
            }
        }
    }
}

/// Why the loop leaves early: an end to record, or an error that leaves the lease to expire (so
/// the run is retried elsewhere). Every part of the loop returns it, so `?` ends the loop from
/// anywhere.
#[derive(Debug)]
pub(crate) enum Exit {
    /// The loop is over (boxed: an answer is large, and every step returns an `Exit`).
    End(Box<LoopEnd>),
    /// Something broke (Postgres unreachable, say).
    Error(anyhow::Error),
}

impl From<LoopEnd> for Exit {
    fn from(end: LoopEnd) -> Self {
        Self::End(Box::new(end))
    }
}

impl From<anyhow::Error> for Exit {
    fn from(err: anyhow::Error) -> Self {
        Self::Error(err)
    }
}

impl From<sqlx::Error> for Exit {
    fn from(err: sqlx::Error) -> Self {
        Self::Error(err.into())
    }
}
