//! What a request carries: [`Descriptor`]s of [`Entry`]s, optionally with their own limit.

use super::unit::Unit;

/// One `(key, value)` entry of a descriptor (ordered by key, then value).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Entry {
    /// The entry's key, e.g. `remote_address`.
    pub key: String,
    /// The entry's value, e.g. `10.0.0.1`.
    pub value: String,
}

impl Entry {
    /// An entry.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A limit sent with the request instead of the configured one (Envoy's
/// `RateLimitDescriptor.limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests allowed per unit; 0 denies everything.
    pub requests_per_unit: u64,
    /// The period.
    pub unit: Unit,
}

/// One descriptor of a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// The entries, outermost first.
    pub entries: Vec<Entry>,
    /// A limit that overrides the configured rules.
    pub limit: Option<LimitOverride>,
    /// Units this descriptor costs; overrides the request's `hits_addend` (0 peeks).
    pub hits_addend: Option<u64>,
    /// Its hits are a charge: usage that already happened, always taken, into debt past the
    /// limit if need be ([`Ask::charge`](crate::store::Ask::charge)). Rules may make hits
    /// charges too ([`LimitSpec::charge`](super::LimitSpec::charge)).
    pub charge: bool,
}

impl Descriptor {
    /// A descriptor with these entries, no override and the request's hits.
    pub fn new(entries: Vec<Entry>) -> Self {
        Descriptor {
            entries,
            limit: None,
            hits_addend: None,
            charge: false,
        }
    }
}
