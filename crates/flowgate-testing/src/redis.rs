//! Real `redis-server` processes for tests: single servers and Redis Clusters on free loopback
//! ports, in their own temporary directories, killed (SIGKILL) when dropped. They never touch
//! a Redis the test did not start.
//!
//! When `redis-server` is not on `PATH`, [`RedisServer::start`] and [`RedisCluster::start`]
//! return `None` after printing a loud message, so the test can return early — unless
//! `FLOWGATE_REQUIRE_REDIS=1` (set by CI), which makes them panic instead.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Whether `redis-server` can be run; panics when it cannot but is required.
fn available(what: &str) -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("FLOWGATE_REQUIRE_REDIS").as_deref() == Ok("1") {
            panic!("{what}: redis-server is not on PATH but FLOWGATE_REQUIRE_REDIS=1");
        }
        eprintln!(
            "\n!!!!!!!! SKIPPED {what}: redis-server is not on PATH (install redis-server; set FLOWGATE_REQUIRE_REDIS=1 to make this an error) !!!!!!!!\n"
        );
    }
    found
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn scratch_dir(port: u16) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "flowgate-redis-{}-{}-{port}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Waits until `port` answers `PING`, for at most `within`.
fn wait_ready(port: u16, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let pong = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .ok()
            .and_then(|client| {
                client
                    .get_connection_with_timeout(Duration::from_millis(200))
                    .ok()
            })
            .is_some_and(|mut conn| redis::cmd("PING").query::<String>(&mut conn).is_ok());
        if pong {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    /// The running process; `None` while killed.
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its working directory (node config for cluster nodes).
    dir: PathBuf,
    /// Extra arguments it was started with (kept for restarts).
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port, or returns `None` (after a loud message) when
    /// `redis-server` is missing and not required. `what` names the test for that message.
    pub fn start(what: &str) -> Option<RedisServer> {
        Self::start_with(what, &[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments.
    pub fn start_with(what: &str, extra: &[&str]) -> Option<RedisServer> {
        if !available(what) {
            return None;
        }
        for _ in 0..5 {
            let port = free_port();
            let mut server = RedisServer {
                child: None,
                port,
                dir: scratch_dir(port),
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            };
            if server.spawn() {
                return Some(server);
            }
        }
        panic!("{what}: could not start redis-server on a free port");
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        if wait_ready(self.port, Duration::from_secs(5)) {
            return true;
        }
        self.kill();
        false
    }

    /// The value it was started with for the argument `name` (e.g. `--tls-port`).
    pub fn arg(&self, name: &str) -> Option<&str> {
        let at = self.extra.iter().position(|a| a == name)?;
        self.extra.get(at + 1).map(String::as_str)
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the process with SIGKILL and waits for it: nothing is flushed or saved.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart a killed server only");
        assert!(
            self.spawn(),
            "redis-server did not come back on port {}",
            self.port
        );
    }

    /// A synchronous connection, for checking state from the test.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connect to the test's redis-server")
    }

    /// Runs `redis-cli -p PORT args…` and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of real `redis-server` processes, created with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    /// Every node, masters first.
    pub nodes: Vec<RedisServer>,
    /// How many of `nodes` were created as masters.
    pub masters: usize,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits until the cluster is
    /// up, or returns `None` when `redis-server` is missing and not required.
    pub fn start(what: &str, masters: usize, replicas: usize) -> Option<RedisCluster> {
        Self::start_with(what, masters, replicas, Vec::new)
    }

    /// Like [`start`](Self::start), each node also given the arguments `extra()` returns
    /// (called once per node).
    pub fn start_with(
        what: &str,
        masters: usize,
        replicas: usize,
        extra: impl Fn() -> Vec<String>,
    ) -> Option<RedisCluster> {
        if !available(what) {
            return None;
        }
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            let more = extra();
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "1000",
                "--cluster-config-file",
                "nodes.conf",
                // Replicas sync at once (Redis 7 waits 5 s for more replicas by default).
                "--repl-diskless-sync-delay",
                "0",
            ];
            args.extend(more.iter().map(String::as_str));
            let node = RedisServer::start_with(what, &args)?;
            nodes.push(node);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "{what}: redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes, masters };
        cluster.wait_ok(Duration::from_secs(20));
        Some(cluster)
    }

    /// Waits until every live node reports `cluster_state:ok` and agrees on the slots, and
    /// every replica is in sync with its master.
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let replication = n.cli(&["info", "replication"]);
                n.cli(&["cluster", "info"]).contains("cluster_state:ok")
                    && n.cli(&["--cluster", "check", &format!("127.0.0.1:{}", n.port)])
                        .contains("[OK] All 16384 slots covered")
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://` URLs of every node, for the cluster client's seed list.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node currently serving `key` as master (by asking `CLUSTER NODES`). Right after a
    /// migration or failover the node asked may not have every update yet, or may suspect a
    /// busy master (`fail?`); it is asked again, for up to 5 s, until one master serves the slot.
    pub fn master_of(&self, key: &str) -> usize {
        let live = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node");
        let slot: u16 = live
            .cli(&["cluster", "keyslot", key])
            .trim()
            .parse()
            .expect("keyslot");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let listing = live.cli(&["cluster", "nodes"]);
            if let Some(port) = master_port_of(&listing, slot) {
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port == port)
                    .expect("a node of this cluster");
            }
            if Instant::now() > deadline {
                panic!("no master serves slot {slot}:\n{listing}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node ID of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        self.nodes[i].cli(&["cluster", "myid"]).trim().to_owned()
    }
}

/// The port of the master that serves `slot` in a `CLUSTER NODES` listing: a master not
/// marked failed (`fail`; a mere suspicion, `fail?`, still serves) whose ranges hold the slot.
fn master_port_of(listing: &str, slot: u16) -> Option<u16> {
    listing.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags: Vec<&str> = fields.get(2)?.split(',').collect();
        if fields.len() < 9 || !flags.contains(&"master") || flags.contains(&"fail") {
            return None;
        }
        let serves = fields[8..].iter().any(|range| match range.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u16, u16) = (a.parse().unwrap_or(1), b.parse().unwrap_or(0));
                (a..=b).contains(&slot)
            }
            None => range.parse::<u16>().ok() == Some(slot),
        });
        if !serves {
            return None;
        }
        fields[1].split(['@', ':']).nth(1)?.parse().ok()
    })
}

/// Whether `port` accepts connections.
pub fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}
