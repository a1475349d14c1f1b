//! [`PeerIp`] and [`ClientIp`]: keys from the client's address.
//!
//! The connection's address is the only one a client cannot forge. Behind a reverse proxy it
//! is the proxy's, and the client's address arrives in `X-Forwarded-For` or `Forwarded` —
//! headers any client can also send itself. [`ClientIp`] therefore believes those headers only
//! from configured trusted proxies, and only as far back as the chain stays trusted: it takes
//! the rightmost address that is not a trusted proxy (each proxy appends the address it saw, so
//! everything left of the first untrusted hop was written by someone we do not trust).
//!
//! IPv6 clients usually control a whole /64, so IPv6 addresses are keyed by their /64 prefix
//! by default; IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`, from dual-stack sockets) are
//! keyed as the IPv4 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::request::Parts;
use http::{Extensions, HeaderMap, HeaderName, StatusCode};
use ipnet::IpNet;

use super::{KeyExtractor, KeyRejection};

/// `X-Forwarded-For`: the client addresses proxies record (read by [`ClientIp`], written by
/// Flowgate's gateway).
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The remote address of a request's connection, for servers that do not record one in a form
/// [`PeerIp`] finds by itself. Insert it into the request's extensions (hyper: in the
/// `service_fn` that you serve the connection with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Looks up the peer's address in a request's extensions.
type PeerLookup = fn(&Extensions) -> Option<IpAddr>;

/// The default lookup: [`PeerAddr`], then a plain `SocketAddr`, then (feature `axum`) axum's
/// `ConnectInfo<SocketAddr>`.
fn default_peer(extensions: &Extensions) -> Option<IpAddr> {
    if let Some(PeerAddr(addr)) = extensions.get::<PeerAddr>() {
        return Some(addr.ip());
    }
    if let Some(addr) = extensions.get::<SocketAddr>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    None
}

/// Keys requests by the address of the connection they came on.
///
/// The address is read from the request's extensions: [`PeerAddr`], a `SocketAddr`, or with the
/// `axum` feature axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`); for anything else (tonic's
/// `TcpConnectInfo`, …) give a lookup with [`from_extensions`](Self::from_extensions). A request
/// without an address is a server misconfiguration and gets a 500.
///
/// ```
/// use std::net::SocketAddr;
/// use flowgate::http::key::{KeyExtractor, PeerAddr, PeerIp};
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(PeerAddr("[2001:db8:1:2:3:4:5:6]:443".parse().unwrap()));
/// let key = PeerIp::new().extract(&request.into_parts().0).unwrap();
/// assert_eq!(key, "2001:db8:1:2::/64");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    /// Where the address comes from.
    lookup: PeerLookup,
    /// IPv4 addresses are keyed by this many leading bits (default 32: the whole address).
    v4_prefix: u8,
    /// IPv6 addresses are keyed by this many leading bits (default 64).
    v6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// Keys by the peer's address: IPv4 whole, IPv6 by /64.
    pub fn new() -> Self {
        PeerIp {
            lookup: default_peer,
            v4_prefix: 32,
            v6_prefix: 64,
        }
    }

    /// Reads the peer's address with `lookup` instead, e.g. for tonic:
    /// `|e| e.get::<TcpConnectInfo>()?.remote_addr().map(|a| a.ip())`.
    pub fn from_extensions(mut self, lookup: fn(&Extensions) -> Option<IpAddr>) -> Self {
        self.lookup = lookup;
        self
    }

    /// Keys IPv6 addresses by their first `bits` bits (0–128; default 64).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits.min(128);
        self
    }

    /// Keys IPv4 addresses by their first `bits` bits (0–32; default 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.v4_prefix = bits.min(32);
        self
    }

    /// The connection's address (IPv4-mapped IPv6 turned into IPv4).
    pub fn peer(&self, parts: &Parts) -> Result<IpAddr, KeyRejection> {
        (self.lookup)(&parts.extensions)
            .map(|ip| ip.to_canonical())
            .ok_or_else(|| {
                KeyRejection::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the server did not record the peer address (serve with connect info)",
                )
            })
    }

    /// `ip` as a key: the whole address, or `network/prefix` when keyed by a prefix.
    pub fn key_of(&self, ip: IpAddr) -> String {
        let mut key = String::with_capacity(15);
        self.push_key(ip, &mut key);
        key
    }

    /// Appends [`key_of(ip)`](Self::key_of) to `key`.
    fn push_key(&self, ip: IpAddr, key: &mut String) {
        use std::fmt::Write;
        // Writing to a `String` cannot fail.
        let _ = match ip.to_canonical() {
            IpAddr::V4(a) if self.v4_prefix >= 32 => {
                push_ip(key, IpAddr::V4(a));
                Ok(())
            }
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.v4_prefix))
                    .unwrap_or(0);
                write!(
                    key,
                    "{}/{}",
                    Ipv4Addr::from(a.to_bits() & mask),
                    self.v4_prefix
                )
            }
            IpAddr::V6(a) if self.v6_prefix >= 128 => {
                push_ip(key, IpAddr::V6(a));
                Ok(())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.v6_prefix))
                    .unwrap_or(0);
                write!(
                    key,
                    "{}/{}",
                    Ipv6Addr::from(a.to_bits() & mask),
                    self.v6_prefix
                )
            }
        };
    }
}

/// Appends `ip` as `Display` writes it (`192.0.2.7`, `2001:db8::1`); see [`IpText`].
///
/// ```
/// let mut out = String::from("for=");
/// flowgate::http::key::push_ip(&mut out, "192.0.2.7".parse().unwrap());
/// assert_eq!(out, "for=192.0.2.7");
/// ```
pub fn push_ip(out: &mut String, ip: IpAddr) {
    let text = IpText::new(ip);
    out.reserve(text.as_bytes().len());
    // ASCII: each byte is a character.
    out.extend(text.as_bytes().iter().map(|&b| char::from(b)));
}

/// An address's text as `Display` writes it (`192.0.2.7`, `2001:db8::1`), held inline — an
/// IPv4 address written by hand: `Display` goes through the formatting machinery, which costs
/// more than the rest of a key extraction, and this runs on every request (keys,
/// `X-Forwarded-For`).
///
/// ```
/// use flowgate::http::key::IpText;
/// assert_eq!(IpText::new("10.0.100.255".parse().unwrap()).as_bytes(), b"10.0.100.255");
/// assert_eq!(IpText::new("2001:db8::1".parse().unwrap()).as_bytes(), b"2001:db8::1");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct IpText {
    /// The text's bytes, from the start.
    bytes: [u8; IpText::MAX],
    /// How many there are.
    len: u8,
}

impl IpText {
    /// The longest text: an IPv6 address with an embedded IPv4 one
    /// (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
    const MAX: usize = 45;

    /// The text of `ip`.
    pub fn new(ip: IpAddr) -> Self {
        let mut bytes = [0u8; Self::MAX];
        let len = match ip {
            IpAddr::V4(ip) => {
                let mut len = 0;
                for (i, octet) in ip.octets().into_iter().enumerate() {
                    if i > 0 {
                        bytes[len] = b'.';
                        len += 1;
                    }
                    if octet >= 100 {
                        bytes[len] = b'0' + octet / 100;
                        len += 1;
                    }
                    if octet >= 10 {
                        bytes[len] = b'0' + octet / 10 % 10;
                        len += 1;
                    }
                    bytes[len] = b'0' + octet % 10;
                    len += 1;
                }
                len
            }
            IpAddr::V6(ip) => {
                use std::io::Write;
                let mut rest = &mut bytes[..];
                // The longest IPv6 text fits: the write cannot fail.
                let _ = write!(rest, "{ip}");
                Self::MAX - rest.len()
            }
        };
        IpText {
            bytes,
            len: len as u8,
        }
    }

    /// The text (ASCII: digits, dots, hex digits and colons).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        Ok(self.key_of(self.peer(parts)?))
    }

    fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        self.push_key(self.peer(parts)?, key);
        Ok(())
    }
}

/// Which header trusted proxies write the client's address into. Only one is read: reading
/// both would let a client slip an address into the one its proxies do not overwrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the de-facto standard; nginx, AWS, GCP).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for="[2001:db8::1]:4711"` (RFC 7239).
    Forwarded,
}

/// Keys requests by the client's address, believing `X-Forwarded-For` (or `Forwarded`) only
/// from trusted proxies.
///
/// * The request came from an untrusted peer: the key is the peer's address; whatever
///   forwarding headers it sent are ignored.
/// * It came from a trusted proxy: the header's addresses are walked from the right, skipping
///   trusted proxies; the first untrusted address is the client. If every address is a trusted
///   proxy, the leftmost is used; if an entry cannot be parsed (`unknown`, an obfuscated node,
///   garbage), the walk stops at the last trusted address before it.
///
/// ```
/// use flowgate::http::key::{ClientIp, KeyExtractor, PeerAddr};
///
/// let client_ip = ClientIp::new(["10.0.0.0/8".parse().unwrap()]);
/// let request = |peer: &str| {
///     let mut r = http::Request::builder()
///         .header("x-forwarded-for", "198.51.100.9, 203.0.113.7, 10.1.2.3")
///         .body(()).unwrap();
///     r.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
///     r.into_parts().0
/// };
/// // Through our load balancer 10.0.0.5: the rightmost untrusted hop is the client.
/// assert_eq!(client_ip.extract(&request("10.0.0.5:4000")).unwrap(), "203.0.113.7");
/// // Straight from the internet: the header is the client's own claim and is ignored.
/// assert_eq!(client_ip.extract(&request("192.0.2.1:4000")).unwrap(), "192.0.2.1");
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    /// Finds and keys the connection's address.
    peer: PeerIp,
    /// The networks of proxies whose forwarding header is believed.
    trusted: Vec<IpNet>,
    /// The header they write.
    header: ForwardedHeader,
}

impl ClientIp {
    /// Believes `X-Forwarded-For` from peers in `trusted` (e.g. `10.0.0.0/8`, `127.0.0.1/32`).
    pub fn new(trusted: impl IntoIterator<Item = IpNet>) -> Self {
        ClientIp {
            peer: PeerIp::new(),
            trusted: trusted.into_iter().map(|n| n.trunc()).collect(),
            header: ForwardedHeader::XForwardedFor,
        }
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// How the connection's address is found and addresses are keyed (see [`PeerIp`]).
    pub fn peer_ip(mut self, peer: PeerIp) -> Self {
        self.peer = peer;
        self
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client's address for this request.
    pub fn client_ip(&self, parts: &Parts) -> Result<IpAddr, KeyRejection> {
        let peer = self.peer.peer(parts)?;
        if !self.is_trusted(peer) {
            return Ok(peer);
        }
        Ok(match self.header {
            ForwardedHeader::XForwardedFor => {
                self.rightmost_untrusted(peer, x_forwarded_for_from_the_right(&parts.headers))
            }
            ForwardedHeader::Forwarded => {
                self.rightmost_untrusted(peer, forwarded(&parts.headers).into_iter().rev())
            }
        })
    }

    /// Walks `hops` from the right (nearest proxy first), skipping trusted proxies: the first
    /// untrusted address; the leftmost if all are trusted; the last trusted one before an
    /// unparsable hop; `peer` if there are none.
    fn rightmost_untrusted(
        &self,
        peer: IpAddr,
        hops: impl Iterator<Item = Option<IpAddr>>,
    ) -> IpAddr {
        let mut client = peer;
        for hop in hops {
            match hop {
                Some(ip) => {
                    client = ip.to_canonical();
                    if !self.is_trusted(client) {
                        break;
                    }
                }
                None => break,
            }
        }
        client
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> Result<String, KeyRejection> {
        Ok(self.peer.key_of(self.client_ip(parts)?))
    }

    fn extract_into(&self, parts: &Parts, key: &mut String) -> Result<(), KeyRejection> {
        self.peer.push_key(self.client_ip(parts)?, key);
        Ok(())
    }
}

/// The values of every `name` header line, in order, as text (lines that are not visible ASCII
/// are one unparsable hop).
fn lines<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl DoubleEndedIterator<Item = Option<&'a str>> {
    headers.get_all(name).iter().map(|v| v.to_str().ok())
}

/// The hops of `X-Forwarded-For`, right to left (the order they are walked in, so nothing is
/// collected); `None` for one that is not an address.
fn x_forwarded_for_from_the_right(headers: &HeaderMap) -> impl Iterator<Item = Option<IpAddr>> {
    lines(headers, &X_FORWARDED_FOR).rev().flat_map(|line| {
        let hops = line.map(|line| line.rsplit(',').map(|hop| parse_node(hop.trim())));
        // A line that is not text is one unparsable hop.
        let unparsable = line.is_none().then_some(None);
        hops.into_iter().flatten().chain(unparsable)
    })
}

/// The `for=` of each element of `Forwarded` (RFC 7239), left to right; `None` for an element
/// without one or whose node is not an address (`unknown`, `_hidden`).
fn forwarded(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut hops = Vec::new();
    for line in lines(headers, &http::header::FORWARDED) {
        let Some(line) = line else {
            hops.push(None);
            continue;
        };
        for element in split_unquoted(line, ',') {
            let node = split_unquoted(element, ';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| unquote(value.trim()))
            });
            hops.push(node.and_then(|n| parse_node(&n)));
        }
    }
    hops
}

/// Splits `s` at `sep` outside double quotes (a quoted-string may contain `,` and `;`).
fn split_unquoted(s: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut quoted = false;
    let mut escaped = false;
    s.split(move |c: char| {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            return true;
        }
        false
    })
}

/// A token or quoted-string's value.
fn unquote(value: &str) -> String {
    match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                out.push(if c == '\\' {
                    chars.next().unwrap_or(c)
                } else {
                    c
                });
            }
            out
        }
        None => value.to_owned(),
    }
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:80`.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = node.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    node.strip_prefix('[')?
        .strip_suffix(']')?
        .parse::<Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder();
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut r = b.body(()).unwrap();
        r.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
        r.into_parts().0
    }

    fn trusted() -> ClientIp {
        ClientIp::new([
            "10.0.0.0/8".parse().unwrap(),
            "2001:db8:ffff::/48".parse().unwrap(),
        ])
    }

    #[test]
    fn forwarding_headers_are_believed_only_from_trusted_proxies() {
        let c = trusted();
        let xff = [("x-forwarded-for", "1.1.1.1, 2.2.2.2")];
        assert_eq!(c.extract(&parts("9.9.9.9:1", &xff)).unwrap(), "9.9.9.9");
        assert_eq!(c.extract(&parts("10.0.0.1:1", &xff)).unwrap(), "2.2.2.2");
        // Trusted hops are skipped; the rightmost untrusted one is the client.
        let chain = [("x-forwarded-for", "6.6.6.6, 3.3.3.3, 10.2.2.2, 10.1.1.1")];
        assert_eq!(c.extract(&parts("10.0.0.1:1", &chain)).unwrap(), "3.3.3.3");
        // Split across header lines, in order.
        let lines = [
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "4.4.4.4, 10.9.9.9"),
        ];
        assert_eq!(c.extract(&parts("10.0.0.1:1", &lines)).unwrap(), "4.4.4.4");
        // All trusted: the leftmost.
        let all = [("x-forwarded-for", "10.3.3.3, 10.4.4.4")];
        assert_eq!(c.extract(&parts("10.0.0.1:1", &all)).unwrap(), "10.3.3.3");
        // No header: the proxy itself.
        assert_eq!(c.extract(&parts("10.0.0.1:1", &[])).unwrap(), "10.0.0.1");
        // Garbage stops the walk at the last trusted hop.
        let junk = [("x-forwarded-for", "5.5.5.5, nonsense, 10.7.7.7")];
        assert_eq!(c.extract(&parts("10.0.0.1:1", &junk)).unwrap(), "10.7.7.7");
        // A line that is not text is one unparsable hop.
        let mut binary = parts("10.0.0.1:1", &[("x-forwarded-for", "5.5.5.5")]);
        for line in [&b"\xff"[..], b"10.7.7.7"] {
            let value = http::HeaderValue::from_bytes(line).unwrap();
            binary.headers.append("x-forwarded-for", value);
        }
        assert_eq!(c.extract(&binary).unwrap(), "10.7.7.7");
        // Ports and brackets as some proxies write them.
        let ported = [("x-forwarded-for", "[2001:db8:1:2::9]:443, 7.7.7.7:80")];
        assert_eq!(c.extract(&parts("10.0.0.1:1", &ported)).unwrap(), "7.7.7.7");
        // The other header is ignored when X-Forwarded-For is configured.
        let other = [("forwarded", "for=8.8.8.8")];
        assert_eq!(c.extract(&parts("10.0.0.1:1", &other)).unwrap(), "10.0.0.1");
    }

    #[test]
    fn rfc7239_forwarded_is_parsed_with_quotes_ports_and_obfuscation() {
        let c = trusted().header(ForwardedHeader::Forwarded);
        let h = [(
            "forwarded",
            r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711", for=10.1.1.1"#,
        )];
        assert_eq!(
            c.extract(&parts("10.0.0.1:1", &h)).unwrap(),
            "2001:db8:cafe::/64"
        );
        let quoted = [("forwarded", r#"for="a,b;c", for=198.51.100.1"#)];
        assert_eq!(
            c.extract(&parts("10.0.0.1:1", &quoted)).unwrap(),
            "198.51.100.1"
        );
        let hidden = [("forwarded", "for=192.0.2.1, for=_hidden, for=10.5.5.5")];
        assert_eq!(
            c.extract(&parts("10.0.0.1:1", &hidden)).unwrap(),
            "10.5.5.5"
        );
    }

    #[test]
    fn ipv6_is_keyed_by_prefix_and_mapped_ipv4_as_ipv4() {
        let p = PeerIp::new();
        let ip: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        assert_eq!(p.key_of(ip), "2001:db8:1:2::/64");
        assert_eq!(p.ipv6_prefix(48).key_of(ip), "2001:db8:1::/48");
        assert_eq!(p.ipv6_prefix(128).key_of(ip), "2001:db8:1:2:aaaa::1");
        assert_eq!(p.ipv6_prefix(0).key_of(ip), "::/0");
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(p.key_of(mapped), "192.0.2.7");
        assert_eq!(p.ipv4_prefix(24).key_of(mapped), "192.0.2.0/24");
        // A trusted IPv4 network matches a mapped peer address.
        let c = trusted();
        assert!(c.is_trusted("::ffff:10.0.0.1".parse().unwrap()));
        assert!(c.is_trusted("2001:db8:ffff:1::1".parse().unwrap()));
    }

    proptest! {
        #[test]
        fn ipv4_keys_are_the_dotted_quad(bits in any::<u32>()) {
            let ip = Ipv4Addr::from(bits);
            prop_assert_eq!(PeerIp::new().key_of(IpAddr::V4(ip)), ip.to_string());
        }

        #[test]
        fn ip_text_is_what_display_writes(v4 in any::<u32>(), v6 in any::<u128>(), low in any::<u32>()) {
            for ip in [
                IpAddr::V4(Ipv4Addr::from(v4)),
                IpAddr::V6(Ipv6Addr::from(v6)),
                // Mapped and compatible forms, written with a dotted quad.
                IpAddr::V6(Ipv6Addr::from(0xffff_0000_0000 | u128::from(low))),
                IpAddr::V6(Ipv6Addr::from(u128::from(low))),
                IpAddr::V6(Ipv6Addr::from(u128::MAX)),
            ] {
                let text = IpText::new(ip);
                let display = ip.to_string();
                prop_assert_eq!(text.as_bytes(), display.as_bytes());
            }
        }
    }

    #[test]
    fn a_missing_peer_address_is_a_server_error() {
        let parts = http::Request::new(()).into_parts().0;
        assert_eq!(PeerIp::new().extract(&parts).unwrap_err().status, 500);
    }

    proptest! {
        #[test]
        fn any_header_value_is_handled_without_panicking(value in "[ -~]{0,80}") {
            for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
                let c = ClientIp::new(["0.0.0.0/0".parse().unwrap()]).header(header);
                let p = parts("10.0.0.1:1", &[("x-forwarded-for", &value), ("forwarded", &value)]);
                prop_assert!(c.extract(&p).is_ok());
            }
        }

        #[test]
        fn the_client_is_the_rightmost_untrusted_hop(
            chain in proptest::collection::vec((any::<bool>(), any::<u16>()), 0..8),
            peer_trusted in any::<bool>(),
        ) {
            // Trusted hops are 10.x.y.1, untrusted ones 172.x.y.1 (10/8 is trusted).
            let addr = |(trusted, n): (bool, u16)| {
                let [a, b] = n.to_be_bytes();
                Ipv4Addr::new(if trusted { 10 } else { 172 }, a, b, 1)
            };
            let peer = addr((peer_trusted, 7));
            let header = chain.iter().map(|&h| addr(h).to_string()).collect::<Vec<_>>().join(", ");
            let p = parts(&format!("{peer}:1"), &[("x-forwarded-for", &header)]);
            let expected = if !peer_trusted {
                peer
            } else {
                chain.iter().rev().find(|(t, _)| !t).or(chain.first()).map_or(peer, |&h| addr(h))
            };
            prop_assert_eq!(trusted().client_ip(&p).unwrap(), IpAddr::V4(expected));
        }
    }
}
