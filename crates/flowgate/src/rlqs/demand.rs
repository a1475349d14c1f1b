//! One Envoy's demand for one rule instance, estimated from its usage reports and kept
//! **sticky**: the estimate moves only when a report falls outside the noise band around it,
//! so a steady Envoy keeps the same demand — and so the same share, and the same token
//! bucket (Envoy refills a bucket whose assignment changed). A report with denials above the
//! estimate moves it up at once: the share is binding, and the band must not hide a demand
//! that grew.

use crate::clock::Nanos;

/// A report counts as a change when it differs from what the estimate expects by more than
/// this fraction of it...
const RELATIVE_BAND: f64 = 0.1;
/// ...plus this many standard deviations of a Poisson count, plus one request.
const POISSON_SIGMAS: f64 = 3.0;

/// The demand estimate of one (Envoy, rule instance). See the [module docs](self).
///
/// ```
/// use flowgate::rlqs::DemandEstimate;
/// const S: u64 = 1_000_000_000;
/// let mut d = DemandEstimate::default();
/// d.report(1, 0, S); // the first report (one request) says nothing of the rate
/// assert_eq!(d.per_period(), None);
/// assert!(d.report(100, S, S)); // 100 in the last second: 100 per period
/// assert_eq!(d.per_period(), Some(100));
/// assert!(!d.report(108, 2 * S, S)); // within the noise band: unchanged
/// assert_eq!(d.per_period(), Some(100));
/// assert!(d.report(300, 3 * S, S));
/// assert_eq!(d.per_period(), Some(300));
/// // Denied requests above the estimate: up at once.
/// assert!(d.report_with_denials(310, 10, 4 * S, S));
/// assert_eq!(d.per_period(), Some(310));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DemandEstimate {
    /// Requests per period, once a full interval was reported.
    sticky: Option<u64>,
    /// When the last report arrived.
    last_report: Option<Nanos>,
    /// Since when every report said 0 requests (`None` while requests come).
    idle_since: Option<Nanos>,
}

impl DemandEstimate {
    /// Takes a report of `count` requests (allowed + denied) received at `now`, for a rule
    /// whose period is `period` ns. Returns whether the estimate changed.
    pub fn report(&mut self, count: u64, now: Nanos, period: Nanos) -> bool {
        self.report_with_denials(count, 0, now, period)
    }

    /// [`report`](Self::report), with `denied` of the `count` requests denied: a count above
    /// the estimate with denials moves it whatever the band.
    pub fn report_with_denials(
        &mut self,
        count: u64,
        denied: u64,
        now: Nanos,
        period: Nanos,
    ) -> bool {
        let previous = self.last_report.replace(now);
        if count == 0 {
            self.idle_since.get_or_insert(now);
        } else {
            self.idle_since = None;
        }
        let Some(previous) = previous else {
            // The first report is sent at the first request: no interval to divide by.
            return false;
        };
        let elapsed = now.saturating_sub(previous).max(1);
        let rate = u128::from(count) * u128::from(period.max(1)) / u128::from(elapsed);
        let rate = u64::try_from(rate).unwrap_or(u64::MAX);
        let Some(sticky) = self.sticky else {
            self.sticky = Some(rate);
            return true;
        };
        // What the estimate expects in this interval, and the band around it.
        let expected = sticky as f64 * elapsed as f64 / period.max(1) as f64;
        let band = RELATIVE_BAND * expected + POISSON_SIGMAS * expected.sqrt() + 1.0;
        let grew_while_denied = denied > 0 && count as f64 > expected;
        if grew_while_denied || (count as f64 - expected).abs() > band {
            self.sticky = Some(rate);
            true
        } else {
            false
        }
    }

    /// Requests per period, once known.
    pub fn per_period(&self) -> Option<u64> {
        self.sticky
    }

    /// Since when the reports said no requests, if they do.
    pub fn idle_since(&self) -> Option<Nanos> {
        self.idle_since
    }

    /// When the last report arrived.
    pub fn last_report(&self) -> Option<Nanos> {
        self.last_report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn poisson_noise_does_not_move_the_estimate_but_a_shift_does() {
        let mut d = DemandEstimate::default();
        d.report(1, 0, S);
        assert!(d.report(200, S, S));
        for (i, count) in [186, 214, 201, 190, 212].into_iter().enumerate() {
            assert!(!d.report(count, (i as u64 + 2) * S, S), "{count}");
        }
        assert_eq!(d.per_period(), Some(200));
        assert!(d.report(120, 7 * S, S));
        assert_eq!(d.per_period(), Some(120));
    }

    #[test]
    fn rates_scale_with_the_interval_and_idleness_is_tracked() {
        let mut d = DemandEstimate::default();
        d.report(1, 0, 60 * S);
        // 10 requests in half a second, for a per-minute rule: 1200 per period.
        assert!(d.report(10, S / 2, 60 * S));
        assert_eq!(d.per_period(), Some(1200));
        assert_eq!(d.idle_since(), None);
        d.report(0, S, 60 * S);
        d.report(0, 2 * S, 60 * S);
        assert_eq!(d.idle_since(), Some(S));
        d.report(3, 3 * S, 60 * S);
        assert_eq!(d.idle_since(), None);
        assert_eq!(d.last_report(), Some(3 * S));
    }
}
