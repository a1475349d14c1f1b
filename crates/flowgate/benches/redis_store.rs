//! Redis store throughput, side by side in one run against one `redis-server` this benchmark
//! starts itself (on a free port, never 6379):
//!
//! * (a) a redis_rate-style GCRA script (go-redis/redis_rate's `allowN`), one `EVALSHA` per
//!   decision, from the same Rust client (redis-rs, one multiplexed connection);
//! * (b) `RedisStore` with GCRA; (c) with fixed_window and sliding_window (and the others).
//!
//! 64 concurrent callers on random keys out of 10,000 for `FLOWGATE_BENCH_SECS` (default 5)
//! seconds each. Reports decisions/s, p50/p99 latency, and Redis CPU per decision (from
//! `INFO cpu` deltas). Then replays (b) paced at half its maximum throughput for p99 there.
//!
//! `cargo bench -p flowgate --features redis --bench redis_store`
//!
//! Client and server share this machine's cores: on a 2-core box the client's own CPU use
//! limits what the server can show (see BENCHMARKS.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowgate::store::{Ask, RedisStore, Store};
use flowgate::{Algorithm, Quota};

const CALLERS: usize = 64;
const KEYS: u64 = 10_000;

/// go-redis/redis_rate v10's GCRA script, as redis_rate sends it (floating-point seconds).
const REDIS_RATE: &str = r#"
redis.replicate_commands()
local rate_limit_key = KEYS[1]
local burst = ARGV[1]
local rate = ARGV[2]
local period = ARGV[3]
local cost = tonumber(ARGV[4])
local emission_interval = period / rate
local increment = emission_interval * cost
local burst_offset = emission_interval * burst
local jan_1_2017 = 1483228800
local now = redis.call("TIME")
now = (now[1] - jan_1_2017) + (now[2] / 1000000)
local tat = redis.call("GET", rate_limit_key)
if not tat then
  tat = now
else
  tat = tonumber(tat)
end
tat = math.max(tat, now)
local new_tat = tat + increment
local allow_at = new_tat - burst_offset
local diff = now - allow_at
local remaining = diff / emission_interval
if remaining < 0 then
  local reset_after = tat - now
  local retry_after = diff * -1
  return {0, 0, tostring(retry_after), tostring(reset_after)}
end
local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", rate_limit_key, new_tat, "EX", math.ceil(reset_after))
end
local retry_after = -1
return {cost, remaining, tostring(retry_after), tostring(reset_after)}
"#;

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // FLOWGATE_BENCH_REDIS_CPU=N pins the server to CPU N (with `taskset`), so that it does
        // not compete with the client for a core (run the bench itself under `taskset -c M`).
        let mut command = match std::env::var("FLOWGATE_BENCH_REDIS_CPU") {
            Ok(cpu) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpu, "redis-server"]);
                c
            }
            Err(_) => Command::new("redis-server"),
        };
        let child = command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let server = Server { child, port };
        for _ in 0..500 {
            if let Ok(mut c) = redis::Client::open(server.url()).and_then(|c| c.get_connection())
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return server;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not start");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `EVALSHA` calls and the µs Redis spent executing them so far (`INFO commandstats`).
    fn evalsha(&self) -> (f64, f64) {
        let mut c = redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut c)
            .unwrap();
        let Some(line) = info.lines().find(|l| l.starts_with("cmdstat_evalsha:")) else {
            return (0.0, 0.0);
        };
        let field = |name: &str| -> f64 {
            line.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                .unwrap_or(0.0)
        };
        (field("calls"), field("usec"))
    }

    /// Redis's CPU seconds (user + sys) so far.
    fn cpu(&self) -> f64 {
        let mut c = redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let info: String = redis::cmd("INFO").arg("cpu").query(&mut c).unwrap();
        info.lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k == "used_cpu_user" || k == "used_cpu_sys")
                    .then(|| v.trim().parse::<f64>().ok())?
            })
            .sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// One caller's work: a decision for a random key; returns whether it was allowed.
type Decide = Arc<dyn Fn(u64) -> BoxFuture<bool> + Send + Sync>;

/// This process's CPU time (user + system) so far, from `/proc/self/stat` (Linux; zero
/// elsewhere).
fn own_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map_or(vec![], |(_, rest)| rest.split(' ').collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime, in clock ticks of 10 ms.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

struct Outcome {
    decisions: u64,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    redis_cpu_per_decision: Duration,
    /// This process's (the client's) CPU per decision.
    client_cpu_per_decision: Duration,
    /// Decisions per `EVALSHA` call.
    per_call: f64,
    /// Redis's time executing `EVALSHA` per decision (`INFO commandstats`).
    script_per_decision: Duration,
}

/// Runs `decide` from `CALLERS` tasks for `secs`; with `pace`, each caller waits for its next
/// slot so that all together issue `pace` decisions per second.
async fn run(server: &Server, decide: Decide, secs: f64, pace: Option<f64>) -> Outcome {
    let cpu0 = server.cpu();
    let (calls0, usec0) = server.evalsha();
    let own0 = own_cpu();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let decide = decide.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(100_000);
            let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (caller as u64 + 1);
            let gap = pace.map(|p| Duration::from_secs_f64(CALLERS as f64 / p));
            let mut next = Instant::now()
                + gap.map_or(Duration::ZERO, |g| {
                    g.mul_f64(caller as f64 / CALLERS as f64)
                });
            loop {
                if let Some(gap) = gap {
                    tokio::time::sleep_until(next.into()).await;
                    next += gap;
                }
                let t = Instant::now();
                if t >= until {
                    break;
                }
                // xorshift: a cheap random key
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                decide(seed % KEYS).await;
                latencies.push(t.elapsed().as_nanos() as u64);
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = server.cpu() - cpu0;
    let (calls1, usec1) = server.evalsha();
    let own = own_cpu() - own0;
    all.sort_unstable();
    let at = |q: f64| Duration::from_nanos(all[((all.len() - 1) as f64 * q) as usize]);
    Outcome {
        decisions: all.len() as u64,
        per_sec: all.len() as f64 / elapsed,
        p50: at(0.50),
        p99: at(0.99),
        redis_cpu_per_decision: Duration::from_secs_f64(cpu / all.len() as f64),
        client_cpu_per_decision: own / all.len() as u32,
        per_call: all.len() as f64 / (calls1 - calls0).max(1.0),
        script_per_decision: Duration::from_secs_f64((usec1 - usec0) / 1e6 / all.len() as f64),
    }
}

fn report(name: &str, o: &Outcome, baseline: Option<f64>) {
    let ratio = baseline.map_or(String::new(), |b| format!("{:>6.2}×", o.per_sec / b));
    println!(
        "{name:<52} {:>8.0}/s {ratio:>7} p50 {:>7.1?} p99 {:>7.1?} | CPU per decision: Redis {:>5.2} µs (script {:>5.2}), client {:>5.2} µs | {:>5.1} decisions/EVALSHA ({} decisions)",
        o.per_sec,
        o.p50,
        o.p99,
        o.redis_cpu_per_decision.as_secs_f64() * 1e6,
        o.script_per_decision.as_secs_f64() * 1e6,
        o.client_cpu_per_decision.as_secs_f64() * 1e6,
        o.per_call,
        o.decisions
    );
}

fn main() {
    let secs: f64 = std::env::var("FLOWGATE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let threads: usize = std::env::var("FLOWGATE_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let server = Server::start();
    println!(
        "redis-server {} on port {}, {CALLERS} callers, {KEYS} keys, {secs} s each, {threads} client threads",
        String::from_utf8_lossy(
            &Command::new("redis-server")
                .arg("--version")
                .output()
                .unwrap()
                .stdout
        )
        .trim(),
        server.port
    );
    rt.block_on(async {
        // (a) redis_rate-style, one EVALSHA per decision.
        let client = redis::Client::open(server.url()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let script = redis::Script::new(REDIS_RATE);
        let sha = script.get_hash().to_owned();
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(REDIS_RATE)
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        let per_call: Decide = Arc::new(move |k| {
            let mut conn = conn.clone();
            let sha = sha.clone();
            Box::pin(async move {
                let reply: (i64, f64, String, String) = redis::cmd("EVALSHA")
                    .arg(&sha)
                    .arg(1)
                    .arg(format!("rr:{k}"))
                    .arg(1000) // burst
                    .arg(1000) // rate
                    .arg(1) // period, seconds
                    .arg(1) // cost
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                reply.0 > 0
            })
        });
        let in_flight: usize = std::env::var("FLOWGATE_BENCH_IN_FLIGHT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2);
        let store = RedisStore::builder(server.url())
            .timeout(Duration::from_secs(5))
            .max_in_flight(in_flight)
            .connect()
            .await
            .unwrap();
        let mut scenarios: Vec<(String, Decide)> = vec![(
            "(a) redis_rate-style GCRA, EVALSHA per call".to_owned(),
            per_call,
        )];
        for algorithm in Algorithm::ALL {
            let quota = Quota::per_second(1000)
                .with_algorithm(algorithm)
                .unwrap();
            let store = store.clone();
            let decide: Decide = Arc::new(move |k| {
                let store = store.clone();
                Box::pin(async move {
                    let key = format!("k:{k}");
                    store.check(Ask::new(&key, &quota)).await.unwrap().allowed
                })
            });
            let label = match algorithm {
                Algorithm::Gcra => "(b) RedisStore gcra, batched".to_owned(),
                a => format!("(c) RedisStore {a}, batched"),
            };
            scenarios.push((label, decide));
        }
        // Warm up connections, scripts and keys.
        for (_, decide) in &scenarios {
            run(&server, decide.clone(), 1.0, None).await;
        }
        // Rounds of every scenario back to back, so that the machine's noise hits all alike;
        // each round's ratios are against that round's (a).
        let rounds: usize = std::env::var("FLOWGATE_BENCH_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3);
        let mut results: Vec<Vec<Outcome>> = scenarios.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            for (i, (name, decide)) in scenarios.iter().enumerate() {
                let o = run(&server, decide.clone(), secs, None).await;
                let baseline = (i > 0).then(|| results[0][round].per_sec);
                report(&format!("round {round} {name}"), &o, baseline);
                results[i].push(o);
            }
        }
        println!("\nmedians over {rounds} rounds:");
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        for (i, (name, _)) in scenarios.iter().enumerate() {
            let r = &results[i];
            let ratio = median(
                r.iter()
                    .zip(&results[0])
                    .map(|(o, a)| o.per_sec / a.per_sec)
                    .collect(),
            );
            println!(
                "{name:<44} {:>8.0}/s {:>6.2}× p50 {:>7.1?} p99 {:>7.1?} | CPU per decision: Redis {:>5.2} µs (script {:>5.2}), client {:>5.2} µs | {:>5.1} decisions/EVALSHA",
                median(r.iter().map(|o| o.per_sec).collect()),
                ratio,
                Duration::from_secs_f64(median(r.iter().map(|o| o.p50.as_secs_f64()).collect())),
                Duration::from_secs_f64(median(r.iter().map(|o| o.p99.as_secs_f64()).collect())),
                median(r.iter().map(|o| o.redis_cpu_per_decision.as_secs_f64() * 1e6).collect()),
                median(r.iter().map(|o| o.script_per_decision.as_secs_f64() * 1e6).collect()),
                median(r.iter().map(|o| o.client_cpu_per_decision.as_secs_f64() * 1e6).collect()),
                median(r.iter().map(|o| o.per_call).collect()),
            );
        }
        // Latency at half of (b)'s maximum, paced.
        let max_b = median(results[1].iter().map(|o| o.per_sec).collect());
        let half = run(&server, scenarios[1].1.clone(), secs, Some(max_b / 2.0)).await;
        report(
            &format!("(b) gcra paced at half its max ({:.0}/s)", max_b / 2.0),
            &half,
            None,
        );
    });
}
