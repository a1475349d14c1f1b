//! A chat server on a free loopback port, stopped when dropped.

use std::net::SocketAddr;

use example_ws_chat::{Config, run};
use tokio::task::JoinHandle;

/// A running chat server.
pub(crate) struct Server {
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Starts the chat with `config` on `127.0.0.1:0`.
    pub(crate) async fn start(config: Config) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            run(listener, &config).await.unwrap();
        });
        Server { addr, task }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
