//! The built-in traffic patterns, each scaled to the quota under test.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::rng::SplitMix64;
use super::traffic::{Retry, Traffic};
use crate::clock::Nanos;
use crate::quota::Quota;

/// Where every built-in scenario starts: 2026-01-01 12:00:00 UTC, in nanoseconds since the
/// Unix epoch — a whole minute, hour and second, so fixed windows of those lengths start
/// with it.
pub const SCENARIO_START: Nanos = 1_767_268_800_000_000_000;

/// The key every built-in scenario's requests are for.
pub const SCENARIO_KEY: &str = "client";

/// Tries in all (the first included) of the clients in the retry storms.
pub const STORM_ATTEMPTS: u32 = 10;

/// A built-in traffic pattern. Each is scaled to the quota it is run against: with `L` =
/// limit, `P` = period and `r = L / P` the quota's rate, all requests are for one key and cost
/// one unit:
///
/// | scenario | traffic | what it shows |
/// |---|---|---|
/// | `steady` | evenly spaced at 1.25·r for 4·P | how each algorithm settles to the rate |
/// | `bursty` | 0.5·r of jittered background for 4·P, plus a burst of `L` within P/20 at a random point of each period | bursts on top of light load |
/// | `flash-crowd` | 0.5·r for P, then 10·r for P, then 0.5·r for 2·P (jittered) | a sudden surge and the recovery after it |
/// | `boundary` | `L` requests at once P/60 before a fixed-window boundary and `L` P/60 after it (for 100 per minute: 100 at 12:00:59, 100 at 12:01:01) | the fixed window's 2× spike across a boundary |
/// | `retry-storm` | 2·L clients within P/60, each retrying P/60 after every denial, up to [`STORM_ATTEMPTS`] tries | naive retries |
/// | `retry-storm-honoured` | the same clients, waiting for `Retry-After` instead | what honouring `Retry-After` changes |
///
/// "Jittered" arrivals are spaced by a uniform draw between 0 and twice the mean gap, from a
/// seeded generator: the same scenario, quota and seed always give the same requests.
///
/// ```
/// use flowgate::simulate::Scenario;
/// use flowgate::Quota;
/// let traffic = Scenario::Boundary.traffic(&Quota::per_minute(100), 1);
/// assert_eq!(traffic.len(), 200);
/// assert_eq!("flash-crowd".parse::<Scenario>(), Ok(Scenario::FlashCrowd));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// Evenly spaced requests a quarter above the rate.
    Steady,
    /// Light background load with one burst of a whole limit per period.
    Bursty,
    /// Ten times the rate for one period between quiet spells.
    FlashCrowd,
    /// A limit's worth just before a fixed-window boundary and another just after.
    Boundary,
    /// Twice a limit's worth of clients at once, retrying at a fixed pace when denied.
    RetryStorm,
    /// The same clients, honouring `Retry-After`.
    RetryStormHonoured,
}

impl Scenario {
    /// Every scenario, in the order of the table above.
    pub const ALL: [Scenario; 6] = [
        Scenario::Steady,
        Scenario::Bursty,
        Scenario::FlashCrowd,
        Scenario::Boundary,
        Scenario::RetryStorm,
        Scenario::RetryStormHonoured,
    ];

    /// The scenario's name, as the command line takes it (e.g. `"flash-crowd"`).
    pub const fn name(self) -> &'static str {
        match self {
            Scenario::Steady => "steady",
            Scenario::Bursty => "bursty",
            Scenario::FlashCrowd => "flash-crowd",
            Scenario::Boundary => "boundary",
            Scenario::RetryStorm => "retry-storm",
            Scenario::RetryStormHonoured => "retry-storm-honoured",
        }
    }

    /// One line on what the scenario sends.
    pub const fn description(self) -> &'static str {
        match self {
            Scenario::Steady => "evenly spaced requests at 1.25x the rate for 4 periods",
            Scenario::Bursty => {
                "0.5x the rate in the background, plus a burst of a whole limit each period"
            }
            Scenario::FlashCrowd => "0.5x the rate, then 10x for one period, then 0.5x again",
            Scenario::Boundary => {
                "a limit's worth just before a fixed-window boundary and another just after"
            }
            Scenario::RetryStorm => {
                "2x the limit of clients at once, retrying every period/60 when denied"
            }
            Scenario::RetryStormHonoured => {
                "the same clients, waiting as long as Retry-After says when denied"
            }
        }
    }

    /// The scenario's requests under `quota`, drawn with `seed` where the scenario is
    /// random (`bursty`, `flash-crowd`, the retry storms' arrival times).
    pub fn traffic(self, quota: &Quota, seed: u64) -> Traffic {
        let limit = quota.limit();
        let period = crate::clock::nanos(quota.period());
        let mut rng = SplitMix64::new(seed);
        let start = SCENARIO_START;
        let mut traffic = Traffic::new(self.name());
        // Mean gap between requests at `times` × the quota's rate, in ns (at least 1).
        let gap = |times_num: u64, times_den: u64| {
            ((u128::from(period) * u128::from(times_den))
                / (u128::from(limit) * u128::from(times_num)))
            .max(1) as Nanos
        };
        let span = match self {
            Scenario::Steady => {
                let every = gap(5, 4);
                let end = start + 4 * period;
                let mut t = start;
                while t < end {
                    traffic.push_unsorted(t, SCENARIO_KEY, 1, 0);
                    t += every;
                }
                4 * period
            }
            Scenario::Bursty => {
                jittered(&mut traffic, &mut rng, start, start + 4 * period, gap(1, 2));
                let width = (period / 20).max(1);
                for k in 0..4 {
                    let at = start + k * period + rng.below(period - width + 1);
                    for _ in 0..limit {
                        traffic.push_unsorted(at + rng.below(width), SCENARIO_KEY, 1, 0);
                    }
                }
                4 * period
            }
            Scenario::FlashCrowd => {
                let quiet = gap(1, 2);
                jittered(&mut traffic, &mut rng, start, start + period, quiet);
                jittered(
                    &mut traffic,
                    &mut rng,
                    start + period,
                    start + 2 * period,
                    gap(10, 1),
                );
                jittered(
                    &mut traffic,
                    &mut rng,
                    start + 2 * period,
                    start + 4 * period,
                    quiet,
                );
                4 * period
            }
            Scenario::Boundary => {
                let boundary = (start + period / 2).div_ceil(period) * period;
                let offset = (period / 60).max(1);
                for at in [boundary - offset, boundary + offset] {
                    for _ in 0..limit {
                        traffic.push_unsorted(at, SCENARIO_KEY, 1, 0);
                    }
                }
                boundary + period - start
            }
            Scenario::RetryStorm | Scenario::RetryStormHonoured => {
                let width = (period / 60).max(1);
                for _ in 0..2 * limit {
                    traffic.push_unsorted(start + rng.below(width), SCENARIO_KEY, 1, 0);
                }
                3 * period
            }
        };
        let retry = match self {
            Scenario::RetryStorm => Retry::Fixed {
                delay: Duration::from_nanos((period / 60).max(1)),
                attempts: STORM_ATTEMPTS,
            },
            Scenario::RetryStormHonoured => Retry::RetryAfter {
                attempts: STORM_ATTEMPTS,
            },
            _ => Retry::Never,
        };
        traffic.sort();
        traffic.with_retry(retry).with_span(start, start + span)
    }
}

/// Requests from `from` until `until`, spaced by uniform draws in `0..=2·gap`.
fn jittered(traffic: &mut Traffic, rng: &mut SplitMix64, from: Nanos, until: Nanos, gap: Nanos) {
    let mut t = from + rng.below(2 * gap + 1);
    while t < until {
        traffic.push_unsorted(t, SCENARIO_KEY, 1, 0);
        t += rng.below(2 * gap + 1).max(1);
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown scenario name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown scenario `{0}`; expected one of steady, bursty, flash-crowd, boundary, retry-storm, retry-storm-honoured"
)]
pub struct UnknownScenario(pub String);

impl FromStr for Scenario {
    type Err = UnknownScenario;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scenario::ALL
            .into_iter()
            .find(|scenario| scenario.name() == s)
            .ok_or_else(|| UnknownScenario(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn the_boundary_scenario_straddles_a_window_boundary() {
        let t = Scenario::Boundary.traffic(&Quota::per_minute(100), 0);
        let times: Vec<Nanos> = t.arrivals().iter().map(|a| a.at).collect();
        assert_eq!(times.len(), 200);
        // 12:00:59 and 12:01:01.
        assert!(
            times[..100]
                .iter()
                .all(|&at| at == SCENARIO_START + 59 * SEC)
        );
        assert!(
            times[100..]
                .iter()
                .all(|&at| at == SCENARIO_START + 61 * SEC)
        );
        assert_eq!(t.retry(), Retry::Never);
        assert_eq!(
            (t.start(), t.end()),
            (SCENARIO_START, SCENARIO_START + 120 * SEC)
        );
    }

    #[test]
    fn scenarios_scale_with_the_quota_and_are_reproducible() {
        let q = Quota::per_minute(100);
        assert_eq!(Scenario::Steady.traffic(&q, 0).len(), 500);
        let flash = Scenario::FlashCrowd.traffic(&q, 3);
        // About 50 + 1000 + 100 requests.
        assert!((1000..1300).contains(&flash.len()), "{}", flash.len());
        for scenario in Scenario::ALL {
            let a = scenario.traffic(&q, 42);
            let b = scenario.traffic(&q, 42);
            assert_eq!(a.arrivals(), b.arrivals(), "{scenario}");
            assert!(a.arrivals().windows(2).all(|w| w[0].at <= w[1].at));
            assert_eq!(scenario.name().parse::<Scenario>(), Ok(scenario));
        }
        let storm = Scenario::RetryStormHonoured.traffic(&q, 1);
        assert_eq!(storm.len(), 200);
        assert_eq!(
            storm.retry(),
            Retry::RetryAfter {
                attempts: STORM_ATTEMPTS
            }
        );
        assert!("storm".parse::<Scenario>().is_err());
    }
}
