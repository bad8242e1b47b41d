//! Open streams per user in this process, against `SPOOL_SSE_MAX_STREAMS_PER_USER` (review
//! M10): a client that opens streams and never closes them (a page that makes a new
//! `EventSource` on every render, a script in a loop) is refused with 429 `too_many_streams`
//! before it holds the process's sockets and memory, while other users stream on.
//!
//! The count is per process, not global: a stream lives on one process, and what it holds
//! (a socket, a session, a subscription) is that process's. Every streaming route takes its
//! slot before it changes anything (the OpenAI-compatible routes before they enqueue), so a
//! refused request creates nothing. A slot also counts the stream in `spool_sse_streams_open`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use spool_shared::db::threads::Owner;

use crate::error::ApiError;

/// Seconds a refused client is told to wait (a stream of its own usually ends within that).
const RETRY_AFTER: u32 = 2;

/// The process's open streams per user. Cheap to clone.
#[derive(Clone, Default)]
pub struct StreamSlots {
    open: Arc<Mutex<HashMap<Owner, usize>>>,
}

/// One open stream of a user: counted until dropped.
pub struct StreamSlot {
    slots: StreamSlots,
    owner: Owner,
}

impl StreamSlots {
    /// A slot for one more stream of `owner`, unless it already has `max` open here (0: no
    /// limit): then 429 `too_many_streams`.
    pub fn take(&self, owner: &Owner, max: usize) -> Result<StreamSlot, ApiError> {
        let mut open = self.lock();
        let count = open.entry(owner.clone()).or_default();
        if max > 0 && *count >= max {
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
        *count += 1;
        metrics::gauge!("spool_sse_streams_open").increment(1.0);
        Ok(StreamSlot {
            slots: self.clone(),
            owner: owner.clone(),
        })
    }

    /// How many streams `owner` has open here.
    pub fn open(&self, owner: &Owner) -> usize {
        self.lock().get(owner).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, usize>> {
        // Every update is one counter change: consistent even after a panic.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        metrics::gauge!("spool_sse_streams_open").decrement(1.0);
        let mut open = self.slots.lock();
        if let Some(count) = open.get_mut(&self.owner) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.owner);
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

    #[test]
    fn a_user_gets_max_slots_others_are_unaffected_and_a_dropped_slot_frees_one() {
        let slots = StreamSlots::default();
        let alice = owner("alice");
        let mut held: Vec<StreamSlot> = (0..3)
            .map(|_| slots.take(&alice, 3).expect("within the limit"))
            .collect();
        let refused = slots.take(&alice, 3).err().expect("the fourth is refused");
        assert!(matches!(
            refused,
            ApiError::TooManyRequests {
                code: "too_many_streams",
                ..
            }
        ));
        let bob = slots.take(&owner("bob"), 3).expect("another user");
        let other_tenant = Owner {
            tenant_id: "globex".into(),
            user_id: "alice".into(),
        };
        let _other = slots
            .take(&other_tenant, 3)
            .expect("same user id, another tenant");
        drop(held.pop());
        let _again = slots
            .take(&alice, 3)
            .expect("a closed stream frees its slot");
        drop(bob);
        assert_eq!((slots.open(&alice), slots.open(&owner("bob"))), (3, 0));
        assert!(
            slots.lock().get(&owner("bob")).is_none(),
            "no entry left behind"
        );
        let _unlimited: Vec<StreamSlot> = (0..10)
            .map(|_| slots.take(&owner("carol"), 0).expect("0 is no limit"))
            .collect();
    }
}
