//! Listing the counters in Redis ([`ListKeys`] for [`RedisStore`]): `SCAN` with `MATCH` and
//! `COUNT`, never `KEYS`; on a Redis Cluster, every master in turn.
//!
//! The cursor is `{slot}.{scan cursor}`: the master serving `slot` (a single server: `0`) and
//! where its `SCAN` stands. Masters are taken in the order of the lowest slot each serves,
//! read from `CLUSTER SLOTS` on every page, so a page continues with the master that serves
//! the slot, whichever node that is now. `SCAN`'s guarantee — every key present the whole
//! time is returned at least once — holds on each master while the cluster's slots stay
//! where they are; a key whose slot moves, or whose master fails over, during a listing may
//! be missed or returned twice.
//!
//! A page runs at most [`MAX_SCANS`] `SCAN`s of `COUNT` the names still wanted, and stops
//! once it has `limit` names (a `SCAN` may return a few more than its `COUNT`).

use std::time::Duration;

use redis::Value;

use super::RedisStore;
use super::conn::convert;
use crate::quota::Algorithm;
use crate::store::list::{self, KeyPage, ListError, ListKeys};
use crate::store::{BoxFuture, StoreError};

/// The most `SCAN` calls one page makes.
pub const MAX_SCANS: usize = 16;

/// The least time one `SCAN` (or `CLUSTER SLOTS`) is given, whatever the store's timeout.
const MIN_SCAN_TIMEOUT: Duration = Duration::from_secs(1);

impl ListKeys for RedisStore {
    fn list_keys<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<KeyPage, ListError>> {
        Box::pin(self.list_page(prefix, cursor, list::clamp(limit)))
    }
}

/// `text` with the characters a `SCAN` pattern gives a meaning (`*`, `?`, `[`, `]`, `\`)
/// escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A cursor: the slot whose master is being scanned and where its scan stands.
fn parse_cursor(cursor: &str) -> Option<(u16, u64)> {
    let (slot, scan) = cursor.split_once('.')?;
    let slot: u16 = slot.parse().ok()?;
    (slot < 16384).then_some(())?;
    Some((slot, scan.parse().ok()?))
}

impl RedisStore {
    async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<KeyPage, ListError> {
        let wrap = &self.inner.prefix;
        let pattern = format!("{}{{{}*", glob_escape(wrap), glob_escape(prefix));
        let masters = self.masters().await?;
        let (mut slot, mut scan) = match cursor {
            None => (masters[0], 0),
            Some(cursor) => parse_cursor(cursor).ok_or(ListError::Cursor)?,
        };
        let mut keys: Vec<String> = Vec::new();
        let mut next = None;
        for _ in 0..MAX_SCANS {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(scan)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(limit - keys.len());
            let reply = self.bounded(self.inner.conn.command_at(cmd, slot)).await?;
            let (after, found) = scan_reply(reply)?;
            for key in found {
                if let Some(name) = name_of(&key, wrap)
                    && !keys.iter().any(|k| k == name)
                {
                    keys.push(name.to_owned());
                }
            }
            if after == 0 {
                // This master is done: on to the next one, if any.
                match masters.iter().find(|&&s| s > slot) {
                    Some(&s) => (slot, scan) = (s, 0),
                    None => {
                        next = None;
                        break;
                    }
                }
            } else {
                scan = after;
            }
            next = Some(format!("{slot}.{scan}"));
            if keys.len() >= limit {
                break;
            }
        }
        Ok(KeyPage {
            keys,
            next,
            complete: true,
        })
    }

    /// `call` within the store's timeout (at least [`MIN_SCAN_TIMEOUT`]).
    async fn bounded(
        &self,
        call: impl Future<Output = Result<Value, StoreError>>,
    ) -> Result<Value, StoreError> {
        let timeout = self.inner.timeout.max(MIN_SCAN_TIMEOUT);
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(timeout))?
    }

    /// The lowest slot of every master, in order: `[0]` for a single server.
    async fn masters(&self) -> Result<Vec<u16>, StoreError> {
        if !self.inner.conn.is_cluster() {
            return Ok(vec![0]);
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = self.bounded(self.inner.conn.command(&cmd)).await?;
        let Value::Array(ranges) = reply else {
            return Err(unexpected("CLUSTER SLOTS"));
        };
        // Each range: [start, end, [host, port, id, …] (the master), replicas…].
        let mut masters: Vec<(Vec<u8>, i64, u16)> = Vec::new();
        for range in ranges {
            let Value::Array(range) = range else {
                return Err(unexpected("CLUSTER SLOTS"));
            };
            let (Some(Value::Int(start)), Some(Value::Array(node))) = (range.first(), range.get(2))
            else {
                return Err(unexpected("CLUSTER SLOTS"));
            };
            let host = match node.first() {
                Some(Value::BulkString(host)) => host.clone(),
                Some(Value::SimpleString(host)) => host.clone().into_bytes(),
                _ => return Err(unexpected("CLUSTER SLOTS")),
            };
            let Some(Value::Int(port)) = node.get(1) else {
                return Err(unexpected("CLUSTER SLOTS"));
            };
            let start = u16::try_from(*start).map_err(|_| unexpected("CLUSTER SLOTS"))?;
            match masters.iter_mut().find(|(h, p, _)| *h == host && p == port) {
                Some(master) => master.2 = master.2.min(start),
                None => masters.push((host, *port, start)),
            }
        }
        let mut slots: Vec<u16> = masters.into_iter().map(|(_, _, slot)| slot).collect();
        slots.sort_unstable();
        if slots.is_empty() {
            return Err(StoreError::Unavailable(
                "the Redis Cluster serves no slot".into(),
            ));
        }
        Ok(slots)
    }
}

/// The counter name in the Redis key `key` (`{prefix}{<name>}:{algorithm}`), if it is one.
fn name_of<'k>(key: &'k str, prefix: &str) -> Option<&'k str> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (name, algorithm) = rest.rsplit_once("}:")?;
    Algorithm::ALL
        .iter()
        .any(|a| a.name() == algorithm)
        .then_some(name)
}

/// A `SCAN` reply: the next cursor and the keys.
fn scan_reply(reply: Value) -> Result<(u64, Vec<String>), StoreError> {
    let Value::Array(mut parts) = reply else {
        return Err(unexpected("SCAN"));
    };
    if parts.len() != 2 {
        return Err(unexpected("SCAN"));
    }
    let keys = parts.pop();
    let cursor: u64 = redis::from_redis_value(parts.pop().unwrap_or(Value::Nil))
        .map_err(|e| convert(e.into()))?;
    let keys: Vec<Vec<u8>> =
        redis::from_redis_value(keys.unwrap_or(Value::Nil)).map_err(|e| convert(e.into()))?;
    // Names are UTF-8 (they are Rust strings); anything else is not a counter of ours.
    let keys = keys
        .into_iter()
        .filter_map(|k| String::from_utf8(k).ok())
        .collect();
    Ok((cursor, keys))
}

fn unexpected(command: &str) -> StoreError {
    StoreError::Backend(format!("unexpected reply to {command}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_patterns_and_cursors() {
        assert_eq!(glob_escape(r"a*b?[c]\d{e}"), r"a\*b\?\[c\]\\d{e}");
        assert_eq!(
            name_of("flowgate:{edge|ip=1#gcra:1:2:1}:gcra", "flowgate:"),
            Some("edge|ip=1#gcra:1:2:1")
        );
        // A name holding braces: the last `}:` ends it.
        assert_eq!(
            name_of("flowgate:{e|k=}:x}:fixed_window", "flowgate:"),
            Some("e|k=}:x")
        );
        assert_eq!(name_of("flowgate:lease:{x}", "flowgate:"), None);
        assert_eq!(name_of("flowgate:{x}:nope", "flowgate:"), None);
        assert_eq!(parse_cursor("5461.17"), Some((5461, 17)));
        for bad in ["", "1", "16384.0", "a.1", "1.b", "-1.0"] {
            assert_eq!(parse_cursor(bad), None, "{bad}");
        }
    }
}
