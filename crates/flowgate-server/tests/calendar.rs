//! A calendar quota through the service: a rule with `calendar: true` renews at local midnight
//! on the 1st, and `/v1/check`, `/json` and the headers say how long until then (checked against
//! the boundary jiff computes, within the test's own running time).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use flowgate::calendar::{Calendar, CalendarUnit};
use flowgate_testing::server::TestServer;
use flowgate_testing::window::{Window, in_one_window};

const API: &str = r#"
domain: api
descriptors:
  - key: api_key
    rate_limit:
      unit: month
      requests_per_unit: 2
      calendar: true
      time_zone: Europe/Berlin
      name: monthly
"#;

const BODY: &str =
    r#"{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}"#;

/// The rule's calendar: months in Berlin.
fn month() -> &'static Calendar {
    Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap()
}

/// Milliseconds from now to the next 1st of the month, midnight in Berlin.
fn until_next_month() -> u64 {
    let now = jiff::Timestamp::now();
    let (_, end) = month().window(now);
    u64::try_from((end.as_millisecond() - now.as_millisecond()).max(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_month_resets_at_midnight_on_the_first_in_its_zone() {
    // The three checks count in one month, and the times to its end are compared with the
    // month jiff finds after them: a run across midnight on the 1st runs again, on a fresh
    // server.
    in_one_window(&[Window::Calendar(month())], async |_| {
        let server = TestServer::start(&[("api.yaml", API)]).await;
        let started = Instant::now();
        let first = server.post("/v1/check", BODY).await;
        assert_eq!(first.status, 200, "{}", first.body);
        let d = &first.json()["descriptors"][0];
        assert_eq!(
            (d["limit"].as_u64(), d["remaining"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(d["algorithm"], "fixed_window");
        let expected = until_next_month();
        let slack = started.elapsed().as_millis() as u64 + 1_000;
        let reset = d["reset_after_ms"].as_u64().unwrap();
        assert!(reset.abs_diff(expected) <= slack, "{reset} vs {expected}");

        server.post("/v1/check", BODY).await;
        let denied = server.post("/v1/check", BODY).await;
        assert_eq!(denied.status, 429);
        let d = &denied.json()["descriptors"][0];
        let retry = d["retry_after_ms"].as_u64().unwrap();
        let expected = until_next_month();
        assert!(retry.abs_diff(expected) <= slack, "{retry} vs {expected}");
        let retry_after: u64 = denied.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(retry_after, retry.div_ceil(1000));
        assert!(
            denied
                .header("ratelimit")
                .unwrap()
                .starts_with(&format!("\"monthly\";r=0;t={retry_after}")),
            "{:?}",
            denied.header("ratelimit")
        );
        assert_eq!(
            denied.header("ratelimit-policy").unwrap(),
            "\"monthly\";q=2;w=2592000"
        );

        // Envoy's view: the unit is MONTH and the reset is the time to the 1st.
        let json = server.post("/json", BODY).await;
        assert_eq!(json.status, 429);
        let status = &json.json()["statuses"][0];
        assert_eq!(status["currentLimit"]["unit"], "MONTH");
        let until: u64 = status["durationUntilReset"]
            .as_str()
            .unwrap()
            .trim_end_matches('s')
            .parse::<f64>()
            .map(|s| (s * 1000.0) as u64)
            .unwrap();
        let expected = until_next_month();
        assert!(
            Duration::from_millis(until.abs_diff(expected)) <= Duration::from_millis(slack),
            "{until} vs {expected}"
        );

        // The running configuration names the calendar.
        let config = server.get("/v1/config").await.json();
        let rule = &config["rules"][0];
        assert_eq!(rule["calendar"], "month@Europe/Berlin");
        assert_eq!(rule["unit"], "month");
        server.stop().await;
    })
    .await;
}

/// docs/service.md's calendar example is a configuration the service runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_calendar_example_runs() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/service.md"
    ))
    .unwrap();
    let yaml = doc
        .split("```yaml\n# calendar.yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the example");
    let server = TestServer::start(&[("calendar.yaml", yaml)]).await;
    let config = server.get("/v1/config").await.json();
    let calendars: Vec<&str> = config["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["calendar"].as_str())
        .collect();
    assert_eq!(calendars, ["month@Europe/Berlin", "day@UTC"]);
    server.stop().await;
}
