//! The admin token (`FLOWGATE_ADMIN_TOKEN`): what a valid one is, how a request presents it,
//! and the log of refused attempts.
//!
//! * **Read once, checked at start.** Surrounding whitespace is removed — a token stored in a
//!   file (a Kubernetes Secret, `echo … > token`) usually ends with a newline, which no request
//!   could present, since a header value is trimmed — and the removal is logged (not the
//!   token). What remains must be at least [`MIN_ADMIN_TOKEN_BYTES`] bytes of visible ASCII
//!   (what an HTTP header can carry), or the server refuses to start, naming the variable but
//!   never its value. Unset or empty: the admin endpoints are disabled.
//! * **Compared in constant time**, never printed (`Debug` shows nothing of it).
//! * **Refusals are logged** at WARN with the client's address and the reason, at most
//!   [`REFUSALS_LOGGED_PER_MINUTE`] lines a minute per token (a burst of as many): a flood of
//!   wrong tokens costs a few lines, and the next line logged says how many went unlogged.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{HeaderMap, header};
use flowgate::clock::PreciseClock;
use flowgate::{Quota, RateLimiter};

/// The shortest admin token accepted, in bytes (after surrounding whitespace is removed).
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

/// Refused admin attempts logged per minute, at most (and at once, as a burst).
pub const REFUSALS_LOGGED_PER_MINUTE: u64 = 10;

/// The environment variable the server reads the token from.
const VARIABLE: &str = "FLOWGATE_ADMIN_TOKEN";

/// Why a token is refused. The messages name the variable, never the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdminTokenError {
    /// Fewer than [`MIN_ADMIN_TOKEN_BYTES`] bytes.
    #[error(
        "{VARIABLE} is {len} bytes long; it must be at least {MIN_ADMIN_TOKEN_BYTES} (e.g. `openssl rand -hex 32`), or unset to disable the admin endpoints"
    )]
    TooShort {
        /// Its length after surrounding whitespace was removed.
        len: usize,
    },
    /// A byte an HTTP header cannot carry (a control character, non-ASCII): no request could
    /// ever present it.
    #[error(
        "{VARIABLE} has a byte that an HTTP header cannot carry (a control character or non-ASCII), so no request could present it; use visible ASCII (e.g. `openssl rand -hex 32`)"
    )]
    NotVisibleAscii,
}

/// The admin endpoints' bearer token (`FLOWGATE_ADMIN_TOKEN`): compared in constant time, and
/// never printed (its `Debug` shows nothing of it). Surrounding whitespace is removed; what
/// remains must be at least [`MIN_ADMIN_TOKEN_BYTES`] bytes of visible ASCII. Refused
/// attempts are logged at WARN with the client's address, at most
/// [`REFUSALS_LOGGED_PER_MINUTE`] lines a minute.
#[derive(Clone)]
pub struct AdminToken {
    /// The secret.
    secret: Arc<[u8]>,
    /// Refused attempts, logged within a budget.
    refusals: Arc<RefusalLog>,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// How a request presented the admin token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presented {
    /// No `Authorization: Bearer …` header.
    Nothing,
    /// The token.
    Token,
    /// Some other bearer token.
    Wrong,
}

impl AdminToken {
    /// The token `secret`, without its surrounding whitespace; refused when what remains is
    /// shorter than [`MIN_ADMIN_TOKEN_BYTES`] or holds a byte a header cannot carry.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, AdminTokenError> {
        let secret = secret.as_ref().trim_ascii();
        // What `HeaderValue::to_str` accepts, less what trimming a header value removes at
        // the ends (already gone).
        if !secret
            .iter()
            .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            return Err(AdminTokenError::NotVisibleAscii);
        }
        if secret.len() < MIN_ADMIN_TOKEN_BYTES {
            return Err(AdminTokenError::TooShort { len: secret.len() });
        }
        Ok(AdminToken {
            secret: secret.into(),
            refusals: Arc::new(RefusalLog::new()),
        })
    }

    /// The token of `FLOWGATE_ADMIN_TOKEN`: `None` when unset or empty (the admin endpoints are
    /// disabled), an error when it is not a usable token (see [`AdminToken::new`]). Removing
    /// surrounding whitespace is logged at INFO (how much, not the token).
    pub fn from_env() -> Result<Option<Self>, AdminTokenError> {
        let Some(value) = std::env::var_os(VARIABLE) else {
            return Ok(None);
        };
        let bytes = value.as_encoded_bytes();
        if bytes.is_empty() {
            return Ok(None);
        }
        let token = AdminToken::new(bytes)?;
        let removed = bytes.len() - token.secret.len();
        if removed > 0 {
            let newline = bytes.ends_with(b"\n");
            tracing::info!(
                removed_bytes = removed,
                trailing_newline = newline,
                "{VARIABLE}: surrounding whitespace removed (a request cannot present it); the token is what remains"
            );
        }
        Ok(Some(token))
    }

    /// Whether `presented` is the token, in time that does not depend on where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        use subtle::ConstantTimeEq as _;
        // `ct_eq` on slices of different lengths answers at once; the length is not secret.
        bool::from(self.secret.as_ref().ct_eq(presented))
    }

    /// How `headers` present the token (`Authorization: Bearer <token>`, the scheme in any
    /// case).
    pub(crate) fn presented(&self, headers: &HeaderMap) -> Presented {
        let credentials = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, credentials) = v.split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then(|| credentials.trim())
            });
        match credentials {
            None => Presented::Nothing,
            Some(token) if self.matches(token.as_bytes()) => Presented::Token,
            Some(_) => Presented::Wrong,
        }
    }

    /// Logs a refused attempt on `what` from `client` (within the budget).
    pub(crate) fn refused(&self, client: Option<SocketAddr>, what: &str, reason: &str) {
        self.refusals.refused(client, what, reason);
    }
}

/// Refused attempts: logged at WARN within a budget of lines, counted beyond it.
#[derive(Debug)]
struct RefusalLog {
    /// Lines that may be logged now.
    budget: RateLimiter<PreciseClock>,
    /// Refusals not logged since the last line.
    unlogged: AtomicU64,
}

impl RefusalLog {
    fn new() -> Self {
        RefusalLog {
            budget: RateLimiter::with_clock(
                Quota::per_minute(REFUSALS_LOGGED_PER_MINUTE),
                PreciseClock::new(),
            ),
            unlogged: AtomicU64::new(0),
        }
    }

    fn refused(&self, client: Option<SocketAddr>, what: &str, reason: &str) {
        if self.budget.try_check().is_err() {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        let client = client.map_or_else(|| "unknown".to_owned(), |c| c.ip().to_string());
        tracing::warn!(
            %client,
            reason,
            unlogged_before = unlogged,
            "admin: refused {what}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_matches_only_itself_and_never_prints() {
        let token = AdminToken::new("s3cret-s3cret-s3cret").unwrap();
        assert!(token.matches(b"s3cret-s3cret-s3cret"));
        assert!(!token.matches(b"s3cret-s3cret-s3cre"));
        assert!(!token.matches(b"s3cret-s3cret-s3cret!"));
        assert!(!token.matches(b""));
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn surrounding_whitespace_is_removed_and_short_or_unprintable_tokens_are_refused() {
        let secret = "0123456789abcdef";
        for stored in [
            format!("{secret}\n"),
            format!("{secret}\r\n"),
            format!("  {secret}\t"),
        ] {
            let token = AdminToken::new(&stored).unwrap();
            assert!(token.matches(secret.as_bytes()), "{stored:?}");
            assert!(!token.matches(stored.as_bytes()), "{stored:?}");
        }
        // Inner spaces are part of it (a header carries them).
        assert!(
            AdminToken::new("correct horse battery staple")
                .unwrap()
                .matches(b"correct horse battery staple")
        );
        assert_eq!(
            AdminToken::new("x").unwrap_err(),
            AdminTokenError::TooShort { len: 1 }
        );
        assert_eq!(
            AdminToken::new(format!("{}\n", &secret[..15])).unwrap_err(),
            AdminTokenError::TooShort { len: 15 }
        );
        assert_eq!(
            AdminToken::new("\n").unwrap_err(),
            AdminTokenError::TooShort { len: 0 }
        );
        assert_eq!(
            AdminToken::new("0123456789\nabcdef").unwrap_err(),
            AdminTokenError::NotVisibleAscii
        );
        assert_eq!(
            AdminToken::new("0123456789abcdéf").unwrap_err(),
            AdminTokenError::NotVisibleAscii
        );
        let message = AdminTokenError::TooShort { len: 1 }.to_string();
        assert!(message.contains("FLOWGATE_ADMIN_TOKEN"), "{message}");
        assert!(message.contains("at least 16"), "{message}");
    }

    #[test]
    fn presented_reads_the_bearer_scheme_in_any_case() {
        let token = AdminToken::new("0123456789abcdef").unwrap();
        let presented = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            }
            token.presented(&headers)
        };
        assert_eq!(presented(None), Presented::Nothing);
        assert_eq!(
            presented(Some("Basic 0123456789abcdef")),
            Presented::Nothing
        );
        assert_eq!(presented(Some("Bearer 0123456789abcdef")), Presented::Token);
        assert_eq!(
            presented(Some("bEaReR  0123456789abcdef ")),
            Presented::Token
        );
        assert_eq!(presented(Some("Bearer 0123456789abcdeF")), Presented::Wrong);
    }
}
