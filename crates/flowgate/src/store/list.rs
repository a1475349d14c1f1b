//! Listing the counters a store holds, a page at a time: [`ListKeys`], for the admin API's
//! usage listing and billing exports.
//!
//! A listing names counters by prefix (the one [key grammar](super::key): every counter of an
//! Envoy domain starts with the escaped domain and `|`), returns at most `limit` names a page
//! (at most [`MAX_PAGE`]) and an opaque cursor for the next page, and does a bounded amount of
//! work per call. Following the cursors from the first page to the last returns every counter
//! that existed (and, on the memory store, was named) the whole time at least once — the
//! guarantee of Redis's `SCAN`; a counter created or dropped meanwhile may or may not appear.
//! A page may hold fewer names than `limit`, even none, while more follow: only a page without
//! a cursor is the last.
//!
//! * [`MemoryStore`](super::MemoryStore) keeps only hashes of counter names, so it lists only
//!   with its names directory turned on ([`MemoryStoreBuilder::list_keys`](super::MemoryStoreBuilder::list_keys)):
//!   names in order, each once, the cursor the last name returned. A directory that had to
//!   drop names (it holds as many names as the store holds keys per algorithm) says so:
//!   [`KeyPage::complete`] is `false`.
//! * [`RedisStore`](super::RedisStore) runs `SCAN` with `MATCH` and `COUNT` (never `KEYS`),
//!   on a Redis Cluster on every master in turn.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use flowgate::store::list::ListKeys;
//! use flowgate::store::{Ask, MemoryStore, Store};
//! use flowgate::Quota;
//!
//! let store = MemoryStore::builder().list_keys(true).build();
//! let quota = Quota::per_minute(10);
//! for user in ["ann", "bob", "cy"] {
//!     store.check(Ask::new(&format!("api|user={user}"), &quota)).await?;
//! }
//! let first = store.list_keys("api|", None, 2).await?;
//! assert_eq!(first.keys, ["api|user=ann", "api|user=bob"]);
//! let second = store.list_keys("api|", first.next.as_deref(), 2).await?;
//! assert_eq!((second.keys.as_slice(), second.next), (&["api|user=cy".to_owned()][..], None));
//! # Ok(()) }
//! ```

use super::{BoxFuture, StoreError};

/// Names a page holds when the caller does not say.
pub const DEFAULT_PAGE: usize = 100;

/// The most names a page holds, whatever the caller asks.
pub const MAX_PAGE: usize = 1_000;

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeyPage {
    /// Counter names (as the front ends built them, without a store's own wrapping).
    pub keys: Vec<String>,
    /// The cursor of the next page; `None` on the last page.
    pub next: Option<String>,
    /// `false` when the store knows it may not name every counter it holds (a memory store
    /// whose names directory had to drop names).
    pub complete: bool,
}

impl KeyPage {
    /// A page of `keys`, followed by the page at `next` (`None`: the last page); `complete`:
    /// whether the store names every counter it holds.
    pub fn new(keys: Vec<String>, next: Option<String>, complete: bool) -> Self {
        KeyPage {
            keys,
            next,
            complete,
        }
    }
}

/// Why a listing failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ListError {
    /// The cursor is not one this store handed out.
    #[error("the cursor is not one this listing handed out")]
    Cursor,
    /// The store cannot list (a memory store without its names directory).
    #[error("this store does not list its counters: {0}")]
    Unsupported(&'static str),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A store whose counters can be listed (see the [module docs](self)).
pub trait ListKeys: Send + Sync {
    /// The page of counter names starting with `prefix` after `cursor` (`None`: the first
    /// page), at most `limit` of them (clamped to 1..=[`MAX_PAGE`]).
    fn list_keys<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<KeyPage, ListError>>;
}

impl<L: ListKeys + ?Sized> ListKeys for std::sync::Arc<L> {
    fn list_keys<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<KeyPage, ListError>> {
        (**self).list_keys(prefix, cursor, limit)
    }
}

/// `limit` within 1..=[`MAX_PAGE`].
pub(crate) fn clamp(limit: usize) -> usize {
    limit.clamp(1, MAX_PAGE)
}

/// `bytes` as lower-case hex: cursors that travel in a URL as they are.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The bytes of a [`hex`] string, if it is one.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_it_did_not_write() {
        let text = "edge|ip=10.0.0.1#gcra:1:2:3 é";
        assert_eq!(unhex(&hex(text.as_bytes())).unwrap(), text.as_bytes());
        for bad in ["a", "zz", "0g", "é1"] {
            assert_eq!(unhex(bad), None, "{bad}");
        }
        assert_eq!((clamp(0), clamp(5), clamp(1_000_000)), (1, 5, MAX_PAGE));
    }
}
