//! `flowgate loadgen --rlqs`: a simulated fleet of Envoys running the `rate_limit_quota` filter
//! (`crate::rlqs::client::Envoy`) against one or more RLQS servers, and how many requests the
//! fleet admitted in each window against the rule's limit.
//!
//! Each Envoy offers requests evenly spaced at its rate — the fleet's `--rate`, split over the
//! Envoys by a Zipf law of `--zipf-exponent` (0: evenly) — over `--keys` bucket values (drawn
//! uniformly or by Zipf, like the other modes' keys), decides them as its filter would, reports
//! every `--report-interval` and applies the assignments it receives. With `--churn`, every
//! that often one Envoy leaves and a new one joins. Several `--target`s (comma-separated) are
//! tried in turn, as a load balancer would: an Envoy whose server goes away reconnects to the
//! next at its next report.
//!
//! The Envoys run on `--threads` runtimes, each waking every [`STEP`] to decide the requests
//! due since (each at its own time), so a thousand Envoys cost a thousand timers per step,
//! not one per request.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flowgate::clock::{Clock, Nanos, PreciseClock, nanos};
use flowgate::rlqs::client::{BucketSettings, Expired, Phase, Strategy, TokenBucket};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;

use super::{KeyDistribution, LoadgenArgs};
use crate::rlqs::client::{Envoy, bucket};

/// How often each Envoy wakes to decide the requests due.
pub const STEP: Duration = Duration::from_millis(20);

/// The summary of a fleet run.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// The servers.
    pub targets: Vec<String>,
    /// Envoys at any time.
    pub envoys: usize,
    /// Envoys that ran in all (with churn, more than `envoys`).
    pub envoys_total: usize,
    /// The fleet's offered rate, requests per second.
    pub rate: f64,
    /// Distinct bucket values.
    pub keys: u64,
    /// The rule's limit per window (`--limit`), if given.
    pub limit: Option<u64>,
    /// The window, seconds.
    pub window_s: f64,
    /// Requests decided by the Envoys.
    pub requests: u64,
    /// Allowed.
    pub allowed: u64,
    /// Allowed without an active assignment (no-assignment or expired behaviour).
    pub allowed_unassigned: u64,
    /// Usage reports sent (bucket reports).
    pub reports: u64,
    /// Response messages received.
    pub messages: u64,
    /// Streams opened.
    pub connects: u64,
    /// Per window: offered, allowed, allowed without an assignment.
    pub windows: Vec<Window>,
    /// The most allowed in one window.
    pub max_allowed: u64,
    /// Windows that allowed more than `limit × 1.05`.
    pub windows_over_105: usize,
    /// Seconds from an Envoy's first request to its first assignment, at most (over Envoys).
    pub first_assignment_max_s: f64,
}

/// One window of a fleet run.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Window {
    /// Window start, seconds from the run's start.
    pub at_s: f64,
    /// Requests offered.
    pub offered: u64,
    /// Allowed.
    pub allowed: u64,
    /// Allowed without an active assignment.
    pub unassigned: u64,
}

/// Counters every Envoy adds to, per window.
struct Tally {
    offered: Vec<AtomicU64>,
    allowed: Vec<AtomicU64>,
    unassigned: Vec<AtomicU64>,
    reports: AtomicU64,
    messages: AtomicU64,
    connects: AtomicU64,
    /// Worst time to a first assignment, ns.
    first_assignment: AtomicU64,
}

impl Tally {
    fn new(windows: usize) -> Self {
        let zeros = || (0..windows).map(|_| AtomicU64::new(0)).collect();
        Tally {
            offered: zeros(),
            allowed: zeros(),
            unassigned: zeros(),
            reports: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            first_assignment: AtomicU64::new(0),
        }
    }
}

/// One Envoy's part in the run.
#[derive(Debug, Clone, Copy)]
struct Part {
    /// Its index.
    index: usize,
    /// Requests per second.
    rate: f64,
    /// When it starts and stops, ns since the run's start.
    from: Nanos,
    until: Nanos,
}

/// The Envoys of the run and when each runs: `envoys` at a time; with churn, every `churn`
/// the oldest leaves and a new one (with the leaver's rate) joins.
fn parts(args: &LoadgenArgs, rate: f64, duration: Nanos) -> Vec<Part> {
    let n = args.envoys.max(1);
    let s = args.zipf_exponent.max(0.0);
    let weights: Vec<f64> = (1..=n).map(|r| 1.0 / (r as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut parts: Vec<Part> = weights
        .iter()
        .enumerate()
        .map(|(index, w)| Part {
            index,
            rate: rate * w / total,
            from: 0,
            until: duration,
        })
        .collect();
    if let Some(churn) = args.churn {
        let every = nanos(churn).max(1);
        let mut at = every;
        let mut leaving = 0;
        while at < duration {
            parts[leaving].until = at;
            let index = parts.len();
            parts.push(Part {
                index,
                rate: parts[leaving].rate,
                from: at,
                until: duration,
            });
            leaving += 1;
            at += every;
        }
    }
    parts
}

/// The recommended bucket settings (docs/rlqs.md): allow until assigned; when an assignment
/// expires, an even split of the limit (if given) for 30 s.
fn settings(args: &LoadgenArgs) -> BucketSettings {
    let fallback = match args.limit {
        Some(limit) => Strategy::TokenBucket(TokenBucket {
            max_tokens: 1,
            tokens_per_fill: (limit / args.envoys.max(1) as u64).max(1),
            fill_interval: Duration::from_secs(1),
        }),
        None => Strategy::AllowAll,
    };
    BucketSettings {
        no_assignment: Strategy::AllowAll,
        expired: Some(Expired::Fallback {
            strategy: fallback,
            timeout: Duration::from_secs(30),
        }),
    }
}

/// Runs `flowgate loadgen --rlqs`.
pub(super) fn run(args: &LoadgenArgs) -> ExitCode {
    let targets: Vec<String> = args
        .target
        .split(',')
        .map(|t| {
            let t = t.trim();
            match t.strip_prefix("grpc://") {
                Some(rest) => format!("http://{rest}"),
                None => t.to_owned(),
            }
        })
        .collect();
    let Some(rate) = args.rate else {
        let _ = writeln!(
            std::io::stderr(),
            "loadgen --rlqs needs --rate (the fleet's requests per second)"
        );
        return ExitCode::FAILURE;
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = runtime.block_on(fleet(args, targets, rate));
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_string_pretty(&report)
            .map_err(std::io::Error::other)
            .and_then(|json| writeln!(out, "{json}"))
    } else {
        write_text(&mut out, &report)
    };
    if written.is_err() || report.requests == 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

async fn fleet(args: &LoadgenArgs, targets: Vec<String>, rate: f64) -> FleetReport {
    let duration = nanos(args.duration);
    let window = nanos(args.window).max(1);
    let windows = usize::try_from(duration.div_ceil(window)).unwrap_or(1);
    let tally = Arc::new(Tally::new(windows));
    let clock = PreciseClock::new();
    let start = clock.now();
    let started = Instant::now();
    let parts = parts(args, rate, duration);
    let total = parts.len();
    let mut tasks = tokio::task::JoinSet::new();
    for part in parts {
        let tally = tally.clone();
        let targets = targets.clone();
        let args = args.clone();
        tasks.spawn(async move {
            envoy(part, &args, &targets, start, window, &tally).await;
        });
    }
    while tasks.join_next().await.is_some() {}
    let _ = started;
    let load = |v: &[AtomicU64]| {
        v.iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect::<Vec<_>>()
    };
    let (offered, allowed, unassigned) = (
        load(&tally.offered),
        load(&tally.allowed),
        load(&tally.unassigned),
    );
    let windows: Vec<Window> = (0..windows)
        .map(|k| Window {
            at_s: (k as u64 * window) as f64 / 1e9,
            offered: offered[k],
            allowed: allowed[k],
            unassigned: unassigned[k],
        })
        .collect();
    let over = |w: &&Window| {
        args.limit
            .is_some_and(|limit| w.allowed as f64 > limit as f64 * 1.05)
    };
    FleetReport {
        targets,
        envoys: args.envoys,
        envoys_total: total,
        rate,
        keys: args.keys,
        limit: args.limit,
        window_s: window as f64 / 1e9,
        requests: offered.iter().sum(),
        allowed: allowed.iter().sum(),
        allowed_unassigned: unassigned.iter().sum(),
        reports: tally.reports.load(Ordering::Relaxed),
        messages: tally.messages.load(Ordering::Relaxed),
        connects: tally.connects.load(Ordering::Relaxed),
        max_allowed: windows.iter().map(|w| w.allowed).max().unwrap_or(0),
        windows_over_105: windows.iter().filter(over).count(),
        windows,
        first_assignment_max_s: tally.first_assignment.load(Ordering::Relaxed) as f64 / 1e9,
    }
}

/// One Envoy's life: requests at its rate, reports every interval, assignments applied.
async fn envoy(
    part: Part,
    args: &LoadgenArgs,
    targets: &[String],
    start: Nanos,
    window: Nanos,
    tally: &Tally,
) {
    let Ok(envoy) = Envoy::new(&args.domain, targets, settings(args)) else {
        return;
    };
    let mut envoy = envoy.starting_at(part.index);
    let clock = PreciseClock::new();
    let mut rng = SmallRng::seed_from_u64(args.seed.wrapping_add(part.index as u64));
    let zipf = Zipf::new(args.keys.max(1) as f64, args.zipf_exponent.max(0.0)).ok();
    let keys: Vec<_> = (0..args.keys.max(1))
        .map(|k| bucket(&[(args.key.as_str(), &format!("k{k}"))]))
        .collect();
    let gap = (1e9 / part.rate.max(1e-3)) as Nanos;
    let interval = nanos(args.report_interval).max(1);
    // Requests start at a random point of the first gap; reports at a random point of the
    // first interval (Envoys do not report in step).
    let mut next = start + part.from + rng.random_range(0..gap.max(1));
    let mut next_report = start + part.from + rng.random_range(0..interval);
    let end = start + part.until;
    let mut waiting: BTreeMap<usize, Nanos> = BTreeMap::new();
    let mut ticker = tokio::time::interval(STEP);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::time::sleep(Duration::from_nanos(part.from)).await;
    loop {
        ticker.tick().await;
        let now = clock.now().min(end);
        while next <= now {
            let k = match (args.distribution, &zipf) {
                (KeyDistribution::Zipf, Some(z)) => (z.sample(&mut rng) as usize).saturating_sub(1),
                _ => rng.random_range(0..keys.len()),
            }
            .min(keys.len() - 1);
            let assigned = matches!(envoy.phase(&keys[k], next), Some(Phase::Active(_)));
            let new = envoy.phase(&keys[k], next).is_none();
            let allowed = envoy.request(&keys[k], next);
            let w = usize::try_from((next - start) / window).unwrap_or(usize::MAX);
            if let Some(c) = tally.offered.get(w) {
                c.fetch_add(1, Ordering::Relaxed);
                if allowed {
                    tally.allowed[w].fetch_add(1, Ordering::Relaxed);
                    if !assigned {
                        tally.unassigned[w].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if new {
                waiting.entry(k).or_insert(next);
            }
            next += gap;
        }
        let sent = envoy.flush().await;
        tally.reports.fetch_add(sent, Ordering::Relaxed);
        if now >= next_report {
            let sent = envoy.report(now).await;
            tally.reports.fetch_add(sent, Ordering::Relaxed);
            next_report += interval;
        }
        envoy.receive(clock.now());
        waiting.retain(|&k, &mut asked| {
            if matches!(envoy.phase(&keys[k], now), Some(Phase::Active(_))) {
                let took = clock.now().saturating_sub(asked);
                tally.first_assignment.fetch_max(took, Ordering::Relaxed);
                false
            } else {
                true
            }
        });
        if now >= end {
            break;
        }
    }
    tally
        .messages
        .fetch_add(envoy.stats().messages, Ordering::Relaxed);
    tally
        .connects
        .fetch_add(envoy.stats().connects, Ordering::Relaxed);
}

fn write_text(out: &mut impl std::io::Write, r: &FleetReport) -> std::io::Result<()> {
    writeln!(
        out,
        "targets:    {} — {} Envoys ({} in all), {:.0} requests/s offered, {} bucket values",
        r.targets.join(", "),
        r.envoys,
        r.envoys_total,
        r.rate,
        r.keys
    )?;
    writeln!(
        out,
        "decided:    {} requests, {} allowed ({} without an assignment); {} reports sent, {} assignment messages, {} streams opened",
        r.requests, r.allowed, r.allowed_unassigned, r.reports, r.messages, r.connects
    )?;
    match r.limit {
        Some(limit) => writeln!(
            out,
            "accuracy:   limit {limit} per {} s; most allowed in a window {} ({:+.1} %); {} windows above limit × 1.05",
            r.window_s,
            r.max_allowed,
            (r.max_allowed as f64 / limit as f64 - 1.0) * 100.0,
            r.windows_over_105
        )?,
        None => writeln!(
            out,
            "accuracy:   most allowed in a window {}",
            r.max_allowed
        )?,
    }
    writeln!(
        out,
        "first assignment: within {:.3} s of an Envoy's first request",
        r.first_assignment_max_s
    )?;
    writeln!(out, "window   offered  allowed  unassigned")?;
    for w in &r.windows {
        writeln!(
            out,
            "{:6.1}s {:8} {:8} {:10}",
            w.at_s, w.offered, w.allowed, w.unassigned
        )?;
    }
    Ok(())
}
