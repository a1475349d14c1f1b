//! The Lua scripts, how requests become their arguments and how replies become [`Decision`]s.
//!
//! A script decides and updates state; it does not compute the decision's numbers. It returns
//! the state it read (and the time it used), and the client replays the library's own
//! transition ([`crate::algorithm`]) on that state to fill in `remaining`, `reset_after` and
//! `retry_after`. So the Redis store's decisions are the reference semantics by construction,
//! and a script that ever disagreed with the reference about `allowed` is reported as a
//! [`StoreError::Backend`] instead of being trusted silently.

use std::sync::OnceLock;

use crate::algorithm::{FixedWindow, Gcra, LeakyBucket, MAX_CHARGE, SlidingWindow};
use crate::clock::{Clock, Nanos, PreciseClock};
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};
use crate::store::StoreError;

/// Largest count the scripts keep exactly (Lua numbers are doubles).
const MAX_EXACT: u64 = 1 << 53;

/// Largest burst for the bucket algorithms: keeps `cost × (T mod 1 µs)` below 2^53.
const MAX_BUCKET_BURST: u64 = 1 << 43;

/// One algorithm's script: its source and SHA-1.
#[derive(Debug)]
pub(super) struct Script {
    /// The full source (shared prelude + the algorithm's body).
    pub(super) source: String,
    /// Lowercase hex SHA-1 of `source`, for `EVALSHA`.
    pub(super) sha: String,
}

fn build(body: &str) -> Script {
    let source = format!("{}\n{}", include_str!("prelude.lua"), body);
    let sha = redis::Script::new(&source).get_hash().to_owned();
    Script { source, sha }
}

/// The script for `algorithm`, built once per process.
pub(super) fn script(algorithm: Algorithm) -> &'static Script {
    static SCRIPTS: OnceLock<[Script; 5]> = OnceLock::new();
    let scripts = SCRIPTS.get_or_init(|| {
        [
            build(include_str!("gcra.lua")),
            build(include_str!("leaky_bucket.lua")),
            build(include_str!("fixed_window.lua")),
            build(include_str!("sliding_window.lua")),
            build(include_str!("sliding_log.lua")),
        ]
    });
    &scripts[algorithm.index()]
}

/// Integers each request's reply holds, status included.
pub(super) fn reply_width(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::Gcra | Algorithm::FixedWindow => 3,
        Algorithm::SlidingWindow => 4,
        Algorithm::LeakyBucket => 5,
        Algorithm::SlidingLog => 6,
    }
}

/// A quota the Redis store cannot enforce exactly, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsupportedQuota {
    /// Window algorithms need whole microseconds, so that window indices stay exact in Lua.
    #[error(
        "the Redis store needs {algorithm} periods in whole microseconds, got {period_nanos} ns"
    )]
    PeriodNotWholeMicros {
        /// The window algorithm.
        algorithm: Algorithm,
        /// The period asked for.
        period_nanos: Nanos,
    },
    /// Counts above 2^53 cannot be kept exactly by Redis's Lua (a fixed window's count can
    /// be charged up to `limit + 2^44`, so its limit stops at 2^52).
    #[error(
        "the Redis store supports limits up to 2^52 (2^53 for sliding_log) for {algorithm}, got {limit}"
    )]
    LimitTooLarge {
        /// The algorithm.
        algorithm: Algorithm,
        /// The limit asked for.
        limit: u64,
    },
    /// Bucket algorithms support bursts up to 2^43 (8.8 trillion) units.
    #[error("the Redis store supports bursts up to 2^43 for {algorithm}, got {burst}")]
    BurstTooLarge {
        /// The algorithm.
        algorithm: Algorithm,
        /// The burst asked for.
        burst: u64,
    },
}

/// The largest limit a counting algorithm's script keeps exactly: a fixed window's count may
/// reach `limit + MAX_CHARGE` and then take `MAX_CHARGE` more, all below 2^53.
fn max_limit(algorithm: Algorithm) -> u64 {
    if algorithm == Algorithm::FixedWindow {
        MAX_EXACT / 2
    } else {
        MAX_EXACT
    }
}

/// Checks that the Redis store decides `quota` exactly as the reference does.
///
/// Bucket algorithms (`gcra`, `leaky_bucket`) need a burst of at most 2^43; window algorithms
/// (`fixed_window`, `sliding_window`) a period of whole microseconds; `fixed_window` a limit
/// of at most 2^52, `sliding_log` of at most 2^53. Everything else is supported, from
/// nanosecond intervals to periods of decades.
pub fn check_quota(quota: &Quota) -> Result<(), UnsupportedQuota> {
    let algorithm = quota.algorithm();
    if matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow)
        && !quota.period_nanos().is_multiple_of(1000)
    {
        return Err(UnsupportedQuota::PeriodNotWholeMicros {
            algorithm,
            period_nanos: quota.period_nanos(),
        });
    }
    if algorithm.has_burst() && quota.burst() > MAX_BUCKET_BURST {
        return Err(UnsupportedQuota::BurstTooLarge {
            algorithm,
            burst: quota.burst(),
        });
    }
    if matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingLog)
        && quota.limit() > max_limit(algorithm)
    {
        return Err(UnsupportedQuota::LimitTooLarge {
            algorithm,
            limit: quota.limit(),
        });
    }
    Ok(())
}

/// Whether a script call checks (and takes) or refunds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Take `cost` units (0 peeks).
    Check,
    /// Give back `cost` units.
    Refund,
    /// Take `cost` units whatever the state ([`State::charge`](crate::algorithm::State::charge)).
    Charge,
}

/// Appends a time span as the (µs, ns) pair the scripts use.
fn push_pair(args: &mut Vec<u64>, nanos: Nanos) {
    args.push(nanos / 1000);
    args.push(nanos % 1000);
}

/// The width, in µs, of the buckets by which scripts decide when to refresh a key's expiry:
/// the smallest power of two above `span` (so that dividing by it is exact in Lua).
fn expiry_bucket(span: Nanos) -> u64 {
    (span / 1000 + 1).next_power_of_two()
}

/// A script call's ARGV: the header as strings (some may be empty), then numbers.
#[derive(Debug)]
pub(super) struct Args {
    /// now (µs, ns) or empty for the server's TIME, mode, number of quotas, uniform cost or
    /// empty.
    pub(super) header: [String; 5],
    /// Quota blocks, then (quota index, cost) per request unless the cost is uniform.
    pub(super) numbers: Vec<u64>,
}

/// The ARGV for requests of one algorithm (see the scripts' headers).
pub(super) fn args<'a>(
    now: Option<Nanos>,
    mode: Mode,
    requests: impl Iterator<Item = (&'a Quota, u64)>,
) -> Args {
    let mut quotas: Vec<&Quota> = Vec::new();
    let mut per_request = Vec::new();
    for (quota, cost) in requests {
        let index = match quotas.iter().position(|q| *q == quota) {
            Some(i) => i,
            None => {
                quotas.push(quota);
                quotas.len() - 1
            }
        };
        per_request.push(index as u64 + 1);
        // Units beyond the burst change nothing (refunds), nor beyond `MAX_CHARGE` (charges);
        // keeping them below it keeps the scripts' products exact.
        per_request.push(match mode {
            Mode::Charge => cost.min(MAX_CHARGE),
            Mode::Check | Mode::Refund => cost.min(quota.burst()),
        });
    }
    let uniform = (quotas.len() == 1)
        .then(|| per_request.get(1).copied())
        .flatten()
        .filter(|&first| per_request.chunks(2).all(|r| r[1] == first));
    let mut numbers = Vec::with_capacity(quotas.len() * 4 + per_request.len());
    for quota in &quotas {
        match quota.algorithm() {
            Algorithm::Gcra | Algorithm::LeakyBucket => {
                push_pair(&mut numbers, quota.interval_nanos());
                push_pair(&mut numbers, quota.tolerance_nanos());
                numbers.push(expiry_bucket(quota.tolerance_nanos()));
            }
            Algorithm::FixedWindow => {
                numbers.push(quota.limit());
                match quota.window_calendar() {
                    None => numbers.extend([quota.period_nanos() / 1000, 0, 0, 0, 0]),
                    Some(calendar) => {
                        // The previous, current and next periods around this host's clock: the
                        // script picks the one containing its own (see fixed_window.lua).
                        let near = now.unwrap_or_else(|| PreciseClock::new().now());
                        numbers.push(0);
                        numbers.extend(calendar.boundaries(near));
                    }
                }
            }
            Algorithm::SlidingWindow => {
                numbers.push(quota.limit());
                numbers.push(quota.period_nanos() / 1000);
            }
            Algorithm::SlidingLog => {
                numbers.push(quota.limit());
                push_pair(&mut numbers, quota.period_nanos());
                numbers.push(expiry_bucket(quota.period_nanos()));
            }
        }
    }
    if uniform.is_none() {
        numbers.extend(per_request);
    }
    let (now_u, now_r) = now.map_or((String::new(), String::new()), |now| {
        ((now / 1000).to_string(), (now % 1000).to_string())
    });
    let mode = match mode {
        Mode::Check => "0",
        Mode::Refund => "1",
        Mode::Charge => "2",
    };
    Args {
        header: [
            now_u,
            now_r,
            mode.to_owned(),
            quotas.len().to_string(),
            uniform.map_or(String::new(), |c| c.to_string()),
        ],
        numbers,
    }
}

/// Joins a (µs, ns) pair from a reply into nanoseconds.
fn join(u: i64, r: i64) -> Result<Nanos, StoreError> {
    let u = u64::try_from(u).map_err(|_| malformed())?;
    let r = u64::try_from(r).map_err(|_| malformed())?;
    u.checked_mul(1000)
        .and_then(|n| n.checked_add(r))
        .ok_or_else(malformed)
}

fn count(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| malformed())
}

pub(super) fn malformed() -> StoreError {
    StoreError::Backend("the Redis script returned a malformed reply".into())
}

/// The time the script used, from the head of its reply.
pub(super) fn reply_now(reply: &[i64]) -> Result<Nanos, StoreError> {
    match reply {
        [u, r, ..] => join(*u, *r),
        _ => Err(malformed()),
    }
}

/// Turns one request's slice of a check reply into its decision, replaying the reference
/// transition on the state the script read.
pub(super) fn decide(
    key: &str,
    (quota, cost, charge): (&Quota, u64, bool),
    now: Nanos,
    reply: &[i64],
) -> Result<Decision, StoreError> {
    let ask = crate::store::Ask::new(key, quota).cost(cost).charge(charge);
    let Some((&status, state)) = reply.split_first() else {
        return Err(malformed());
    };
    let allowed = match status {
        1 => true,
        0 => false,
        -1 => return Err(foreign(key)),
        -2 => return Err(calendar_skew(key, now)),
        _ => return Err(malformed()),
    };
    let decision = match (quota.algorithm(), state) {
        (Algorithm::Gcra, &[u, r]) => ask.apply(&mut Gcra { tat: join(u, r)? }, now),
        (Algorithm::LeakyBucket, &[lu, lr, uu, ur]) => ask.apply(
            &mut LeakyBucket {
                level: join(lu, lr)?,
                updated: join(uu, ur)?,
            },
            now,
        ),
        (Algorithm::FixedWindow, &[w, c]) => ask.apply(
            &mut FixedWindow {
                window: count(w)?,
                count: count(c)?,
            },
            now,
        ),
        (Algorithm::SlidingWindow, &[w, c, p]) => ask.apply(
            &mut SlidingWindow {
                window: count(w)?,
                current: count(c)?,
                previous: count(p)?,
            },
            now,
        ),
        (Algorithm::SlidingLog, &[held, lu, lr, ru, rr]) => {
            log_decision(quota, allowed, count(held)?, (lu, lr), (ru, rr), now)?
        }
        _ => return Err(malformed()),
    };
    if decision.allowed != allowed {
        return Err(StoreError::Backend(format!(
            "the Redis {} script {} `{key}` where the reference {}; please report this",
            quota.algorithm(),
            if allowed { "granted" } else { "denied" },
            if decision.allowed { "grants" } else { "denies" },
        )));
    }
    Ok(decision)
}

/// The sliding log's decision from what the script saw: its state can hold up to `limit`
/// stamps, so the script reports only the ones that matter.
fn log_decision(
    quota: &Quota,
    allowed: bool,
    held: u64,
    newest: (i64, i64),
    retry: (i64, i64),
    now: Nanos,
) -> Result<Decision, StoreError> {
    let period = quota.period_nanos();
    let limit = quota.limit();
    let reset = if newest.0 < 0 {
        0
    } else {
        (join(newest.0, newest.1)? + period).saturating_sub(now)
    };
    let remaining = limit.checked_sub(held).ok_or_else(malformed)?;
    if allowed {
        Ok(Decision::allow(quota, remaining, reset))
    } else {
        let retry = (join(retry.0, retry.1)? + period).saturating_sub(now);
        Ok(Decision::deny(quota, remaining, reset, retry))
    }
}

/// The Redis server's clock fell outside the calendar periods the client passed: it is more
/// than a whole period away from this host's.
pub(super) fn calendar_skew(key: &str, now: Nanos) -> StoreError {
    StoreError::Backend(format!(
        "the Redis server's clock ({} s since the epoch) is more than a calendar period away from this host's; `{key}` was not counted",
        now / 1_000_000_000
    ))
}

/// A key holding a value the scripts did not write.
pub(super) fn foreign(key: &str) -> StoreError {
    StoreError::Backend(format!(
        "the Redis key `{key}` holds a value Flowgate did not write; delete it or choose another key prefix"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn window_periods_must_be_whole_micros_and_counts_exact() {
        let q = Quota::new(10, Duration::from_nanos(1_500))
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap();
        assert!(matches!(
            check_quota(&q),
            Err(UnsupportedQuota::PeriodNotWholeMicros { .. })
        ));
        assert!(check_quota(&q.with_algorithm(Algorithm::Gcra).unwrap()).is_ok());
        let big = Quota::new(1 << 54, Duration::from_secs(1 << 30))
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        assert!(matches!(
            check_quota(&big),
            Err(UnsupportedQuota::LimitTooLarge { .. })
        ));
        for a in Algorithm::ALL {
            let q = Quota::per_minute(100).with_algorithm(a).unwrap();
            assert_eq!(check_quota(&q), Ok(()));
        }
    }

    /// A server clock outside the calendar periods the client passed is reported (status
    /// -2), counts nothing, and becomes an error naming the skew.
    #[cfg(feature = "calendar")]
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_server_clock_outside_the_passed_periods_is_reported_not_counted() {
        use crate::calendar::{Calendar, CalendarUnit};
        let Some(server) = flowgate_testing::redis::RedisServer::start("calendar_skew") else {
            return;
        };
        let quota = Quota::per_calendar(5, Calendar::utc(CalendarUnit::Day)).unwrap();
        // Periods around 2001-09-09, while the server's TIME is today: a skew of decades.
        let long_ago = 1_000_000_000 * 1_000_000_000;
        let mut args = args(Some(long_ago), Mode::Check, std::iter::once((&quota, 1)));
        args.header[0].clear();
        args.header[1].clear();
        let mut conn = server.connection();
        let reply: Vec<i64> = redis::cmd("EVAL")
            .arg(&script(Algorithm::FixedWindow).source)
            .arg(1)
            .arg("skewed")
            .arg(&args.header)
            .arg(&args.numbers)
            .query(&mut conn)
            .unwrap();
        assert_eq!(reply[2..], [-2, 0, 0]);
        let exists: i64 = redis::cmd("EXISTS").arg("skewed").query(&mut conn).unwrap();
        assert_eq!(exists, 0);
        let now = reply_now(&reply).unwrap();
        let err = decide("skewed", (&quota, 1, false), now, &reply[2..]).unwrap_err();
        assert!(
            err.to_string().contains("more than a calendar period away"),
            "{err}"
        );
    }

    #[test]
    fn scripts_are_distinct_and_stable() {
        let shas: Vec<_> = Algorithm::ALL.iter().map(|&a| &script(a).sha).collect();
        for (i, a) in shas.iter().enumerate() {
            assert_eq!(a.len(), 40);
            assert!(shas[i + 1..].iter().all(|b| b != a));
        }
    }
}
