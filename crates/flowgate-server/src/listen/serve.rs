//! The accept loop every HTTP listener but the WebSocket gateway's shares: accept (within the
//! cap), serve each connection on its own task, and on shutdown stop accepting, ask every
//! connection to finish gracefully and wait up to a grace period for them.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown};

use super::{Acceptor, Limited};

/// Serves the connections `acceptor` accepts, each as `connection(stream, peer)` makes it,
/// until `shutdown` completes; then stops accepting and waits up to `grace` for the
/// connections still open (each is asked to finish gracefully: HTTP/1 closes after its
/// response in flight, HTTP/2 sends `GOAWAY`). Connections that end with an error are counted
/// (late or oversized heads) and logged at `debug`. `name` names the listener in logs.
pub async fn serve_connections<C, F>(
    acceptor: Acceptor,
    name: &'static str,
    shutdown: impl Future<Output = ()> + Send,
    grace: Duration,
    mut connection: F,
) -> std::io::Result<()>
where
    F: FnMut(Limited, SocketAddr) -> C,
    C: GracefulConnection<Error = hyper::Error> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.as_mut() => break,
            accepted = acceptor.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("{name}: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let connection = graceful.watch(connection(stream, peer));
        let ended = acceptor.ended();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                ended.with_error(&e);
                tracing::debug!(%peer, "{name} connection ended with an error: {e}");
            }
        });
    }
    drop(acceptor);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "{name}: requests still in flight after {}; closing their connections",
            humantime::format_duration(grace)
        );
    }
    Ok(())
}
