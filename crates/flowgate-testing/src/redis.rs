//! Real `redis-server` processes for tests: single servers and Redis Clusters on loopback, in
//! their own temporary directories, killed (SIGKILL) when dropped. They never touch a Redis the
//! test did not start.
//!
//! `redis-server` cannot listen on port 0 (that turns TCP off), so each is started on a
//! [`candidate_port`] and, when it reports the port taken (`Address already in use`, and exits),
//! on another; it counts as started when it says `Ready to accept connections`. Both are read
//! from its own log, never guessed from timing.
//!
//! When `redis-server` is not on `PATH`, [`RedisServer::start`] and [`RedisCluster::start`]
//! return `None` after printing a loud message, so the test can return early — unless
//! `FLOWGATE_REQUIRE_REDIS=1` (set by CI), which makes them panic instead.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::net::candidate_port;

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

/// How many candidate ports a server is tried on before the test gives up.
const TRIES: usize = 8;

/// How long `redis-server` may take to say it is ready (or why it is not).
const START: Duration = Duration::from_secs(30);

/// Why a `redis-server` did not start.
#[derive(Debug)]
enum NotStarted {
    /// It said one of its ports is taken: try others.
    PortTaken,
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    /// The running process; `None` while killed.
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its TLS port on 127.0.0.1, when started with [`start_tls`](Self::start_tls).
    pub tls_port: Option<u16>,
    /// Its working directory (node config for cluster nodes).
    dir: PathBuf,
    /// Extra arguments it was started with (kept for restarts).
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server, or returns `None` (after a loud message) when `redis-server` is
    /// missing and not required. `what` names the test for that message.
    pub fn start(what: &str) -> Option<RedisServer> {
        Self::start_with(what, &[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments.
    pub fn start_with(what: &str, extra: &[&str]) -> Option<RedisServer> {
        Self::launch(what, extra, false)
    }

    /// Like [`start_with`](Self::start_with), also listening for TLS on [`tls_port`](Self::tls_port)
    /// (`extra` gives the certificate files: `--tls-cert-file`, …).
    pub fn start_tls(what: &str, extra: &[&str]) -> Option<RedisServer> {
        Self::launch(what, extra, true)
    }

    /// Starts `redis-server` on candidate ports ([`candidate_port`]) until it does not report a
    /// port as taken (at most [`TRIES`] times).
    fn launch(what: &str, extra: &[&str], tls: bool) -> Option<RedisServer> {
        if !available(what) {
            return None;
        }
        for _ in 0..TRIES {
            let port = candidate_port();
            let mut server = RedisServer {
                child: None,
                port,
                tls_port: tls.then(candidate_port),
                dir: scratch_dir(port),
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            };
            match server.spawn() {
                Ok(()) => return Some(server),
                Err(NotStarted::PortTaken) => continue,
            }
        }
        panic!("{what}: redis-server found its port taken {TRIES} times");
    }

    /// Runs `redis-server` and waits for it to say it is ready — or that a port is taken (it
    /// exits then). Any other exit, or no word within [`START`], fails the test with its log.
    fn spawn(&mut self) -> Result<(), NotStarted> {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--logfile", ""])
            .arg("--dir")
            .arg(&self.dir);
        if let Some(tls_port) = self.tls_port {
            command.args(["--tls-port", &tls_port.to_string()]);
        }
        let mut child = command
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn redis-server");
        let lines = log_lines(&mut child);
        let deadline = Instant::now() + START;
        let mut log = String::new();
        let outcome = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    log.push_str(&line);
                    log.push('\n');
                    if line.contains("Ready to accept connections") {
                        break Ok(());
                    }
                    if line.contains("Address already in use") {
                        break Err(NotStarted::PortTaken);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = child.kill();
                    let status = child.wait();
                    panic!(
                        "redis-server on port {} exited ({status:?}) before it was ready:\n{log}",
                        self.port
                    );
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "redis-server on port {} was not ready within {START:?}:\n{log}",
                        self.port
                    );
                }
            }
        };
        match outcome {
            Ok(()) => {
                self.child = Some(child);
                Ok(())
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
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

    /// Starts the server again on the same ports (after [`kill`](Self::kill)). Its clients know
    /// these ports, so it cannot move: if another program took one meanwhile, the test fails
    /// saying so.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart a killed server only");
        if let Err(NotStarted::PortTaken) = self.spawn() {
            panic!(
                "port {} (or TLS port {:?}) was taken while its redis-server was down",
                self.port, self.tls_port
            );
        }
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

/// The lines `child` writes to stdout and stderr, as they come; the channel closes when both
/// end (the process exited). Both pipes are read to their end, so the process never blocks
/// on a full pipe; lines nobody waits for any more are dropped.
fn log_lines(child: &mut Child) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = child
        .stdout
        .take()
        .map(|s| Box::new(s) as Box<dyn Read + Send>);
    let stderr = child
        .stderr
        .take()
        .map(|s| Box::new(s) as Box<dyn Read + Send>);
    for stream in [stdout, stderr].into_iter().flatten() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                let _ = tx.send(line);
            }
        });
    }
    rx
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
        Self::create(what, masters, replicas, extra, false)
    }

    /// Like [`start_with`](Self::start_with), every node also listening for TLS
    /// ([`RedisServer::start_tls`]; with `--tls-cluster yes` in `extra()`, the cluster bus too).
    pub fn start_tls(
        what: &str,
        masters: usize,
        replicas: usize,
        extra: impl Fn() -> Vec<String>,
    ) -> Option<RedisCluster> {
        Self::create(what, masters, replicas, extra, true)
    }

    fn create(
        what: &str,
        masters: usize,
        replicas: usize,
        extra: impl Fn() -> Vec<String>,
        tls: bool,
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
            let node = RedisServer::launch(what, &args, tls)?;
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
