//! `flowgate loadgen`: a load generator for rate-limit services — the Envoy RLS gRPC API of
//! any server (Flowgate, envoyproxy/ratelimit, …), `POST /json` and Flowgate's `/v1/check` —
//! and, with `--rlqs`, a simulated fleet of Envoys on the Rate Limit Quota Service ([`rlqs`]).
//!
//! Callers run concurrently for a duration or a number of requests; keys are drawn from a
//! fixed cardinality with a uniform or Zipf distribution. The summary has throughput and an
//! HDR histogram's p50/p90/p99/p99.9 latencies, as text or JSON.
//!
//! Each of `--threads` OS threads runs its own single-threaded tokio runtime with its own
//! connections and its share of the callers. A multi-thread runtime is not used: on one core
//! its LIFO slot runs a connection's task right after each caller that woke it, so every
//! request went out in a write of its own (≈ 1 write syscall per request instead of one per
//! batch).

pub mod rlqs;
mod target;

use std::cell::RefCell;
use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;

pub use target::{Caller, Connections, Outcome, Protocol, Target};

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
    /// Share of the requests (0 to 1, a seeded draw per request) that ask for `--heavy-hits`
    /// units instead of `--hits` — e.g. more than a limit has left, so that they are denied
    /// by the counter while the others are allowed.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    pub heavy_share: f64,
    /// Units each heavy request asks for (see `--heavy-share`).
    #[arg(long, default_value_t = 1)]
    pub heavy_hits: u32,
    /// Concurrent callers.
    #[arg(long, short = 'c', default_value_t = 64)]
    pub concurrency: usize,
    /// Connections shared by the callers (gRPC multiplexes callers over them; HTTP/1.1 uses
    /// one per caller regardless).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Threads driving the load, each with its own connections and share of the callers
    /// [default: the CPUs this process may run on, at most --connections (gRPC) or
    /// --concurrency].
    #[arg(long)]
    pub threads: Option<usize>,
    /// How long to run, e.g. `10s` (ignored with `--requests`).
    #[arg(long, short = 'd', default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Stop after this many requests instead of after `--duration`.
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,
    /// Requests per second in all (open loop): each caller sends on a fixed schedule of
    /// `rate / concurrency` per second, and latency counts from the scheduled send time, so a
    /// slow server cannot hide its stalls by slowing the callers down (no coordinated
    /// omission). Without it, callers send back to back (closed loop).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Seed of the key draws (runs with the same seed send the same keys).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Simulate a fleet of Envoys running the `rate_limit_quota` filter against the RLQS
    /// service of `--target` (several, comma-separated, tried in turn) instead of calling
    /// ShouldRateLimit; `--rate` is the fleet's offered load, split over the Envoys by a Zipf
    /// law of `--zipf-exponent` (0: evenly).
    #[arg(long)]
    pub rlqs: bool,
    /// Envoys in the fleet (with `--rlqs`).
    #[arg(long, default_value_t = 20, requires = "rlqs")]
    pub envoys: usize,
    /// How often each Envoy reports (its `reporting_interval`, with `--rlqs`).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration, requires = "rlqs")]
    pub report_interval: Duration,
    /// The rule's limit per `--window`, to report the fleet's accuracy against (with `--rlqs`).
    #[arg(long, requires = "rlqs")]
    pub limit: Option<u64>,
    /// The window the fleet's admitted requests are counted in (with `--rlqs`).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration, requires = "rlqs")]
    pub window: Duration,
    /// Every this often one Envoy leaves and a new one joins (with `--rlqs`).
    #[arg(long, value_parser = humantime::parse_duration, requires = "rlqs")]
    pub churn: Option<Duration>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rate) if rate > 0.0 && rate.is_finite() => Ok(rate),
        _ => Err(format!("`{s}` is not a rate above 0 (requests per second)")),
    }
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("`{s}` is not a share between 0 and 1")),
    }
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
    /// Threads that drove them.
    pub threads: usize,
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

/// Draws key values.
#[derive(Debug)]
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
    // Without any subscriber, the `tracing` spans of h2 fall back to `log` records: ~4,800
    // instructions per request spent on spans nobody reads (callgrind).
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
    if args.rlqs {
        return rlqs::run(args);
    }
    // This thread only waits for the threads that drive the load.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let runtime = match runtime {
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
        "target:     {} ({}), {} callers on {} threads, {} keys ({:?})",
        r.target, r.protocol, r.concurrency, r.threads, r.keys, r.distribution
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

/// Progress counters of one thread's callers (written by that thread only).
#[derive(Debug, Default)]
struct Counters {
    ok: AtomicU64,
    over_limit: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn add(&self, counter: &AtomicU64) {
        // Only this thread writes: a load and a store, no locked instruction.
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// What every thread shares.
#[derive(Debug)]
struct Shared {
    keys: Keys,
    /// Per thread.
    counters: Vec<Counters>,
    /// Requests started (for `--requests`).
    issued: AtomicU64,
}

impl Shared {
    fn sum(&self, f: impl Fn(&Counters) -> &AtomicU64) -> u64 {
        self.counters
            .iter()
            .map(|c| f(c).load(Ordering::Relaxed))
            .sum()
    }
}

/// How many threads drive the load.
fn thread_count(args: &LoadgenArgs, protocol: Protocol) -> usize {
    let wanted = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let most = match protocol {
        Protocol::Grpc => args.connections.max(1),
        Protocol::Json | Protocol::Check => args.concurrency,
    };
    wanted.clamp(1, most.min(args.concurrency).max(1))
}

/// When the threads start and stop.
#[derive(Debug, Clone, Copy)]
struct Clock {
    /// Stop issuing requests then (`None` with `--requests`).
    deadline: Option<Instant>,
}

/// What one thread does.
struct Plan {
    thread: usize,
    threads: usize,
    target: Target,
    args: LoadgenArgs,
    shared: Arc<Shared>,
    /// Tells the coordinator that the connections are open (or why not).
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
    /// The start signal; dropped unsent when another thread could not connect.
    go: tokio::sync::oneshot::Receiver<Clock>,
}

/// A thread's latencies and when its last caller finished.
type Finished = (Histogram<u64>, Instant);

/// Runs `plan` on a new single-threaded runtime.
fn drive(plan: Plan) -> Result<Option<Finished>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let Plan {
            thread,
            threads,
            target,
            args,
            shared,
            ready,
            go,
        } = plan;
        // Callers thread, thread + threads, …; connections likewise.
        let callers: Vec<usize> = (thread..args.concurrency).step_by(threads).collect();
        let connections = (thread..args.connections.max(1)).step_by(threads).count();
        let opened = target
            .connect(connections.max(1), callers.len(), &args.domain, &args.key)
            .await;
        let connections = match opened {
            Ok(connections) => {
                let _ = ready.send(Ok(()));
                connections
            }
            Err(e) => {
                let _ = ready.send(Err(e.clone()));
                return Err(e);
            }
        };
        let Ok(clock) = go.await else {
            return Ok(None);
        };
        let histogram = Rc::new(RefCell::new(histogram()?));
        let mut tasks = tokio::task::JoinSet::new();
        for (i, &worker) in callers.iter().enumerate() {
            let caller = connections.caller(i);
            tasks.spawn_local(call_loop(
                caller,
                worker,
                args.clone(),
                shared.clone(),
                thread,
                histogram.clone(),
                clock,
            ));
        }
        while let Some(joined) = tasks.join_next().await {
            joined.map_err(|e| e.to_string())?;
        }
        let finished = Instant::now();
        let histogram = histogram.borrow().clone();
        Ok(Some((histogram, finished)))
    })
}

/// One caller: requests back to back until the deadline or `--requests`.
async fn call_loop(
    mut caller: Caller,
    worker: usize,
    args: LoadgenArgs,
    shared: Arc<Shared>,
    thread: usize,
    histogram: Rc<RefCell<Histogram<u64>>>,
    clock: Clock,
) {
    let counters = &shared.counters[thread];
    let mut rng = SmallRng::seed_from_u64(args.seed.wrapping_add(worker as u64));
    let mut now = Instant::now();
    // With --rate: this caller's interval, and its first slot staggered among the callers'.
    let interval = args
        .rate
        .map(|rate| Duration::from_secs_f64(args.concurrency.max(1) as f64 / rate));
    let mut next =
        interval.map(|i| now + i.mul_f64(worker as f64 / args.concurrency.max(1) as f64));
    loop {
        if let (Some(slot), Some(interval)) = (next, interval) {
            if slot > now {
                tokio::time::sleep_until(slot.into()).await;
            }
            now = slot;
            next = Some(slot + interval);
        }
        if clock.deadline.is_some_and(|d| now >= d) {
            break;
        }
        if let Some(limit) = args.requests
            && shared.issued.fetch_add(1, Ordering::Relaxed) >= limit
        {
            break;
        }
        let key = shared.keys.draw(&mut rng);
        let hits = if args.heavy_share > 0.0 && rng.random_bool(args.heavy_share) {
            args.heavy_hits
        } else {
            args.hits
        };
        let sent = now;
        let outcome = caller.call(key, hits).await;
        now = Instant::now();
        let micros = u64::try_from((now - sent).as_micros()).unwrap_or(u64::MAX);
        match outcome {
            Outcome::Ok | Outcome::OverLimit => {
                histogram.borrow_mut().saturating_record(micros.max(1));
                counters.add(if outcome == Outcome::Ok {
                    &counters.ok
                } else {
                    &counters.over_limit
                });
            }
            Outcome::Error => counters.add(&counters.errors),
        }
    }
}

/// Runs the load described by `args` and returns its summary.
pub async fn measure(args: &LoadgenArgs) -> Result<Report, String> {
    if args.concurrency == 0 {
        return Err("--concurrency must be at least 1".into());
    }
    let keys = Keys::new(args)?;
    let target = Target::parse(&args.target)?;
    let threads = thread_count(args, target.protocol());
    let shared = Arc::new(Shared {
        keys,
        counters: (0..threads).map(|_| Counters::default()).collect(),
        issued: AtomicU64::new(0),
    });

    let mut handles = Vec::new();
    let mut ready = Vec::new();
    let mut go = Vec::new();
    for thread in 0..threads {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel();
        let plan = Plan {
            thread,
            threads,
            target: target.clone(),
            args: args.clone(),
            shared: shared.clone(),
            ready: ready_tx,
            go: go_rx,
        };
        let handle = std::thread::Builder::new()
            .name(format!("loadgen-{thread}"))
            .spawn(move || drive(plan))
            .map_err(|e| format!("cannot start a thread: {e}"))?;
        handles.push(handle);
        ready.push(ready_rx);
        go.push(go_tx);
    }
    // Every thread connects first; the clock starts when all have.
    let mut failure = None;
    for ready in ready {
        match ready.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some("a load thread stopped".to_owned())),
        }
    }
    let started = Instant::now();
    if failure.is_none() {
        let clock = Clock {
            deadline: args.requests.is_none().then(|| started + args.duration),
        };
        for go in go {
            let _ = go.send(clock);
        }
    } else {
        drop(go);
    }

    let progress = progress_bar(args);
    let ticker = progress.clone().map(|bar| {
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let answered = shared.sum(|c| &c.ok) + shared.sum(|c| &c.over_limit);
                bar.set_position(answered + shared.sum(|c| &c.errors));
                bar.set_message(format!(
                    "{:.0} req/s",
                    answered as f64 / started.elapsed().as_secs_f64().max(1e-9)
                ));
            }
        })
    });
    let results = tokio::task::spawn_blocking(move || {
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a load thread panicked".into()))
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| e.to_string())?;
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let mut merged = histogram()?;
    let mut finished = started;
    for result in results {
        match result {
            Ok(Some((histogram, at))) => {
                merged.add(histogram).map_err(|e| e.to_string())?;
                finished = finished.max(at);
            }
            Ok(None) => {}
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let elapsed = (finished - started).as_secs_f64();
    let ok = shared.sum(|c| &c.ok);
    let over_limit = shared.sum(|c| &c.over_limit);
    let requests = ok + over_limit;
    Ok(Report {
        target: args.target.clone(),
        protocol: target.protocol().name(),
        concurrency: args.concurrency,
        threads,
        keys: args.keys,
        distribution: args.distribution,
        elapsed_s: elapsed,
        requests,
        ok,
        over_limit,
        errors: shared.sum(|c| &c.errors),
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
