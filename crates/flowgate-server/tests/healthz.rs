//! The skeleton server answers `/healthz` over real HTTP.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn healthz_answers_ok_and_shutdown_is_graceful() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(flowgate_server::server::run(listener, async {
        let _ = stopped.await;
    }));
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("ok\n"), "{response}");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
