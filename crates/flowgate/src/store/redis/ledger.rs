//! [`RedisLedger`]: the RLQS [`Ledger`] in Redis or Redis Cluster, so that every Flowgate
//! instance on the same Redis hands out shares of one division per tick.
//!
//! A rule instance has three keys sharing one hash tag (one cluster slot):
//! `{prefix}rlqs:{rule}:m` (members → demand and when it was refreshed),
//! `…:d` (tick → division) and `…:c` (tick → join budget spent). Three scripts
//! (`rlqs_*.lua`) do the atomic parts: record demands and read or collect for the division,
//! store a division if none is, claim from the join budget. Time is the Redis server's
//! `TIME` (or the store's injected clock), so instances agree on ticks whatever their own
//! clocks say. Every key expires a few ticks after its last use.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::Value;

use super::RedisStore;
use super::conn::Connection;
use super::script::{Script, malformed};
use crate::clock::{Clock, Nanos};
use crate::rlqs::Member;
use crate::rlqs::ledger::{Claim, Claimed, Demand, Ledger, Synced, Timing};
use crate::store::{BoxFuture, StoreError};

/// The three scripts, built once per process.
fn scripts() -> &'static [Script; 3] {
    static SCRIPTS: OnceLock<[Script; 3]> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        [
            include_str!("rlqs_sync.lua"),
            include_str!("rlqs_publish.lua"),
            include_str!("rlqs_claim.lua"),
        ]
        .map(|source| Script {
            sha: redis::Script::new(source).get_hash().to_owned(),
            source: source.to_owned(),
        })
    })
}

/// The RLQS ledger on a [`RedisStore`]'s connection, prefix, timeout and clock
/// ([`RedisStore::quota_ledger`]). Cheap to clone.
#[derive(Clone)]
pub struct RedisLedger {
    conn: Connection,
    prefix: String,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger")
            .field("conn", &self.conn)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// The RLQS [`Ledger`] on this store's Redis (same connection, key prefix, per-call
    /// timeout and clock).
    pub fn quota_ledger(&self) -> RedisLedger {
        RedisLedger {
            conn: self.inner.conn.clone(),
            prefix: self.inner.prefix.clone(),
            timeout: self.inner.timeout,
            clock: self.inner.clock.clone(),
        }
    }
}

/// Microseconds, at least 1.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// An expiry in ms for keys used every `tick` and needed for `extra` beyond: at least a
/// second (Redis counts it in its own time, the ledger may run on an injected clock).
fn keep_ms(tick: Duration, extra: Duration) -> String {
    let ms = (tick * 3 + extra).as_millis().max(1000);
    ms.to_string()
}

fn text(value: &Value) -> Result<Option<String>, StoreError> {
    match value {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => String::from_utf8(bytes.clone())
            .map(Some)
            .map_err(|_| malformed()),
        Value::SimpleString(s) => Ok(Some(s.clone())),
        Value::VerbatimString { text, .. } => Ok(Some(text.clone())),
        _ => Err(malformed()),
    }
}

fn int(value: &Value) -> Result<i64, StoreError> {
    match value {
        Value::Int(i) => Ok(*i),
        _ => Err(malformed()),
    }
}

impl RedisLedger {
    /// The key of `part` (`m`, `d`, `c`) of `rule`.
    fn key(&self, rule: &str, part: &str) -> String {
        super::tagged_key(&self.prefix, "rlqs", rule, Some(part))
    }

    /// Now as the scripts take it: the injected clock's, in µs, or '' for the server's TIME.
    fn now_arg(&self) -> String {
        self.clock
            .as_ref()
            .map_or_else(String::new, |c| (c.now() / 1000).to_string())
    }

    async fn run(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, StoreError> {
        match tokio::time::timeout(self.timeout, self.conn.eval_value(script, keys, args, &[]))
            .await
        {
            Ok(reply) => reply,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

impl Ledger for RedisLedger {
    fn sync<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        demands: &'a [Demand<'a>],
        members: bool,
    ) -> BoxFuture<'a, Result<Synced, StoreError>> {
        Box::pin(async move {
            let keys = [
                self.key(rule, "m"),
                self.key(rule, "d"),
                self.key(rule, "c"),
            ];
            let mut args = Vec::with_capacity(5 + 2 * demands.len());
            args.push(self.now_arg());
            args.push(micros(timing.tick).to_string());
            args.push(micros(timing.stale_after).to_string());
            args.push(keep_ms(timing.tick, timing.stale_after));
            args.push(if members { "1" } else { "0" }.to_owned());
            for &(member, demand) in demands {
                args.push(member.to_owned());
                args.push(demand.map_or_else(|| "-".to_owned(), |d| d.to_string()));
            }
            let reply = self.run(&scripts()[0], &keys, &args).await?;
            let Value::Array(items) = reply else {
                return Err(malformed());
            };
            if items.len() < 5 || items.len() % 2 != 1 {
                return Err(malformed());
            }
            let number = |v: &Value| u64::try_from(int(v)?).map_err(|_| malformed());
            let now_us = number(&items[0])?;
            let mut listed = Vec::with_capacity((items.len() - 5) / 2);
            for pair in items[5..].chunks_exact(2) {
                let id = text(&pair[0])?.ok_or_else(malformed)?;
                let demand = text(&pair[1])?.ok_or_else(malformed)?;
                let demand = match demand.as_str() {
                    "-" => None,
                    d => Some(d.parse::<u64>().map_err(|_| malformed())?),
                };
                listed.push(Member::new(id, demand));
            }
            Ok(Synced {
                now: now_us.saturating_mul(1000) as Nanos,
                tick: number(&items[1])?,
                current: text(&items[2])?,
                previous: text(&items[3])?,
                claimed_before: number(&items[4])?,
                members: listed,
            })
        })
    }

    fn publish<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        tick: u64,
        division: &'a str,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            let keys = [self.key(rule, "d")];
            let args = [
                tick.to_string(),
                division.to_owned(),
                keep_ms(timing.tick, Duration::ZERO),
            ];
            let reply = self.run(&scripts()[1], &keys, &args).await?;
            text(&reply)?.ok_or_else(malformed)
        })
    }

    fn claim<'a>(
        &'a self,
        rule: &'a str,
        timing: &'a Timing,
        tick: u64,
        claim: &'a Claim,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        Box::pin(async move {
            let keys = [self.key(rule, "c")];
            let args = [
                self.now_arg(),
                micros(timing.tick).to_string(),
                tick.to_string(),
                claim.ask.to_string(),
                claim.fraction.to_string(),
                claim.burst.to_string(),
                claim.budget.to_string(),
                keep_ms(timing.tick, Duration::ZERO),
            ];
            match int(&self.run(&scripts()[2], &keys, &args).await?)? {
                -1 => Ok(Claimed::TickPassed),
                0 => Ok(Claimed::Exhausted),
                tokens if tokens > 0 => Ok(Claimed::Granted(tokens as u64)),
                _ => Err(malformed()),
            }
        })
    }

    fn remove<'a>(
        &'a self,
        rule: &'a str,
        members: &'a [&'a str],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if members.is_empty() {
                return Ok(());
            }
            let mut cmd = redis::cmd("HDEL");
            cmd.arg(self.key(rule, "m")).arg(members);
            match tokio::time::timeout(self.timeout, self.conn.command(&cmd)).await {
                Ok(reply) => reply.map(drop),
                Err(_) => Err(StoreError::Timeout(self.timeout)),
            }
        })
    }
}
