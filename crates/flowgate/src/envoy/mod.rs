//! Envoy's rate-limit model, as envoyproxy/ratelimit implements it (feature `envoy`): domains
//! of nested descriptor rules, request descriptors matched against them, and the semantics of
//! `hits_addend`, limit overrides, `unlimited`, blocklists (`requests_per_unit: 0`), shadow
//! mode and `replaces`. The service (`flowgate serve`) parses its YAML into a [`RuleSet`] and
//! answers Envoy's `ShouldRateLimit` with [`check`]; a program can do the same in process.
//!
//! **Matching.** A request descriptor is a list of `(key, value)` entries, e.g.
//! `[("remote_address", "10.0.0.1"), ("path", "/login")]`. A [`RuleSet`] walks it level by
//! level through its rule tree and answers with at most one [`Rule`]:
//!
//! * At each level, a rule with the entry's key **and** value wins over a rule whose value is a
//!   [`Wildcard`] (`value: "/api/*"`, `"/api/*/action"`: each `*` matches any run of
//!   characters; among several, the most literal characters win — for trailing `*`, the longest
//!   prefix — then the first defined), which wins over a rule with the key only (no `value`: it
//!   matches every value and keeps one counter per value). A wildcard rule keeps one counter per
//!   value too, unless it has `share_threshold`: then all its matches share one.
//! * A rule applies only at the depth of the request's descriptor: the limit of the rule reached
//!   by the **last** entry is returned; a limit on an intermediate rule does not apply to a longer
//!   descriptor, and a descriptor longer than the rule tree matches nothing.
//!
//! The tree is built from plain [`DomainSpec`]/[`RuleSpec`] values and validated: empty keys,
//! duplicate rules, duplicate domains and self-replacing limits are errors that point at the
//! offending rule by index path ([`RulePath`]).
//!
//! **Checking** ([`check`]). A request names a domain and carries one or more [`Descriptor`]s;
//! each is matched to at most one rule or carries its own limit override, and every counted
//! descriptor is asked of the store at once ([`pipeline::decide`](crate::pipeline::decide)): the
//! request is allowed only if every enforced limit allows, and a denied request consumes
//! nothing anywhere.
//!
//! * `hits_addend`: a descriptor's own value wins (0 peeks); otherwise the request's, where 0
//!   means 1.
//! * A descriptor's `limit` override replaces whatever rule matches (when the domain exists);
//!   it is enforced (no shadow mode) with the default algorithm ([`Algorithm::default`](crate::Algorithm::default), GCRA).
//! * `unlimited` rules always allow; `requests_per_unit: 0` (blocked) always denies; a rule in
//!   shadow mode counts but never denies.
//! * A rule whose `name` is listed in the `replaces` of another rule matched by the same request
//!   is skipped.
//! * A rule may carry several limits ([`RuleSpec::limits`], "10 per second and 10,000 per
//!   day"), each with its own counter, name, `replaces`, `fail` and `charge`; all must allow,
//!   and a request one refuses consumes nothing from the others. The descriptor's answer is
//!   its binding limit's — the one that refused (the longest wait first), else the one with
//!   the least remaining — with the others beside it ([`DescriptorVerdict::others`]). In
//!   quota mode the descriptor is over its quota when any of its limits is.
//! * Charges ([`Ask::charge`](crate::store::Ask::charge): usage that already happened, always
//!   taken, into debt past the limit): a descriptor marked [`Descriptor::charge`], or hits
//!   above zero on a rule whose limit [`charge`](LimitSpec::charge)s. A charge is never
//!   refunded when another limit denies the request.
//! * `quota_mode` rules deny only together: the request is denied for them only when every
//!   quota-mode limit it matches denies ([`check_with`] also has the global shadow and quota
//!   modes).
//! * A rule's `metadata` is carried on its [`Rule`] for the service's response.
//! * Each rule's `fail` mode travels with its request to the store ([`Ask::fail`](crate::store::Ask::fail)),
//!   where a [`FallbackStore`](crate::store::FallbackStore) applies it.
//!
//! Counters are keyed by domain, the request's entries and the quota ([`counter_key`]), so a
//! rule whose quota is unchanged by a configuration reload keeps its counters, and a changed
//! one starts afresh.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use flowgate::envoy::{check, Descriptor, DomainSpec, Entry, LimitSpec, Rate, RuleSet, RuleSpec};
//! use flowgate::{store::MemoryStore, Quota};
//!
//! let rules = RuleSet::build(vec![DomainSpec::new("api", vec![
//!     RuleSpec::new("user").with_limit(LimitSpec::new(Rate::Limited(Quota::per_minute(2)))),
//! ])])?;
//! assert_eq!(rules.find("api", &[Entry::new("user", "ann")]).unwrap().path, "user");
//! let store = MemoryStore::new();
//! let request = [Descriptor::new(vec![Entry::new("user", "alice")])];
//! assert!(check(&rules, &store, "api", &request, 1).await.allowed);
//! assert!(check(&rules, &store, "api", &request, 1).await.allowed);
//! assert!(!check(&rules, &store, "api", &request, 1).await.allowed);
//! # Ok(()) }
//! ```

mod admin;
mod check;
mod descriptor;
mod key;
mod metadata;
mod resolve;
mod rules;
mod ruleset;
mod unit;
mod wildcard;

pub use admin::{CounterState, Lookup, inspect, reset};
pub use check::{DescriptorVerdict, Modes, Status, Verdict, check, check_now, check_with};
pub use descriptor::{Descriptor, Entry, LimitOverride};
pub use key::{CounterKey, counter_key, decode_counter_key};
pub use metadata::{MetaValue, Metadata, merge_metadata};
pub use resolve::{AppliedLimit, resolve};
pub use rules::{
    DomainSpec, Level, LevelValue, LimitSpec, Rate, Rule, RuleError, RuleErrorKind, RulePath,
    RuleSpec,
};
pub use ruleset::{DomainRules, MAX_BUCKET_STEPS, RuleSet};
pub use unit::{Unit, UnknownUnit};
pub use wildcard::Wildcard;
