//! Addresses as the command line and the configuration files write them: where to listen
//! ([`ListenAddr`]: `--http`, `--grpc`, `--gateway`, `--websocket`, `gateway.listen`,
//! `websocket.listen`) and whose forwarding fields to believe ([`TrustedProxy`], [`Ipv6Prefix`]
//! and [`client_ip`]: `trusted_proxies` and `ipv6_prefix` of `gateway` and `websocket`).

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use flowgate::http::key::{ClientIp, PeerIp};
use ipnet::IpNet;

/// An address to listen on: `IP:PORT` (`127.0.0.1:8080`, `[::1]:8080`) or `HOST:PORT`
/// (`localhost:8080`). A host name is resolved once, when it is read; when it has several
/// addresses, Flowgate listens on the first one the system's resolver returns (`serve` logs
/// the others) — give an IP address to choose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    /// As written.
    written: String,
    /// The address listened on.
    addr: SocketAddr,
    /// The host name's other addresses, not listened on.
    others: Vec<SocketAddr>,
}

impl ListenAddr {
    /// The address to listen on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The host name's other addresses, which are not listened on (empty for an IP address).
    pub fn others(&self) -> &[SocketAddr] {
        &self.others
    }

    /// As written (`localhost:8080`).
    pub fn written(&self) -> &str {
        &self.written
    }
}

impl From<SocketAddr> for ListenAddr {
    fn from(addr: SocketAddr) -> Self {
        ListenAddr {
            written: addr.to_string(),
            addr,
            others: Vec::new(),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(addr.into());
        }
        let port_given = text
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_given {
            return Err(format!(
                "`{text}` is not an address; write HOST:PORT, e.g. `127.0.0.1:8080` or `localhost:8080`"
            ));
        }
        let mut resolved = text
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve `{text}`: {e}"))?;
        let addr = resolved
            .next()
            .ok_or_else(|| format!("`{text}` resolves to no address"))?;
        let mut others: Vec<SocketAddr> = resolved.filter(|a| *a != addr).collect();
        others.dedup();
        Ok(ListenAddr {
            written: text.to_owned(),
            addr,
            others,
        })
    }
}

impl fmt::Display for ListenAddr {
    /// The address listened on (and the name it came from, if any).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.written == self.addr.to_string() {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{} ({})", self.addr, self.written)
        }
    }
}

impl<'de> serde::Deserialize<'de> for ListenAddr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One entry of `trusted_proxies`: a network (`10.0.0.0/8`) or one address (`192.0.2.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrustedProxy(pub IpNet);

impl FromStr for TrustedProxy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        match (text.parse::<IpNet>(), text.parse::<IpAddr>()) {
            (Ok(net), _) => Ok(TrustedProxy(net)),
            (_, Ok(ip)) => Ok(TrustedProxy(IpNet::from(ip))),
            _ => Err(format!(
                "`{text}` is not a network or address; write e.g. `10.0.0.0/8` or `192.0.2.1`"
            )),
        }
    }
}

impl<'de> serde::Deserialize<'de> for TrustedProxy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `ipv6_prefix`: the prefix length IPv6 clients are keyed by (0–128; default 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Prefix(pub u8);

impl<'de> serde::Deserialize<'de> for Ipv6Prefix {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bits = u64::deserialize(deserializer)?;
        match u8::try_from(bits) {
            Ok(bits) if bits <= 128 => Ok(Ipv6Prefix(bits)),
            _ => Err(serde::de::Error::custom("must be between 0 and 128")),
        }
    }
}

/// How a section finds the client's address: the peer's, or behind one of `trusted` the
/// rightmost untrusted forwarding hop; IPv6 by `prefix`.
pub fn client_ip(trusted: &[TrustedProxy], prefix: Option<Ipv6Prefix>) -> ClientIp {
    let peer = match prefix {
        Some(Ipv6Prefix(bits)) => PeerIp::new().ipv6_prefix(bits),
        None => PeerIp::new(),
    };
    ClientIp::new(trusted.iter().map(|t| t.0)).peer_ip(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_ips_and_host_names() {
        let ip: ListenAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(ip.addr(), SocketAddr::from(([127, 0, 0, 1], 8080)));
        assert_eq!(ip.to_string(), "127.0.0.1:8080");
        let named: ListenAddr = "localhost:8080".parse().unwrap();
        assert!(named.addr().ip().is_loopback() && named.addr().port() == 8080);
        assert!(named.others().iter().all(|a| a.ip().is_loopback()));
        assert!(named.to_string().ends_with("(localhost:8080)"));
        for bad in [
            "localhost",
            "8080",
            ":8080",
            "localhost:http",
            "127.0.0.1:99999",
        ] {
            let error = bad.parse::<ListenAddr>().unwrap_err();
            assert!(error.contains("is not an address"), "{bad}: {error}");
        }
        assert!(
            "no-such-host.invalid:80"
                .parse::<ListenAddr>()
                .unwrap_err()
                .starts_with("cannot resolve `no-such-host.invalid:80`")
        );
    }

    #[test]
    fn trusted_proxies_are_networks_or_addresses() {
        assert_eq!(
            "10.0.0.0/8".parse::<TrustedProxy>().unwrap().0.to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            "192.0.2.1".parse::<TrustedProxy>().unwrap().0.to_string(),
            "192.0.2.1/32"
        );
        assert!("10.0.0.0/33".parse::<TrustedProxy>().is_err());
    }
}
