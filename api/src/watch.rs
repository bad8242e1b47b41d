//! Waiting for a run without holding a database connection (`GET /v1/workflows/{id}?wait=S`).
//!
//! One `LISTEN spool_run_status` connection per API process (a trigger NOTIFYs the run's id
//! when a watched run ends or pauses, in the changing transaction; `runs::watch` marks it) fans
//! out to every waiter through a
//! broadcast channel. A waiter subscribes, reads the run once, and reads it again only when its
//! run's id comes by (or when the listener lost its connection and notifications may have been
//! missed: it then wakes everyone). So 1,000 waits hold one connection, not 1,000.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use spool_shared::WorkflowId;

/// The channel the `runs_status_changed` trigger notifies (payload: the run's id).
pub const RUN_STATUS_CHANNEL: &str = "spool_run_status";

/// How many notifications may queue per waiter before it is told it lagged (and re-reads).
const BACKLOG: usize = 1024;

/// The process's status-change feed: `Some(id)` when run `id` changed, `None` when changes
/// may have been missed (every waiter re-reads).
#[derive(Clone, Debug)]
pub struct RunWatch {
    changes: broadcast::Sender<Option<WorkflowId>>,
}

impl RunWatch {
    /// Starts the listener task; it stops when `shutdown` fires.
    pub fn start(db: PgPool, shutdown: CancellationToken) -> Self {
        let (changes, _) = broadcast::channel(BACKLOG);
        let sender = changes.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = listen(db, sender) => {}
                () = shutdown.cancelled() => {}
            }
        });
        Self { changes }
    }

    /// A receiver of later changes. Subscribe before reading the run, so a change between the
    /// read and the wait is not missed.
    pub fn subscribe(&self) -> broadcast::Receiver<Option<WorkflowId>> {
        self.changes.subscribe()
    }
}

async fn listen(db: PgPool, changes: broadcast::Sender<Option<WorkflowId>>) {
    loop {
        let mut listener = match PgListener::connect_with(&db).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, "run status LISTEN connection failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(err) = listener.listen(RUN_STATUS_CHANNEL).await {
            tracing::warn!(error = %err, "LISTEN for run status failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        // Anything may have changed while no connection listened.
        let _ = changes.send(None);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    if let Ok(id) = notification.payload().parse() {
                        let _ = changes.send(Some(id));
                    }
                }
                // The connection was lost; the next call reconnects and listens again.
                Ok(None) => {
                    let _ = changes.send(None);
                }
                Err(err) => {
                    tracing::warn!(error = %err, "run status LISTEN failed; reconnecting");
                    let _ = changes.send(None);
                    break;
                }
            }
        }
    }
}
