//! Without the `calendar` feature there are no calendars: an uninhabited stand-in for
//! `calendar::Calendar`, so that the fixed window and the stores need no `cfg` of their own.

use std::fmt;

use crate::clock::Nanos;

/// No calendar can exist without the `calendar` feature.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) enum Calendar {}

impl Calendar {
    /// See `calendar::Calendar::bounds`.
    pub(crate) fn bounds(&self, _now: Nanos) -> (u64, Nanos) {
        match *self {}
    }

    /// See `calendar::Calendar::end_of`.
    pub(crate) fn end_of(&self, _window: u64) -> Nanos {
        match *self {}
    }

    /// See `calendar::Calendar::boundaries`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn boundaries(&self, _now: Nanos) -> [u64; 4] {
        match *self {}
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, _f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {}
    }
}
