//! Loopback ports without "find a free port, release it, hope": a port held closed for as long
//! as a test needs nothing to answer there, and candidate ports for child processes that must
//! bind a port themselves and say when it is taken (the caller retries with another).
//!
//! In-process servers never need either: they bind port 0 and hand the listener over.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::Mutex;

/// A loopback port that is bound but not listening: a connection to it is refused at once,
/// and no other socket can take the port while this value lives. For "a Redis / an upstream
/// that is not there".
#[derive(Debug)]
pub struct ClosedPort {
    /// The bound socket (never listening); dropping it frees the port.
    _socket: tokio::net::TcpSocket,
    /// Its address on 127.0.0.1.
    addr: SocketAddr,
}

impl ClosedPort {
    /// Binds a socket to 127.0.0.1:0 and holds it without listening.
    pub fn new() -> ClosedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind 127.0.0.1:0");
        let addr = socket.local_addr().expect("the bound address");
        ClosedPort {
            _socket: socket,
            addr,
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Default for ClosedPort {
    fn default() -> Self {
        ClosedPort::new()
    }
}

/// The range candidates come from: below Linux's ephemeral range (32768–60999), so a port the
/// system gives to a listener on port 0 or to an outgoing connection is never one of them,
/// and low enough that `port + 10000` (a Redis Cluster node's bus port) is below it too.
const CANDIDATES: std::ops::Range<u16> = 20_000..22_768;

/// A loopback port for a child process to bind itself, different from every other candidate
/// this process handed out. Another program may still hold it: the child must report that
/// (e.g. `Address already in use`) and the caller then asks for another candidate, a bounded
/// number of times.
pub fn candidate_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    let span = u64::from(CANDIDATES.end - CANDIDATES.start);
    assert!(
        (given.len() as u64) < span,
        "every candidate port was handed out"
    );
    let state = RandomState::new();
    let mut draw = state.hash_one((std::process::id(), given.len()));
    loop {
        let port = CANDIDATES.start + (draw % span) as u16;
        if given.insert(port) {
            return port;
        }
        draw = state.hash_one(draw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_port_refuses_connections() {
        let closed = ClosedPort::new();
        let refused = std::net::TcpStream::connect(closed.addr()).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn candidates_differ_and_stay_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..100).map(|_| candidate_port()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|p| CANDIDATES.contains(p)));
    }
}
