//! A [`Verdict`] as the client-visible [`Answer`]: every front end — `ShouldRateLimit`,
//! `POST /json`, `POST /v1/check` and the gateway — renders through here and the library's
//! one renderer, so they send the same fields, `Retry-After` and fallback marker.

use flowgate::Decision;
use flowgate::envoy::{AppliedLimit, Rate, Rule, Status, Verdict};
use flowgate::http::answer::{Answer, LimitReport};
use flowgate::http::headers::{blocked_policy_item_value, policy_item_value};
use flowgate::store::StoreError;
use http::HeaderValue;

/// The name a limit is reported under: its `name`, else its rule path, else `override`.
pub fn limit_name<'a>(applied: &AppliedLimit<'a>) -> &'a str {
    match applied {
        AppliedLimit::Rule(rule) => rule.display_name(),
        AppliedLimit::Override(..) => "override",
    }
}

/// Each rule's `RateLimit-Policy` item, formatted once per configuration (by rule id; empty for
/// unlimited rules, which are never reported).
pub fn policy_items(rules: &[Rule]) -> Vec<HeaderValue> {
    rules
        .iter()
        .map(|rule| item(rule.display_name(), rule.rate))
        .collect()
}

/// The `RateLimit-Policy` item of a limit named `name` that does `rate`.
fn item(name: &str, rate: Rate) -> HeaderValue {
    match rate {
        Rate::Limited(quota) => policy_item_value(name, &quota),
        Rate::Blocked { period } => blocked_policy_item_value(name, period),
        Rate::Unlimited => HeaderValue::from_static(""),
    }
}

/// The answer to `verdict`; `items` are the running configuration's [`policy_items`].
pub fn answer(verdict: &Verdict<'_>, items: &[HeaderValue]) -> Answer {
    // Limit overrides have no item formatted in advance.
    let overrides: Vec<Option<HeaderValue>> = verdict
        .descriptors
        .iter()
        .map(|d| match d.applied {
            Some(applied @ AppliedLimit::Override(..)) => Some(item("override", applied.rate())),
            _ => None,
        })
        .collect();
    let results: Vec<Option<Result<Decision, StoreError>>> = verdict
        .descriptors
        .iter()
        .map(|d| match &d.status {
            Status::Checked(decision) => Some(Ok(*decision)),
            Status::Failed(e) => Some(Err(e.clone())),
            _ => None,
        })
        .collect();
    let reports = verdict
        .descriptors
        .iter()
        .zip(&results)
        .zip(&overrides)
        .filter_map(|((d, result), own)| {
            let (applied, result) = (d.applied.as_ref()?, result.as_ref()?);
            let policy_item = match applied {
                AppliedLimit::Rule(rule) => items.get(rule.id)?,
                AppliedLimit::Override(..) => own.as_ref()?,
            };
            Some(LimitReport {
                name: limit_name(applied),
                policy_item,
                enforced: !applied.shadow_mode(),
                result,
            })
        });
    Answer::new(reports, false)
}
