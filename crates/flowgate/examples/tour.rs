//! The README tour's library in ten lines: `cargo run -p flowgate --example tour`.
//!
//! Its test (`cargo test -p flowgate --example tour`) checks that it prints the line the README
//! shows under it.

use std::io::Write;

use flowgate::{KeyedRateLimiter, Quota};

fn main() -> std::io::Result<()> {
    tour(&mut std::io::stdout().lock())
}

/// What the README's snippet does, writing to `out`.
fn tour(out: &mut impl Write) -> std::io::Result<()> {
    // 3 requests per second per client, bursts of 3 (GCRA, the default algorithm).
    let limiter = KeyedRateLimiter::<String>::new(Quota::per_second(3));
    for i in 1..=5 {
        let decision = limiter.check_key("client-7");
        writeln!(
            out,
            "request {i}: allowed={} remaining={} retry after {} s",
            decision.allowed,
            decision.remaining,
            decision.retry_after_secs()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The README shows, under its snippet, a line this example prints.
    #[test]
    fn prints_the_line_the_readme_shows() {
        let readme = include_str!("../../../README.md");
        let shown = readme
            .lines()
            .find_map(|line| line.strip_prefix("// request "))
            .expect("the README's `// request …` line");
        let mut out = Vec::new();
        super::tour(&mut out).expect("writes to a Vec");
        let printed = String::from_utf8(out).expect("UTF-8");
        assert!(
            printed
                .lines()
                .any(|line| line == format!("request {shown}")),
            "the README shows `request {shown}`; the example printed:\n{printed}"
        );
    }
}
