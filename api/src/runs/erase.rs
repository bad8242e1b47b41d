//! Erasing a thread: `DELETE /v1/threads/{id}`. Its active run is stopped, and its messages,
//! runs, steps, idempotency keys, webhook deliveries and stream are deleted.
//!
//! The order is what keeps it safe: the thread's row is locked first (no enqueue can start a
//! run on it meanwhile), then its stream is erased in Redis with the fences of its runs that
//! may still publish raised for good (so their workers publish nothing more and the stream is
//! not born again), then the rows go in the same transaction. If Redis fails, nothing is
//! erased; if Postgres fails after Redis, the fences are lifted again.
//!
//! The transaction is bounded ([`threads::ERASURE_LOCK_TIMEOUT`],
//! [`threads::ERASURE_STATEMENT_TIMEOUT`]): an erasure that cannot take its locks or finish in
//! time is rolled back whole and answered 503 `erasure_timed_out` with `Retry-After`, rather
//! than hold the thread's rows locked (and a request's connection) without bound.

use spool_shared::ThreadId;
use spool_shared::db;
use spool_shared::db::threads;
use spool_shared::stream;

use super::thread_not_found;
use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;

/// Erases the caller's thread (see the module doc); 404 if it has none of that id.
pub(crate) async fn erase_thread(
    state: &AppState,
    caller: &Caller,
    thread_id: ThreadId,
) -> Result<(), ApiError> {
    let mut tx = state.db.begin().await?;
    let erasing = threads::lock_for_erasure(&mut tx, thread_id, caller.write_scope())
        .await
        .map_err(erasure_error)?
        .ok_or_else(thread_not_found)?;
    // Redis first, under the thread's lock: if it fails, nothing is erased and the client can
    // try again; once it succeeds, the active run's worker can publish nothing more.
    let mut conn = state.streams.conn();
    stream::erase(
        &mut conn,
        state.streams.keys(),
        thread_id,
        &erasing.publishing,
    )
    .await
    .map_err(|err| {
        tracing::warn!(error = %err, thread.id = %thread_id, "could not erase the stream");
        ApiError::Unavailable {
            code: "redis_unavailable",
            message: "the stream store is unavailable; try again".into(),
            retry_after: 1,
        }
    })?;
    let erased = match threads::erase(&mut tx, thread_id).await {
        Ok(()) => tx.commit().await,
        Err(err) => Err(err),
    };
    if let Err(err) = erased {
        // The thread stays: lift the fences, or its active run could never publish again (best
        // effort; the stream itself is gone, which only a replay notices: `stream_reset`).
        let lifted = stream::lift_fences(
            &mut conn,
            state.streams.keys(),
            thread_id,
            &erasing.publishing,
        );
        if let Err(redis_err) = lifted.await {
            tracing::error!(error = %redis_err, thread.id = %thread_id,
                "erasure failed after its stream was erased; the fences of its runs stay up");
        }
        return Err(erasure_error(err));
    }
    // The erased active runs hold no room in their quotas any more.
    for (run, tenant, quota) in &erasing.admitted {
        state.admission.release(tenant, *run, quota).await;
    }
    for run in &erasing.publishing {
        // An active run's worker stops at once (else at its next heartbeat, which matches no
        // row); an ended run ignores it.
        db::notify_cancel(&state.db, *run).await?;
    }
    tracing::info!(thread.id = %thread_id, runs = erasing.runs.len(), "thread erased");
    Ok(())
}

/// A database error of the erasure as the client's answer: a lock or statement timeout is a
/// 503 to retry (the transaction was rolled back: nothing was erased).
fn erasure_error(err: sqlx::Error) -> ApiError {
    if db::is_timeout(&err) {
        tracing::warn!(error = %err, "erasure timed out; rolled back");
        return ApiError::Unavailable {
            code: "erasure_timed_out",
            message: "the thread is being written to and could not be erased in time; \
                      nothing was erased: try again"
                .into(),
            retry_after: 1,
        };
    }
    err.into()
}
