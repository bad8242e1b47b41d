//! The attempt as the agent loop sees it: the database, the worker's engine (models, tools'
//! clients), the claimed run, its stop signal and its event publisher. Nothing of the claim loop
//! or the lease keeper: the loop cannot reach them.

use std::time::Duration;

use sqlx::PgPool;

use spool_shared::db::runs::{Claimed, Fence, Pause};
use spool_shared::db::steps::SavedStep;
use spool_shared::event::{BlockId, TextDelta, TextEnd, TextStart};
use spool_shared::run::PendingAction;
use spool_shared::status::RunStatus;

use super::answer::{Exit, LoopEnd};
use super::engine::Engine;
use crate::publish::Publisher;
use crate::stop::Stop;

/// What one attempt's loop works with.
pub(crate) struct Attempt<'a> {
    /// Postgres.
    pub(crate) db: &'a PgPool,
    /// Models, tools' HTTP clients and the default agent.
    pub(crate) engine: &'a Engine,
    /// The run and the attempt that holds it.
    pub(crate) claimed: &'a Claimed,
    /// When to stop whatever it is doing.
    pub(crate) stop: &'a Stop,
    /// Where its events go.
    pub(crate) events: &'a Publisher,
    /// The quota counters (Redis).
    pub(crate) admission: &'a spool_shared::quota::admission::Admission,
}

impl Attempt<'_> {
    /// Saves step `step` (fenced on this attempt); ends the loop if the lease is lost.
    pub(crate) async fn save_step(&self, step: u32, data: &SavedStep) -> Result<(), Exit> {
        held(self.claimed.save_step(self.db, step, data).await?)
    }

    /// Pauses the run (fenced on this attempt) for `action`, for at most `timeout_secs`; ends
    /// the loop if the lease is lost. `CancelRequested` if a cancel request stood in the way
    /// (the run was not paused).
    pub(crate) async fn pause(
        &self,
        status: RunStatus,
        action: &PendingAction,
        timeout_secs: u32,
    ) -> Result<Pause, Exit> {
        let mut timeout = Duration::from_secs(u64::from(timeout_secs));
        // A pause ends by the run's time limit at the latest: the claim then fails it.
        if let Some(remaining) = self.stop.remaining() {
            timeout = timeout.min(remaining.max(Duration::from_secs(1)));
        }
        let paused = self.claimed.pause(self.db, status, action, timeout);
        match paused.await? {
            Pause::Lost => Err(LoopEnd::LeaseLost.into()),
            other => Ok(other),
        }
    }

    /// Publishes a whole text block at once (held-back or re-shown text).
    pub(crate) fn emit_text(&self, step: u32, text: &str) {
        if text.is_empty() {
            return;
        }
        let block_id = BlockId::of_step(step);
        self.events.send(TextStart {
            block_id: block_id.clone(),
        });
        self.events.send(TextDelta {
            block_id: block_id.clone(),
            delta: text.to_owned(),
        });
        self.events.send(TextEnd { block_id });
    }
}

/// A lost lease ends the loop; nothing more may be written.
fn held(fence: Fence) -> Result<(), Exit> {
    match fence {
        Fence::Held => Ok(()),
        Fence::Lost => Err(LoopEnd::LeaseLost.into()),
    }
}
