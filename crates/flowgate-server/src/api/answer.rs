//! A [`Verdict`] as the client-visible [`Answer`]: every front end — `ShouldRateLimit`,
//! `POST /json`, `POST /v1/check` and the gateway — renders through here and the library's
//! one renderer, so they send the same fields, `Retry-After` and fallback marker.

use flowgate::answer::headers::{blocked_policy_item_value, policy_item_value};
use flowgate::answer::{Answer, LimitReport};
use flowgate::envoy::{AppliedLimit, Rate, Rule, Status, Verdict};
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
    // Limit overrides have no item formatted in advance: theirs, in request order.
    let own: Vec<HeaderValue> = verdict
        .descriptors
        .iter()
        .filter_map(|d| match d.applied {
            Some(applied @ AppliedLimit::Override(..)) => Some(item("override", applied.rate())),
            _ => None,
        })
        .collect();
    let mut own = own.iter();
    // Every limit of each descriptor: one `RateLimit-Policy` item per limit.
    let reports = verdict
        .descriptors
        .iter()
        .flat_map(|d| d.limits())
        .filter_map(|d| {
            let applied = d.applied.as_ref()?;
            let policy_item = match applied {
                AppliedLimit::Rule(rule) => items.get(rule.id)?,
                AppliedLimit::Override(..) => own.next()?,
            };
            // Shadow mode (the rule's or the global one) and quota mode while another quota-mode
            // limit passes: reported, not enforced.
            let (name, enforced) = (limit_name(applied), d.enforced && !applied.shadow_mode());
            match &d.status {
                Status::Counted(result) => {
                    Some(LimitReport::new(name, policy_item, enforced, result))
                }
                Status::Blocked { period } => {
                    Some(LimitReport::blocked(name, policy_item, enforced, *period))
                }
                _ => None,
            }
        });
    Answer::new(reports, false)
}
