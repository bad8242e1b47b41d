//! What a restarted attempt (after a crash, a release or a reclaim) shows again.
//!
//! On `attempt_restarted` a client that follows the stream keeps everything up to the last
//! `step` result and drops the rest (docs/streaming.md). The attempt learns from Redis which
//! result that is ([`takeover`](spool_shared::stream::takeover), which raises the fence in the
//! same round trip, so no earlier attempt adds one afterwards) and shows what the client
//! dropped or never got: every
//! settled step after it (text, calls and results), the results of its step that did not reach
//! the stream, and the unsettled step's text and calls unless that step is the one whose result
//! the client holds. Results are published only once their step is saved, so every result the
//! stream holds is one the attempt has: nothing is shown twice and nothing is left out, whether
//! the earlier attempt died before its save, between the save and the publish, or after both.
//!
//! If Redis cannot say (it is down), the attempt goes by the marks saved with the unsettled step
//! (a result marked published was, unless the attempt died between its save and its publish).

use std::time::Duration;

use spool_shared::db::steps::{CallResult, SavedStep};
use spool_shared::stream::PublishError;

use super::context::Attempt;
use super::step::{announce_calls, result_event};

/// How long the takeover waits for Redis before going by the saved marks.
const WAIT: Duration = Duration::from_secs(2);

/// Shows again what the client of a restarted attempt does not hold of the settled steps, and
/// marks each of the unsettled step's results (`number`, `results`) published if the stream
/// holds it. Returns whether the unsettled step's text and calls are to be shown again.
pub(crate) async fn show_again(
    a: &Attempt<'_>,
    settled: &[(u32, SavedStep)],
    unsettled: Option<(u32, &mut [CallResult])>,
) -> bool {
    let shown = match a.events.takeover(WAIT).await {
        Ok(shown) => shown,
        // A newer attempt holds the run: nothing of this one reaches the stream.
        Err(PublishError::Fenced { .. }) => return false,
        Err(PublishError::Redis(err)) => {
            tracing::warn!(error = %err, "could not read what the stream shows; going by the saved marks");
            return unsettled.is_some_and(|(_, results)| !results.iter().any(|r| r.published));
        }
    };
    for (number, step) in settled {
        let number = *number;
        let n = u64::from(number);
        if n < shown.step {
            continue;
        }
        if n > shown.step {
            a.emit_text(number, &step.assistant.text);
            announce_calls(a, number, &step.assistant.tool_calls);
        }
        for result in &step.results {
            if n > shown.step || !shown.calls.contains(&result.tool_call_id) {
                a.events.send(result_event(number, result));
            }
        }
    }
    let Some((number, results)) = unsettled else {
        return false;
    };
    let held = u64::from(number) == shown.step;
    for result in results {
        result.published = held && shown.calls.contains(&result.tool_call_id);
    }
    !held
}
