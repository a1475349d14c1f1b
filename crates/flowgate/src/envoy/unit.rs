//! The time units of envoyproxy/ratelimit's `unit` field (and of the RLS protocol).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The time units of envoyproxy/ratelimit's `unit` field (and of the RLS protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days, as envoyproxy/ratelimit counts a year.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length in seconds.
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit's length.
    pub const fn duration(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// The unit's name as written in configuration files: `"second"`, `"minute"`, …
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit's number in the RLS protocol: `envoy.type.v3.RateLimitUnit` and
    /// `RateLimitResponse.RateLimit.Unit` number them alike (`SECOND` 1, `MINUTE` 2, `HOUR` 3,
    /// `DAY` 4, `MONTH` 5, `YEAR` 6, `WEEK` 7; 0 is `UNKNOWN`).
    pub const fn proto_number(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit numbered `number` in the RLS protocol ([`Unit::proto_number`]); `None` for
    /// `UNKNOWN` (0) and numbers the protocol does not define.
    pub fn from_proto_number(number: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.proto_number() == number)
    }

    /// The unit exactly `period` long, if there is one.
    pub fn from_period(period: Duration) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.duration() == period)
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A unit name that is not one of second, minute, hour, day, week, month, year.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown unit `{0}`; expected one of second, minute, hour, day, week, month, year")]
pub struct UnknownUnit(pub String);

impl FromStr for Unit {
    type Err = UnknownUnit;

    /// Parses a unit name, ignoring ASCII case (`SECOND` and `second` are both accepted, as
    /// envoyproxy/ratelimit does).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownUnit(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_in_any_case() {
        assert_eq!("MINUTE".parse::<Unit>(), Ok(Unit::Minute));
        assert_eq!(
            Unit::from_period(Duration::from_secs(86_400)),
            Some(Unit::Day)
        );
        assert!("fortnight".parse::<Unit>().is_err());
        for unit in Unit::ALL {
            assert_eq!(Unit::from_proto_number(unit.proto_number()), Some(unit));
        }
        assert_eq!(Unit::from_proto_number(0), None);
        assert_eq!(Unit::from_proto_number(8), None);
    }
}
