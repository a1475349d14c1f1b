//! The upstream the gateway forwards to: an `http://host:port` URL.

use std::fmt;
use std::str::FromStr;

use http::Uri;
use http::uri::Authority;

/// Where requests go: `http://host[:port]`. TLS to the upstream and path prefixes are not
/// supported (yet); [`Upstream::from_str`] says so rather than guessing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `host[:port]`.
    authority: Authority,
}

/// Why an `--upstream` URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid upstream URL `{url}`: {reason}")]
pub struct UpstreamError {
    /// The URL as given.
    pub url: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for Upstream {
    type Err = UpstreamError;

    /// Parses `http://host[:port][/]`.
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let error = |reason| UpstreamError {
            url: url.to_owned(),
            reason,
        };
        let uri: Uri = url
            .parse()
            .map_err(|_| error("not a URL; write e.g. http://127.0.0.1:3000"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(error(
                    "only http:// upstreams are supported (TLS to the upstream is not implemented)",
                ));
            }
            Some(_) => return Err(error("only http:// upstreams are supported")),
            None => return Err(error("give the scheme: http://host:port")),
        }
        let authority = uri.authority().ok_or_else(|| error("no host"))?.clone();
        if authority.as_str().contains('@') {
            return Err(error("user information is not supported"));
        }
        if authority.host().is_empty() {
            return Err(error("no host"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(error(
                "a path or query is not supported; requests keep their own path",
            ));
        }
        Ok(Upstream { authority })
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.authority)
    }
}

impl Upstream {
    /// Its `host[:port]`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_origins_are_accepted() {
        let ok: Upstream = "http://127.0.0.1:3000".parse().unwrap();
        assert_eq!(ok.to_string(), "http://127.0.0.1:3000");
        assert_eq!(ok.authority().as_str(), "127.0.0.1:3000");
        assert!("http://example.com/".parse::<Upstream>().is_ok());
        for (bad, why) in [
            ("https://example.com", "TLS"),
            ("ftp://example.com", "only http://"),
            ("example.com:80", "scheme"),
            ("http://example.com/api", "path"),
            ("http://u:p@example.com", "user"),
            ("not a url", "not a URL"),
        ] {
            let e = bad.parse::<Upstream>().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
