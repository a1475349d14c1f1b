//! The `concurrency` section (see [`crate::config::concurrency`]).

use std::path::Path;

use flowgate::FailMode;
use flowgate::lease::Terms;
use serde::Deserialize;

use super::{SectionErrors, Spanned};
use crate::config::concurrency::{ConcurrencyLimit, DEFAULT_LEASE_TIME};
use crate::config::error::ConfigError;

/// One item of the `concurrency` list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConcurrencyYaml {
    /// The limit's name (the API's path segment).
    name: Spanned<String>,
    /// Leases held at once per key.
    limit: Spanned<u64>,
    /// How long a lease lasts unless renewed.
    #[serde(default)]
    lease_time: Option<Spanned<String>>,
    /// closed | open.
    #[serde(default)]
    fail: Option<Spanned<String>>,
}

/// Validates the `concurrency` list; pushes its errors (every one) and returns the limits by
/// name with each name's position.
pub(super) fn convert_concurrency(
    file: &Path,
    items: Vec<ConcurrencyYaml>,
    errors: &mut Vec<ConfigError>,
) -> Vec<(String, (u64, u64), ConcurrencyLimit)> {
    let mut e = SectionErrors::new(file, "concurrency", errors);
    let mut limits: Vec<(String, (u64, u64), ConcurrencyLimit)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for item in items {
        let name = item.name.value.trim();
        let mut ok = true;
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            e.push(
                item.name.at,
                "name",
                "must be letters, digits, `-`, `_` or `.` (it is a path segment of /v1/leases)",
            );
            ok = false;
        } else if names.iter().any(|n| n == name) {
            e.push(item.name.at, "name", format!("`{name}` is defined twice"));
            ok = false;
        } else {
            names.push(name.to_owned());
        }
        let lease_time = match &item.lease_time {
            Some(d) => e.duration(d, "lease_time"),
            None => Some(DEFAULT_LEASE_TIME),
        };
        let terms = lease_time.and_then(|ttl| match Terms::new(item.limit.value, ttl) {
            Ok(terms) => Some(terms),
            Err(err @ flowgate::lease::TermsError::Limit(_)) => {
                e.push(item.limit.at, "limit", err.to_string());
                None
            }
            Err(err) => {
                let at = item.lease_time.as_ref().map_or(item.name.at, |d| d.at);
                e.push(at, "lease_time", err.to_string());
                None
            }
        });
        let fail = match item.fail.as_ref().map(|f| (f, f.value.trim())) {
            None | Some((_, "closed")) => Some(FailMode::Closed),
            Some((_, "open")) => Some(FailMode::Open),
            Some((f, other)) => {
                e.push(
                    f.at,
                    "fail",
                    format!("unknown value `{other}`; expected closed or open"),
                );
                None
            }
        };
        if let (true, Some(terms), Some(fail)) = (ok, terms, fail) {
            limits.push((
                name.to_owned(),
                item.name.at,
                ConcurrencyLimit { terms, fail },
            ));
        }
    }
    limits
}
