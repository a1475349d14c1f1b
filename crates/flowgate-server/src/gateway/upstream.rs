//! The upstream the gateway forwards to: an `http://host:port` or `https://host:port` URL.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use http::Uri;
use http::uri::Authority;

/// Where requests go: `http://host[:port]` or `https://host[:port]` (TLS, verified against the
/// system's roots or those of [`Upstream::with_ca_file`]). Path prefixes are not supported;
/// [`Upstream::from_str`] says so rather than guessing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `host[:port]`.
    authority: Authority,
    /// TLS to the upstream (`https://`).
    tls: Option<UpstreamTls>,
}

/// The TLS client configuration of an `https://` upstream.
#[derive(Clone)]
pub struct UpstreamTls(pub Arc<rustls::ClientConfig>);

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UpstreamTls")
    }
}

impl PartialEq for UpstreamTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for UpstreamTls {}

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

    /// Parses `http://host[:port][/]` or `https://host[:port][/]` (the system's roots).
    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let error = |reason| UpstreamError {
            url: url.to_owned(),
            reason,
        };
        let uri: Uri = url
            .parse()
            .map_err(|_| error("not a URL; write e.g. http://127.0.0.1:3000"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(_) => return Err(error("only http:// and https:// upstreams are supported")),
            None => return Err(error("give the scheme: http://host:port")),
        };
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
        let tls = match https {
            false => None,
            true => Some(UpstreamTls(
                crate::tls::client_config(None)
                    .map_err(|_| error("the system's CA certificates cannot be read"))?,
            )),
        };
        Ok(Upstream { authority, tls })
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.authority)
    }
}

impl Upstream {
    /// Its `host[:port]`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The port connected to: the URL's, else 80 (`http`) or 443 (`https`).
    pub fn port(&self) -> u16 {
        self.authority
            .port_u16()
            .unwrap_or(if self.tls.is_some() { 443 } else { 80 })
    }

    /// Its TLS configuration, for an `https://` upstream.
    pub fn tls(&self) -> Option<&UpstreamTls> {
        self.tls.as_ref()
    }

    /// Verifies an `https://` upstream against the CA certificates of the PEM file `path`
    /// instead of the system's. Fails for an `http://` upstream or an unusable file.
    pub fn with_ca_file(mut self, path: &Path) -> Result<Self, String> {
        if self.tls.is_none() {
            return Err(format!(
                "--upstream-ca-file {} needs an https:// upstream (the upstream is {self})",
                path.display()
            ));
        }
        let config =
            crate::tls::client_config(Some(path)).map_err(|e| format!("upstream CA file {e}"))?;
        self.tls = Some(UpstreamTls(config));
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_https_origins_are_accepted() {
        let ok: Upstream = "http://127.0.0.1:3000".parse().unwrap();
        assert_eq!(ok.to_string(), "http://127.0.0.1:3000");
        assert_eq!(ok.authority().as_str(), "127.0.0.1:3000");
        assert!(ok.tls().is_none());
        let plain: Upstream = "http://example.com/".parse().unwrap();
        assert_eq!(plain.port(), 80);
        let tls: Upstream = "https://example.com".parse().unwrap();
        assert!(tls.tls().is_some());
        assert_eq!(tls.port(), 443);
        assert_eq!(tls.to_string(), "https://example.com");
        let e = plain
            .with_ca_file(Path::new("/nonexistent.pem"))
            .unwrap_err();
        assert!(e.contains("needs an https:// upstream"), "{e}");
        let e = tls.with_ca_file(Path::new("/nonexistent.pem")).unwrap_err();
        assert!(e.contains("/nonexistent.pem: cannot read"), "{e}");
        for (bad, why) in [
            ("ftp://example.com", "only http:// and https://"),
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
