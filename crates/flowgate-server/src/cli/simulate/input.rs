//! What `flowgate simulate` compares: one case per quota — the command line's, or each
//! limited rule of the configuration files — with the scenario's or the trace's traffic.

use std::path::Path;
use std::rc::Rc;

use flowgate::envoy::Rate;
use flowgate::simulate::{Scenario, Traffic};
use flowgate::{Algorithm, Quota};

use crate::config;

/// One comparison: a quota, the traffic offered under it, and where they came from.
#[derive(Debug)]
pub(super) struct Case {
    /// What is compared, for headings: `boundary`, `trace.csv`, `edge: remote_address`.
    pub(super) title: String,
    /// The configuration rule it comes from (its path in the domain's tree), if any.
    pub(super) rule: Option<RuleRef>,
    /// The quota every limiter enforces (each with its own algorithm).
    pub(super) quota: Quota,
    /// The requests.
    pub(super) traffic: Rc<Traffic>,
}

/// The configuration rule a case simulates.
#[derive(Debug, Clone)]
pub(super) struct RuleRef {
    /// Its domain.
    pub(super) domain: String,
    /// Its path, as envoyproxy/ratelimit names it (`remote_address.path_/login`).
    pub(super) path: String,
    /// Its name, if it has one.
    pub(super) name: Option<String>,
    /// The algorithm the configuration gives it (the one the service would run).
    pub(super) algorithm: Algorithm,
}

/// Where the traffic comes from.
#[derive(Debug, Clone)]
pub(super) enum Source {
    /// A built-in scenario, scaled to each case's quota, drawn with a seed.
    Scenario(Scenario, u64),
    /// A trace (see [`read_trace`]), the same for every case.
    Trace(Rc<Traffic>),
}

/// The cases: one for `quota`, or — given configuration files — one per limited rule, with
/// notes on the rules that cannot be simulated (unlimited, blocked).
pub(super) fn cases(
    source: &Source,
    quota: Quota,
    config_files: &[std::path::PathBuf],
) -> Result<(Vec<Case>, Vec<String>), String> {
    let traffic_for = |quota: &Quota| match source {
        Source::Scenario(scenario, seed) => Rc::new(scenario.traffic(quota, *seed)),
        Source::Trace(trace) => trace.clone(),
    };
    if config_files.is_empty() {
        let traffic = traffic_for(&quota);
        return Ok((
            vec![Case {
                title: traffic.name().to_owned(),
                rule: None,
                quota,
                traffic,
            }],
            Vec::new(),
        ));
    }
    let policy = config::load(config_files).map_err(|errors| errors.to_string())?;
    let (mut cases, mut notes) = (Vec::new(), Vec::new());
    for rule in policy.rules.rules() {
        // `limit_path`: each limit of a rule with several apart (`path#index`).
        let name = match &rule.name {
            Some(name) => format!("{}: {} ({name})", rule.domain, rule.limit_path()),
            None => format!("{}: {}", rule.domain, rule.limit_path()),
        };
        match rule.rate {
            Rate::Limited(quota) => {
                let traffic = traffic_for(&quota);
                cases.push(Case {
                    title: name,
                    rule: Some(RuleRef {
                        domain: rule.domain.clone(),
                        path: rule.path.clone(),
                        name: rule.name.clone(),
                        algorithm: quota.algorithm(),
                    }),
                    quota,
                    traffic,
                });
            }
            Rate::Unlimited => notes.push(format!("{name}: unlimited, nothing to simulate")),
            Rate::Blocked { .. } => {
                notes.push(format!("{name}: blocks everything, nothing to simulate"))
            }
        }
    }
    if cases.is_empty() {
        return Err("the configuration has no rate-limited rule to simulate".into());
    }
    Ok((cases, notes))
}

/// Reads a CSV trace; errors name the file and the line.
pub(super) fn read_trace(path: &Path) -> Result<Traffic, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Traffic::from_csv(name, std::io::BufReader::new(file))
        .map_err(|e| format!("{}: {e}", path.display()))
}
