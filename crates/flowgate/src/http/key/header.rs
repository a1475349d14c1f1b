//! [`Header`]: a request header's value as the key (an API key, a tenant id).

use http::request::Parts;
use http::{HeaderName, StatusCode};

use super::{KeyExtractor, KeyRejection};

/// The longest header value accepted as a key by default: longer values are rejected rather
/// than stored, so clients cannot make keys (and the store's memory) arbitrarily large.
pub const DEFAULT_HEADER_MAX_LEN: usize = 256;

/// Keys requests by a header's value, e.g. `X-Api-Key`.
///
/// A request without the header (or with an empty one) is rejected with 401 by default
/// ([`missing`](Self::missing) changes the status); a value that is not visible ASCII or longer
/// than [`max_len`](Self::max_len) is rejected with 400, and so is a request that carries the
/// header more than once: keying on one of its values while the application (or an upstream)
/// may read another would let a client choose which limit it meets.
///
/// ```
/// use flowgate::http::key::{Header, KeyExtractor};
/// let api_key = Header::new(http::HeaderName::from_static("x-api-key"));
/// let request = http::Request::builder().header("x-api-key", "k-42").body(()).unwrap();
/// assert_eq!(api_key.extract(&request.into_parts().0).unwrap(), "k-42");
/// ```
#[derive(Debug, Clone)]
pub struct Header {
    /// Which header.
    name: HeaderName,
    /// The status when it is missing.
    missing: StatusCode,
    /// The longest value accepted.
    max_len: usize,
}

impl Header {
    /// Keys by `name`'s value.
    pub fn new(name: HeaderName) -> Self {
        Header {
            name,
            missing: StatusCode::UNAUTHORIZED,
            max_len: DEFAULT_HEADER_MAX_LEN,
        }
    }

    /// The status for a request without the header (default 401; 400 suits headers that are
    /// not credentials).
    pub fn missing(mut self, status: StatusCode) -> Self {
        self.missing = status;
        self
    }

    /// The longest value accepted (default [`DEFAULT_HEADER_MAX_LEN`]).
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }
}

impl Header {
    /// The header's trimmed value, or why it cannot be a key.
    fn value<'a>(&self, parts: &'a Parts) -> Result<&'a str, KeyRejection> {
        let mut lines = parts.headers.get_all(&self.name).iter();
        let first = lines.next();
        if lines.next().is_some() {
            return Err(KeyRejection::bad_request(format!(
                "the {} header appears more than once",
                self.name
            )));
        }
        let value = first
            .map(|v| v.to_str().map(str::trim))
            .transpose()
            .map_err(|_| {
                KeyRejection::bad_request(format!("the {} header is not visible ASCII", self.name))
            })?
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                KeyRejection::new(
                    self.missing,
                    format!("the {} header is required", self.name),
                )
            })?;
        if value.len() > self.max_len {
            return Err(KeyRejection::bad_request(format!(
                "the {} header is longer than {} bytes",
                self.name, self.max_len
            )));
        }
        Ok(value)
    }
}

impl KeyExtractor for Header {
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        self.value(parts).map(str::to_owned)
    }

    fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        key.push_str(self.value(parts)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(value: Option<&[u8]>) -> Parts {
        let mut b = http::Request::builder();
        if let Some(v) = value {
            b = b.header("x-api-key", http::HeaderValue::from_bytes(v).unwrap());
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn missing_bad_and_long_values_are_rejected_with_4xx() {
        let h = Header::new(HeaderName::from_static("x-api-key")).max_len(8);
        assert_eq!(h.extract(&parts(None)).unwrap_err().status, 401);
        assert_eq!(h.extract(&parts(Some(b"  "))).unwrap_err().status, 401);
        assert_eq!(
            h.extract(&parts(Some(b"\xff\xfe"))).unwrap_err().status,
            400
        );
        assert_eq!(
            h.extract(&parts(Some(b"123456789"))).unwrap_err().status,
            400
        );
        assert_eq!(h.extract(&parts(Some(b" abc "))).unwrap(), "abc");
        let h = h.missing(StatusCode::BAD_REQUEST);
        assert_eq!(h.extract(&parts(None)).unwrap_err().status, 400);
    }

    #[test]
    fn a_repeated_header_is_rejected_whatever_its_values() {
        let h = Header::new(HeaderName::from_static("x-api-key"));
        for values in [["a", "b"], ["a", "a"], ["", "b"]] {
            let mut b = http::Request::builder();
            for v in values {
                b = b.header("x-api-key", v);
            }
            let rejection = h.extract(&b.body(()).unwrap().into_parts().0).unwrap_err();
            assert_eq!(rejection.status, 400, "{values:?}");
            assert!(rejection.detail.contains("more than once"), "{rejection:?}");
        }
    }
}
