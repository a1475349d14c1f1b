//! The one accept loop of every listener: accept (within the cap), serve each connection on its
//! own task, and on shutdown stop accepting, ask every connection to finish gracefully and wait
//! up to a grace period for them.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::rt::{Read, Write};
use hyper::service::HttpService;
use tokio::sync::watch;

use super::{Acceptor, Limited};

/// A served connection the accept loop can ask to finish: after the response in flight
/// (HTTP/1), or with `GOAWAY` (HTTP/2).
pub trait Connection: Future<Output = Result<(), hyper::Error>> {
    /// Starts finishing gracefully.
    fn graceful_shutdown(self: Pin<&mut Self>);
}

/// An error a service or body may have.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<I, S, B> Connection for hyper::server::conn::http1::Connection<I, S>
where
    I: Read + Write + Unpin + Send + 'static,
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::Connection::graceful_shutdown(self);
    }
}

impl<I, S, B> Connection for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    I: Read + Write + Unpin + Send + 'static,
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl<I, S, B, E> Connection for hyper::server::conn::http2::Connection<I, S, E>
where
    I: Read + Write + Unpin + Send + 'static,
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B> + Send + 'static,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http2::Connection::graceful_shutdown(self);
    }
}

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
    C: Connection + Send + 'static,
{
    // Every connection's task holds a receiver: a message asks them to finish, and the
    // sender sees when the last one has gone.
    let (stop, _) = watch::channel(());
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
        let connection = connection(stream, peer);
        let mut stopping = stop.subscribe();
        let ended = acceptor.ended();
        tokio::spawn(async move {
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = stopping.changed() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            drop(stopping);
            if let Err(e) = result {
                ended.with_error(&e);
                tracing::debug!(%peer, "{name} connection ended with an error: {e}");
            }
        });
    }
    drop(acceptor);
    let _ = stop.send(());
    if tokio::time::timeout(grace, stop.closed()).await.is_err() {
        tracing::warn!(
            "{name}: requests still in flight after {}; closing their connections",
            humantime::format_duration(grace)
        );
    }
    Ok(())
}
