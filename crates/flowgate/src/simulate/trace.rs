//! Recorded traffic as CSV: `timestamp_ms,key,cost`, one request a line.

use std::io::BufRead;

use super::traffic::Traffic;

/// The most milliseconds a trace's time stamp may have: the year 2262, where nanoseconds
/// since the epoch stop fitting in a `u64`, less a century of room for the periods added to
/// them.
const MAX_TIMESTAMP_MS: u64 = (u64::MAX / 1_000_000) - 100 * 365 * 86_400_000;

/// Why a trace could not be read. [`Line`](TraceError::Line) names the line (1-based), so an
/// editor can jump to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// A line is not `timestamp_ms,key,cost`.
    #[error("line {line}: {message}")]
    Line {
        /// The line, counting from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The trace has no requests.
    #[error("the trace has no requests (expected lines of `timestamp_ms,key,cost`)")]
    Empty,
    /// The trace could not be read.
    #[error("cannot read the trace: {0}")]
    Io(String),
}

impl Traffic {
    /// Reads a CSV trace: one request per line as `timestamp_ms,key,cost`.
    ///
    /// * `timestamp_ms`: whole milliseconds since the Unix epoch (so fixed windows fall where
    ///   they did in production); a trace that starts at 0 works too. Lines may come in any
    ///   order; requests with the same time stamp keep their order in the file.
    /// * `key`: whose request it is (any text without a comma; surrounding spaces are
    ///   trimmed; may be empty).
    /// * `cost`: units asked for, a whole number ≥ 1; may be left out (`timestamp_ms,key`) for 1.
    ///
    /// A first line `timestamp_ms,key,cost` is taken as a header; empty lines and lines
    /// starting with `#` are skipped. Errors name the line.
    ///
    /// ```
    /// use flowgate::simulate::{TraceError, Traffic};
    /// let csv = "timestamp_ms,key,cost\n1000,alice,1\n1500,bob,2\n1500,alice\n";
    /// let traffic = Traffic::from_csv("trace.csv", csv.as_bytes())?;
    /// assert_eq!(traffic.len(), 3);
    /// assert_eq!(traffic.keys(), ["alice", "bob"]);
    ///
    /// let err = Traffic::from_csv("bad.csv", "1000,alice,1\n1001,bob,lots\n".as_bytes());
    /// assert_eq!(
    ///     err.unwrap_err().to_string(),
    ///     "line 2: cost `lots` is not a whole number of units"
    /// );
    /// # Ok::<(), TraceError>(())
    /// ```
    pub fn from_csv(name: impl Into<String>, reader: impl BufRead) -> Result<Traffic, TraceError> {
        let mut traffic = Traffic::new(name);
        for (index, line) in reader.lines().enumerate() {
            let number = index + 1;
            let line = line.map_err(|e| TraceError::Io(format!("line {number}: {e}")))?;
            let text = line.trim();
            if text.is_empty() || text.starts_with('#') || (number == 1 && is_header(text)) {
                continue;
            }
            let error = |message: String| TraceError::Line {
                line: number,
                message,
            };
            let (at, key, cost) = parse_line(text).map_err(error)?;
            let line = u32::try_from(number).unwrap_or(u32::MAX);
            traffic.push_unsorted(at, key, cost, line);
        }
        if traffic.is_empty() {
            return Err(TraceError::Empty);
        }
        traffic.sort();
        Ok(traffic)
    }
}

fn is_header(line: &str) -> bool {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    fields == ["timestamp_ms", "key", "cost"] || fields == ["timestamp_ms", "key"]
}

/// One line's time (ns), key and cost, or what is wrong with it.
fn parse_line(line: &str) -> Result<(u64, &str, u64), String> {
    let mut fields = line.split(',');
    let (Some(at), Some(key)) = (fields.next(), fields.next()) else {
        return Err(format!(
            "expected `timestamp_ms,key,cost`, found `{line}` (no comma)"
        ));
    };
    let cost = fields.next();
    if fields.next().is_some() {
        return Err(format!(
            "expected 3 fields (`timestamp_ms,key,cost`), found {} (keys may not contain commas)",
            line.split(',').count()
        ));
    }
    let at = at.trim();
    let ms: u64 = at
        .parse()
        .map_err(|_| format!("timestamp `{at}` is not a whole number of milliseconds"))?;
    if ms > MAX_TIMESTAMP_MS {
        return Err(format!(
            "timestamp {ms} is too far in the future (the most is {MAX_TIMESTAMP_MS} ms)"
        ));
    }
    let cost = match cost.map(str::trim) {
        None => 1,
        Some(c) => match c.parse::<u64>() {
            Ok(0) => return Err("cost must be at least 1 (a cost of 0 takes nothing)".into()),
            Ok(c) => c,
            Err(_) => return Err(format!("cost `{c}` is not a whole number of units")),
        },
    };
    Ok((ms * 1_000_000, key.trim(), cost))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Traffic, TraceError> {
        Traffic::from_csv("t", text.as_bytes())
    }

    fn line_error(text: &str) -> (usize, String) {
        match parse(text) {
            Err(TraceError::Line { line, message }) => (line, message),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn reads_headers_comments_defaults_and_sorts() {
        let t = parse("timestamp_ms, key, cost\n# a comment\n\n2000,b,2\n1000, a \n2000,a,1\n")
            .unwrap();
        let got: Vec<(u64, &str, u64, u32)> = t
            .arrivals()
            .iter()
            .map(|a| (a.at, t.keys()[a.key as usize].as_str(), a.cost, a.line))
            .collect();
        assert_eq!(
            got,
            [
                (1_000_000_000, "a", 1, 5),
                (2_000_000_000, "b", 2, 4),
                (2_000_000_000, "a", 1, 6)
            ]
        );
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        assert_eq!(
            line_error("1,a,1\n2,b,1\nx,c,1\n"),
            (
                3,
                "timestamp `x` is not a whole number of milliseconds".into()
            )
        );
        assert_eq!(
            line_error("1,a,1\n\n2,a,0\n"),
            (
                3,
                "cost must be at least 1 (a cost of 0 takes nothing)".into()
            )
        );
        let (line, message) = line_error("1,a,1,9\n");
        assert_eq!(line, 1);
        assert!(message.contains("found 4"), "{message}");
        let (line, message) = line_error("# header-less\n12345\n");
        assert_eq!(line, 2);
        assert!(message.contains("no comma"), "{message}");
        let (line, message) = line_error("99999999999999999,a,1\n");
        assert_eq!(line, 1);
        assert!(message.contains("too far"), "{message}");
        // A header is only a header on the first line.
        let (line, _) = line_error("1,a,1\ntimestamp_ms,key,cost\n");
        assert_eq!(line, 2);
        assert_eq!(parse("# nothing\n").unwrap_err(), TraceError::Empty);
    }
}
