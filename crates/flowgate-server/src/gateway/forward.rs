//! What a proxy changes in the messages it forwards (RFC 9110 §7.6): hop-by-hop fields are
//! removed, `X-Forwarded-For`, `Forwarded` and `Via` record the hop, and the `Host` rules of
//! RFC 9112 §3.2 are applied.

use std::net::IpAddr;

use bytes::Bytes;
use flowgate::http::key::X_FORWARDED_FOR;
use flowgate::http::key::push_ip;
use http::header::{
    CONNECTION, CONTENT_LENGTH, FORWARDED, HOST, HeaderMap, HeaderName, HeaderValue, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE, VIA,
};
use http::request::Parts;
use http::uri::Authority;
use http::{StatusCode, Version};

/// Turns an allowed request's head into the one sent upstream: the target in origin form
/// (`/path?query`: the upstream is a server, not a proxy), HTTP/1.1, the hop-by-hop fields
/// removed, this hop recorded for `client` (see `add_forwarding`; `keep_earlier` keeps the
/// hops the client sent, for trusted peers or `forwarded: append`), no extensions.
pub fn rewrite_request(parts: &mut Parts, client: IpAddr, keep_earlier: bool) {
    parts.uri = match parts.uri.path_and_query() {
        Some(path) => http::Uri::from(path.clone()),
        None => http::Uri::from_static("/"),
    };
    parts.version = Version::HTTP_11;
    remove_hop_by_hop(&mut parts.headers);
    add_forwarding(&mut parts.headers, client, keep_earlier);
    parts.extensions = http::Extensions::new();
}

/// Removes the hop-by-hop fields: `Connection` and every field it names, `Keep-Alive`, every
/// `Proxy-*` field, `TE`, `Trailer`, `Transfer-Encoding` and `Upgrade`. A message that came
/// with `Transfer-Encoding` also loses `Content-Length` (RFC 9112 §6.3: the two together are
/// a smuggling attempt or an error, and the length is re-framed on the next hop anyway).
///
/// One look at the names says which are there, and only those are removed: most messages carry
/// none, or only `Connection: keep-alive` (every upstream response, in practice).
pub(crate) fn remove_hop_by_hop(headers: &mut HeaderMap) {
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

/// Records this hop in a request about to be forwarded: `client` appended to
/// `X-Forwarded-For` and, as an RFC 7239 element `for=…;host=…;proto=http`, to `Forwarded`,
/// and `Via: 1.1 flowgate` (RFC 9110 §7.6.3). Earlier hops are kept only when
/// `keep_earlier` (the peer is a trusted proxy, or the operator asked to append); otherwise
/// both fields are replaced, so an upstream reading their leftmost entry never sees an address
/// the client made up.
pub(crate) fn add_forwarding(headers: &mut HeaderMap, client: IpAddr, keep_earlier: bool) {
    let ip = client.to_canonical();
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty());
    let escapes = host.map_or(0, |h| {
        h.bytes().filter(|b| matches!(b, b'"' | b'\\')).count()
    });
    // Both values are written into one buffer of their exact total size (over 15 bytes, so
    // `push_ip` writes without growing it), which both header values then share: one
    // allocation for the text and one for the count the two share (two buffers, one grown by
    // `push_ip` and one not full, cost four). Each value is still validated as it is made.
    let ip_len = text_len(ip);
    let for_len = match ip {
        IpAddr::V4(_) => ip_len,
        IpAddr::V6(_) => ip_len + 4,
    };
    let host_len = host.map_or(0, |h| ";host=\"\"".len() + h.len() + escapes);
    let mut text =
        String::with_capacity(ip_len + "for=".len() + for_len + host_len + ";proto=http".len());
    push_ip(&mut text, ip);
    let xff_len = text.len();
    text.push_str("for=");
    match ip {
        IpAddr::V4(_) => text.extend_from_within(..xff_len),
        IpAddr::V6(_) => {
            text.push_str("\"[");
            text.extend_from_within(..xff_len);
            text.push_str("]\"");
        }
    }
    if let Some(host) = host {
        text.push_str(";host=\"");
        if escapes > 0 {
            for c in host.chars() {
                if c == '"' || c == '\\' {
                    text.push('\\');
                }
                text.push(c);
            }
        } else {
            text.push_str(host);
        }
        text.push('"');
    }
    text.push_str(";proto=http");
    let text = Bytes::from(text);
    let xff = text.slice(..xff_len);
    let element = text.slice(xff_len..);

    if keep_earlier {
        append_list(headers, &X_FORWARDED_FOR, xff);
        append_list(headers, &FORWARDED, element);
    } else {
        // `insert` replaces every earlier line: the client's own hops are dropped.
        set(headers, &X_FORWARDED_FOR, xff);
        set(headers, &FORWARDED, element);
    }
    if let http::header::Entry::Vacant(via) = headers.entry(VIA) {
        via.insert(HeaderValue::from_static(VIA_FLOWGATE));
    } else {
        append_list(headers, &VIA, Bytes::from_static(VIA_FLOWGATE.as_bytes()));
    }
}

/// The length of `ip`'s text form (IPv4 counted, IPv6 an upper bound).
fn text_len(ip: IpAddr) -> usize {
    match ip {
        IpAddr::V4(v4) => {
            3 + v4
                .octets()
                .iter()
                .map(|&o| 1 + usize::from(o >= 10) + usize::from(o >= 100))
                .sum::<usize>()
        }
        IpAddr::V6(_) => 45,
    }
}

/// This hop in `Via`.
const VIA_FLOWGATE: &str = "1.1 flowgate";

/// Sets `name` to `value` alone (earlier lines removed). The value takes the bytes as they are.
fn set(headers: &mut HeaderMap, name: &HeaderName, value: Bytes) {
    if let Ok(value) = HeaderValue::from_maybe_shared(value) {
        headers.insert(name.clone(), value);
    }
}

/// Appends `item` to the comma-separated list in `name`, folding earlier lines into one
/// (some upstreams read only the first line).
fn append_list(headers: &mut HeaderMap, name: &HeaderName, item: Bytes) {
    if !headers.contains_key(name) {
        return set(headers, name, item);
    }
    let mut joined = String::new();
    for value in headers.get_all(name) {
        if let Ok(value) = value.to_str() {
            let value = value.trim();
            if !value.is_empty() {
                joined.push_str(value);
                joined.push_str(", ");
            }
        }
    }
    let mut joined = joined.into_bytes();
    joined.extend_from_slice(&item);
    set(headers, name, Bytes::from(joined));
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
        add_forwarding(&mut h, "::ffff:192.0.2.7".parse().unwrap(), true);
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 192.0.2.7");
        assert_eq!(
            h["forwarded"],
            r#"for=192.0.2.7;host="api.example:8000";proto=http"#
        );
        assert_eq!(h["via"], "1.1 flowgate");
        for ip in ["0.0.0.0", "9.10.99.100", "10.0.100.255", "255.255.255.255"] {
            let mut h = HeaderMap::new();
            add_forwarding(&mut h, ip.parse().unwrap(), true);
            assert_eq!(h["x-forwarded-for"], ip);
            assert_eq!(h["forwarded"], format!("for={ip};proto=http"));
        }
        let mut h = headers(&[("host", r#"we"ird\host"#), ("via", "1.0 edge")]);
        add_forwarding(&mut h, "192.0.2.1".parse().unwrap(), true);
        assert_eq!(
            h["forwarded"],
            r#"for=192.0.2.1;host="we\"ird\\host";proto=http"#
        );
        assert_eq!(h["via"], "1.0 edge, 1.1 flowgate");
        let mut h = headers(&[("forwarded", "for=198.51.100.1")]);
        add_forwarding(&mut h, "2001:db8::1".parse().unwrap(), true);
        assert_eq!(
            h["forwarded"],
            r#"for=198.51.100.1, for="[2001:db8::1]";proto=http"#
        );
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
