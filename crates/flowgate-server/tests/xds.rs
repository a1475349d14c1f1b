//! Rules from an xDS management server (`--config-source xds://…`): a small ADS server here
//! (tonic and envoy-types' server trait, on loopback) sends `RateLimitConfig` versions to an
//! in-process Flowgate; each version is ACKed and enforced, or NACKed with the errors while the
//! running rules stay; the client outlives and finds again a restarted server; a domain defined
//! by a file and by xDS is refused; `xdss://` verifies the server and presents a client
//! certificate. Every wait is on an event (a request the server receives),
//! bounded by a timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use flowgate_server::config::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit, TYPE_URL,
};
use flowgate_server::server::ServerConfig;
use flowgate_server::xds::{XdsOptions, XdsTlsFiles};
use flowgate_testing::STEP;
use flowgate_testing::binary::Serving;
use flowgate_testing::grpc::{OK, OVER_LIMIT, descriptor, request, should};
use flowgate_testing::http::http_post;
use flowgate_testing::server::{TestServer, wait_metric};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::codegen::tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::codegen::tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// The management server's shared state: what it sends and what it received.
struct Ads {
    /// Responses to send on the open stream (one at a time is open in these tests).
    pushes: watch::Receiver<Vec<DiscoveryResponse>>,
    /// Every request received, in order.
    received: mpsc::UnboundedSender<DiscoveryRequest>,
    /// Set to end every stream (the server going away).
    killed: watch::Receiver<bool>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let (received, mut pushes, mut killed) = (
            self.received.clone(),
            self.pushes.clone(),
            self.killed.clone(),
        );
        tokio::spawn(async move {
            // Everything pushed before this stream opened is sent once it asks (state of the
            // world: the latest is what counts, but the tests push in order and want each).
            let mut sent = 0;
            let mut asked = false;
            loop {
                if asked {
                    let list = pushes.borrow_and_update().clone();
                    for response in &list[sent.min(list.len())..] {
                        if tx.send(Ok(response.clone())).await.is_err() {
                            return;
                        }
                    }
                    sent = list.len();
                }
                tokio::select! {
                    changed = killed.changed() => {
                        if changed.is_err() || *killed.borrow() {
                            let _ = tx.send(Err(Status::unavailable("going away"))).await;
                            return;
                        }
                    }
                    request = incoming.next() => match request {
                        Some(Ok(request)) => {
                            asked = true;
                            let _ = received.send(request);
                        }
                        _ => return,
                    },
                    changed = pushes.changed(), if asked => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// A running management server on loopback.
struct Management {
    addr: SocketAddr,
    pushes: watch::Sender<Vec<DiscoveryResponse>>,
    received: mpsc::UnboundedReceiver<DiscoveryRequest>,
    kill: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    nonce: u64,
}

impl Management {
    /// Serves on `listener`.
    fn serve(listener: TcpListener) -> Management {
        let addr = listener.local_addr().unwrap();
        Self::serve_incoming(addr, TcpListenerStream::new(listener))
    }

    /// Serves the connections of `incoming`, accepted at `addr`.
    fn serve_incoming<S, IO>(addr: SocketAddr, incoming: S) -> Management
    where
        S: Stream<Item = Result<IO, std::io::Error>> + Send + 'static,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
    {
        let (pushes, pushes_rx) = watch::channel(Vec::new());
        let (received_tx, received) = mpsc::unbounded_channel();
        let (kill, killed) = watch::channel(false);
        let ads = Ads {
            pushes: pushes_rx,
            received: received_tx,
            killed: killed.clone(),
        };
        let mut stop = killed;
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(ads))
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop.wait_for(|k| *k).await;
                })
                .await
                .unwrap();
        });
        Management {
            addr,
            pushes,
            received,
            kill,
            server,
            nonce: 0,
        }
    }

    async fn start() -> Management {
        Self::serve(TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    /// Sends version `version` of `resources`; returns its nonce.
    fn push(&mut self, version: &str, resources: Vec<Any>) -> String {
        self.nonce += 1;
        let nonce = format!("n{}", self.nonce);
        let response = DiscoveryResponse {
            version_info: version.to_owned(),
            resources,
            type_url: TYPE_URL.to_owned(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        self.pushes.send_modify(|list| list.push(response));
        nonce
    }

    /// The next request Flowgate sends (bounded wait).
    async fn next_request(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(STEP, self.received.recv())
            .await
            .expect("a request within the step")
            .expect("the server is running")
    }

    /// Ends every stream and stops serving; the listener is closed. Returns the address to
    /// serve on again.
    async fn stop(self) -> SocketAddr {
        let _ = self.kill.send(true);
        tokio::time::timeout(STEP, self.server)
            .await
            .expect("the management server stops")
            .unwrap();
        self.addr
    }
}

/// Asserts `request` ACKs `version` with `nonce`.
fn assert_ack(request: &DiscoveryRequest, version: &str, nonce: &str) {
    assert_eq!(
        (
            request.version_info.as_str(),
            request.response_nonce.as_str()
        ),
        (version, nonce),
        "{request:?}"
    );
    assert_eq!(request.type_url, TYPE_URL);
    assert!(request.error_detail.is_none(), "{request:?}");
}

/// Asserts `request` NACKs with `nonce`, still at `version`; returns the error message.
fn assert_nack(request: &DiscoveryRequest, version: &str, nonce: &str) -> String {
    assert_eq!(
        (
            request.version_info.as_str(),
            request.response_nonce.as_str()
        ),
        (version, nonce),
        "{request:?}"
    );
    request
        .error_detail
        .as_ref()
        .expect("a NACK has error_detail")
        .message
        .clone()
}

/// A resource `name` for `domain`: `key` limited to `per_minute` per minute (unit MINUTE, or
/// none when `per_minute` is 0, which is invalid).
fn resource(name: &str, domain: &str, key: &str, per_minute: u32) -> Any {
    let config = RateLimitConfig {
        name: name.to_owned(),
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            key: key.to_owned(),
            rate_limit: Some(RateLimitPolicy {
                unit: if per_minute == 0 {
                    RateLimitUnit::Unknown
                } else {
                    RateLimitUnit::Minute
                } as i32,
                requests_per_unit: per_minute.max(1),
                ..Default::default()
            }),
            ..Default::default()
        }],
    };
    Any {
        type_url: TYPE_URL.to_owned(),
        value: config.encode_to_vec(),
    }
}

/// Flowgate following the management server at `addr`, with `files`.
async fn flowgate(addr: SocketAddr, files: &[(&str, &str)]) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        paths.push(path);
    }
    let url = format!("xds://{addr}").parse().unwrap();
    let mut options = XdsOptions::new(url, "test-node".to_owned(), XdsTlsFiles::default()).unwrap();
    options.node_metadata = vec![("zone".to_owned(), "a".to_owned())];
    options.backoff_initial = Duration::from_millis(20);
    options.backoff_max = Duration::from_millis(200);
    options.connect_timeout = Duration::from_secs(2);
    let config = ServerConfig::load_with_xds(paths.clone(), options).unwrap();
    TestServer::start_with(config, dir, paths).await
}

/// The overall codes of `n` requests for `domain`'s `key`.
async fn codes(server: &TestServer, domain: &str, key: &str, n: usize) -> Vec<i32> {
    let mut rls = server.rls().await;
    let mut codes = Vec::new();
    for _ in 0..n {
        let r = should(&mut rls, request(domain, vec![descriptor(&[(key, "u")])])).await;
        codes.push(r.overall_code);
    }
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_is_applied_acked_and_enforced() {
    let mut management = Management::start().await;
    let server = flowgate(management.addr, &[]).await;
    let first = management.next_request().await;
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!(
        (first.version_info.as_str(), first.response_nonce.as_str()),
        ("", "")
    );
    let node = first.node.expect("the first request names the node");
    assert_eq!(node.id, "test-node");
    assert_eq!(node.user_agent_name, "flowgate");
    assert!(node.metadata.unwrap().fields.contains_key("zone"));

    let nonce = management.push("v1", vec![resource("app-limits", "app", "user", 2)]);
    assert_ack(&management.next_request().await, "v1", &nonce);
    // The ACK follows the swap: the rules are live.
    assert_eq!(codes(&server, "app", "user", 3).await, [OK, OK, OVER_LIMIT]);
    let config = server.get("/v1/config").await.json();
    assert_eq!(config["xds_version"], "v1");
    assert_eq!(config["xds_resources"], serde_json::json!(["app-limits"]));
    assert_eq!(config["domains"], serde_json::json!(["app"]));
    assert_eq!(
        server
            .metric("flowgate_config_reloads_total{result=\"ok\",source=\"xds\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_version_is_nacked_and_the_running_rules_stay() {
    let mut management = Management::start().await;
    let server = flowgate(management.addr, &[]).await;
    management.next_request().await;
    let nonce = management.push("v1", vec![resource("app", "app", "user", 2)]);
    assert_ack(&management.next_request().await, "v1", &nonce);

    let nonce = management.push("v2", vec![resource("app", "app", "user", 0)]);
    let error = assert_nack(&management.next_request().await, "v1", &nonce);
    assert!(
        error.contains("xDS resource `app`: `descriptors[0].rate_limit.unit`"),
        "{error}"
    );
    // v1 still enforces.
    assert_eq!(codes(&server, "app", "user", 3).await, [OK, OK, OVER_LIMIT]);
    assert_eq!(server.get("/v1/config").await.json()["xds_version"], "v1");
    assert_eq!(
        server
            .metric("flowgate_config_reloads_total{result=\"failed\",source=\"xds\"}")
            .await,
        1.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_versions_is_answered_in_order_and_the_last_wins() {
    let mut management = Management::start().await;
    let server = flowgate(management.addr, &[]).await;
    management.next_request().await;
    let versions = [("v1", 5), ("v2", 4), ("v3", 0), ("v4", 3), ("v5", 1)];
    let nonces: Vec<String> = versions
        .iter()
        .map(|(version, limit)| {
            management.push(version, vec![resource("app", "app", "user", *limit)])
        })
        .collect();
    let mut last_good = "";
    for ((version, limit), nonce) in versions.iter().zip(&nonces) {
        let reply = management.next_request().await;
        if *limit == 0 {
            assert_nack(&reply, last_good, nonce);
        } else {
            assert_ack(&reply, version, nonce);
            last_good = version;
        }
    }
    assert_eq!(codes(&server, "app", "user", 2).await, [OK, OVER_LIMIT]);
    assert_eq!(server.get("/v1/config").await.json()["xds_version"], "v5");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_outlive_the_management_server_and_the_client_comes_back() {
    let mut management = Management::start().await;
    let server = flowgate(management.addr, &[]).await;
    management.next_request().await;
    let nonce = management.push("v1", vec![resource("app", "app", "user", 2)]);
    assert_ack(&management.next_request().await, "v1", &nonce);

    let addr = management.stop().await;
    // The server is gone: the last good rules are still enforced.
    assert_eq!(codes(&server, "app", "user", 3).await, [OK, OK, OVER_LIMIT]);

    // Back on the same address (this test owned the port): the client reconnects and says
    // which version it runs.
    let mut management = Management::serve(TcpListener::bind(addr).await.unwrap());
    let first = management.next_request().await;
    assert_eq!(
        (first.version_info.as_str(), first.response_nonce.as_str()),
        ("v1", "")
    );
    assert_eq!(first.node.unwrap().id, "test-node");
    let nonce = management.push("v2", vec![resource("app", "app", "team", 1)]);
    assert_ack(&management.next_request().await, "v2", &nonce);
    assert_eq!(codes(&server, "app", "team", 2).await, [OK, OVER_LIMIT]);
    // `user` has no rule any more.
    assert_eq!(codes(&server, "app", "user", 1).await, [OK]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_from_a_file_and_from_xds_is_refused_and_both_sources_combine() {
    let file = "domain: app\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let mut management = Management::start().await;
    let server = flowgate(management.addr, &[("app.yaml", file)]).await;
    management.next_request().await;

    let nonce = management.push("v1", vec![resource("clash", "app", "user", 5)]);
    let error = assert_nack(&management.next_request().await, "", &nonce);
    let path = server.files[0].display().to_string();
    assert!(
        error.contains(&format!(
            "xDS resource `clash`: `domain`: domain `app` is already defined by {path}"
        )),
        "{error}"
    );
    // The file's rule stays.
    assert_eq!(codes(&server, "app", "user", 2).await, [OK, OVER_LIMIT]);

    // Another domain combines with the file's.
    let nonce = management.push("v2", vec![resource("edge", "edge", "ip", 1)]);
    assert_ack(&management.next_request().await, "v2", &nonce);
    assert_eq!(codes(&server, "edge", "ip", 2).await, [OK, OVER_LIMIT]);
    let config = server.get("/v1/config").await.json();
    assert_eq!(config["domains"], serde_json::json!(["app", "edge"]));
    assert_eq!(config["files"], serde_json::json!([path]));

    // A reload of the file keeps the rules from xDS.
    let version = config["version"].as_u64().unwrap();
    std::fs::write(&server.files[0], file.replace("user", "team")).unwrap();
    let deadline = std::time::Instant::now() + STEP;
    let config = loop {
        let config = server.get("/v1/config").await.json();
        if config["version"].as_u64() > Some(version) {
            break config;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the file was never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(config["domains"], serde_json::json!(["app", "edge"]));
    assert_eq!(config["xds_version"], "v2");
    assert_eq!(codes(&server, "edge", "ip", 1).await, [OVER_LIMIT]);

    // A file changed to a domain xDS defines is rejected; both stay as they were.
    std::fs::write(&server.files[0], file.replace("app", "edge")).unwrap();
    wait_metric(
        &server,
        "flowgate_config_reloads_total{result=\"failed\",source=\"files\"}",
        1.0,
    )
    .await;
    assert_eq!(
        server.get("/v1/config").await.json()["domains"],
        serde_json::json!(["app", "edge"])
    );
    server.stop().await;
}

/// The binary, run with the command docs/service.md shows (its management server's address
/// replaced by the test's), plus settings from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reads_its_xds_settings_from_flags_and_the_environment() {
    let mut management = Management::start().await;
    let addr = management.addr;
    let doc = flowgate_testing::docs::read("docs/service.md");
    let shown = doc
        .lines()
        .find(|l| l.starts_with("flowgate serve --config-source xds://"))
        .expect("docs/service.md shows the xDS command");
    let args: Vec<String> = shown
        .replace("127.0.0.1:18000", &addr.to_string())
        .split_whitespace()
        .skip(1)
        .map(str::to_owned)
        .collect();
    assert!(
        args.iter().any(|a| a.contains(&addr.to_string())),
        "{shown}"
    );
    let serving = tokio::task::spawn_blocking(move || {
        Serving::start(
            std::process::Command::new(env!("CARGO_BIN_EXE_flowgate"))
                .args(&args)
                .args(["--xds-node-metadata", "zone=b,rack=7"])
                .env("FLOWGATE_HTTP", "127.0.0.1:0")
                .env("FLOWGATE_GRPC", "127.0.0.1:0")
                .env("FLOWGATE_XDS_BACKOFF_INITIAL", "50ms"),
        )
    })
    .await
    .unwrap();
    let first = management.next_request().await;
    let node = first.node.unwrap();
    assert_eq!(node.id, "edge-1");
    let metadata = node.metadata.unwrap().fields;
    assert!(
        metadata.contains_key("zone") && metadata.contains_key("rack"),
        "{metadata:?}"
    );

    let nonce = management.push("2026-12-02.1", vec![resource("app", "app", "user", 1)]);
    assert_ack(&management.next_request().await, "2026-12-02.1", &nonce);
    let http = serving.http;
    let answers = tokio::task::spawn_blocking(move || {
        let body = r#"{"domain":"app","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
        [
            http_post(http, "/json", body),
            http_post(http, "/json", body),
        ]
    })
    .await
    .unwrap();
    assert!(answers[0].starts_with("HTTP/1.1 200"), "{}", answers[0]);
    assert!(answers[1].starts_with("HTTP/1.1 429"), "{}", answers[1]);
    let log = serving.log();
    assert!(log.contains("xDS version applied"), "{log}");
    assert!(log.contains("2026-12-02.1"), "{log}");
}

/// A TLS connection the management server accepted.
struct TlsIo(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for TlsIo {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl tokio::io::AsyncRead for TlsIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TlsIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// `xdss://`: the management server's certificate is verified against `--xds-ca-file` for
/// `--xds-server-name`, and the client presents `--xds-cert-file` to a server that requires
/// one (mutual TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xdss_verifies_the_server_and_presents_the_client_certificate() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let pki = flowgate_testing::pki::Pki::new("xds test CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = pki.write_ca(dir.path());
    let (client_cert, client_key) = pki.leaf().write(dir.path(), "client");
    let server_leaf = pki.leaf();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(pki.ca_der())).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(std::sync::Arc::new(roots))
        .build()
        .unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from(server_leaf.cert_der.clone())],
            PrivateKeyDer::from_pem_slice(server_leaf.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, incoming) = mpsc::channel::<Result<TlsIo, std::io::Error>>(4);
    let (peer_tx, mut peer_certs) = mpsc::unbounded_channel::<usize>();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let Ok(tls) = acceptor.accept(tcp).await else {
                continue;
            };
            let _ = peer_tx.send(tls.get_ref().1.peer_certificates().map_or(0, <[_]>::len));
            if accepted.send(Ok(TlsIo(tls))).await.is_err() {
                return;
            }
        }
    });
    let mut management = Management::serve_incoming(addr, ReceiverStream::new(incoming));

    let url = format!("xdss://127.0.0.1:{}", addr.port()).parse().unwrap();
    let tls = XdsTlsFiles {
        ca_file: Some(ca_file),
        client: Some(flowgate_server::tls::CertificateFiles {
            chain: client_cert,
            key: client_key,
        }),
        server_name: Some("localhost".to_owned()),
    };
    let options = XdsOptions::new(url, "tls-node".to_owned(), tls).unwrap();
    let config = ServerConfig::load_with_xds(Vec::new(), options).unwrap();
    let server = TestServer::start_with(config, tempfile::tempdir().unwrap(), Vec::new()).await;
    assert_eq!(management.next_request().await.node.unwrap().id, "tls-node");
    assert_eq!(
        tokio::time::timeout(STEP, peer_certs.recv()).await.unwrap(),
        Some(1),
        "the client presented its certificate"
    );
    let nonce = management.push("v1", vec![resource("app", "app", "user", 1)]);
    assert_ack(&management.next_request().await, "v1", &nonce);
    assert_eq!(codes(&server, "app", "user", 2).await, [OK, OVER_LIMIT]);
    server.stop().await;
}

#[test]
fn tls_flags_need_xdss_and_readable_files() {
    let plain = "xds://127.0.0.1:1".parse().unwrap();
    let error = XdsOptions::new(
        plain,
        "n".to_owned(),
        XdsTlsFiles {
            server_name: Some("x".to_owned()),
            ..XdsTlsFiles::default()
        },
    )
    .unwrap_err();
    assert!(error.contains("write xdss://"), "{error}");
    let tls = "xdss://127.0.0.1:1".parse().unwrap();
    let error = XdsOptions::new(
        tls,
        "n".to_owned(),
        XdsTlsFiles {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..XdsTlsFiles::default()
        },
    )
    .unwrap_err();
    assert!(error.contains("/nonexistent/ca.pem"), "{error}");
}
