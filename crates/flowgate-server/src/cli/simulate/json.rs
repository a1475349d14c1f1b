//! The comparison as JSON (`--format json`), for scripts. Field order is fixed, so the same
//! input gives the same bytes.

use std::time::Duration;

use flowgate::simulate::{Deployment, Limiter, Retry, Run};
use serde::Serialize;

use super::Outcome;

/// The whole output.
#[derive(Debug, Serialize)]
struct Output<'a> {
    /// One per quota simulated.
    cases: Vec<CaseJson<'a>>,
    /// Rules that could not be simulated, and why.
    notes: &'a [String],
}

#[derive(Debug, Serialize)]
struct CaseJson<'a> {
    title: &'a str,
    /// The configuration rule, when simulating a configuration.
    rule: Option<RuleJson<'a>>,
    traffic: &'a str,
    quota: QuotaJson,
    retry: RetryJson,
    /// Requests offered (retries not counted).
    offered: u64,
    keys: u64,
    /// Time 0 of the series, in whole ms since the Unix epoch.
    start_unix_ms: u64,
    /// Span covered, ms.
    span_ms: f64,
    /// Width of a series bucket, ms.
    bucket_ms: f64,
    runs: Vec<RunJson>,
    /// Subjects left out (the shaper in a store deployment).
    skipped: &'a [String],
}

#[derive(Debug, Serialize)]
struct RuleJson<'a> {
    domain: &'a str,
    path: &'a str,
    name: Option<&'a str>,
    algorithm: &'static str,
}

#[derive(Debug, Serialize)]
struct QuotaJson {
    limit: u64,
    period_ms: f64,
    burst: u64,
}

#[derive(Debug, Serialize)]
struct RetryJson {
    /// `never`, `fixed` or `retry-after`.
    kind: &'static str,
    /// Tries in all, the first included.
    attempts: u32,
    /// For `fixed`: the delay between tries, ms.
    delay_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
struct RunJson {
    /// The row's label, as in the table.
    label: String,
    limiter: &'static str,
    deployment: DeploymentJson,
    /// Whether this is the algorithm the configuration gives the rule.
    configured: bool,
    /// The quota as this limiter enforces it (window algorithms have no separate burst).
    quota: QuotaJson,
    requests: u64,
    retries: u64,
    admitted: u64,
    denied: u64,
    gave_up: u64,
    admitted_units: u64,
    max_in_window: u64,
    first_denial_ms: Option<f64>,
    /// The shaper's waits, ms.
    wait_ms: Option<WaitJson>,
    series: SeriesJson,
}

#[derive(Debug, Serialize)]
struct DeploymentJson {
    kind: &'static str,
    instances: u64,
    sync_every_ms: Option<f64>,
    fail: Option<&'static str>,
    outage_ms: Option<[f64; 2]>,
    /// The `rlqs` deployment's report interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    report_every_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
struct WaitJson {
    p50: f64,
    p99: f64,
    max: f64,
}

#[derive(Debug, Serialize)]
struct SeriesJson {
    admitted: Vec<u64>,
    denied: Vec<u64>,
}

fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

fn quota(q: &flowgate::Quota) -> QuotaJson {
    QuotaJson {
        limit: q.limit(),
        period_ms: ms(q.period()),
        burst: q.burst(),
    }
}

fn deployment(d: &Deployment) -> DeploymentJson {
    let mut json = DeploymentJson {
        kind: "in-process",
        instances: d.instances(),
        sync_every_ms: None,
        fail: None,
        outage_ms: None,
        report_every_ms: None,
    };
    match *d {
        Deployment::InProcess => {}
        Deployment::PerInstance { .. } => json.kind = "per-instance",
        Deployment::Shared { .. } => json.kind = "shared",
        Deployment::Hybrid { sync_every, .. } => {
            json.kind = "hybrid";
            json.sync_every_ms = Some(ms(sync_every));
        }
        Deployment::Fallback { mode, outage, .. } => {
            json.kind = "fallback";
            json.fail = Some(mode.name());
            json.outage_ms = Some([ms(outage.from), ms(outage.until)]);
        }
        Deployment::Rlqs { report_every, .. } => {
            json.kind = "rlqs";
            json.report_every_ms = Some(ms(report_every));
        }
    }
    json
}

fn run(run: &Run, configured: bool) -> RunJson {
    let s = &run.summary;
    RunJson {
        label: run.subject.to_string(),
        limiter: run.subject.limiter.name(),
        deployment: deployment(&run.subject.deployment),
        configured,
        quota: quota(&run.quota),
        requests: s.requests,
        retries: s.retries,
        admitted: s.admitted,
        denied: s.denied,
        gave_up: s.gave_up,
        admitted_units: s.admitted_units,
        max_in_window: s.max_in_window,
        first_denial_ms: s.first_denial.map(ms),
        wait_ms: s.wait.map(|w| WaitJson {
            p50: ms(w.p50),
            p99: ms(w.p99),
            max: ms(w.max),
        }),
        series: SeriesJson {
            admitted: run.series.admitted.clone(),
            denied: run.series.denied.clone(),
        },
    }
}

/// Every case as one pretty-printed JSON document.
pub(super) fn render(outcomes: &[Outcome], notes: &[String]) -> Result<String, String> {
    let cases = outcomes
        .iter()
        .map(|o| {
            let r = &o.report;
            let rule = o.case.rule.as_ref();
            CaseJson {
                title: &o.case.title,
                rule: rule.map(|rule| RuleJson {
                    domain: &rule.domain,
                    path: &rule.path,
                    name: rule.name.as_deref(),
                    algorithm: rule.algorithm.name(),
                }),
                traffic: &r.traffic,
                quota: quota(&r.quota),
                retry: match o.retry {
                    Retry::Never => RetryJson {
                        kind: "never",
                        attempts: 1,
                        delay_ms: None,
                    },
                    Retry::Fixed { delay, attempts } => RetryJson {
                        kind: "fixed",
                        attempts,
                        delay_ms: Some(ms(delay)),
                    },
                    Retry::RetryAfter { attempts } => RetryJson {
                        kind: "retry-after",
                        attempts,
                        delay_ms: None,
                    },
                },
                offered: r.offered,
                keys: r.keys,
                start_unix_ms: r.start / 1_000_000,
                span_ms: (r.end - r.start) as f64 / 1e6,
                bucket_ms: ms(r.bucket),
                runs: r
                    .runs
                    .iter()
                    .map(|x| {
                        let configured = rule.is_some_and(|rule| {
                            x.subject.limiter == Limiter::Algorithm(rule.algorithm)
                        });
                        run(x, configured)
                    })
                    .collect(),
                skipped: &o.skipped,
            }
        })
        .collect();
    serde_json::to_string_pretty(&Output { cases, notes }).map_err(|e| e.to_string())
}
