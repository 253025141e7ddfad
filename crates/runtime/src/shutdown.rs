//! Graceful shutdown: one `watch` flag every task waits on.

use tokio::sync::watch;

/// Resolves when the shutdown flag becomes true (or its sender is gone).
pub async fn wait_for(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
