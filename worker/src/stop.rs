//! An attempt's stop signal, as one small value (after mini-redis's `Shutdown`).
//!
//! Three things stop an attempt whatever it is doing: its lease is lost (another worker owns the
//! run now: write nothing more), the worker shuts down past its grace period (give the run
//! back), or someone asks to cancel the run (keep what was produced and end it `cancelled`).
//! [`Stop`] packs the three signals; the model call, the tools and the step settlement ask it
//! [`Stop::now`] between pieces of work and race [`Stop::wait`] against the work itself.

use tokio_util::sync::CancellationToken;

/// Why an attempt must stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Halt {
    /// The lease is gone: write nothing more.
    LeaseLost,
    /// Shutdown: give the run back to the queue.
    Released,
    /// Cancel requested: record what was produced.
    Cancelled,
}

/// The stop signal of one attempt.
#[derive(Clone, Debug)]
pub(crate) struct Stop {
    lost: CancellationToken,
    cancel: CancellationToken,
    release: CancellationToken,
    /// The claim already saw a cancel request.
    cancelled_at_claim: bool,
}

impl Stop {
    /// The signal of an attempt whose lease fires `lost` and `cancel` (a cancel request read by
    /// the heartbeat or a NOTIFY), in a worker whose shutdown fires `release`.
    pub(crate) fn new(
        lost: CancellationToken,
        cancel: CancellationToken,
        release: CancellationToken,
        cancelled_at_claim: bool,
    ) -> Self {
        Self {
            lost,
            cancel,
            release,
            cancelled_at_claim,
        }
    }

    /// Whether the attempt must stop now, and why. A lost lease wins over everything: nothing
    /// may be written then, not even a cancellation.
    pub(crate) fn now(&self) -> Option<Halt> {
        if self.lost.is_cancelled() {
            Some(Halt::LeaseLost)
        } else if self.cancel.is_cancelled() || self.cancelled_at_claim {
            Some(Halt::Cancelled)
        } else if self.release.is_cancelled() {
            Some(Halt::Released)
        } else {
            None
        }
    }

    /// Resolves when the attempt must stop (as [`Self::now`] would say, if several fired).
    pub(crate) async fn wait(&self) -> Halt {
        tokio::select! {
            biased;
            () = self.lost.cancelled() => Halt::LeaseLost,
            () = self.cancel.cancelled() => Halt::Cancelled,
            () = self.release.cancelled() => Halt::Released,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lost_lease_wins_over_a_cancel_and_a_shutdown() {
        let tokens: [CancellationToken; 3] = Default::default();
        let [lost, cancel, release] = tokens.clone();
        let stop = Stop::new(lost, cancel, release, false);
        assert_eq!(stop.now(), None);
        tokens[2].cancel();
        assert_eq!(stop.now(), Some(Halt::Released));
        tokens[1].cancel();
        assert_eq!(stop.now(), Some(Halt::Cancelled));
        tokens[0].cancel();
        assert_eq!(stop.now(), Some(Halt::LeaseLost));
        assert_eq!(stop.wait().await, Halt::LeaseLost);
        let at_claim = Stop::new(
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
            true,
        );
        assert_eq!(at_claim.now(), Some(Halt::Cancelled));
    }
}
