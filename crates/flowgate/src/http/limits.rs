//! [`Limits`]: which limits a request is checked against, with which key, quota and fail mode.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderValue;
use http::request::Parts;

use super::error::LimitsError;
use super::key::{KeyExtractor, KeyRejection};
use crate::answer::headers::policy_item_value;
use crate::decision::FailMode;
use crate::quota::Quota;
use crate::store::Ask;
use crate::store::key::{KeyWriter, escape_from};

/// A quota of a limit (for one tier, or for all), with what each request needs of it formatted
/// once: its `RateLimit-Policy` item and the start of its store keys
/// ([the key grammar](crate::store::key)).
#[derive(Debug, Clone)]
pub(crate) struct Tier {
    /// The quota.
    pub(crate) quota: Quota,
    /// `"name";q=…;w=…`.
    pub(crate) item: HeaderValue,
    /// `http:name|tier=tier|key=` (no `tier` field for an untiered limit), which the request's
    /// key completes (see [`Limit::select`]).
    key_prefix: Box<str>,
}

impl Tier {
    /// `quota` for tier `tier` (`None` for a limit without tiers, `*` for `otherwise`) of limit
    /// `name`.
    fn new(name: &str, tier: Option<&str>, quota: Quota) -> Self {
        let item = policy_item_value(name, &quota);
        let mut key_prefix = String::new();
        let mut key = KeyWriter::tagged(&mut key_prefix, "http", name);
        if let Some(tier) = tier {
            key = key.field("tier", tier);
        }
        key.open_field("key");
        let key_prefix = key_prefix.into_boxed_str();
        Tier {
            quota,
            item,
            key_prefix,
        }
    }
}

/// How a limit picks its quota.
enum Quotas {
    /// The same quota for every key. `misused` records a [`Limit::tier`] or
    /// [`Limit::otherwise`] call on such a limit, refused when the layer is built.
    One(Tier, Option<&'static str>),
    /// A quota per tier, the tier read from the request.
    Tiered {
        /// Reads the tier (`free`, `enterprise`, a route template).
        tier: Box<dyn KeyExtractor>,
        /// Quota per tier value.
        tiers: HashMap<String, Tier>,
        /// The quota for a tier not in `tiers`; `None` skips the limit for such requests.
        otherwise: Option<Tier>,
    },
}

/// One limit of a set of [`Limits`]: a name (shown to clients in the `RateLimit` headers), a
/// key extractor, and a quota — the same for everyone, or one per tier.
///
/// ```
/// use flowgate::{http::{key::{Header, PeerIp}, Limit}, Quota};
///
/// let per_ip = Limit::new("per-ip", PeerIp::new(), Quota::per_second(50));
/// // Free 10 r/s burst 20, Enterprise 500 r/s burst 1000, by the X-Plan header.
/// let per_key = Limit::tiered(
///         "per-key",
///         Header::new(http::HeaderName::from_static("x-api-key")),
///         Header::new(http::HeaderName::from_static("x-plan")),
///     )
///     .tier("free", Quota::per_second(10).with_burst(20)?)
///     .tier("enterprise", Quota::per_second(500).with_burst(1000)?);
/// # let _ = (per_ip, per_key);
/// # Ok::<(), flowgate::QuotaError>(())
/// ```
pub struct Limit {
    /// The policy name: letters, digits, `-`, `_`, `.` and `/`.
    name: Arc<str>,
    /// Reads the counter's key.
    key: Box<dyn KeyExtractor>,
    /// The quota, or quotas by tier.
    quotas: Quotas,
    /// Units a request takes.
    cost: u64,
    /// Counted but never denies (to try a limit out on live traffic).
    shadow: bool,
    /// What a fallback store decides for this limit while the shared store is away; `None`:
    /// the fallback store's default.
    fail: Option<FailMode>,
}

impl std::fmt::Debug for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("cost", &self.cost)
            .field("shadow", &self.shadow)
            .field("fail", &self.fail)
            .finish_non_exhaustive()
    }
}

impl Limit {
    /// Every key gets `quota`.
    pub fn new(name: impl Into<String>, key: impl KeyExtractor, quota: Quota) -> Self {
        let name: Arc<str> = name.into().into();
        Limit {
            quotas: Quotas::One(Tier::new(&name, None, quota), None),
            name,
            key: Box::new(key),
            cost: 1,
            shadow: false,
            fail: None,
        }
    }

    /// Each key's quota depends on its tier, read by `tier` (a plan claim, a header, the
    /// route); add tiers with [`tier`](Self::tier). A request whose tier is unknown is not
    /// checked against this limit unless [`otherwise`](Self::otherwise) gives a quota for it;
    /// a request whose tier cannot be read at all is rejected as `tier` says.
    pub fn tiered(
        name: impl Into<String>,
        key: impl KeyExtractor,
        tier: impl KeyExtractor,
    ) -> Self {
        Limit {
            name: name.into().into(),
            key: Box::new(key),
            quotas: Quotas::Tiered {
                tier: Box::new(tier),
                tiers: HashMap::new(),
                otherwise: None,
            },
            cost: 1,
            shadow: false,
            fail: None,
        }
    }

    /// The quota for tier `value`. Only for a limit made with [`tiered`](Self::tiered): on
    /// another, building the layer fails with [`LimitsError::NotTiered`].
    pub fn tier(mut self, value: impl Into<String>, quota: Quota) -> Self {
        match &mut self.quotas {
            Quotas::Tiered { tiers, .. } => {
                let value = value.into();
                let tier = Tier::new(&self.name, Some(&value), quota);
                tiers.insert(value, tier);
            }
            Quotas::One(_, misused) => *misused = Some("tier"),
        }
        self
    }

    /// The quota for tiers not named with [`tier`](Self::tier). Only for a limit made with
    /// [`tiered`](Self::tiered), like `tier`.
    pub fn otherwise(mut self, quota: Quota) -> Self {
        match &mut self.quotas {
            Quotas::Tiered { otherwise, .. } => {
                *otherwise = Some(Tier::new(&self.name, Some("*"), quota));
            }
            Quotas::One(_, misused) => *misused = Some("otherwise"),
        }
        self
    }

    /// What to decide for this limit while a shared store is away (applied by a
    /// [`FallbackStore`](crate::store::FallbackStore); without one, a store error is answered
    /// 503). Default: the fallback store's own default.
    pub fn fail(mut self, mode: FailMode) -> Self {
        self.fail = Some(mode);
        self
    }

    /// Units each request takes (default 1). Must fit every quota's burst.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Counts requests without ever denying them, and leaves the limit out of the headers.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The limit's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the limit may deny (it is not a shadow limit).
    pub(crate) fn enforced(&self) -> bool {
        !self.shadow
    }

    /// The quota this request falls under, with its store key — `http:name|tier=…|key=…`, in
    /// [the one key grammar](crate::store::key) — appended to `store_key`; `None` when the
    /// request's tier has no quota (the limit does not apply to it). The limit's name and tier
    /// keep counters of different limits and tiers apart.
    pub(crate) fn select(
        &self,
        parts: &Parts,
        store_key: &mut String,
    ) -> Result<Option<&Tier>, KeyRejection> {
        let priced = match &self.quotas {
            Quotas::One(p, _) => p,
            Quotas::Tiered {
                tier,
                tiers,
                otherwise,
            } => {
                // The tier's value goes where the key will: no string of its own.
                let start = store_key.len();
                tier.extract_into(parts, store_key)?;
                let found = tiers.get(&store_key[start..]);
                store_key.truncate(start);
                match found.or(otherwise.as_ref()) {
                    Some(p) => p,
                    None => return Ok(None),
                }
            }
        };
        store_key.push_str(&priced.key_prefix);
        let start = store_key.len();
        self.key.extract_into(parts, store_key)?;
        escape_from(store_key, start);
        Ok(Some(priced))
    }

    /// What the limit decides while a shared store is away, if it says.
    pub(crate) fn fail_mode(&self) -> Option<FailMode> {
        self.fail
    }

    /// What the limit asks of the store for one request, counted in `store_key` under `tier`.
    pub(crate) fn ask<'a>(&self, store_key: &'a str, tier: &'a Tier) -> Ask<'a> {
        Ask::new(store_key, &tier.quota)
            .cost(self.cost)
            .fail(self.fail)
            .shadow(self.shadow)
    }

    /// This limit as it applies to one request.
    pub(crate) fn selected(&self, store_key: String, tier: &Tier) -> Selected {
        Selected {
            name: self.name.clone(),
            store_key,
            quota: tier.quota,
            policy_item: tier.item.clone(),
            cost: self.cost,
            enforced: !self.shadow,
            fail: self.fail,
        }
    }

    fn quotas(&self) -> Vec<(Option<&str>, &Quota)> {
        match &self.quotas {
            Quotas::One(p, _) => vec![(None, &p.quota)],
            Quotas::Tiered {
                tiers, otherwise, ..
            } => tiers
                .iter()
                .map(|(t, p)| (Some(t.as_str()), &p.quota))
                .chain(otherwise.iter().map(|p| (None, &p.quota)))
                .collect(),
        }
    }
}

/// The limits a request is checked against. A request passes only if every limit (shadow
/// limits aside) allows it; units taken from the limits that allowed are given back when
/// another denies.
///
/// ```
/// use flowgate::{http::{key::PeerIp, Limit, Limits}, Quota};
/// let limits = Limits::new()
///     .limit(Limit::new("per-ip", PeerIp::new(), Quota::per_second(10)))
///     .limit(Limit::new("everyone", flowgate::http::key::Global::default(), Quota::per_second(1000)));
/// assert_eq!(limits.iter().count(), 2);
/// ```
#[derive(Debug, Default)]
pub struct Limits {
    /// The limits, in the order they are reported.
    limits: Vec<Limit>,
}

/// One limit as it applies to one request: the store key, the quota and the cost.
#[derive(Debug, Clone)]
pub(crate) struct Selected {
    /// The limit's name.
    pub(crate) name: Arc<str>,
    /// `http:name|tier=…|key=…` (see [`Limit::select`]).
    pub(crate) store_key: String,
    /// The quota that applies.
    pub(crate) quota: Quota,
    /// Its `RateLimit-Policy` item.
    pub(crate) policy_item: HeaderValue,
    /// Units the request takes.
    pub(crate) cost: u64,
    /// Whether the limit may deny.
    pub(crate) enforced: bool,
    /// Its fail mode, for the store.
    pub(crate) fail: Option<FailMode>,
}

impl Selected {
    /// What the limit asks of the store.
    pub(crate) fn ask(&self) -> Ask<'_> {
        Ask::new(&self.store_key, &self.quota)
            .cost(self.cost)
            .fail(self.fail)
            .shadow(!self.enforced)
    }
}

impl Limits {
    /// No limits yet; add them with [`limit`](Self::limit).
    pub fn new() -> Self {
        Limits::default()
    }

    /// One limit for everyone together, named `global`: `quota` shared by all requests.
    pub fn global(quota: Quota) -> Self {
        Limits::new().limit(Limit::new("global", super::key::Global::default(), quota))
    }

    /// Adds a limit.
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// The limits, in the order they are reported.
    pub fn iter(&self) -> impl Iterator<Item = &Limit> {
        self.limits.iter()
    }

    /// The limit, when the policy has exactly one.
    pub(crate) fn single(&self) -> Option<&Limit> {
        match self.limits.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Checks names, tiers and costs: every name is a valid, unique policy identifier, tiers
    /// are only given to tiered limits, and every cost fits its quotas' bursts, so no request
    /// can fail on them later.
    pub(crate) fn validate(&self) -> Result<(), LimitsError> {
        if self.limits.is_empty() {
            return Err(LimitsError::Empty);
        }
        let mut seen = std::collections::HashSet::new();
        for limit in &self.limits {
            let name = limit.name();
            if !valid_name(name) {
                return Err(LimitsError::InvalidName(name.to_owned()));
            }
            if !seen.insert(name) {
                return Err(LimitsError::DuplicateName(name.to_owned()));
            }
            if let Quotas::One(_, Some(method)) = &limit.quotas {
                return Err(LimitsError::NotTiered {
                    limit: name.to_owned(),
                    method,
                });
            }
            for (tier, quota) in limit.quotas() {
                // `*` is the store-key tier of `otherwise`.
                if let Some(tier) = tier.filter(|t| t.is_empty() || *t == "*") {
                    return Err(LimitsError::InvalidTier {
                        limit: name.to_owned(),
                        tier: tier.to_owned(),
                    });
                }
                quota
                    .check_cost(limit.cost)
                    .map_err(|source| LimitsError::CostExceedsBurst {
                        limit: name.to_owned(),
                        source,
                    })?;
            }
        }
        Ok(())
    }

    /// The limits that apply to a request, or the first key extractor's rejection (with the
    /// limit's name).
    pub(crate) fn select(&self, parts: &Parts) -> Result<Vec<Selected>, KeyRejection> {
        let mut selected = Vec::with_capacity(self.limits.len());
        for limit in &self.limits {
            let mut store_key = String::new();
            if let Some(tier) = limit.select(parts, &mut store_key)? {
                selected.push(limit.selected(store_key, tier));
            }
        }
        Ok(selected)
    }
}

/// Policy names are shown to clients as sf-strings and are part of store keys: ASCII letters,
/// digits, `-`, `_`, `.` and `/`, 1 to 64 of them.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::key::{Global, Header};

    #[test]
    fn bad_policies_are_rejected_when_built() {
        let q = Quota::per_second(5);
        assert_eq!(Limits::new().validate(), Err(LimitsError::Empty));
        let bad = Limits::new().limit(Limit::new("a:b", Global::default(), q));
        assert!(matches!(bad.validate(), Err(LimitsError::InvalidName(_))));
        let dup = Limits::new()
            .limit(Limit::new("a", Global::default(), q))
            .limit(Limit::new("a", Global::default(), q));
        assert!(matches!(dup.validate(), Err(LimitsError::DuplicateName(_))));
        let costly = Limits::new().limit(Limit::new("a", Global::default(), q).cost(6));
        assert!(matches!(
            costly.validate(),
            Err(LimitsError::CostExceedsBurst { .. })
        ));
        let tier = Limits::new()
            .limit(Limit::tiered("t", Global::default(), Global::default()).tier("*", q));
        assert!(matches!(
            tier.validate(),
            Err(LimitsError::InvalidTier { .. })
        ));
        let untiered = Limits::new().limit(Limit::new("u", Global::default(), q).tier("free", q));
        assert_eq!(
            untiered.validate(),
            Err(LimitsError::NotTiered {
                limit: "u".into(),
                method: "tier"
            })
        );
    }

    #[test]
    fn tiers_pick_quotas_and_unknown_tiers_skip_or_fall_back() {
        let (free, pro) = (Quota::per_second(10), Quota::per_second(100));
        let plan = || Header::new(http::HeaderName::from_static("x-plan"));
        let policy = Limits::new()
            .limit(
                Limit::tiered("plan", Global::default(), plan())
                    .tier("free", free)
                    .tier("pro", pro),
            )
            .limit(Limit::new("all", Global("everyone".into()), pro).shadow(true));
        let parts = |p: &str| {
            http::Request::builder()
                .header("x-plan", p)
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let applied = policy.select(&parts("pro")).unwrap();
        assert_eq!(applied[0].quota, pro);
        assert_eq!(applied[0].store_key, "http:plan|tier=pro|key=global");
        assert_eq!(applied[1].store_key, "http:all|key=everyone");
        assert!(!applied[1].enforced);
        assert_eq!(policy.select(&parts("gold")).unwrap().len(), 1);
        let policy = Limits::new().limit(
            Limit::tiered("plan", Global::default(), plan())
                .tier("free", free)
                .otherwise(free),
        );
        assert_eq!(
            policy.select(&parts("gold")).unwrap()[0].store_key,
            "http:plan|tier=*|key=global"
        );
        let none = http::Request::new(()).into_parts().0;
        assert_eq!(policy.select(&none).unwrap_err().status, 401);
    }
}
