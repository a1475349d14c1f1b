//! TLS with rustls, over real connections on loopback, with certificates each test makes
//! (`flowgate_testing::pki`): the HTTP API, the gRPC API and the gateway serve TLS; the certificate
//! is reloaded when its files change (and a broken file keeps the running one); a handshake
//! that never comes is closed after the header read timeout and counted; plaintext to a TLS
//! port is refused and counted; the gateway reaches `https://` upstreams and refuses one it
//! cannot verify.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use flowgate_server::listen::ListenLimits;
use flowgate_server::server::ServerConfig;
use flowgate_server::tls::{CertificateFiles, ListenerTls, ServerCertificate, TlsListener};
use flowgate_testing::grpc::{descriptor, request};
use flowgate_testing::pki::Pki;
use flowgate_testing::server::TestServer;
use flowgate_testing::upstream::PASS_ALL;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const LIMITED: &str = r#"
domain: edge
gateway:
  descriptors:
    - [{key: remote_address}]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

/// A server with TLS on `listeners`, its certificate files in the server's directory.
async fn tls_server(
    pki: &Pki,
    listeners: &[TlsListener],
    upstream: Option<&str>,
    limits: ListenLimits,
) -> (TestServer, CertificateFiles) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, LIMITED).unwrap();
    let (chain, key) = pki.leaf().write(dir.path(), "server");
    let files = CertificateFiles { chain, key };
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.tls = Some(ListenerTls {
        certificate: ServerCertificate::load(files.clone()).unwrap(),
        listeners: listeners.to_vec(),
    });
    config.listen = limits;
    config.upstream = upstream.map(|u| u.parse().unwrap());
    (TestServer::start_with(config, dir, vec![path]).await, files)
}

/// A TLS client trusting only `pki`'s CA, offering `alpn`.
fn connector(pki: &Pki, alpn: &[&[u8]]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(pki.ca_der())).unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

async fn tls_connect(
    connector: &TlsConnector,
    addr: SocketAddr,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// The leaf certificate `addr` presents now.
async fn presented(connector: &TlsConnector, addr: SocketAddr) -> Vec<u8> {
    let stream = tls_connect(connector, addr).await.unwrap();
    let (_, session) = stream.get_ref();
    session.peer_certificates().unwrap()[0].to_vec()
}

/// `GET path` over HTTPS: status and body.
async fn https_get(connector: &TlsConnector, addr: SocketAddr, path: &str) -> (u16, String) {
    let stream = tls_connect(connector, addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let response = sender
        .send_request(
            Request::get(path)
                .header("host", "localhost")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Connects tonic's channel over TLS (tonic's own TLS is not compiled in: this is rustls
/// under the same channel).
#[derive(Clone)]
struct TlsChannelConnector {
    connector: TlsConnector,
    addr: SocketAddr,
}

impl tower_service::Service<http::Uri> for TlsChannelConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let (connector, addr) = (self.connector.clone(), self.addr);
        Box::pin(async move { Ok(TokioIo::new(tls_connect(&connector, addr).await?)) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_api_serves_tls_with_h2_and_plaintext_is_refused_and_counted() {
    let pki = Pki::new("grpc test CA");
    let (server, _) = tls_server(&pki, &[TlsListener::Grpc], None, ListenLimits::default()).await;
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(TlsChannelConnector {
            connector: connector(&pki, &[b"h2"]),
            addr: server.grpc,
        })
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let mut codes = Vec::new();
    for _ in 0..3 {
        let answer = client
            .should_rate_limit(request("edge", vec![descriptor(&[("api_key", "k")])]))
            .await
            .unwrap()
            .into_inner();
        codes.push(answer.overall_code);
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32],
        "2 per minute over TLS"
    );

    // A plaintext gRPC client on the TLS port gets no answer, and the failure is counted on
    // the (plain) HTTP API's /metrics.
    let plain = tokio::time::timeout(
        Duration::from_secs(5),
        RateLimitServiceClient::connect(format!("http://{}", server.grpc)),
    )
    .await
    .expect("refused, not hung");
    if let Ok(mut client) = plain {
        let answer = client
            .should_rate_limit(request("edge", vec![descriptor(&[("api_key", "p")])]))
            .await;
        assert!(answer.is_err(), "plaintext answered on a TLS port");
    }
    let failures = server
        .metric("flowgate_listener_tls_handshake_failures_total{listener=\"grpc\"}")
        .await;
    assert!(failures >= 1.0, "{failures}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_serves_tls_and_a_new_certificate_is_presented_after_its_files_change() {
    let pki = Pki::new("reload test CA");
    let (server, files) = tls_server(&pki, &TlsListener::ALL, None, ListenLimits::default()).await;
    let client = connector(&pki, &[b"http/1.1"]);
    let (status, body) = https_get(&client, server.http, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let first = presented(&client, server.http).await;

    // Rotate: a new certificate and key, written over the old files.
    let rotated = pki.leaf();
    assert_ne!(rotated.cert_der, first);
    std::fs::write(&files.key, &rotated.key_pem).unwrap();
    std::fs::write(&files.chain, &rotated.cert_pem).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if presented(&client, server.http).await == rotated.cert_der {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rotated certificate was not presented"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A broken rewrite (a key that does not match the certificate) keeps the running one.
    let stray = pki.leaf();
    std::fs::write(&files.key, &stray.key_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(presented(&client, server.http).await, rotated.cert_der);
    let (status, _) = https_get(&client, server.http, "/readyz").await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_comes_is_closed_after_the_header_read_timeout() {
    let pki = Pki::new("slow handshake CA");
    let timeout = Duration::from_millis(300);
    let (server, _) = tls_server(
        &pki,
        &[TlsListener::Grpc],
        None,
        ListenLimits {
            header_read_timeout: timeout,
            ..ListenLimits::default()
        },
    )
    .await;
    let mut silent = TcpStream::connect(server.grpc).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("the server closes a silent connection");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let took = started.elapsed();
    assert!(took >= timeout - Duration::from_millis(20), "{took:?}");
    // Half a ClientHello, then nothing: the same.
    let mut half = TcpStream::connect(server.grpc).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    let read = tokio::time::timeout(Duration::from_secs(5), half.read(&mut buf))
        .await
        .expect("the server closes a stalled handshake");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let failures = server
        .metric("flowgate_listener_tls_handshake_failures_total{listener=\"grpc\"}")
        .await;
    assert!(failures >= 2.0, "{failures}");
    server.stop().await;
}

/// An HTTPS upstream presenting `leaf`: answers every request with `200 tls upstream`.
async fn https_upstream(dir: &std::path::Path, pki: &Pki) -> SocketAddr {
    let (chain, key) = pki.leaf().write(dir, "upstream");
    let acceptor = ServerCertificate::load(CertificateFiles { chain, key })
        .unwrap()
        .acceptor(&[b"http/1.1"]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_request: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"tls upstream",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_tls_and_forwards_to_an_https_upstream_it_can_verify() {
    let upstream_pki = Pki::new("upstream CA");
    let scratch = tempfile::tempdir().unwrap();
    let upstream = https_upstream(scratch.path(), &upstream_pki).await;
    let ca_file = upstream_pki.write_ca(scratch.path());
    let url = format!("https://localhost:{}", upstream.port());

    // Verified against the upstream's CA: forwarded; the gateway itself serves TLS with
    // another CA's certificate.
    let pki = Pki::new("gateway CA");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.yaml");
    std::fs::write(&path, PASS_ALL).unwrap();
    let (chain, key) = pki.leaf().write(dir.path(), "server");
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.tls = Some(ListenerTls {
        certificate: ServerCertificate::load(CertificateFiles { chain, key }).unwrap(),
        listeners: vec![TlsListener::Gateway],
    });
    let parsed: flowgate_server::gateway::Upstream = url.parse().unwrap();
    config.upstream = Some(parsed.with_ca_file(&ca_file).unwrap());
    let server = TestServer::start_with(config, dir, vec![path]).await;
    let client = connector(&pki, &[b"http/1.1"]);
    let (status, body) = https_get(&client, server.gateway.unwrap(), "/anything").await;
    assert_eq!((status, body.as_str()), (200, "tls upstream"));
    server.stop().await;

    // With the system's roots the upstream's private CA is not trusted: 502, and the body
    // does not say why (the log does).
    let server = flowgate_testing::upstream::gateway(PASS_ALL, &url).await;
    let answer = flowgate_testing::upstream::get(&server, "/anything", &[]).await;
    assert_eq!(answer.status, 502);
    let body = String::from_utf8_lossy(&answer.body);
    assert!(!body.contains("certificate"), "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_gateway_serves_wss() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let upstream = flowgate_testing::ws::EchoUpstream::start().await;
    let pki = Pki::new("wss CA");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.yaml");
    std::fs::write(
        &path,
        format!(
            "domain: chat\nwebsocket:\n  upstream: ws://{}\n  limits:\n    messages: {{limit: 100, per: 1h}}\n",
            upstream.addr
        ),
    )
    .unwrap();
    let (chain, key) = pki.leaf().write(dir.path(), "server");
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.tls = Some(ListenerTls {
        certificate: ServerCertificate::load(CertificateFiles { chain, key }).unwrap(),
        listeners: vec![TlsListener::Websocket],
    });
    let server = TestServer::start_with(config, dir, vec![path]).await;
    let stream = tls_connect(&connector(&pki, &[b"http/1.1"]), server.websocket.unwrap())
        .await
        .unwrap();
    let (mut ws, response) = tokio_tungstenite::client_async("wss://localhost/chat", stream)
        .await
        .unwrap();
    assert_eq!(response.status(), 101);
    ws.send(Message::text("over tls")).await.unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(echoed, Message::text("over tls"));
    server.stop().await;
}

/// The binary end to end: `flowgate serve` counting in a TLS-only Redis (`rediss://`,
/// `--redis-ca-file`) and serving its HTTP API over TLS (`--tls-cert`, `--tls-key`,
/// `--tls-listeners http`); files it cannot use stop it at start, naming the file.
#[cfg(feature = "redis")]
#[test]
fn serve_counts_in_redis_over_tls_and_answers_over_https() {
    use std::process::Command;
    const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");
    let what = "serve_counts_in_redis_over_tls_and_answers_over_https";
    let pki = Pki::new("end-to-end CA");
    let dir = tempfile::tempdir().unwrap();
    let (redis_cert, redis_key) = pki.leaf().write(dir.path(), "redis");
    let ca = pki.write_ca(dir.path());
    let s = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let Some(redis) = flowgate_testing::redis::RedisServer::start_tls(
        what,
        &[
            "--tls-cert-file",
            &s(&redis_cert),
            "--tls-key-file",
            &s(&redis_key),
            "--tls-ca-cert-file",
            &s(&ca),
            "--tls-auth-clients",
            "no",
        ],
    ) else {
        return;
    };
    let config = dir.path().join("edge.yaml");
    std::fs::write(&config, LIMITED).unwrap();
    let (cert, key) = pki.leaf().write(dir.path(), "server");
    let redis_url = format!("rediss://localhost:{}", redis.tls_port.unwrap());

    // Files it cannot use: exit 1 at start, naming the file.
    let stray = pki.leaf().write(dir.path(), "stray").1;
    let mismatched = Command::new(FLOWGATE)
        .args(["serve", "--tls-cert", &s(&cert), "--tls-key", &s(&stray)])
        .output()
        .unwrap();
    assert_eq!(mismatched.status.code(), Some(1), "{mismatched:?}");
    let stderr = String::from_utf8_lossy(&mismatched.stderr);
    assert!(
        stderr.contains("stray.key") && stderr.contains("does not match"),
        "{stderr}"
    );
    let no_ca = Command::new(FLOWGATE)
        .args([
            "serve",
            "--redis",
            &redis_url,
            "--redis-ca-file",
            "/nonexistent/ca.pem",
        ])
        .output()
        .unwrap();
    assert_eq!(no_ca.status.code(), Some(1), "{no_ca:?}");
    assert!(
        String::from_utf8_lossy(&no_ca.stderr).contains("/nonexistent/ca.pem"),
        "{no_ca:?}"
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = connector(&pki, &[b"http/1.1"]);
    let mut serving = flowgate_testing::binary::Serving::start(
        Command::new(FLOWGATE)
            .args(["serve", "--config", &s(&config), "--drain-period", "0s"])
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(["--redis", &redis_url, "--redis-ca-file", &s(&ca)])
            // Not the 50 ms default: a TLS handshake on a loaded test machine can take longer.
            .args(["--redis-timeout", "5s"])
            .args(["--tls-cert", &s(&cert), "--tls-key", &s(&key)])
            .args(["--tls-listeners", "http"])
            .stdout(std::process::Stdio::null()),
    );
    let http = serving.http;
    let answers = runtime.block_on(async {
        let (ready, body) = https_get(&client, http, "/readyz").await;
        assert_eq!(ready, 200, "{body}");
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let stream = tls_connect(&client, http).await.unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let check = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"e2e"}]}]}"#;
            let response = sender
                .send_request(
                    Request::post("/v1/check")
                        .header("host", "localhost")
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(check.as_bytes())))
                        .unwrap(),
                )
                .await
                .unwrap();
            statuses.push(response.status().as_u16());
        }
        statuses
    });
    let _ = serving.child.kill();
    assert_eq!(
        answers,
        [200, 200, 429],
        "2 per minute, counted in Redis over TLS"
    );
    // And the counter is in that Redis.
    let keys = redis.cli(&["--scan", "--pattern", "flowgate:*"]);
    assert!(keys.contains("e2e"), "{keys}");
}
