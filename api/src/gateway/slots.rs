//! Open streams per user in this process, against `SPOOL_SSE_MAX_STREAMS_PER_USER` (review
//! M10): a client that opens streams and never closes them (a page that makes a new
//! `EventSource` on every render, a script in a loop) is refused with 429 `too_many_streams`
//! before it holds the process's sockets and memory, while other users stream on.
//!
//! The process as a whole holds at most `SPOOL_SSE_MAX_STREAMS` streams, whoever opens them:
//! many users each within their own limit could otherwise still open more streams than the
//! process has memory and sockets for. One more is refused with 503 `server_stream_capacity`
//! and `Retry-After` (the client is not at fault: another process, or this one a little later,
//! has room).
//!
//! The counts are per process, not global: a stream lives on one process, and what it holds
//! (a socket, a session, a subscription) is that process's. Every streaming route takes its
//! slot before it changes anything (the OpenAI-compatible routes before they enqueue), so a
//! refused request creates nothing. A slot also counts the stream in `spool_sse_streams_open`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use spool_shared::db::threads::Owner;

use crate::error::ApiError;

/// Seconds a refused client is told to wait (a stream of its own usually ends within that).
const RETRY_AFTER: u32 = 2;

/// The process's open streams, per user and in all. Cheap to clone.
#[derive(Clone, Default)]
pub struct StreamSlots {
    open: Arc<Mutex<Open>>,
}

/// The counts behind [`StreamSlots`].
#[derive(Default)]
struct Open {
    /// Per user (no entry: none open).
    by_owner: HashMap<Owner, usize>,
    /// In all.
    total: usize,
}

/// The limits a slot is taken against (0: no limit).
#[derive(Clone, Copy, Debug)]
pub struct StreamLimits {
    /// Streams one user may hold open on this process (`SPOOL_SSE_MAX_STREAMS_PER_USER`).
    pub per_user: usize,
    /// Streams this process holds open in all (`SPOOL_SSE_MAX_STREAMS`).
    pub per_process: usize,
}

/// One open stream of a user: counted until dropped.
pub struct StreamSlot {
    slots: StreamSlots,
    owner: Owner,
}

impl StreamSlots {
    /// A slot for one more stream of `owner`, unless it already has `limits.per_user` open here
    /// (429 `too_many_streams`) or the process has `limits.per_process` open in all (503
    /// `server_stream_capacity`). The user's limit is checked first: a client over its own
    /// limit is told so, whatever the process's load.
    pub fn take(&self, owner: &Owner, limits: StreamLimits) -> Result<StreamSlot, ApiError> {
        let mut open = self.lock();
        let count = open.by_owner.get(owner).copied().unwrap_or(0);
        let max = limits.per_user;
        if max > 0 && count >= max {
            return Err(ApiError::TooManyRequests {
                code: "too_many_streams",
                message: format!(
                    "this user has {max} streams open on this server \
                     (SPOOL_SSE_MAX_STREAMS_PER_USER); close one first"
                ),
                retry_after: RETRY_AFTER,
                details: serde_json::Map::new(),
            }
            .with("limit", max)
            .with("retry_after", RETRY_AFTER));
        }
        if limits.per_process > 0 && open.total >= limits.per_process {
            metrics::counter!("spool_sse_streams_refused_total", "limit" => "process").increment(1);
            return Err(ApiError::Unavailable {
                code: "server_stream_capacity",
                message: "this server holds as many streams as it may (SPOOL_SSE_MAX_STREAMS); \
                          retry shortly"
                    .into(),
                retry_after: RETRY_AFTER,
            });
        }
        *open.by_owner.entry(owner.clone()).or_default() += 1;
        open.total += 1;
        metrics::gauge!("spool_sse_streams_open").increment(1.0);
        Ok(StreamSlot {
            slots: self.clone(),
            owner: owner.clone(),
        })
    }

    /// How many streams `owner` has open here.
    pub fn open(&self, owner: &Owner) -> usize {
        self.lock().by_owner.get(owner).copied().unwrap_or(0)
    }

    /// How many streams are open here in all.
    pub fn total(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // Every update is one counter change: consistent even after a panic.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        metrics::gauge!("spool_sse_streams_open").decrement(1.0);
        let mut open = self.slots.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(count) = open.by_owner.get_mut(&self.owner) {
            *count -= 1;
            if *count == 0 {
                open.by_owner.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(user: &str) -> Owner {
        Owner {
            tenant_id: "acme".into(),
            user_id: user.into(),
        }
    }

    /// A per-user limit of `max`, no process limit.
    fn user(max: usize) -> StreamLimits {
        StreamLimits {
            per_user: max,
            per_process: 0,
        }
    }

    #[test]
    fn a_user_gets_max_slots_others_are_unaffected_and_a_dropped_slot_frees_one() {
        let slots = StreamSlots::default();
        let alice = owner("alice");
        let mut held: Vec<StreamSlot> = (0..3)
            .map(|_| slots.take(&alice, user(3)).expect("within the limit"))
            .collect();
        let refused = slots
            .take(&alice, user(3))
            .err()
            .expect("the fourth is refused");
        assert!(matches!(
            refused,
            ApiError::TooManyRequests {
                code: "too_many_streams",
                ..
            }
        ));
        let bob = slots.take(&owner("bob"), user(3)).expect("another user");
        let other_tenant = Owner {
            tenant_id: "globex".into(),
            user_id: "alice".into(),
        };
        let _other = slots
            .take(&other_tenant, user(3))
            .expect("same user id, another tenant");
        drop(held.pop());
        let _again = slots
            .take(&alice, user(3))
            .expect("a closed stream frees its slot");
        drop(bob);
        assert_eq!((slots.open(&alice), slots.open(&owner("bob"))), (3, 0));
        assert!(
            !slots.lock().by_owner.contains_key(&owner("bob")),
            "no entry left behind"
        );
        let _unlimited: Vec<StreamSlot> = (0..10)
            .map(|_| slots.take(&owner("carol"), user(0)).expect("0 is no limit"))
            .collect();
    }

    #[test]
    fn the_process_holds_at_most_its_limit_in_all_503_past_it_and_a_user_over_its_own_limit_hears_429()
     {
        let slots = StreamSlots::default();
        let limits = StreamLimits {
            per_user: 2,
            per_process: 3,
        };
        let alice = owner("alice");
        let mut held = vec![
            slots.take(&alice, limits).expect("1"),
            slots.take(&alice, limits).expect("2"),
            slots.take(&owner("bob"), limits).expect("3"),
        ];
        let refused = slots.take(&owner("carol"), limits).err().expect("full");
        assert!(
            matches!(
                refused,
                ApiError::Unavailable {
                    code: "server_stream_capacity",
                    retry_after: RETRY_AFTER,
                    ..
                }
            ),
            "{refused:?}"
        );
        let own = slots.take(&alice, limits).err().expect("alice is at hers");
        assert!(matches!(
            own,
            ApiError::TooManyRequests {
                code: "too_many_streams",
                ..
            }
        ));
        assert_eq!(slots.total(), 3, "refusals hold nothing");
        drop(held.pop());
        let _carol = slots
            .take(&owner("carol"), limits)
            .expect("a closed stream frees room in the process");
        let unlimited = StreamLimits {
            per_user: 0,
            per_process: 0,
        };
        let _more: Vec<StreamSlot> = (0..10)
            .map(|_| {
                slots
                    .take(&owner("dave"), unlimited)
                    .expect("0 is no limit")
            })
            .collect();
        assert_eq!(slots.total(), 13);
    }
}
