//! Process signals. `main` owns them and turns them into a `CancellationToken`; everything
//! below takes the token, so tests stop components without signals.

use tokio_util::sync::CancellationToken;

/// Cancels `token` on SIGTERM or Ctrl-C (SIGINT).
pub async fn on_signal(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM; Ctrl-C only");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown signal received");
    token.cancel();
}
