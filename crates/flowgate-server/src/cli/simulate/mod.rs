//! `flowgate simulate`: runs traffic through several algorithms (and deployments) with the same
//! quota, on a simulated clock, and shows how they differ — a table (or JSON) of admitted,
//! denied, the most admitted in any window, the first denial and the shaper's waits, and an
//! SVG chart of admitted and denied requests over time.
//!
//! The simulation itself is the library's [`flowgate::simulate`]; this module reads the
//! command line, the trace or the configuration (`input.rs`), and renders the report
//! (`table.rs`, `json.rs`, `svg.rs`).

mod input;
mod json;
mod progress;
mod svg;
mod table;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::Duration;

use flowgate::simulate::{
    Deployment, Limiter, Outage, Report, Retry, Scenario, Simulation, Subject,
};
use flowgate::{Algorithm, FailMode, Quota};

use input::{Case, Source};

/// Flags of `flowgate simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// A built-in scenario, scaled to the quota [default: boundary].
    #[arg(long, value_parser = scenario_parser(), conflicts_with = "trace")]
    pub scenario: Option<Scenario>,
    /// A CSV trace instead of a scenario: `timestamp_ms,key,cost` per line (cost optional).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Simulate the rate-limited rules of these configuration files (envoyproxy/ratelimit
    /// YAML, as `serve` loads them) instead of --limit/--period/--burst: one comparison per
    /// rule, with its quota.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Vec<PathBuf>,
    /// Units per period.
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// The period, e.g. `1m`, `5m`, `90s`.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub period: Duration,
    /// Capacity of gcra, leaky_bucket and the shaper [default: the limit]; the window
    /// algorithms always allow `limit` per window.
    #[arg(long)]
    pub burst: Option<u64>,
    /// Limiters to compare, comma-separated: gcra, leaky_bucket, fixed_window,
    /// sliding_window, sliding_log, shaper [default: all]. (`token_bucket` = gcra.)
    #[arg(long, value_delimiter = ',', value_parser = parse_limiter)]
    pub algorithms: Vec<LimiterName>,
    /// Where the state lives, comma-separated; every limiter runs in each.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "in-process")]
    pub deployments: Vec<DeploymentKind>,
    /// Instances of the service (for every deployment but in-process); requests go to them
    /// in turn.
    #[arg(long, default_value_t = 3)]
    pub instances: u64,
    /// Time between a hybrid instance's syncs with the shared store.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    pub sync_every: Duration,
    /// Envoys of the `rlqs` deployment; several (comma-separated) compare fleet sizes.
    #[arg(long, value_delimiter = ',', default_value = "20")]
    pub envoys: Vec<u64>,
    /// How often the `rlqs` deployment's Envoys report (and its server divides the limit);
    /// several (comma-separated) compare intervals.
    #[arg(long, value_delimiter = ',', default_value = "1s", value_parser = humantime::parse_duration)]
    pub report_interval: Vec<Duration>,
    /// When the shared store is away in the fallback deployments, as `FROM..UNTIL` after
    /// the start, e.g. `60s..120s` [default: from one period to two].
    #[arg(long, value_parser = parse_outage)]
    pub outage: Option<Outage>,
    /// The shaper's queue: most requests waiting per key [default: the limit].
    #[arg(long)]
    pub shaper_queue: Option<usize>,
    /// The shaper's longest wait [default: the period].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub shaper_max_delay: Option<Duration>,
    /// Seed of the scenarios' random draws (the same seed gives the same traffic).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Width of a bucket of the series and the chart [default: a round width giving about
    /// 100 buckets].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub bucket: Option<Duration>,
    /// Output on stdout.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Also write an SVG chart of admitted and denied requests over time to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// No progress bar (it only shows on a terminal, for long runs).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// A limiter named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimiterName {
    /// One of the five algorithms.
    Algorithm(Algorithm),
    /// The leaky-bucket queue.
    Shaper,
}

/// A deployment named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeploymentKind {
    /// One in-process limiter sees every request.
    InProcess,
    /// Every instance limits on its own with the whole quota.
    PerInstance,
    /// One counter shared by all instances: the memory store, or Redis (same decisions).
    Shared,
    /// The hybrid store: local decisions, synced every --sync-every.
    Hybrid,
    /// The store is away during --outage; requests are allowed meanwhile.
    FallbackOpen,
    /// The store is away during --outage; requests are denied meanwhile.
    FallbackClosed,
    /// The store is away during --outage; each instance limits to 1/--instances.
    FallbackLocal,
    /// Envoy's Rate Limit Quota Service: --envoys Envoys enforce the token buckets Flowgate
    /// assigns them every --report-interval (one run, whatever the algorithms).
    Rlqs,
}

/// What `flowgate simulate` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One table per comparison.
    Table,
    /// One JSON document, with the series.
    Json,
}

fn scenario_parser() -> impl clap::builder::TypedValueParser<Value = Scenario> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(
        Scenario::ALL.map(|s| PossibleValue::new(s.name()).help(s.description())),
    )
    .try_map(|name| name.parse::<Scenario>())
}

fn parse_limiter(s: &str) -> Result<LimiterName, String> {
    if s == "shaper" {
        return Ok(LimiterName::Shaper);
    }
    s.parse::<Algorithm>()
        .map(LimiterName::Algorithm)
        .map_err(|e| format!("{e}, or shaper"))
}

fn parse_outage(s: &str) -> Result<Outage, String> {
    let (from, until) = s
        .split_once("..")
        .ok_or_else(|| format!("`{s}` is not FROM..UNTIL, e.g. 60s..120s"))?;
    let parse =
        |d: &str| humantime::parse_duration(d.trim()).map_err(|e| format!("`{d}` in `{s}`: {e}"));
    let (from, until) = (parse(from)?, parse(until)?);
    if until <= from {
        return Err(format!("the outage `{s}` ends before it starts"));
    }
    Ok(Outage::new(from, until))
}

/// One case's result, with what the renderers need besides the report.
#[derive(Debug)]
struct Outcome {
    case: Case,
    report: Report,
    /// The clients' retry behaviour.
    retry: Retry,
    /// Subjects left out of this case, and why.
    skipped: Vec<String>,
}

/// Runs `flowgate simulate`.
pub(crate) fn run(args: &SimulateArgs) -> ExitCode {
    match simulate(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "simulate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(args: &SimulateArgs) -> Result<(), String> {
    let quota = command_line_quota(args)?;
    let source = match &args.trace {
        Some(path) => Source::Trace(Rc::new(input::read_trace(path)?)),
        None => Source::Scenario(args.scenario.unwrap_or(Scenario::Boundary), args.seed),
    };
    let (cases, notes) = input::cases(&source, quota, &args.config)?;
    let mut outcomes = Vec::with_capacity(cases.len());
    for case in cases {
        outcomes.push(simulate_case(args, case)?);
    }
    let text = match args.format {
        Format::Table => table::render(&outcomes, &notes),
        Format::Json => json::render(&outcomes, &notes)? + "\n",
    };
    if let Some(path) = &args.svg {
        let svg = svg::render(&outcomes)?;
        std::fs::write(path, svg).map_err(|e| format!("{}: cannot write: {e}", path.display()))?;
    }
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| format!("cannot write the output: {e}"))
}

/// The quota of `--limit`, `--period` and `--burst`.
fn command_line_quota(args: &SimulateArgs) -> Result<Quota, String> {
    let quota =
        Quota::new(args.limit, args.period).map_err(|e| format!("--limit/--period: {e}"))?;
    match args.burst {
        Some(burst) => quota.with_burst(burst).map_err(|e| format!("--burst: {e}")),
        None => Ok(quota),
    }
}

fn simulate_case(args: &SimulateArgs, case: Case) -> Result<Outcome, String> {
    let (subjects, skipped) = subjects(args, &case.quota);
    if subjects.is_empty() {
        return Err(format!(
            "{}: nothing to simulate ({})",
            case.title,
            skipped.join("; ")
        ));
    }
    let mut simulation = Simulation::new(case.quota, &case.traffic).subjects(subjects);
    if let Some(bucket) = args.bucket {
        simulation = simulation.bucket(bucket);
    }
    let total = case.traffic.len() as u64 * simulation_len(args);
    let bar = progress::Bar::new(&case.title, total, args.quiet);
    let report = simulation.run_with_progress(|p| bar.update(p));
    bar.finish();
    let report = report.map_err(|e| format!("{}: {e}", case.title))?;
    let retry = case.traffic.retry();
    Ok(Outcome {
        case,
        report,
        retry,
        skipped,
    })
}

/// About how many runs a case has (for the progress bar's length).
fn simulation_len(args: &SimulateArgs) -> u64 {
    let limiters = if args.algorithms.is_empty() {
        Algorithm::ALL.len() + 1
    } else {
        args.algorithms.len()
    };
    (limiters * args.deployments.len().max(1)) as u64
}

/// The subjects for `quota`: every chosen limiter in every chosen deployment, and the pairs
/// left out.
fn subjects(args: &SimulateArgs, quota: &Quota) -> (Vec<Subject>, Vec<String>) {
    let max_queue = args
        .shaper_queue
        .unwrap_or_else(|| usize::try_from(quota.limit()).unwrap_or(usize::MAX));
    let max_delay = args.shaper_max_delay.unwrap_or(quota.period());
    let limiters: Vec<Limiter> = if args.algorithms.is_empty() {
        Subject::every_limiter(max_queue, max_delay)
            .into_iter()
            .map(|s| s.limiter)
            .collect()
    } else {
        args.algorithms
            .iter()
            .map(|name| match name {
                LimiterName::Algorithm(a) => Limiter::Algorithm(*a),
                LimiterName::Shaper => Limiter::Shaper {
                    max_queue,
                    max_delay,
                },
            })
            .collect()
    };
    let instances = args.instances.max(1);
    let outage = args
        .outage
        .unwrap_or_else(|| Outage::new(quota.period(), quota.period() * 2));
    let fallback = |mode| Deployment::Fallback {
        instances,
        mode,
        outage,
    };
    let (mut subjects, mut skipped) = (Vec::new(), Vec::new());
    for kind in &args.deployments {
        let deployment = match kind {
            DeploymentKind::InProcess => Deployment::InProcess,
            DeploymentKind::PerInstance => Deployment::PerInstance { instances },
            DeploymentKind::Shared => Deployment::Shared { instances },
            DeploymentKind::Hybrid => Deployment::Hybrid {
                instances,
                sync_every: args.sync_every,
            },
            DeploymentKind::FallbackOpen => fallback(FailMode::Open),
            DeploymentKind::FallbackClosed => fallback(FailMode::Closed),
            DeploymentKind::FallbackLocal => fallback(FailMode::Local),
            DeploymentKind::Rlqs => {
                // Envoys enforce token buckets: one run per fleet size and interval, named
                // after GCRA (a token bucket).
                for &envoys in &args.envoys {
                    for &report_every in &args.report_interval {
                        subjects.push(
                            Subject::new(Limiter::Algorithm(Algorithm::Gcra)).in_deployment(
                                Deployment::Rlqs {
                                    envoys: envoys.max(1),
                                    report_every,
                                },
                            ),
                        );
                    }
                }
                continue;
            }
        };
        for &limiter in &limiters {
            let subject = Subject::new(limiter).in_deployment(deployment);
            let in_process = matches!(
                deployment,
                Deployment::InProcess | Deployment::PerInstance { .. }
            );
            if matches!(limiter, Limiter::Shaper { .. }) && !in_process {
                skipped.push(format!(
                    "{subject} (the shaper queues in process: in-process or per-instance only)"
                ));
            } else {
                subjects.push(subject);
            }
        }
    }
    (subjects, skipped)
}
