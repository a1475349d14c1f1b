//! `cargo run -p example-ws-chat`: the chat on `ADDR` (default `127.0.0.1:3001`). See the
//! library's docs and `README.md` for what it limits and what to try.

use std::error::Error;

use example_ws_chat::{Config, run};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let config = Config::from_env()?;
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3001".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("chat on http://{}/?room=lobby", listener.local_addr()?);
    run(listener, &config).await
}
