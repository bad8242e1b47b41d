//! Resuming from the last completed step (invariant 6).
//!
//! Every step is saved in Postgres before the next model call ([`spool_shared::db::steps`]).
//! A new attempt restores what the earlier ones left: each settled step is replayed into the
//! conversation and the answer (its model call and tool calls are never repeated), and the
//! unsettled last step, if any, is settled by the loop. A step is unsettled when a crash cut it
//! short (its approved calls run again, with the same ids and so the same idempotency keys) or
//! when the run paused on it (its answers, or an expired approval, are applied).

use sqlx::PgPool;

use spool_shared::db::runs::Run;
use spool_shared::db::steps::{self, CallResult, SavedStep};

use super::answer::Answer;
use super::limits::Recent;
use super::llm::ChatMessage;
use super::model_call::ModelOutput;

/// What earlier attempts of the run left.
#[derive(Debug, Default)]
pub(crate) struct Checkpoint {
    /// The settled steps' text, tool parts, usage and citations.
    pub(crate) answer: Answer,
    /// The settled steps' messages, to follow the prompt.
    pub(crate) conversation: Vec<ChatMessage>,
    /// The settled steps' tool calls.
    pub(crate) recent: Recent,
    /// The number of the first step not settled.
    pub(crate) next: u32,
    /// That step, if it was saved but not settled.
    pub(crate) unsettled: Option<Unsettled>,
    /// The settled steps, by number (for a restarted attempt to show again what a client
    /// dropped or never got).
    pub(crate) settled: Vec<(u32, SavedStep)>,
}

/// A saved step whose calls are not all done.
#[derive(Debug)]
pub(crate) struct Unsettled {
    /// Its model call's output.
    pub(crate) output: ModelOutput,
    /// Where each of its calls stands.
    pub(crate) results: Vec<CallResult>,
}

impl Checkpoint {
    /// Whether no step was saved yet: the run starts from the beginning.
    pub(crate) fn is_fresh(&self) -> bool {
        self.next == 1 && self.unsettled.is_none()
    }
}

/// Loads the run's saved steps and replays the settled ones. A first attempt has none to load:
/// steps are saved only by an attempt holding the run, fenced on its number, so none can exist
/// before attempt 1 runs (its claim saves a round trip per run).
pub(crate) async fn restore(db: &PgPool, run: &Run) -> sqlx::Result<Checkpoint> {
    if run.attempt <= 1 {
        return Ok(Checkpoint {
            next: 1,
            ..Checkpoint::default()
        });
    }
    let mut saved = steps::load(db, run.id).await?;
    let unsettled = saved.pop_if(|step| !step.data.0.is_settled()).map(|step| {
        let SavedStep {
            assistant,
            results,
            usage,
            model_call,
            ..
        } = step.data.0;
        let output = ModelOutput {
            text: assistant.text,
            tool_calls: assistant.tool_calls,
            usage,
            model_call,
        };
        Unsettled { output, results }
    });
    let mut checkpoint = Checkpoint {
        next: u32::try_from(saved.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1),
        unsettled,
        ..Checkpoint::default()
    };
    for step in saved {
        let number = u32::try_from(step.step).unwrap_or(0);
        checkpoint.replay(number, &step.data.0);
        checkpoint.settled.push((number, step.data.0));
    }
    Ok(checkpoint)
}

impl Checkpoint {
    /// Restores a settled step into the conversation and the answer.
    fn replay(&mut self, number: u32, saved: &SavedStep) {
        self.answer.add_step(number, saved);
        self.answer.usage.add(saved.usage);
        let text = &saved.assistant.text;
        self.conversation.push(ChatMessage::Assistant {
            content: (!text.is_empty()).then(|| text.clone()),
            tool_calls: saved.assistant.tool_calls.clone(),
        });
        self.recent.extend(&saved.assistant.tool_calls);
        for result in &saved.results {
            self.conversation.push(ChatMessage::Tool {
                tool_call_id: result.tool_call_id.clone(),
                content: result.output.clone(),
            });
        }
    }
}
