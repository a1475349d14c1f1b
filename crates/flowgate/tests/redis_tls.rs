//! `rediss://`: the Redis store over TLS (rustls), against real `redis-server` processes
//! started with `--tls-port` and certificates the test makes (`flowgate_testing::pki`) — a single
//! server (with and without client certificates) and a three-node Redis Cluster whose nodes
//! speak TLS to clients and to each other (`--tls-cluster yes`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use flowgate::store::{Ask, RedisStore, Store};
use flowgate::{Algorithm, Quota};
use flowgate_testing::pki::Pki;
use flowgate_testing::redis::{RedisCluster, RedisServer};

/// `redis-server` arguments for TLS with the files in `dir` (the TLS port is the helper's).
fn tls_args(dir: &Path, pki: &Pki, clients_need_certificates: bool) -> Vec<String> {
    let (cert, key) = pki.leaf().write(dir, "redis");
    let ca = pki.write_ca(dir);
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    vec![
        "--tls-cert-file".into(),
        path(&cert),
        "--tls-key-file".into(),
        path(&key),
        "--tls-ca-cert-file".into(),
        path(&ca),
        "--tls-auth-clients".into(),
        if clients_need_certificates {
            "yes"
        } else {
            "no"
        }
        .into(),
    ]
}

/// Each call's timeout: the store's default (50 ms) is a production figure; a TLS handshake to
/// a cluster node the client meets first, on a 2-core machine running the whole suite, can
/// take longer, and a test must not fail on how busy the machine is.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

fn rediss(server: &RedisServer) -> String {
    format!("rediss://localhost:{}", server.tls_port.unwrap())
}

/// Three requests against a limit of 2: granted, granted, denied.
async fn two_of_three(store: &RedisStore, key: &str) -> Vec<bool> {
    let quota = Quota::per_minute(2);
    let mut granted = Vec::new();
    for _ in 0..3 {
        granted.push(store.check(Ask::new(key, &quota)).await.unwrap().allowed);
    }
    granted
}

fn start(what: &str, args: &[String]) -> Option<RedisServer> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RedisServer::start_tls(what, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_over_tls_counts_and_an_untrusted_certificate_is_refused() {
    let pki = Pki::new("redis test CA");
    let dir = tempfile_dir("single");
    let Some(server) = start(
        "a_single_server_over_tls_counts",
        &tls_args(&dir, &pki, false),
    ) else {
        return;
    };
    let store = RedisStore::builder(rediss(&server))
        .tls_roots(pki.ca_pem())
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .unwrap();
    assert_eq!(two_of_three(&store, "tls").await, [true, true, false]);
    // The counter is in that server (read over its plaintext port).
    let exists: i64 = redis::cmd("EXISTS")
        .arg(store.redis_key("tls", Algorithm::Gcra))
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(exists, 1);

    // The system's roots do not know the test's CA: the connection fails, saying so.
    let refused = RedisStore::builder(rediss(&server)).connect().await;
    let error = refused.expect_err("an unknown CA was trusted").to_string();
    assert!(
        error.to_lowercase().contains("certificate") || error.to_lowercase().contains("tls"),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_client_certificates_accepts_only_a_client_with_one() {
    let pki = Pki::new("redis mTLS CA");
    let dir = tempfile_dir("mtls");
    let Some(server) = start(
        "a_server_that_requires_client_certificates",
        &tls_args(&dir, &pki, true),
    ) else {
        return;
    };
    let without = RedisStore::builder(rediss(&server))
        .tls_roots(pki.ca_pem())
        .connect()
        .await;
    assert!(without.is_err(), "connected without a client certificate");
    let client = pki.leaf();
    let store = RedisStore::builder(rediss(&server))
        .tls_roots(pki.ca_pem())
        .tls_client_certificate(client.cert_pem, client.key_pem)
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .unwrap();
    assert_eq!(two_of_three(&store, "mtls").await, [true, true, false]);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_over_tls_counts_on_every_node() {
    let pki = Pki::new("redis cluster CA");
    let dir = tempfile_dir("cluster");
    let Some(cluster) = RedisCluster::start_tls("a_redis_cluster_over_tls", 3, 0, || {
        let mut args = tls_args(&dir, &pki, false);
        args.extend(["--tls-cluster".into(), "yes".into()]);
        args
    }) else {
        return;
    };
    let urls: Vec<String> = cluster.nodes.iter().map(rediss).collect();
    let store = RedisStore::cluster_builder(urls)
        .tls_roots(pki.ca_pem())
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .unwrap();
    // Keys spread over the three masters, each counted exactly.
    let mut masters = std::collections::BTreeSet::new();
    for i in 0..12 {
        let key = format!("k{i}");
        masters.insert(cluster.master_of(&store.redis_key(&key, Algorithm::Gcra)));
        assert_eq!(
            two_of_three(&store, &key).await,
            [true, true, false],
            "{key}"
        );
    }
    assert_eq!(masters.len(), 3, "every master took some keys");
    let _ = std::fs::remove_dir_all(dir);
}

/// A fresh directory for one test's certificate files.
fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("flowgate-redis-tls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
