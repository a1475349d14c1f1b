//! Usage you can list: `GET /v1/keys/{domain}?prefix=…` over real HTTP (pages, prefixes,
//! every kind of counter — several limits, a calendar quota, a charge, a fixed window — each
//! showing what the single-counter endpoint shows; refusals as the other admin routes), and
//! `flowgate export` run as a binary against a running `flowgate serve`, in memory, on a
//! real `redis-server` and on a 3-master Redis Cluster, checking its CSV and JSON lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use flowgate::calendar::{Calendar, CalendarUnit};
use flowgate_server::api::AdminToken;
use flowgate_server::server::ServerConfig;
use flowgate_testing::binary::Serving;
use flowgate_testing::server::{HttpResponse, TestServer};
use flowgate_testing::window::{HOUR, Window, in_one_window, in_one_window_blocking};

const TOKEN: &str = "correct horse battery staple";

const API: &str = r#"
domain: api
descriptors:
  - key: api_key
    rate_limits:
      - {unit: minute, requests_per_unit: 2, name: per_minute}
      - {unit: hour, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 100, calendar: true, time_zone: Europe/Berlin}
  - key: llm_user
    rate_limit: {unit: minute, requests_per_unit: 1000, charge: true}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
"#;

/// A `/v1/check` body: one descriptor `key=value` of domain `api`, `hits` units.
fn check(key: &str, value: &str, hits: u64) -> String {
    format!(
        r#"{{"domain":"api","hits_addend":{hits},"descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

/// The calendar of `tenant`'s quota.
fn berlin_month() -> Window {
    Window::Calendar(Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap())
}

/// The requests every test makes: what each counter has used afterwards is known.
const REQUESTS: [(&str, &str, u64, u16); 7] = [
    ("api_key", "k1", 1, 200),
    ("api_key", "k2", 1, 200),
    ("api_key", "k2", 1, 200),
    // Refused by the per-minute limit: the hour's unit is given back.
    ("api_key", "k2", 1, 429),
    ("tenant", "t,1", 3, 200),
    // A charge past the burst: into debt.
    ("llm_user", "u", 1500, 200),
    ("ip", "10.0.0.1", 4, 200),
];

/// Every counter the requests leave, as `(path, algorithm, limit, used, remaining)`.
fn expected() -> BTreeMap<String, (&'static str, u64, u64, u64)> {
    [
        ("api_key=k1", "gcra", 2, 1, 1),
        ("api_key=k1", "gcra", 5, 1, 4),
        ("api_key=k2", "gcra", 2, 2, 0),
        ("api_key=k2", "gcra", 5, 2, 3),
        ("tenant=t,1", "fixed_window", 100, 3, 97),
        ("llm_user=u", "gcra", 1000, 1000, 0),
        ("ip=10.0.0.1", "fixed_window", 10, 4, 6),
    ]
    .into_iter()
    .map(|(path, algorithm, limit, used, remaining)| {
        (
            format!("{path}/{limit}"),
            (algorithm, limit, used, remaining),
        )
    })
    .collect()
}

async fn server(token: Option<&str>) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.yaml");
    std::fs::write(&path, API).unwrap();
    let mut config = ServerConfig::load(vec![path.clone()]).unwrap();
    config.admin_token = token.map(|t| AdminToken::new(t).unwrap());
    TestServer::start_with(config, dir, vec![path]).await
}

fn assert_problem(response: &HttpResponse, status: u16, type_end: &str) {
    assert_eq!(response.status, status, "{}", response.body);
    assert_eq!(
        response.header("content-type"),
        Some("application/problem+json")
    );
    let body = response.json();
    assert!(body["type"].as_str().unwrap().ends_with(type_end), "{body}");
}

/// Every counter of `domain` (with `query`), `limit` a page, following the cursors; and
/// whether every page said it was complete.
async fn list_all(
    server: &TestServer,
    domain: &str,
    query: &str,
    limit: usize,
) -> (Vec<serde_json::Value>, bool) {
    let auth = format!("Bearer {TOKEN}");
    let mut counters = Vec::new();
    let mut complete = true;
    let mut cursor = String::new();
    for _ in 0..100 {
        let path = format!("/v1/keys/{domain}?limit={limit}{query}{cursor}");
        let page = server
            .request_with("GET", &path, &[("authorization", &auth)], "")
            .await;
        assert_eq!(page.status, 200, "{}", page.body);
        assert_eq!(page.header("cache-control"), Some("no-store"));
        let page = page.json();
        let these = page["counters"].as_array().unwrap();
        assert!(these.len() <= limit);
        counters.extend(these.iter().cloned());
        complete &= page["complete"].as_bool().unwrap();
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return (counters, complete),
        }
    }
    panic!("the listing did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_lists_every_counter_with_its_usage_a_page_at_a_time() {
    // `ip` (a fixed hour) and `tenant` (a month in Berlin) must still be in the windows they
    // were counted in when listed: a run across a boundary runs again, on a fresh server.
    in_one_window(&[HOUR, berlin_month()], async |_| {
        let server = server(Some(TOKEN)).await;
        for (key, value, hits, status) in REQUESTS {
            let response = server.post("/v1/check", &check(key, value, hits)).await;
            assert_eq!(response.status, status, "{key}={value}: {}", response.body);
        }

        let (counters, complete) = list_all(&server, "api", "", 2).await;
        assert!(complete);
        let mut seen = BTreeMap::new();
        for c in &counters {
            let path = c["path"].as_str().unwrap();
            let limit = c["limit"].as_u64().unwrap();
            let used = c["used"].as_u64().unwrap();
            let remaining = c["remaining"].as_u64().unwrap();
            assert_eq!(used + remaining, c["burst"].as_u64().unwrap(), "{c}");
            assert!(c["key"].as_str().unwrap().starts_with("api|"), "{c}");
            let entry = &c["descriptor"][0];
            assert_eq!(
                format!(
                    "{}={}",
                    entry["key"].as_str().unwrap(),
                    entry["value"].as_str().unwrap()
                ),
                percent_encoding::percent_decode_str(path)
                    .decode_utf8()
                    .unwrap()
            );
            seen.insert(
                format!("{path}/{limit}"),
                (c["algorithm"].as_str().unwrap(), limit, used, remaining),
            );
            // The single-counter endpoint shows the same counter the same way.
            let one = server
                .request_with(
                    "GET",
                    &format!("/v1/keys/api/{path}"),
                    &[("authorization", &format!("Bearer {TOKEN}"))],
                    "",
                )
                .await
                .json();
            let shown = one["limits"]
                .as_array()
                .map(|l| l.to_vec())
                .unwrap_or_else(|| vec![one.clone()]);
            let same = shown.iter().find(|s| s["key"] == c["key"]).unwrap();
            assert_eq!(same["remaining"], c["remaining"], "{one} vs {c}");
            assert_eq!(same["algorithm"], c["algorithm"]);
        }
        assert_eq!(seen, expected());
        assert_eq!(counters.len(), 7, "each counter once");

        // The calendar quota names its calendar, and resets at the next month in Berlin.
        let tenant = counters.iter().find(|c| c["path"] == "tenant=t,1").unwrap();
        assert_eq!(tenant["calendar"], "month@Europe/Berlin");
        assert!(tenant["reset_after_ms"].as_u64().unwrap() <= 31 * 86_400_000);
        // The charge's debt shows in its reset time: 1500 units at 1000 a minute.
        let llm = counters.iter().find(|c| c["path"] == "llm_user=u").unwrap();
        assert!(llm["reset_after_ms"].as_u64().unwrap() > 60_000, "{llm}");

        // Prefixes select by the first entries; a value may be cut short.
        let (k, _) = list_all(&server, "api", "&prefix=api_key%3Dk", 100).await;
        assert_eq!(k.len(), 4);
        let (k1, _) = list_all(&server, "api", "&prefix=api_key%3Dk1", 100).await;
        assert_eq!(k1.len(), 2);
        let (comma, _) = list_all(&server, "api", "&prefix=tenant%3Dt%2C", 100).await;
        assert_eq!(comma.len(), 1);
        let (none, complete) = list_all(&server, "nothing", "", 100).await;
        assert!(none.is_empty() && complete);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_is_refused_as_the_other_admin_routes_are() {
    let disabled = server(None).await;
    let response = disabled
        .request_with(
            "GET",
            "/v1/keys/api",
            &[("authorization", &format!("Bearer {TOKEN}"))],
            "",
        )
        .await;
    assert_problem(&response, 404, "/admin-disabled");
    disabled.stop().await;

    let server = server(Some(TOKEN)).await;
    let none = server.request_with("GET", "/v1/keys/api", &[], "").await;
    assert_problem(&none, 401, "/unauthorized");
    let wrong = server
        .request_with(
            "GET",
            "/v1/keys/api",
            &[("authorization", "Bearer not-the-admin-token")],
            "",
        )
        .await;
    assert_problem(&wrong, 403, "/forbidden");
    assert!(!wrong.body.contains(TOKEN));
    let auth = format!("Bearer {TOKEN}");
    let auth = [("authorization", auth.as_str())];
    for bad in [
        "/v1/keys/api?limit=0",
        "/v1/keys/api?limit=many",
        "/v1/keys/api?cursor=not-hex",
        "/v1/keys/api?prefix=novalue",
        "/v1/keys/api?colour=red",
        "/v1/keys/%FF",
    ] {
        let response = server.request_with("GET", bad, &auth, "").await;
        assert_problem(&response, 400, "/bad-request");
    }
    // A domain alone is not a counter to reset.
    let response = server
        .request_with("DELETE", "/v1/keys/api", &auth, "")
        .await;
    assert_problem(&response, 400, "/bad-request");
    server.stop().await;
}

/// `flowgate serve` on the `API` rules with the admin token, and `extra` arguments.
fn serve(dir: &std::path::Path, extra: &[&str]) -> Serving {
    let path = dir.join("api.yaml");
    std::fs::write(&path, API).unwrap();
    Serving::start(
        Command::new(env!("CARGO_BIN_EXE_flowgate"))
            .args([
                "serve",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--config",
            ])
            .arg(&path)
            .args(extra)
            .env("FLOWGATE_ADMIN_TOKEN", TOKEN)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null()),
    )
}

/// Runs `flowgate export` against `http`; answers its exit code, stdout and stderr.
fn export(http: SocketAddr, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flowgate"))
        .arg("export")
        .args(["--server", &format!("http://{http}"), "--domain", "api"])
        .args(args)
        .env("FLOWGATE_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// Makes the `REQUESTS` against the binary at `http`, then checks what `flowgate export`
/// writes as CSV and as JSON lines.
fn requests_then_export(serving: &Serving) {
    for (key, value, hits, status) in REQUESTS {
        let response =
            flowgate_testing::http::http_post(serving.http, "/v1/check", &check(key, value, hits));
        assert!(
            response.starts_with(&format!("HTTP/1.1 {status}")),
            "{key}={value}: {response}"
        );
    }
    // JSON lines, two counters a page: every counter once, with its usage.
    let (code, out, err) = export(serving.http, &["--format", "jsonl", "--page-size", "2"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("7 counters"), "{err}");
    let mut seen = BTreeMap::new();
    for line in out.lines() {
        let c: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(c["domain"], "api");
        let limit = c["limit"].as_u64().unwrap();
        seen.insert(
            format!("{}/{limit}", c["path"].as_str().unwrap()),
            (
                c["algorithm"].as_str().unwrap().to_owned(),
                limit,
                c["used"].as_u64().unwrap(),
                c["remaining"].as_u64().unwrap(),
            ),
        );
    }
    let want: BTreeMap<String, (String, u64, u64, u64)> = expected()
        .into_iter()
        .map(|(k, (a, l, u, r))| (k, (a.to_owned(), l, u, r)))
        .collect();
    assert_eq!(seen, want);

    // CSV: a header and one row per counter; a prefix narrows it.
    let (code, out, err) = export(serving.http, &["--prefix", "api_key=k2"]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some(
            "domain,descriptor,key,algorithm,limit,burst,period_ms,calendar,used,remaining,reset_after_ms,fallback"
        )
    );
    let mut rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    rows.sort_by_key(|r| r[4].parse::<u64>().unwrap());
    assert_eq!(rows.len(), 2, "{out}");
    for (row, (limit, period_ms, used, remaining)) in rows
        .iter()
        .zip([("2", "60000", "2", "0"), ("5", "3600000", "2", "3")])
    {
        assert_eq!(row.len(), 12, "{row:?}");
        assert_eq!(
            (row[0], row[1], row[3], row[4], row[5], row[6]),
            ("api", "api_key=k2", "gcra", limit, limit, period_ms)
        );
        assert_eq!((row[7], row[8], row[9]), ("", used, remaining));
        assert!(row[2].starts_with("api|api_key=k2#gcra:"), "{row:?}");
    }
    // The calendar quota's row names its calendar; its descriptor and key hold a comma, so
    // are quoted.
    let (code, out, _) = export(serving.http, &["--prefix", "tenant="]);
    assert_eq!(code, 0);
    let row = out.lines().nth(1).unwrap();
    assert!(
        row.starts_with("api,\"tenant=t,1\",\"api|tenant=t,1#fixed_window:100:"),
        "{row}"
    );

    // Without the token, or with a wrong one, nothing is written and the token never shows.
    let output = Command::new(env!("CARGO_BIN_EXE_flowgate"))
        .args([
            "export",
            "--server",
            &format!("http://{}", serving.http),
            "--domain",
            "api",
        ])
        .env_remove("FLOWGATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("FLOWGATE_ADMIN_TOKEN"));
    let output = Command::new(env!("CARGO_BIN_EXE_flowgate"))
        .args([
            "export",
            "--server",
            &format!("http://{}", serving.http),
            "--domain",
            "api",
        ])
        .env("FLOWGATE_ADMIN_TOKEN", "a-wrong-token-of-some-length")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("403"), "{err}");
    assert!(!err.contains("a-wrong-token"), "{err}");
    assert!(!serving.log().contains(TOKEN));
}

/// A `flowgate serve` with `extra` arguments (given the attempt), the `REQUESTS` and the
/// exports; run again, by a new process on fresh keys, when `ip`'s hour or `tenant`'s month
/// ended between a request and the export that shows its count.
fn serve_requests_then_export(extra: impl Fn(u32) -> Vec<String>) {
    in_one_window_blocking(&[HOUR, berlin_month()], |attempt| {
        let dir = tempfile::tempdir().unwrap();
        let extra = extra(attempt);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let mut serving = serve(dir.path(), &extra);
        requests_then_export(&serving);
        let _ = serving.child.kill();
        serving.wait_exit(Duration::from_secs(10));
    });
}

/// `--redis urls`; after the first attempt, under a prefix of the attempt's own (fresh keys).
fn in_redis(urls: &str, attempt: u32) -> Vec<String> {
    let mut args = vec![
        "--redis".into(),
        urls.into(),
        "--redis-timeout".into(),
        "5s".into(),
    ];
    if attempt > 0 {
        args.extend(["--redis-prefix".into(), format!("flowgate-retry{attempt}:")]);
    }
    args
}

#[test]
fn export_writes_a_memory_stores_usage_as_csv_and_json_lines() {
    serve_requests_then_export(|_| Vec::new());
}

#[test]
fn export_writes_a_redis_stores_usage_as_csv_and_json_lines() {
    let Some(redis) = flowgate_testing::redis::RedisServer::start("usage_export_redis") else {
        return;
    };
    serve_requests_then_export(|attempt| in_redis(&redis.url(), attempt));
}

#[test]
fn export_writes_a_redis_clusters_usage_from_every_master() {
    let Some(cluster) =
        flowgate_testing::redis::RedisCluster::start("usage_export_redis_cluster", 3, 0)
    else {
        return;
    };
    let urls = cluster.urls().join(",");
    serve_requests_then_export(|attempt| in_redis(&urls, attempt));
}
