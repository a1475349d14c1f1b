//! The comparison as a text table, one per case.

use std::fmt::Write as _;
use std::time::Duration;

use flowgate::simulate::{Limiter, Report, Retry, format_duration};

use super::Outcome;

/// Every case's table, with a heading and notes, as one text.
pub(super) fn render(outcomes: &[Outcome], notes: &[String]) -> String {
    let mut out = String::new();
    for (i, outcome) in outcomes.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render_case(&mut out, outcome);
    }
    for note in notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

fn render_case(out: &mut String, outcome: &Outcome) {
    let report = &outcome.report;
    let _ = writeln!(out, "{}", outcome.case.title);
    let _ = writeln!(out, "  {}", describe(report, outcome.retry));
    let retries = outcome.retry != Retry::Never;
    let window = format!("max in {}", format_duration(report.quota.period()));
    let mut header = vec!["limiter", "admitted", "denied"];
    if retries {
        header.extend(["tries", "gave up"]);
    }
    header.extend([window.as_str(), "first denial", "p99 wait"]);
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for run in &report.runs {
        let s = &run.summary;
        let configured = outcome
            .case
            .rule
            .as_ref()
            .is_some_and(|rule| run.subject.limiter == Limiter::Algorithm(rule.algorithm));
        let mut label = run.subject.to_string();
        if configured {
            label.push_str(" *");
        }
        let mut row = vec![label, s.admitted.to_string(), s.denied.to_string()];
        if retries {
            row.extend([s.requests.to_string(), s.gave_up.to_string()]);
        }
        row.extend([
            s.max_in_window.to_string(),
            s.first_denial.map_or_else(|| "-".into(), seconds),
            s.wait.map_or_else(|| "-".into(), |w| seconds(w.p99)),
        ]);
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        out.push_str("  ");
        for (c, cell) in row.iter().enumerate() {
            let width = widths[c];
            if c == 0 {
                let _ = write!(out, "{cell:<width$}");
            } else {
                let _ = write!(out, "  {cell:>width$}");
            }
        }
        // No trailing spaces (the first column is padded).
        while out.ends_with(' ') {
            out.pop();
        }
        out.push('\n');
    }
    if outcome.case.rule.is_some() {
        let _ = writeln!(out, "  * the algorithm the configuration gives this rule");
    }
    for skipped in &outcome.skipped {
        let _ = writeln!(out, "  skipped: {skipped}");
    }
}

/// The case's one-line description: traffic, quota, retries, buckets.
pub(super) fn describe(report: &Report, retry: Retry) -> String {
    let q = &report.quota;
    let burst = if q.burst() == q.limit() {
        String::new()
    } else {
        format!(" (burst {})", q.burst())
    };
    let retry = match retry {
        Retry::Never => "clients do not retry".to_owned(),
        Retry::Fixed { delay, attempts } => {
            format!(
                "clients retry every {}, {attempts} tries at most",
                format_duration(delay)
            )
        }
        Retry::RetryAfter { attempts } => {
            format!("clients wait for Retry-After, {attempts} tries at most")
        }
    };
    format!(
        "{} requests, {} key{}; {} per {}{burst}; {retry}",
        report.offered,
        report.keys,
        if report.keys == 1 { "" } else { "s" },
        q.limit(),
        format_duration(q.period()),
    )
}

/// `61.000s`: seconds with millisecond precision.
pub(super) fn seconds(d: Duration) -> String {
    format!("{}.{:03}s", d.as_secs(), d.subsec_millis())
}
