//! The upstream the gateway forwards to: an `http://host:port` URL, and the pooled client that
//! talks to it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::Uri;
use http::uri::{Authority, PathAndQuery, Scheme};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// How long an idle pooled connection to the upstream is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

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
    /// The upstream URI for a request's path and query.
    pub(crate) fn uri(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        let path = path_and_query.map_or("/", PathAndQuery::as_str);
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
    }

    /// Its `host[:port]`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

/// The pooled HTTP/1.1 client requests are forwarded with; bodies stream through as
/// [`Incoming`].
pub(crate) type UpstreamClient = Client<HttpConnector, Incoming>;

/// A client with keep-alive connections to the upstream (idle ones kept 90 s), `TCP_NODELAY`,
/// and `connect_timeout` to establish a connection.
pub(crate) fn client(connect_timeout: Duration) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_timer(TokioTimer::new())
        .build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_origins_are_accepted() {
        let ok: Upstream = "http://127.0.0.1:3000".parse().unwrap();
        assert_eq!(ok.to_string(), "http://127.0.0.1:3000");
        assert_eq!(
            ok.uri(Some(&PathAndQuery::from_static("/a?b=1")))
                .unwrap()
                .to_string(),
            "http://127.0.0.1:3000/a?b=1"
        );
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
