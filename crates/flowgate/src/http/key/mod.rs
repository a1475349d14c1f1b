//! Key extractors: what a request is counted against.
//!
//! A [`KeyExtractor`] reads a request's head ([`Parts`]) and returns the key of the counter it
//! draws on — the client's IP, an API key, a JWT claim, the route — or a [`KeyRejection`]
//! (a 400/401 with a problem body, never a 500 for anything the client sent).
//!
//! | extractor | key | rejects |
//! |---|---|---|
//! | [`PeerIp`] | the connection's address (IPv6 by /64) | — |
//! | [`ClientIp`] | the client's address behind trusted proxies | — |
//! | [`Header`] | a header's value (an API key) | 401 when missing |
//! | [`Route`] | the route template (`/users/{id}`), optionally with the method | — |
//! | `JwtClaim` (feature `jwt`) | a claim of a verified token (`sub`, `plan`) | 401 |
//! | [`Host`] | the target host (URI authority or `Host`) | 400 when absent |
//! | [`Global`] | one fixed key: a limit for everyone together | — |
//! | `(A, B)`, `(A, B, C)` | the parts joined with `|` | when a part does |
//! | [`from_fn`] | anything you compute | as you decide |

mod header;
mod ip;
#[cfg(feature = "jwt")]
mod jwt;
mod route;

use std::borrow::Cow;
use std::sync::Arc;

use http::StatusCode;
use http::request::Parts;

pub use header::{DEFAULT_HEADER_MAX_LEN, Header};
pub use ip::{ClientIp, ForwardedHeader, IpText, PeerAddr, PeerIp, X_FORWARDED_FOR, push_ip};
#[cfg(feature = "jwt")]
pub use jwt::{DEFAULT_JWT_MAX_LEN, Jwt, JwtClaim};
pub use route::{Route, RouteError, UNMATCHED_ROUTE};

/// Why a key could not be extracted: the response the client gets (a problem body with this
/// status and detail).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {detail}")]
pub struct KeyRejection {
    /// The response status: 400 for malformed input, 401 for missing or bad credentials.
    pub status: StatusCode,
    /// What was wrong, for the problem body's `detail`.
    pub detail: Cow<'static, str>,
}

impl KeyRejection {
    /// A rejection with `status`.
    pub fn new(status: StatusCode, detail: impl Into<Cow<'static, str>>) -> Self {
        KeyRejection {
            status,
            detail: detail.into(),
        }
    }

    /// 400 Bad Request.
    pub fn bad_request(detail: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    /// 401 Unauthorized.
    pub fn unauthorized(detail: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, detail)
    }
}

/// Reads the key a request is counted against from its head.
///
/// Implement it for your own keys, or wrap a closure with [`from_fn`].
///
/// ```
/// use flowgate::http::key::{KeyExtractor, KeyRejection};
/// use http::request::Parts;
///
/// /// The tenant from the `Host` header's first label: `acme.api.example` → `acme`.
/// struct Tenant;
///
/// impl KeyExtractor for Tenant {
///     fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
///         let host = parts.headers.get(http::header::HOST)
///             .and_then(|h| h.to_str().ok())
///             .ok_or_else(|| KeyRejection::bad_request("no Host header"))?;
///         Ok(host.split('.').next().unwrap_or(host).to_owned())
///     }
/// }
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key for this request, or why there is none.
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection>;

    /// Appends the key for this request to `key`: exactly what [`extract`](Self::extract)
    /// returns, written in place so that the rate-limit layer can build store keys in a reused
    /// buffer instead of allocating one per request. The default calls `extract`; extractors
    /// that can write their key directly override it. After an error, `key` may hold part of a
    /// key; callers discard it.
    fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        key.push_str(&self.extract(parts)?);
        Ok(())
    }
}

/// `extract` for extractors that implement `extract_into`.
fn extract_via_into<E: KeyExtractor + ?Sized>(
    extractor: &E,
    parts: &Parts,
) -> Result<String, KeyRejection> {
    let mut key = String::new();
    extractor.extract_into(parts, &mut key)?;
    Ok(key)
}

impl<E: KeyExtractor + ?Sized> KeyExtractor for Arc<E> {
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        (**self).extract(parts)
    }

    fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        (**self).extract_into(parts, key)
    }
}

impl<E: KeyExtractor + ?Sized> KeyExtractor for Box<E> {
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        (**self).extract(parts)
    }

    fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        (**self).extract_into(parts, key)
    }
}

/// A [`KeyExtractor`] from a closure.
///
/// ```
/// use flowgate::http::key::{from_fn, KeyRejection};
/// let by_method = from_fn(|parts| Ok::<_, KeyRejection>(parts.method.to_string()));
/// # let _ = by_method;
/// ```
pub fn from_fn<F>(f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Result<String, KeyRejection> + Send + Sync + 'static,
{
    FromFn(f)
}

/// See [`from_fn`].
#[derive(Clone, Copy)]
pub struct FromFn<F>(F);

impl<F> std::fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FromFn")
    }
}

impl<F> KeyExtractor for FromFn<F>
where
    F: Fn(&Parts) -> Result<String, KeyRejection> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        (self.0)(parts)
    }
}

/// One key for every request: a limit shared by all clients together.
#[derive(Debug, Clone)]
pub struct Global(pub Cow<'static, str>);

impl Default for Global {
    fn default() -> Self {
        Global(Cow::Borrowed("global"))
    }
}

impl KeyExtractor for Global {
    fn extract(&self, _parts: &Parts) -> Result<String, KeyRejection> {
        Ok(self.0.clone().into_owned())
    }

    fn extract_into(&self, _parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        key.push_str(&self.0);
        Ok(())
    }
}

/// Keys requests by their target host: the URI's authority (`api.bank.example:443`), else the
/// `Host` header; 400 when there is neither. The outbound layer's default key (one pace per
/// upstream), and a per-virtual-host key on servers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host;

impl KeyExtractor for Host {
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        extract_via_into(self, parts)
    }

    fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        let host = match parts.uri.authority() {
            Some(authority) => authority.as_str(),
            None => parts
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .filter(|h| !h.is_empty() && h.len() <= 255)
                .ok_or_else(|| KeyRejection::bad_request("the request names no host"))?,
        };
        let start = key.len();
        key.push_str(host);
        key[start..].make_ascii_lowercase();
        Ok(())
    }
}

/// Appends one part of a composite key: a `|` before every part but the first, then the part's
/// key with its `|` and `\` escaped, so that different parts can never join into the same key.
fn push_part<E: KeyExtractor>(
    extractor: &E,
    parts: &Parts,
    key: &mut String,
    first: bool,
) -> Result<(), KeyRejection> {
    if !first {
        key.push('|');
    }
    let start = key.len();
    extractor.extract_into(parts, key)?;
    if key[start..].contains(['|', '\\']) {
        let part = key.split_off(start);
        for c in part.chars() {
            if c == '|' || c == '\\' {
                key.push('\\');
            }
            key.push(c);
        }
    }
    Ok(())
}

macro_rules! composite {
    ($first:ident $(, $name:ident)+) => {
        /// The parts' keys joined with `|` (each part's `|` and `\` escaped); rejects when any
        /// part rejects.
        impl<$first: KeyExtractor $(, $name: KeyExtractor)+> KeyExtractor
            for ($first, $($name,)+)
        {
            fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
                extract_via_into(self, parts)
            }

            #[allow(non_snake_case)]
            fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
                let ($first, $($name,)+) = self;
                push_part($first, parts, key, true)?;
                $(push_part($name, parts, key, false)?;)+
                Ok(())
            }
        }
    };
}
composite!(A, B);
composite!(A, B, C);
composite!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Parts {
        http::Request::new(()).into_parts().0
    }

    #[test]
    fn extract_into_appends_exactly_what_extract_returns() {
        let header = || Header::new(http::HeaderName::from_static("x-api-key"));
        let route = Route::new(["/users/{id}"]).unwrap();
        let extractors: Vec<(&str, Box<dyn KeyExtractor>)> = vec![
            ("peer", Box::new(PeerIp::new())),
            (
                "peer /24 /48",
                Box::new(PeerIp::new().ipv4_prefix(24).ipv6_prefix(48)),
            ),
            ("peer /128", Box::new(PeerIp::new().ipv6_prefix(128))),
            (
                "client",
                Box::new(ClientIp::new(["10.0.0.0/8".parse().unwrap()])),
            ),
            ("header", Box::new(header())),
            ("route", Box::new(route.clone())),
            ("route with method", Box::new(route.with_method())),
            ("host", Box::new(Host)),
            ("global", Box::new(Global::default())),
            ("pair", Box::new((Global("a|b\\".into()), header()))),
            (
                "triple",
                Box::new((Global(Cow::Borrowed("")), Host, Global("z".into()))),
            ),
            ("closure", Box::new(from_fn(|p| Ok(p.method.to_string())))),
            ("shared", Box::new(Arc::new(header()))),
        ];
        let request = |peer: &str, headers: &[(&str, &str)], uri: &str| {
            let mut b = http::Request::post(uri);
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            let mut r = b.body(()).unwrap();
            r.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
            r.into_parts().0
        };
        let requests = [
            request(
                "10.0.0.1:1",
                &[("x-forwarded-for", "203.0.113.9")],
                "/users/7",
            ),
            request(
                "[2001:db8::1]:1",
                &[("x-api-key", " k|1 "), ("host", "API.example")],
                "/",
            ),
            request(
                "192.0.2.250:1",
                &[("x-api-key", "")],
                "http://Example.COM:8080/x",
            ),
        ];
        for (name, extractor) in &extractors {
            for parts in &requests {
                let mut into = String::from("prefix:");
                match (
                    extractor.extract(parts),
                    extractor.extract_into(parts, &mut into),
                ) {
                    (Ok(key), Ok(())) => assert_eq!(into, format!("prefix:{key}"), "{name}"),
                    (Err(a), Err(b)) => assert_eq!(a, b, "{name}"),
                    (a, b) => panic!("{name}: extract {a:?}, extract_into {b:?}"),
                }
            }
        }
    }

    #[test]
    fn composite_keys_with_empty_parts_stay_apart() {
        let key = |parts: (&'static str, &'static str, &'static str)| {
            let (a, b, c) = parts;
            (Global(a.into()), Global(b.into()), Global(c.into()))
                .extract(&super::tests::parts())
                .unwrap()
        };
        let keys = [
            ("", "", "a"),
            ("", "a", ""),
            ("a", "", ""),
            ("", "a", "b"),
            ("a", "b", ""),
        ];
        let distinct: std::collections::HashSet<String> = keys.into_iter().map(key).collect();
        assert_eq!(distinct.len(), keys.len(), "{distinct:?}");
        assert_eq!(key(("", "a", "b")), "|a|b");
    }

    #[test]
    fn composite_keys_escape_their_separator() {
        let a = (Global("x|y".into()), Global("z".into()));
        let b = (Global("x".into()), Global("y|z".into()));
        let (ka, kb) = (a.extract(&parts()).unwrap(), b.extract(&parts()).unwrap());
        assert_eq!(ka, r"x\|y|z");
        assert_ne!(ka, kb);
        let rejecting = (
            Global::default(),
            from_fn(|_| Err(KeyRejection::unauthorized("no"))),
        );
        assert_eq!(
            rejecting.extract(&parts()).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
    }
}
