//! The run's limits, as the loop enforces them step by step: what ends a run early because it
//! went on too long or spent too much.
//!
//! - Tool calls: the same call [`DOOM_LOOP`] times in a row is a doom loop (`doom_loop`);
//!   more calls in the run than `limits.max_tool_calls` fail it (`max_tool_calls_exceeded`).
//!   [`Recent`] counts them, and a checkpoint restores the count, so a resumed run keeps it.
//! - Daily budgets: every model call's tokens and dollars are charged to the run's budgeted
//!   quota counters ([`charge`]); a budget (`daily_token_budget`, `daily_budget_usd`) found
//!   spent fails the run at its next step (`budget_exceeded`), so the step that spent it keeps
//!   its answer.
//!
//! Elsewhere: the limits the loop applies once, as it prepares (`limits.max_steps`, and the
//! deadline of client tool outputs), stay in `prepare`, next to the spec they adjust;
//! `limits.max_call_depth` is checked where agent calls start ([`super::children`]); the run's
//! time limit (`limits.timeout_secs`) is the attempt's stop signal ([`crate::stop`]).

use spool_shared::db::quota::{self, Spent};
use spool_shared::run::{FailureCode, Usage};

use super::Loop;
use super::answer::Exit;
use super::context::Attempt;
use super::llm::ToolCall;
use super::model_call::ModelOutput;

/// The same call this many times in a row is a doom loop.
pub(crate) const DOOM_LOOP: usize = 3;

/// The run's recent tool calls (name and arguments), for doom-loop detection.
#[derive(Debug, Default)]
pub(crate) struct Recent(Vec<(String, String)>);

impl Recent {
    /// How many tool calls the run has asked for so far.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Records calls that were already made (a replayed or resumed step).
    pub(crate) fn extend(&mut self, calls: &[ToolCall]) {
        self.0
            .extend(calls.iter().map(|c| (c.name.clone(), c.arguments.clone())));
    }

    /// Records a step's calls in order; the first that makes [`DOOM_LOOP`] identical calls in a
    /// row, if any.
    pub(crate) fn doom<'c>(&mut self, calls: &'c [ToolCall]) -> Option<&'c ToolCall> {
        calls.iter().find(|call| {
            self.0.push((call.name.clone(), call.arguments.clone()));
            let tail = &self.0[self.0.len().saturating_sub(DOOM_LOOP)..];
            tail.len() == DOOM_LOOP && tail.iter().all(|c| *c == tail[DOOM_LOOP - 1])
        })
    }
}

impl Loop<'_> {
    /// Adds a model call's tokens to the answer's usage and charges them to the run's budgets;
    /// a budget found spent fails the run at its next step.
    pub(super) async fn spend(&mut self, a: &Attempt<'_>, usage: Usage) -> Result<(), Exit> {
        self.answer.usage.add(usage);
        self.spent = charge(a, usage).await?;
        Ok(())
    }

    /// Fails the run if the last charge found a daily token budget of its counters spent.
    pub(super) fn within_budget(&mut self) -> Result<(), Exit> {
        match self.spent.take() {
            Some(spent) => Err(self.failed(FailureCode::BudgetExceeded, spent.message())),
            None => Ok(()),
        }
    }

    /// Records a step's tool calls and fails the run if they break a limit: the same call
    /// [`DOOM_LOOP`] times in a row, or more calls in the run than `limits.max_tool_calls`.
    pub(super) fn within_call_limits(&mut self, output: &ModelOutput) -> Result<(), Exit> {
        if let Some(call) = self.recent.doom(&output.tool_calls) {
            let message = format!(
                "the model called `{}` with the same arguments {DOOM_LOOP} times in a row",
                call.name
            );
            return Err(self.failed(FailureCode::DoomLoop, message));
        }
        let max = (self.spec.limits.max_tool_calls)
            .unwrap_or(spool_shared::agent::DEFAULT_MAX_TOOL_CALLS);
        if self.recent.len() > max as usize {
            // Shown with its calls (held-back text too: the loop emitted it before this check).
            self.answer.add_text(&output.text);
            let message = format!(
                "the model asked for tool call {} of the run; limits.max_tool_calls is {max}",
                self.recent.len()
            );
            return Err(self.failed(FailureCode::MaxToolCallsExceeded, message));
        }
        Ok(())
    }
}

/// Charges a model call's tokens and dollars (none for an unpriced model) to the run's
/// budgeted quota counters (with no tokens, only reads them); a budget found spent, if any.
/// Runs under no budget make no query.
pub(super) async fn charge(a: &Attempt<'_>, usage: Usage) -> sqlx::Result<Option<Spent>> {
    let run = a.claimed.run();
    let Some(quota) = &run.quota else {
        return Ok(None);
    };
    let tokens = usage.input_tokens.saturating_add(usage.output_tokens);
    let dollars = usage.cost_usd.map_or(0.0, |usd| usd.0);
    let (spent, counted) = quota::charge(a.db, &run.tenant_id, &quota.0, tokens, dollars).await?;
    if tokens > 0 {
        // New runs are admitted against Redis's copy of the day's tokens and dollars.
        a.admission.record_tokens(&run.tenant_id, &counted).await;
    }
    Ok(spent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_identical_calls_in_a_row_are_a_doom_loop_and_two_are_not() {
        let call = |id: &str, args: &str| ToolCall {
            id: id.into(),
            name: "look".into(),
            arguments: args.into(),
        };
        let mut recent = Recent::default();
        recent.extend(&[call("1", "{}")]);
        assert!(recent.doom(&[call("2", "{}")]).is_none());
        assert!(recent.doom(&[call("3", "{\"x\":1}")]).is_none());
        assert!(recent.doom(&[call("4", "{}"), call("5", "{}")]).is_none());
        let third = [call("6", "{}")];
        assert_eq!(recent.doom(&third).map(|c| c.id.as_str()), Some("6"));
    }
}
