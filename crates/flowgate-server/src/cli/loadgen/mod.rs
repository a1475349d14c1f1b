//! `flowgate loadgen`: a load generator for rate-limit services — the Envoy RLS gRPC API of
//! any server (Flowgate, envoyproxy/ratelimit, …), `POST /json` and Flowgate's `/v1/check`.
//!
//! Callers run concurrently for a duration or a number of requests; keys are drawn from a
//! fixed cardinality with a uniform or Zipf distribution. The summary has throughput and an
//! HDR histogram's p50/p90/p99/p99.9 latencies, as text or JSON.

mod target;

use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;

pub use target::{Outcome, Protocol, Target};

/// Flags of `flowgate loadgen`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadgenArgs {
    /// The server: `grpc://HOST:PORT` (Envoy RLS ShouldRateLimit) or `http://HOST:PORT/v1/check`
    /// or `http://HOST:PORT/json`.
    #[arg(long, default_value = "grpc://127.0.0.1:8081")]
    pub target: String,
    /// The domain of every request.
    #[arg(long, default_value = "default")]
    pub domain: String,
    /// The descriptor key; values are `k0`, `k1`, … drawn per request.
    #[arg(long, default_value = "api_key")]
    pub key: String,
    /// Number of distinct key values.
    #[arg(long, default_value_t = 1000)]
    pub keys: u64,
    /// How key values are drawn.
    #[arg(long, value_enum, default_value = "uniform")]
    pub distribution: KeyDistribution,
    /// Zipf exponent (with `--distribution zipf`).
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// Units each request asks for (`hits_addend`).
    #[arg(long, default_value_t = 1)]
    pub hits: u32,
    /// Concurrent callers.
    #[arg(long, short = 'c', default_value_t = 64)]
    pub concurrency: usize,
    /// Connections shared by the callers (gRPC multiplexes callers over them; HTTP/1.1 uses
    /// one per caller regardless).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// How long to run, e.g. `10s` (ignored with `--requests`).
    #[arg(long, short = 'd', default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Stop after this many requests instead of after `--duration`.
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Seed of the key draws (runs with the same seed send the same keys).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// How key values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDistribution {
    /// Every value equally likely.
    Uniform,
    /// A few values get most requests (rank r with probability ∝ 1/r^s).
    Zipf,
}

/// The summary of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What was measured.
    pub target: String,
    /// The protocol used.
    pub protocol: &'static str,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Distinct key values.
    pub keys: u64,
    /// Their distribution.
    pub distribution: KeyDistribution,
    /// Wall time of the measurement, seconds.
    pub elapsed_s: f64,
    /// Requests answered (allowed + over limit).
    pub requests: u64,
    /// Allowed.
    pub ok: u64,
    /// Over the limit.
    pub over_limit: u64,
    /// Failed (transport errors, unexpected statuses).
    pub errors: u64,
    /// Answered requests per second.
    pub throughput: f64,
    /// Latency of answered requests, microseconds.
    pub latency_us: Latency,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Slowest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

/// The histograms' range: 1 µs to 60 s, 3 significant digits (slower answers are recorded
/// as 60 s).
fn histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())
}

/// Shared progress counters.
#[derive(Debug, Default)]
struct Counters {
    ok: AtomicU64,
    over_limit: AtomicU64,
    errors: AtomicU64,
    /// Requests started (for `--requests`).
    issued: AtomicU64,
}

impl Counters {
    fn answered(&self) -> u64 {
        self.ok.load(Ordering::Relaxed) + self.over_limit.load(Ordering::Relaxed)
    }
}

/// Draws key values.
enum Keys {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

impl Keys {
    fn new(args: &LoadgenArgs) -> Result<Keys, String> {
        if args.keys == 0 {
            return Err("--keys must be at least 1".into());
        }
        match args.distribution {
            KeyDistribution::Uniform => Ok(Keys::Uniform(args.keys)),
            KeyDistribution::Zipf => Zipf::new(args.keys as f64, args.zipf_exponent)
                .map(Keys::Zipf)
                .map_err(|e| format!("invalid zipf distribution: {e}")),
        }
    }

    fn draw(&self, rng: &mut SmallRng) -> u64 {
        match self {
            Keys::Uniform(n) => rng.random_range(0..*n),
            // Zipf draws ranks 1..=n.
            Keys::Zipf(zipf) => (zipf.sample(rng) as u64).saturating_sub(1),
        }
    }
}

/// Runs `flowgate loadgen`.
pub(crate) fn run(args: &LoadgenArgs) -> ExitCode {
    let runtime = match super::runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(measure(args)) {
        Ok(report) => {
            let mut out = std::io::stdout().lock();
            let written = if args.json {
                serde_json::to_string_pretty(&report)
                    .map_err(std::io::Error::other)
                    .and_then(|json| writeln!(out, "{json}"))
            } else {
                write_text(&mut out, &report)
            };
            if written.is_err() {
                return ExitCode::FAILURE;
            }
            if report.requests == 0 {
                let _ = writeln!(std::io::stderr(), "no request was answered");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_text(out: &mut impl std::io::Write, r: &Report) -> std::io::Result<()> {
    let ms = |us: u64| us as f64 / 1000.0;
    writeln!(
        out,
        "target:     {} ({}), {} callers, {} keys ({:?})",
        r.target, r.protocol, r.concurrency, r.keys, r.distribution
    )?;
    writeln!(
        out,
        "requests:   {} in {:.2} s (ok {}, over limit {}, errors {})",
        r.requests, r.elapsed_s, r.ok, r.over_limit, r.errors
    )?;
    writeln!(out, "throughput: {:.0} requests/s", r.throughput)?;
    writeln!(
        out,
        "latency:    p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms, mean {:.3} ms",
        ms(r.latency_us.p50),
        ms(r.latency_us.p90),
        ms(r.latency_us.p99),
        ms(r.latency_us.p999),
        ms(r.latency_us.max),
        r.latency_us.mean / 1000.0
    )
}

/// Runs the load described by `args` and returns its summary.
pub async fn measure(args: &LoadgenArgs) -> Result<Report, String> {
    if args.concurrency == 0 {
        return Err("--concurrency must be at least 1".into());
    }
    let keys = Arc::new(Keys::new(args)?);
    let target = Target::connect(args).await?;
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let progress = progress_bar(args);

    let started = Instant::now();
    let deadline = args.requests.is_none().then(|| started + args.duration);
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..args.concurrency {
        let client = target.client(worker);
        let (keys, counters, stop) = (keys.clone(), counters.clone(), stop.clone());
        let (limit, seed) = (args.requests, args.seed.wrapping_add(worker as u64));
        workers.spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut histogram = histogram()?;
            loop {
                if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                if let Some(limit) = limit
                    && counters.issued.fetch_add(1, Ordering::Relaxed) >= limit
                {
                    break;
                }
                let key = keys.draw(&mut rng);
                let sent = Instant::now();
                let outcome = client.call(key).await;
                let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                match outcome {
                    Outcome::Ok | Outcome::OverLimit => {
                        histogram.saturating_record(micros.max(1));
                        let counter = if outcome == Outcome::Ok {
                            &counters.ok
                        } else {
                            &counters.over_limit
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Error => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok::<_, String>(histogram)
        });
    }

    // Progress until every worker is done.
    let ticker = progress.clone().map(|bar| {
        let counters = counters.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                bar.set_position(counters.answered() + counters.errors.load(Ordering::Relaxed));
                bar.set_message(format!(
                    "{:.0} req/s",
                    counters.answered() as f64 / started.elapsed().as_secs_f64().max(1e-9)
                ));
            }
        })
    });
    let mut merged = histogram()?;
    let mut failure = None;
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(Ok(histogram)) => merged.add(histogram).map_err(|e| e.to_string())?,
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(e.to_string()),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let requests = counters.answered();
    Ok(Report {
        target: args.target.clone(),
        protocol: target.protocol().name(),
        concurrency: args.concurrency,
        keys: args.keys,
        distribution: args.distribution,
        elapsed_s: elapsed,
        requests,
        ok: counters.ok.load(Ordering::Relaxed),
        over_limit: counters.over_limit.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        throughput: requests as f64 / elapsed.max(1e-9),
        latency_us: Latency {
            p50: merged.value_at_quantile(0.50),
            p90: merged.value_at_quantile(0.90),
            p99: merged.value_at_quantile(0.99),
            p999: merged.value_at_quantile(0.999),
            max: merged.max(),
            mean: merged.mean(),
        },
    })
}

/// A progress bar on stderr, only when stderr is a terminal.
fn progress_bar(args: &LoadgenArgs) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match args.requests {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    let template = if args.requests.is_some() {
        "{bar:40} {pos}/{len} {msg} ({elapsed})"
    } else {
        "{spinner} {pos} requests {msg} ({elapsed})"
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    Some(bar)
}
