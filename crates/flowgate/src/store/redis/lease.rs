//! [`RedisLeases`]: [leases](crate::lease) in Redis or Redis Cluster, shared by every instance
//! on the same server and prefix.
//!
//! A key's leases are one sorted set, `{prefix}lease:{<key>}` (the key inside a hash tag: one
//! cluster slot), member = the lease id, score = its expiry in microseconds. One script
//! (`lease.lua`) does every operation atomically on the Redis server's `TIME` (or the store's
//! injected clock): it drops expired leases first, so a crashed holder's lease stops counting
//! when it expires, and keeps the key only until its last lease expires.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::RedisStore;
use super::conn::Connection;
use super::script::{Script, malformed};
use crate::clock::Clock;
use crate::lease::{Acquired, LeaseId, Leases, Terms};
use crate::store::{BoxFuture, StoreError};

fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let source = include_str!("lease.lua");
        Script {
            sha: redis::Script::new(source).get_hash().to_owned(),
            source: source.to_owned(),
        }
    })
}

/// [Leases](crate::lease) on a [`RedisStore`]'s connection, prefix, timeout and clock
/// ([`RedisStore::leases`]). Cheap to clone.
#[derive(Clone)]
pub struct RedisLeases {
    conn: Connection,
    prefix: String,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RedisLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeases")
            .field("conn", &self.conn)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// [Leases](crate::lease) on this store's Redis (same connection, key prefix, per-call
    /// timeout and clock).
    pub fn leases(&self) -> RedisLeases {
        RedisLeases {
            conn: self.inner.conn.clone(),
            prefix: self.inner.prefix.clone(),
            timeout: self.inner.timeout,
            clock: self.inner.clock.clone(),
        }
    }
}

/// What the script was asked to do.
#[derive(Clone, Copy)]
enum Op {
    Acquire,
    Renew,
    Release,
    Held,
}

impl RedisLeases {
    /// Runs the script for `op` on `key`: (done, held, microseconds).
    async fn run(
        &self,
        key: &str,
        op: Op,
        id: Option<LeaseId>,
        terms: Option<&Terms>,
    ) -> Result<(bool, u64, u64), StoreError> {
        let keys = [super::tagged_key(&self.prefix, "lease", key, None)];
        let op = match op {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
            Op::Held => "held",
        };
        let now = self
            .clock
            .as_ref()
            .map_or_else(String::new, |c| (c.now() / 1000).to_string());
        let args = [
            now,
            op.to_owned(),
            id.map_or_else(String::new, |id| id.to_string()),
            terms.map_or(0, Terms::limit).to_string(),
            terms.map_or(0, |t| t.ttl().as_micros() as u64).to_string(),
        ];
        let reply = tokio::time::timeout(self.timeout, self.conn.eval(script(), &keys, &args, &[]))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        match reply[..] {
            [done, held, micros] if held >= 0 && micros >= 0 => {
                Ok((done == 1, held as u64, micros as u64))
            }
            _ => Err(malformed()),
        }
    }
}

impl Leases for RedisLeases {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        terms: &'a Terms,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        Box::pin(async move {
            let id = LeaseId::random();
            let (granted, held, micros) = self.run(key, Op::Acquire, Some(id), Some(terms)).await?;
            Ok(if granted {
                Acquired::Granted {
                    id,
                    expires_in: Duration::from_micros(micros),
                    held,
                }
            } else {
                Acquired::Full {
                    held,
                    retry_after: Duration::from_micros(micros),
                }
            })
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        id: LeaseId,
        terms: &'a Terms,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.run(key, Op::Renew, Some(id), Some(terms)).await?.0) })
    }

    fn release<'a>(&'a self, key: &'a str, id: LeaseId) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.run(key, Op::Release, Some(id), None).await?.0) })
    }

    fn held<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move { Ok(self.run(key, Op::Held, None, None).await?.1) })
    }
}
