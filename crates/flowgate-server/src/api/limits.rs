//! Bounds on what one API request may carry, checked while it is decoded — before any
//! matching or store work — so a hostile or broken client costs a bounded amount of memory
//! and CPU. Over a bound: HTTP `413` (body) or `400` (the rest) with an RFC 9457 problem; gRPC
//! `OUT_OF_RANGE` (message size, from tonic) or `INVALID_ARGUMENT`.
//!
//! The defaults are far above what Envoy sends (a few descriptors of a few short entries)
//! and far below what would hurt the service; `docs/service.md` lists them.

use super::rls::InvalidRequest;

/// The largest request body (HTTP) or message (gRPC) accepted by default: 64 KiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024;
/// Descriptors per request by default.
pub const DEFAULT_MAX_DESCRIPTORS: usize = 64;
/// Entries per descriptor by default.
pub const DEFAULT_MAX_ENTRIES: usize = 16;
/// The longest descriptor entry key by default, in bytes.
pub const DEFAULT_MAX_KEY_BYTES: usize = 256;
/// The longest descriptor entry value by default, in bytes (a URL path fits).
pub const DEFAULT_MAX_VALUE_BYTES: usize = 4096;
/// The longest domain by default, in bytes.
pub const DEFAULT_MAX_DOMAIN_BYTES: usize = 256;

/// What one request to `ShouldRateLimit`, `POST /json` or `POST /v1/check` may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    /// The largest body (HTTP: `413` beyond it) or decoded gRPC message.
    pub max_body_bytes: usize,
    /// Descriptors per request.
    pub max_descriptors: usize,
    /// Entries per descriptor.
    pub max_entries: usize,
    /// Bytes per entry key.
    pub max_key_bytes: usize,
    /// Bytes per entry value.
    pub max_value_bytes: usize,
    /// Bytes of the domain.
    pub max_domain_bytes: usize,
}

impl Default for InputLimits {
    fn default() -> Self {
        InputLimits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_descriptors: DEFAULT_MAX_DESCRIPTORS,
            max_entries: DEFAULT_MAX_ENTRIES,
            max_key_bytes: DEFAULT_MAX_KEY_BYTES,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_domain_bytes: DEFAULT_MAX_DOMAIN_BYTES,
        }
    }
}

impl InputLimits {
    /// Checks a decoded request's shape: the domain, then per descriptor its entry count and
    /// each entry's key and value (`entries` yields each descriptor's `(key, value)` pairs).
    /// The error names the bound and where it was crossed.
    pub fn check<'a, D, E>(&self, domain: &str, descriptors: D) -> Result<(), InvalidRequest>
    where
        D: ExactSizeIterator<Item = E>,
        E: ExactSizeIterator<Item = (&'a str, &'a str)>,
    {
        if domain.len() > self.max_domain_bytes {
            return Err(InvalidRequest(format!(
                "the domain is {} bytes; at most {} are accepted",
                domain.len(),
                self.max_domain_bytes
            )));
        }
        if descriptors.len() > self.max_descriptors {
            return Err(InvalidRequest(format!(
                "{} descriptors; at most {} per request are accepted",
                descriptors.len(),
                self.max_descriptors
            )));
        }
        for (i, entries) in descriptors.enumerate() {
            if entries.len() > self.max_entries {
                return Err(InvalidRequest(format!(
                    "descriptor {i} has {} entries; at most {} are accepted",
                    entries.len(),
                    self.max_entries
                )));
            }
            for (j, (key, value)) in entries.enumerate() {
                if key.len() > self.max_key_bytes {
                    return Err(InvalidRequest(format!(
                        "descriptor {i}, entry {j}: the key is {} bytes; at most {} are accepted",
                        key.len(),
                        self.max_key_bytes
                    )));
                }
                if value.len() > self.max_value_bytes {
                    return Err(InvalidRequest(format!(
                        "descriptor {i}, entry {j}: the value is {} bytes; at most {} are accepted",
                        value.len(),
                        self.max_value_bytes
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(limits: &InputLimits, domain: &str, d: &[&[(&str, &str)]]) -> Result<(), String> {
        limits
            .check(domain, d.iter().map(|e| e.iter().copied()))
            .map_err(|e| e.0)
    }

    #[test]
    fn each_bound_is_inclusive_and_named_when_crossed() {
        let l = InputLimits {
            max_body_bytes: 100,
            max_descriptors: 2,
            max_entries: 2,
            max_key_bytes: 3,
            max_value_bytes: 4,
            max_domain_bytes: 5,
        };
        let e = [("abc", "wxyz"), ("k", "")];
        assert_eq!(check(&l, "abcde", &[&e, &e]), Ok(()));
        assert!(check(&l, "abcdef", &[&e]).unwrap_err().contains("domain"));
        assert!(
            check(&l, "d", &[&e, &e, &e])
                .unwrap_err()
                .contains("3 descriptors")
        );
        let three = [("a", ""), ("b", ""), ("c", "")];
        assert!(
            check(&l, "d", &[&three])
                .unwrap_err()
                .contains("descriptor 0 has 3 entries")
        );
        assert!(
            check(&l, "d", &[&e, &[("abcd", "")]])
                .unwrap_err()
                .contains("descriptor 1, entry 0: the key is 4 bytes")
        );
        assert!(
            check(&l, "d", &[&[("k", "vwxyz")]])
                .unwrap_err()
                .contains("the value is 5 bytes")
        );
    }
}
