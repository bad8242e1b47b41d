//! The fault suite: the system under the failures an operator sees, with real processes and
//! real servers. Redis and Postgres are restarted under load (private servers on other
//! ports, never the shared ones), a Redis Cluster master is killed so that its replica takes
//! over, a thousand clients reconnect at random to one API process, a worker is stopped past
//! its lease on a resumed run and then continued, and Postgres is crashed while webhook
//! deliveries are due.
//!
//! The tests take turns ([`SERIAL`]): each loads the machine on purpose, and their figures
//! (printed; `cargo test --test faults -- --nocapture` shows them) mean more alone. Each is
//! bounded in time by its deadlines.

#[path = "../e2e/stack.rs"]
#[expect(
    dead_code,
    reason = "the e2e tests' stack, of which these tests use a part"
)]
mod stack;

mod cluster;
mod graph;
mod restarts;
mod stop;
mod storm;
mod webhooks;

/// One fault test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
