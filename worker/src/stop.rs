//! An attempt's stop signal, as one small value (after mini-redis's `Shutdown`).
//!
//! Four things stop an attempt whatever it is doing: its lease is lost (another worker owns the
//! run now: write nothing more), the worker shuts down past its grace period (give the run
//! back), someone asks to cancel the run (keep what was produced and end it `cancelled`), or
//! the run's time limit (`limits.timeout_secs`, from enqueue by the database clock) runs out
//! (keep what was produced and fail it with `timeout`). [`Stop`] packs the four signals; the model call, the tools and the step settlement ask it
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
    /// The run's time limit ran out: record what was produced, fail the run.
    TimedOut,
}

/// The stop signal of one attempt.
#[derive(Clone, Debug)]
pub(crate) struct Stop {
    lost: CancellationToken,
    cancel: CancellationToken,
    release: CancellationToken,
    timed_out: CancellationToken,
    /// When the run's time limit runs out, once known.
    deadline: std::sync::OnceLock<tokio::time::Instant>,
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
            timed_out: CancellationToken::new(),
            deadline: std::sync::OnceLock::new(),
            cancelled_at_claim,
        }
    }

    /// How long until the run's time limit runs out, if it has one.
    pub(crate) fn remaining(&self) -> Option<std::time::Duration> {
        self.deadline
            .get()
            .map(|deadline| deadline.saturating_duration_since(tokio::time::Instant::now()))
    }

    /// Fires [`Halt::TimedOut`] after `remaining` (at once if it is zero).
    pub(crate) fn time_out_after(&self, remaining: std::time::Duration) -> TimeLimit {
        let _ = self.deadline.set(tokio::time::Instant::now() + remaining);
        if remaining.is_zero() {
            self.timed_out.cancel();
        }
        let timed_out = self.timed_out.clone();
        TimeLimit(tokio::spawn(async move {
            tokio::time::sleep(remaining).await;
            timed_out.cancel();
        }))
    }

    /// Whether the attempt must stop now, and why. A lost lease wins over everything: nothing
    /// may be written then, not even a cancellation.
    pub(crate) fn now(&self) -> Option<Halt> {
        if self.lost.is_cancelled() {
            Some(Halt::LeaseLost)
        } else if self.cancel.is_cancelled() || self.cancelled_at_claim {
            Some(Halt::Cancelled)
        } else if self.timed_out.is_cancelled() {
            Some(Halt::TimedOut)
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
            () = self.timed_out.cancelled() => Halt::TimedOut,
            () = self.release.cancelled() => Halt::Released,
        }
    }
}

/// The timer of a run's time limit; stops when dropped (the attempt is over).
#[derive(Debug)]
pub(crate) struct TimeLimit(tokio::task::JoinHandle<()>);

impl Drop for TimeLimit {
    fn drop(&mut self) {
        self.0.abort();
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
