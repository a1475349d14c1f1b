//! The HTTP server: `run(listener, shutdown)`.

use std::future::Future;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;

/// The HTTP routes.
pub fn router() -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" }))
}

/// Serves until `shutdown` completes, then finishes in-flight requests.
pub async fn run(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Completes on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
