//! The conformance table: one list of traces that every store must replay with exactly the
//! expected decisions.
//!
//! The traces live in `tests/conformance/table.toml`, written by hand from the algorithms'
//! definitions (see that file's header for the format). [`run_table`] replays every trace
//! against a store whose time comes from a [`ManualClock`], and panics with the trace, step,
//! expected and actual decision on the first difference.

use std::time::Duration;

use flowgate::clock::{ManualClock, Nanos};
use flowgate::store::{Ask, Store, StoreError};
use flowgate::{Algorithm, Quota};
use serde::Deserialize;

/// The table, compiled into the test binary.
pub const TABLE: &str = include_str!("../../flowgate/tests/conformance/table.toml");

/// When traces start unless they say otherwise: 2023-11-15T00:00:00Z, a whole number of days
/// since the epoch, so windows of a second, minute, hour or day start exactly there.
pub const DEFAULT_START: Nanos = 1_700_006_400 * 1_000_000_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    trace: Vec<RawTrace>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrace {
    name: String,
    algorithms: Vec<String>,
    limit: u64,
    /// The period; absent for a calendar quota.
    period: Option<String>,
    /// A calendar quota: `day`, `week`, `month` or `year` (then `period` is absent).
    calendar: Option<String>,
    /// The calendar's IANA time zone (default `UTC`).
    time_zone: Option<String>,
    burst: Option<u64>,
    start: Option<String>,
    /// Check that the allowed steps never exceed `limit` units in any window of `period`.
    #[serde(default)]
    check_window_bound: bool,
    steps: Vec<Vec<toml::Value>>,
}

/// One trace, for one algorithm.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Human-readable name, with the algorithm.
    pub name: String,
    /// The quota under test.
    pub quota: Quota,
    /// Absolute time of offset 0.
    pub start: Nanos,
    /// Whether to check the window bound on the allowed steps.
    pub check_window_bound: bool,
    /// What to do and what must come out.
    pub steps: Vec<Step>,
}

impl Trace {
    /// Whether the trace charges (usage that already happened; see `Ask::charge`).
    pub fn charges(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s.op, Op::Check { charge: true, .. }))
    }
}

/// One call and its expected outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Offset from the trace's start (may be negative: a clock behind).
    pub at: i64,
    /// What to call.
    pub op: Op,
}

/// A store call and what it must return.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `check` of `cost` (a charge when `charge`) must return exactly this decision.
    Check {
        /// Units asked for.
        cost: u64,
        /// Whether the units are charged (always taken, into debt) rather than checked.
        charge: bool,
        /// What must come back.
        expect: Expected,
    },
    /// `refund(units)`.
    Refund {
        /// Units given back.
        units: u64,
    },
    /// `reset()`.
    Reset,
}

/// What a check must return.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// A decision with these fields (limit is the quota's).
    Decision {
        /// Whether the units were granted.
        allowed: bool,
        /// Whole units left.
        remaining: u64,
        /// Until the cost would be granted (zero when allowed).
        retry_after: Duration,
        /// Until the state is fully replenished.
        reset_after: Duration,
    },
    /// `StoreError::Capacity`: the cost exceeds the burst.
    CapacityError,
}

/// Parses `"<n><unit>"` (unit ns, us, ms, s, m, h, d; `n` may have a fraction and a sign) into
/// nanoseconds. `"0"` is zero.
pub fn parse_duration(text: &str) -> i64 {
    let (sign, rest) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text),
    };
    if rest == "0" {
        return 0;
    }
    let split = rest
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or_else(|| panic!("duration {text:?} has no unit"));
    let (number, unit) = rest.split_at(split);
    let scale: i64 = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        other => panic!("duration {text:?} has unknown unit {other:?}"),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mut nanos = whole.parse::<i64>().expect("whole part") * scale;
    let mut place = scale;
    for digit in fraction.chars() {
        place /= 10;
        assert!(place > 0, "duration {text:?} is finer than a nanosecond");
        nanos += i64::from(digit.to_digit(10).expect("fraction digit")) * place;
    }
    sign * nanos
}

fn duration(value: &toml::Value) -> Duration {
    let text = value.as_str().expect("durations are strings");
    let nanos = parse_duration(text);
    assert!(nanos >= 0, "expected durations are never negative: {text}");
    Duration::from_nanos(nanos as u64)
}

fn parse_step(raw: &[toml::Value], trace: &str) -> Step {
    let at = parse_duration(raw[0].as_str().expect("step time is a string"));
    let op = match &raw[1] {
        toml::Value::String(op) if op == "refund" => Op::Refund {
            units: raw[2].as_integer().expect("refund units") as u64,
        },
        toml::Value::String(op) if op == "reset" => Op::Reset,
        toml::Value::Integer(cost) => {
            let cost = *cost as u64;
            let verdict = raw[2].as_str().expect("verdict");
            let expect = match verdict {
                "error" => Expected::CapacityError,
                "allow" | "deny" | "charge" => {
                    assert_eq!(raw.len(), 6, "{trace}: step {raw:?} needs 6 fields");
                    Expected::Decision {
                        allowed: verdict != "deny",
                        remaining: raw[3].as_integer().expect("remaining") as u64,
                        retry_after: duration(&raw[4]),
                        reset_after: duration(&raw[5]),
                    }
                }
                other => panic!("{trace}: unknown verdict {other:?}"),
            };
            Op::Check {
                cost,
                charge: verdict == "charge",
                expect,
            }
        }
        other => panic!("{trace}: unknown operation {other:?}"),
    };
    Step { at, op }
}

/// A trace's quota (before its algorithm and burst are applied).
fn quota(raw: &RawTrace) -> Quota {
    match (&raw.period, &raw.calendar) {
        (Some(period), None) => {
            let period = Duration::from_nanos(parse_duration(period) as u64);
            Quota::new(raw.limit, period).expect("valid quota")
        }
        (None, Some(unit)) => {
            use flowgate::calendar::Calendar;
            let unit = unit.parse().expect("calendar unit");
            let zone = raw.time_zone.as_deref().unwrap_or("UTC");
            let calendar = Calendar::new(unit, zone).expect("time zone");
            Quota::per_calendar(raw.limit, calendar).expect("valid quota")
        }
        _ => panic!("{}: give either `period` or `calendar`", raw.name),
    }
}

/// A trace's `start`: an RFC 3339 instant (`2028-02-01T00:00:00Z`) or a duration since the
/// epoch.
fn parse_start(text: &str) -> Nanos {
    if text.contains('T') {
        let t: jiff::Timestamp = text.parse().expect("RFC 3339 start");
        u64::try_from(t.as_nanosecond()).expect("start after the epoch")
    } else {
        parse_duration(text) as Nanos
    }
}

/// Every trace in the table, expanded to one per algorithm it lists.
pub fn traces() -> Vec<Trace> {
    let table: Table = toml::from_str(TABLE).expect("conformance table parses");
    let mut traces = Vec::new();
    for raw in &table.trace {
        for algorithm in &raw.algorithms {
            let algorithm: Algorithm = algorithm.parse().expect("algorithm name");
            let mut quota = quota(raw).with_algorithm(algorithm).expect("valid quota");
            if let Some(burst) = raw.burst {
                quota = quota.with_burst(burst).expect("valid burst");
            }
            let start = raw.start.as_deref().map_or(DEFAULT_START, parse_start);
            let name = format!("{} [{algorithm}]", raw.name);
            let steps = raw.steps.iter().map(|s| parse_step(s, &name)).collect();
            traces.push(Trace {
                name,
                quota,
                start,
                check_window_bound: raw.check_window_bound,
                steps,
            });
        }
    }
    traces
}

/// Replays every trace against `store`, whose time must come from `clock`. Keys are
/// `{key_prefix}{n}`, one per trace. Panics on the first difference.
pub async fn run_table<S: Store>(store: &S, clock: &ManualClock, key_prefix: &str) {
    run_table_where(store, clock, key_prefix, |_| true).await;
}

/// [`run_table`] for the traces `keep` keeps (for limiters that cannot charge).
pub async fn run_table_where<S: Store>(
    store: &S,
    clock: &ManualClock,
    key_prefix: &str,
    keep: impl Fn(&Trace) -> bool,
) {
    let traces = traces();
    assert!(traces.len() >= 30, "the table lost traces");
    for (n, trace) in traces.iter().enumerate() {
        if keep(trace) {
            let key = format!("{key_prefix}{n}");
            run_trace(store, clock, &key, trace).await;
        }
    }
}

/// Replays one trace.
pub async fn run_trace<S: Store>(store: &S, clock: &ManualClock, key: &str, trace: &Trace) {
    let quota = &trace.quota;
    let mut granted: Vec<(Nanos, u64)> = Vec::new();
    for (i, step) in trace.steps.iter().enumerate() {
        let now = trace
            .start
            .checked_add_signed(step.at)
            .expect("time in range");
        clock.set(now);
        let context = || format!("trace {:?}, step {i} ({step:?})", trace.name);
        match &step.op {
            Op::Refund { units } => store
                .refund(Ask::new(key, quota).cost(*units))
                .await
                .unwrap_or_else(|e| panic!("{}: refund failed: {e}", context())),
            Op::Reset => store
                .reset(Ask::new(key, quota))
                .await
                .unwrap_or_else(|e| panic!("{}: reset failed: {e}", context())),
            Op::Check {
                cost,
                charge,
                expect,
            } => {
                let ask = Ask::new(key, quota).cost(*cost).charge(*charge);
                let actual = store.check(ask).await;
                match (expect, actual) {
                    (Expected::CapacityError, Err(StoreError::Capacity(_))) => {}
                    (
                        Expected::Decision {
                            allowed,
                            remaining,
                            retry_after,
                            reset_after,
                        },
                        Ok(actual),
                    ) => {
                        let got = (
                            actual.allowed,
                            actual.limit,
                            actual.burst,
                            actual.remaining,
                            actual.retry_after,
                            actual.reset_after,
                            actual.fallback,
                        );
                        let expected = (
                            *allowed,
                            quota.limit(),
                            quota.burst(),
                            *remaining,
                            *retry_after,
                            *reset_after,
                            None,
                        );
                        assert_eq!(got, expected, "{}", context());
                        if actual.allowed && *cost > 0 && !charge {
                            granted.push((now, *cost));
                        }
                    }
                    (expect, actual) => {
                        panic!("{}: expected {expect:?}, got {actual:?}", context())
                    }
                }
            }
        }
    }
    if trace.check_window_bound {
        let period = quota.period().as_nanos() as u64;
        for &(t, _) in &granted {
            let in_window: u64 = granted
                .iter()
                .filter(|&&(u, _)| u >= t && u < t + period)
                .map(|&(_, c)| c)
                .sum();
            assert!(
                in_window <= quota.limit(),
                "trace {:?}: {in_window} units granted in the window starting at {t}",
                trace.name
            );
        }
    }
}
