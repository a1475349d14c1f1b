//! What a proxy changes in the messages it forwards (RFC 9110 §7.6): hop-by-hop fields are
//! removed, `X-Forwarded-For`, `Forwarded` and `Via` record the hop, and the `Host` rules of
//! RFC 9112 §3.2 are applied.

use std::net::IpAddr;

use flowgate::http::key::IpText;
use flowgate::http::key::X_FORWARDED_FOR;
use http::header::{
    CONNECTION, CONTENT_LENGTH, FORWARDED, HOST, HeaderMap, HeaderName, HeaderValue, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE, VIA,
};
use http::request::Parts;
use http::uri::Authority;
use http::{StatusCode, Version};
use smallvec::SmallVec;

/// Removes the hop-by-hop fields: `Connection` and every field it names, `Keep-Alive`, every
/// `Proxy-*` field, `TE`, `Trailer`, `Transfer-Encoding` and `Upgrade`. A message that came
/// with `Transfer-Encoding` also loses `Content-Length` (RFC 9112 §6.3: the two together are
/// a smuggling attempt or an error, and the length is re-framed on the next hop anyway).
///
/// One look at the names says which are there, and only those are removed: most messages carry
/// none, or only `Connection: keep-alive` (every upstream response, in practice).
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let mut present = 0u8;
    for name in headers.keys() {
        present |= hop_by_hop(name);
    }
    if present == 0 {
        return;
    }
    if present & CONNECTION_BIT != 0 {
        // Fields named by `Connection` that the message has (the map cannot change while
        // borrowed, so they are collected first; usually there are none: `keep-alive`, the
        // usual token, is hop-by-hop itself).
        let mut named: Vec<HeaderName> = Vec::new();
        for value in headers.get_all(CONNECTION) {
            let Ok(value) = value.to_str() else {
                continue;
            };
            for token in value.split(',') {
                let token = token.trim();
                if token.eq_ignore_ascii_case("keep-alive") {
                    continue;
                }
                let Ok(name) = HeaderName::from_bytes(token.as_bytes()) else {
                    continue;
                };
                if hop_by_hop(&name) == 0 && headers.contains_key(&name) {
                    named.push(name);
                }
            }
        }
        for name in named {
            headers.remove(name);
        }
    }
    for (bit, name) in [
        (CONNECTION_BIT, &CONNECTION),
        (TRANSFER_ENCODING_BIT, &TRANSFER_ENCODING),
        (KEEP_ALIVE_BIT, &KEEP_ALIVE),
        (TE_BIT, &TE),
        (TRAILER_BIT, &TRAILER),
        (UPGRADE_BIT, &UPGRADE),
    ] {
        if present & bit != 0 {
            headers.remove(name);
        }
    }
    if present & TRANSFER_ENCODING_BIT != 0 {
        headers.remove(CONTENT_LENGTH);
    }
    if present & PROXY_BIT != 0 {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("proxy-"))
            .cloned()
            .collect();
        for name in names {
            headers.remove(name);
        }
    }
}

/// `Keep-Alive` (RFC 2068).
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// The bits [`hop_by_hop`] answers with, one per field that is hop-by-hop whatever
/// `Connection` says.
const CONNECTION_BIT: u8 = 1;
const TRANSFER_ENCODING_BIT: u8 = 2;
const KEEP_ALIVE_BIT: u8 = 4;
const TE_BIT: u8 = 8;
const TRAILER_BIT: u8 = 16;
const UPGRADE_BIT: u8 = 32;
const PROXY_BIT: u8 = 64;

/// Which hop-by-hop field `name` is (its bit; `0` when it is an end-to-end one): a match on
/// the lower-case name, which compiles to a look at its length and a few compares.
fn hop_by_hop(name: &HeaderName) -> u8 {
    match name.as_str() {
        "connection" => CONNECTION_BIT,
        "transfer-encoding" => TRANSFER_ENCODING_BIT,
        "keep-alive" => KEEP_ALIVE_BIT,
        "te" => TE_BIT,
        "trailer" => TRAILER_BIT,
        "upgrade" => UPGRADE_BIT,
        name if name.starts_with("proxy-") => PROXY_BIT,
        _ => 0,
    }
}

/// Checks the request's `Host` as RFC 9112 §3.2 asks of a server: an HTTP/1.1 request needs
/// exactly one `Host`, which must be a valid authority (or empty); a request in absolute form
/// (`GET http://host/path`) is for the URI's host, whatever `Host` says, so `Host` is set to
/// it. Returns why the request is malformed.
pub fn check_host(parts: &mut Parts) -> Result<(), (StatusCode, &'static str)> {
    if let Some(authority) = parts.uri.authority() {
        let value = HeaderValue::from_str(authority.as_str()).map_err(|_| {
            (
                StatusCode::BAD_REQUEST,
                "the request target's host is invalid",
            )
        })?;
        parts.headers.insert(HOST, value);
        return Ok(());
    }
    let mut hosts = parts.headers.get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => Err((
            StatusCode::BAD_REQUEST,
            "the request has more than one Host header",
        )),
        (None, None) if parts.version == Version::HTTP_11 => Err((
            StatusCode::BAD_REQUEST,
            "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)",
        )),
        (Some(host), _)
            if !host.is_empty()
                && host
                    .to_str()
                    .ok()
                    .and_then(|h| h.parse::<Authority>().ok())
                    .is_none() =>
        {
            Err((
                StatusCode::BAD_REQUEST,
                "the Host header is not a valid host",
            ))
        }
        _ => Ok(()),
    }
}

/// This hop, as a forwarded request records it: the client's address appended to
/// `X-Forwarded-For` and, as an RFC 7239 element `for=…;host=…;proto=http`, to `Forwarded`,
/// and `Via: 1.1 flowgate` (RFC 9110 §7.6.3). Earlier hops in `X-Forwarded-For` and
/// `Forwarded` are kept only when `keep_earlier` (the peer is a trusted proxy, or the
/// operator asked to append); otherwise the client's own are replaced, so an upstream reading
/// their leftmost entry never sees an address the client made up. Earlier `Via` entries are
/// always kept. Earlier lines of a field are folded into one (some upstreams read only the
/// first).
#[derive(Debug, Clone, Copy)]
pub struct Hop {
    /// The client's address (an IPv4-mapped IPv6 address as IPv4).
    client: IpAddr,
    /// Its text.
    ip: IpText,
    /// Whether the client's `X-Forwarded-For` and `Forwarded` entries are kept.
    keep_earlier: bool,
}

/// The fields a [`Hop`] writes, in the order it writes them.
static HOP_FIELDS: [&HeaderName; 3] = [&X_FORWARDED_FOR, &FORWARDED, &VIA];

/// This hop in `Via`.
const VIA_FLOWGATE: &str = "1.1 flowgate";

impl Hop {
    /// The hop of a request from `client`; `keep_earlier` keeps the client's own
    /// `X-Forwarded-For` and `Forwarded` entries ahead of this hop's.
    pub fn new(client: IpAddr, keep_earlier: bool) -> Self {
        let client = client.to_canonical();
        Hop {
            client,
            ip: IpText::new(client),
            keep_earlier,
        }
    }

    /// The fields this hop writes, in the order it writes them: `X-Forwarded-For`,
    /// `Forwarded`, `Via`.
    pub fn fields() -> &'static [&'static HeaderName; 3] {
        &HOP_FIELDS
    }

    /// Sets the three fields in `headers`, replacing their earlier lines: for a head another
    /// writer sends (the WebSocket gateway's handshake, through hyper's client).
    pub fn apply(&self, headers: &mut HeaderMap) {
        let mut values: [Vec<u8>; 3] = Default::default();
        {
            let earlier = Earlier::of(headers);
            for (name, value) in HOP_FIELDS.iter().zip(&mut values) {
                self.write_value(name, &earlier, value);
            }
        }
        for (name, value) in HOP_FIELDS.into_iter().zip(values) {
            // Always valid: the client's values were, and what is added is visible ASCII.
            if let Ok(value) = HeaderValue::from_bytes(&value) {
                headers.insert(name, value);
            }
        }
    }

    /// Appends the value of `name` (one of [`Hop::fields`]) for a request whose own fields
    /// are `earlier`.
    pub fn write_value(&self, name: &HeaderName, earlier: &Earlier<'_>, out: &mut Vec<u8>) {
        let ip = self.ip.as_bytes();
        if self.keep_earlier || name == VIA {
            let lines = HOP_FIELDS
                .iter()
                .position(|field| *field == name)
                .map_or(&[][..], |at| &earlier.lines[at][..]);
            for value in lines {
                if let Ok(value) = value.to_str() {
                    let value = value.trim();
                    if !value.is_empty() {
                        out.extend_from_slice(value.as_bytes());
                        out.extend_from_slice(b", ");
                    }
                }
            }
        }
        if name == X_FORWARDED_FOR {
            out.extend_from_slice(ip);
        } else if name == FORWARDED {
            out.extend_from_slice(b"for=");
            match self.client {
                IpAddr::V4(_) => out.extend_from_slice(ip),
                IpAddr::V6(_) => {
                    out.extend_from_slice(b"\"[");
                    out.extend_from_slice(ip);
                    out.extend_from_slice(b"]\"");
                }
            }
            let host = earlier
                .host
                .and_then(|h| h.to_str().ok())
                .filter(|h| !h.is_empty());
            if let Some(host) = host {
                // A quoted string (RFC 7239 §4): `"` and `\` escaped.
                out.extend_from_slice(b";host=\"");
                let mut rest = host.as_bytes();
                while let Some(at) = rest.iter().position(|&b| b == b'"' || b == b'\\') {
                    out.extend_from_slice(&rest[..at]);
                    out.extend_from_slice(&[b'\\', rest[at]]);
                    rest = &rest[at + 1..];
                }
                out.extend_from_slice(rest);
                out.push(b'"');
            }
            out.extend_from_slice(b";proto=http");
        } else {
            out.extend_from_slice(VIA_FLOWGATE.as_bytes());
        }
    }
}

/// What a [`Hop`] reads of the request: its `Host` and the client's own lines of the fields
/// the hop writes anew — gathered while the head is written, in its one pass over the fields
/// (no lookup by name afterwards).
#[derive(Debug, Default)]
pub struct Earlier<'a> {
    /// The request's `Host` (its first line).
    host: Option<&'a HeaderValue>,
    /// The client's lines of each of [`Hop::fields`], in that order, each in its order.
    lines: [SmallVec<[&'a HeaderValue; 2]>; 3],
}

impl<'a> Earlier<'a> {
    /// What `headers` hold.
    pub fn of(headers: &'a HeaderMap) -> Self {
        let mut earlier = Earlier::default();
        for (name, value) in headers {
            earlier.note(name, value);
        }
        earlier
    }

    /// Takes note of the request's field `name: value` (fields in the request's order):
    /// `true` when it is one the hop writes anew (`X-Forwarded-For`, `Forwarded`, `Via`),
    /// whose line a head writer leaves out, writing [`Hop::fields`] with
    /// [`Hop::write_value`] instead.
    pub fn note(&mut self, name: &HeaderName, value: &'a HeaderValue) -> bool {
        if let Some(at) = HOP_FIELDS.iter().position(|field| *field == name) {
            self.lines[at].push(value);
            return true;
        }
        if name == HOST && self.host.is_none() {
            self.host = Some(value);
        }
        false
    }

    /// Whether the request has a `Host` field.
    pub fn has_host(&self) -> bool {
        self.host.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_removed() {
        let mut h = headers(&[
            ("connection", "keep-alive, X-Secret"),
            ("connection", "close"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("content-length", "5"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
            ("authorization", "Bearer t"),
        ]);
        remove_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "x-kept"]);
        let mut h = headers(&[("content-length", "5")]);
        remove_hop_by_hop(&mut h);
        assert_eq!(h["content-length"], "5");
        // The usual upstream response: only `Connection: keep-alive`.
        let mut h = headers(&[
            ("connection", "keep-alive"),
            ("content-length", "2"),
            ("server", "nginx"),
        ]);
        remove_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "server"]);
        // `Proxy-*` alone; `Connection` naming a field the message lacks, or nonsense.
        let mut h = headers(&[
            ("proxy-foo", "1"),
            ("connection", "x-absent, bad token"),
            ("x-kept", "1"),
        ]);
        remove_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn forwarding_headers_are_appended_in_one_line() {
        let mut h = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
            ("host", "api.example:8000"),
        ]);
        Hop::new("::ffff:192.0.2.7".parse().unwrap(), true).apply(&mut h);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 192.0.2.7");
        assert_eq!(
            h["forwarded"],
            r#"for=192.0.2.7;host="api.example:8000";proto=http"#
        );
        assert_eq!(h["via"], "1.1 flowgate");
        for ip in ["0.0.0.0", "9.10.99.100", "10.0.100.255", "255.255.255.255"] {
            let mut h = HeaderMap::new();
            Hop::new(ip.parse().unwrap(), true).apply(&mut h);
            assert_eq!(h["x-forwarded-for"], ip);
            assert_eq!(h["forwarded"], format!("for={ip};proto=http"));
        }
        let mut h = headers(&[("host", r#"we"ird\host"#), ("via", "1.0 edge")]);
        Hop::new("192.0.2.1".parse().unwrap(), true).apply(&mut h);
        assert_eq!(
            h["forwarded"],
            r#"for=192.0.2.1;host="we\"ird\\host";proto=http"#
        );
        assert_eq!(h["via"], "1.0 edge, 1.1 flowgate");
        let mut h = headers(&[("forwarded", "for=198.51.100.1")]);
        Hop::new("2001:db8::1".parse().unwrap(), true).apply(&mut h);
        assert_eq!(
            h["forwarded"],
            r#"for=198.51.100.1, for="[2001:db8::1]";proto=http"#
        );
    }

    #[test]
    fn an_untrusted_clients_own_hops_are_replaced_and_via_kept() {
        let mut h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("via", "1.0 edge"),
            ("host", "api.example"),
        ]);
        let hop = Hop::new("192.0.2.7".parse().unwrap(), false);
        let values: Vec<String> = Hop::fields()
            .iter()
            .map(|name| {
                let mut value = Vec::new();
                hop.write_value(name, &Earlier::of(&h), &mut value);
                format!("{name}: {}", String::from_utf8(value).unwrap())
            })
            .collect();
        assert_eq!(
            values,
            [
                "x-forwarded-for: 192.0.2.7",
                r#"forwarded: for=192.0.2.7;host="api.example";proto=http"#,
                "via: 1.0 edge, 1.1 flowgate",
            ]
        );
        hop.apply(&mut h);
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert_eq!(
            h["forwarded"],
            r#"for=192.0.2.7;host="api.example";proto=http"#
        );
        assert_eq!(h["via"], "1.0 edge, 1.1 flowgate");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        let value = HeaderValue::from_static("v");
        let mut earlier = Earlier::default();
        for name in ["x-forwarded-for", "Forwarded", "VIA"] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert!(earlier.note(&name, &value));
        }
        assert!(!earlier.has_host());
        assert!(!earlier.note(&HOST, &value));
        assert!(earlier.has_host());
    }

    #[test]
    fn host_follows_rfc_9112() {
        let parts = |uri: &str, version: Version, hosts: &[&str]| {
            let mut b = http::Request::builder().uri(uri).version(version);
            for h in hosts {
                b = b.header("host", *h);
            }
            b.body(()).unwrap().into_parts().0
        };
        assert!(check_host(&mut parts("/", Version::HTTP_11, &["a.example"])).is_ok());
        assert!(check_host(&mut parts("/", Version::HTTP_11, &[])).is_err());
        assert!(check_host(&mut parts("/", Version::HTTP_10, &[])).is_ok());
        assert!(check_host(&mut parts("/", Version::HTTP_11, &["a", "b"])).is_err());
        assert!(check_host(&mut parts("/", Version::HTTP_11, &["a b"])).is_err());
        assert!(check_host(&mut parts("/", Version::HTTP_11, &[""])).is_ok());
        let mut absolute = parts("http://b.example/x", Version::HTTP_11, &["a.example"]);
        assert!(check_host(&mut absolute).is_ok());
        assert_eq!(absolute.headers["host"], "b.example");
    }
}
