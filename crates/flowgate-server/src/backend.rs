//! Where the service counts: this process's memory (the embedded default), or a store shared by
//! several instances (Redis, Redis Cluster) behind the library's
//! [`FallbackStore`], which applies each rule's `fail` mode
//! (the mode travels with each request, [`Ask::fail`](flowgate::store::Ask::fail)).
//!
//! Redis URLs may hold a password: whatever the server says about them goes through
//! [`redact_url`] (a URL) or [`redact_redis_text`] (a message that may quote one).

use std::sync::Arc;
use std::time::Duration;

use flowgate::clock::{Clock, PreciseClock};
use flowgate::lease::{Leases, MemoryLeases};
use flowgate::local::TableStats;
use flowgate::rlqs::Ledger;
use flowgate::store::list::ListKeys;
use flowgate::store::{Ask, DynStore, FallbackStats, FallbackStore, MemoryStore, Store};
use flowgate::{FailMode, Quota};

/// The service's store: one [`DynStore`] that every request goes to, and — for a shared store
/// — the fallback wrapped around it, for health and metrics.
#[derive(Clone)]
pub struct Backend {
    /// What requests are checked in: the memory store, or the fallback store over a shared one.
    store: Arc<dyn DynStore>,
    /// The fallback store, when the counters are shared.
    shared: Option<Arc<FallbackStore<Arc<dyn DynStore>, PreciseClock>>>,
    /// The memory store's size and evictions, when the counters are in this process's memory
    /// store (for `/metrics`).
    memory: Option<Arc<dyn Fn() -> TableStats + Send + Sync>>,
    /// Where RLQS divisions are shared with other instances (the shared store's); `None`:
    /// this process only.
    quota_ledger: Option<Arc<dyn Ledger>>,
    /// Where in-flight leases are held (`/v1/leases`): this process's memory, or the shared
    /// store's.
    leases: Arc<dyn Leases>,
    /// What lists the counters (`GET /v1/keys/{domain}`), when the store can.
    lister: Option<Arc<dyn ListKeys>>,
    /// Whether this is [`Backend::default`]'s memory store, untouched: the server may rebuild
    /// it with its names directory on ([`Backend::listing`]).
    default_memory: bool,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("kind", &self.kind())
            .field("fallback", &self.fallback_stats())
            .finish()
    }
}

impl Default for Backend {
    /// The embedded in-memory store, on a precise clock: a decision in the service costs
    /// microseconds, so a time-stamp read per decision is noise, and the library's default
    /// clock would start a thread that wakes every millisecond (1.9 % of a pinned core while
    /// idle, preempting the worker on it).
    fn default() -> Self {
        Backend {
            default_memory: true,
            ..Backend::memory(Arc::new(
                MemoryStore::builder().clock(PreciseClock::new()).build(),
            ))
        }
    }
}

/// Leases in this process's memory, on a precise clock.
fn memory_leases() -> Arc<dyn Leases> {
    Arc::new(MemoryLeases::with_clock(PreciseClock::new()))
}

/// How a shared store falls back; see [`Backend::shared`].
#[derive(Debug, Clone, Copy)]
pub struct SharedOptions {
    /// The mode of rules that set no `fail` (default: [`FailMode::default()`], open).
    pub fail: FailMode,
    /// Service instances sharing the store: `fail: local` grants each `1 / instances` of a quota.
    pub instances: u64,
}

impl Default for SharedOptions {
    fn default() -> Self {
        SharedOptions {
            fail: FailMode::default(),
            instances: 1,
        }
    }
}

impl Backend {
    /// Counters in `store`, this process only (no fallback: the store is expected not to fail).
    pub fn local(store: Arc<dyn DynStore>) -> Self {
        Backend {
            store,
            shared: None,
            memory: None,
            quota_ledger: None,
            leases: memory_leases(),
            lister: None,
            default_memory: false,
        }
    }

    /// Counters in this process's memory store (bounded by its `max_keys` per algorithm),
    /// whose size and evictions `/metrics` reports.
    /// Its counters can be listed when the store keeps their names
    /// ([`MemoryStoreBuilder::list_keys`](flowgate::store::MemoryStoreBuilder::list_keys)).
    pub fn memory<C: Clock + 'static>(store: Arc<MemoryStore<C>>) -> Self {
        let stats = store.clone();
        Backend {
            lister: Some(store.clone()),
            store,
            shared: None,
            memory: Some(Arc::new(move || stats.stats())),
            quota_ledger: None,
            leases: memory_leases(),
            default_memory: false,
        }
    }

    /// The same backend, ready to list its counters: [`Backend::default`]'s memory store is
    /// rebuilt with its names directory on (before anything was counted in it); any other
    /// backend is returned as it is. The server calls this when the admin endpoints are on.
    pub fn listing(self) -> Self {
        if !self.default_memory {
            return self;
        }
        Backend::memory(Arc::new(
            MemoryStore::builder()
                .clock(PreciseClock::new())
                .list_keys(true)
                .build(),
        ))
    }

    /// The same backend, listing its counters through `lister` (the shared store itself,
    /// e.g. a [`RedisStore`](flowgate::store::RedisStore)).
    pub fn with_lister(mut self, lister: Arc<dyn ListKeys>) -> Self {
        self.lister = Some(lister);
        self
    }

    /// What lists the counters, if the store can.
    pub fn lister(&self) -> Option<&dyn ListKeys> {
        self.lister.as_deref()
    }

    /// Counters in `store`, shared with other instances, behind a breaker and `options`.
    pub fn shared(store: Arc<dyn DynStore>, options: SharedOptions) -> Self {
        let fallback = Arc::new(
            FallbackStore::builder(store)
                .clock(PreciseClock::new())
                .fail(options.fail)
                .instances(options.instances.max(1))
                .build(),
        );
        Backend {
            store: fallback.clone(),
            shared: Some(fallback),
            memory: None,
            quota_ledger: None,
            leases: memory_leases(),
            lister: None,
            default_memory: false,
        }
    }

    /// The same backend, sharing RLQS divisions through `ledger` (the shared store's:
    /// [`RedisStore::quota_ledger`](flowgate::store::RedisStore::quota_ledger)).
    pub fn with_quota_ledger(mut self, ledger: Arc<dyn Ledger>) -> Self {
        self.quota_ledger = Some(ledger);
        self
    }

    /// The same backend, holding in-flight leases in `leases` (the shared store's:
    /// [`RedisStore::leases`](flowgate::store::RedisStore::leases)).
    pub fn with_shared_leases(mut self, leases: Arc<dyn Leases>) -> Self {
        self.leases = leases;
        self
    }

    /// Where in-flight leases are held.
    pub fn leases(&self) -> &dyn Leases {
        &*self.leases
    }

    /// Where RLQS divisions are shared, when they are.
    pub fn quota_ledger(&self) -> Option<Arc<dyn Ledger>> {
        self.quota_ledger.clone()
    }

    /// The store every request is checked in.
    pub fn store(&self) -> &(dyn DynStore + 'static) {
        &*self.store
    }

    /// Whether the store itself (not its fallback) answers within `timeout`: a zero-cost peek
    /// of a probe key.
    pub async fn reachable(&self, timeout: Duration) -> bool {
        let quota = Quota::per_second(1);
        let store: &(dyn DynStore + 'static) = match &self.shared {
            Some(fallback) => &**fallback.inner(),
            None => &*self.store,
        };
        matches!(
            tokio::time::timeout(timeout, store.peek(Ask::new("flowgate:readyz", &quota))).await,
            Ok(Ok(_))
        )
    }

    /// The memory store's size and evictions, for counters in memory ([`Backend::memory`]).
    pub fn memory_stats(&self) -> Option<TableStats> {
        self.memory.as_ref().map(|stats| stats())
    }

    /// The fallback's counts, for a shared store.
    pub fn fallback_stats(&self) -> Option<FallbackStats> {
        self.shared.as_ref().map(|f| f.stats())
    }

    /// A short name for logs and `/readyz`: `local` or `shared`.
    pub fn kind(&self) -> &'static str {
        match self.shared {
            None => "local",
            Some(_) => "shared",
        }
    }
}

/// `url` without the secret part of its user information: `redis://:secret@host:6379` →
/// `redis://:***@host:6379`, `redis://app:pw@host` → `redis://app:***@host`, and a user
/// information without `:` (which may well be a password) whole: `redis://token@host` →
/// `redis://***@host`. The user information ends at the **last** `@`, so a password with
/// characters a URL cannot hold as they are (`#`, `/`, `?`, `@`, spaces: the URL then does not
/// parse) is hidden too; a string without `://` is read as starting with it. Unchanged when
/// there is no `@`.
pub fn redact_url(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let Some(at) = url[start..].rfind('@').map(|i| start + i) else {
        return url.to_owned();
    };
    let user = match url[start..at].find(':') {
        Some(colon) => &url[start..start + colon + 1],
        None => "",
    };
    format!("{}{user}***{}", &url[..start], &url[at..])
}

/// The passwords of `urls`, as written and percent-decoded (see [`redact_url`] for what counts).
fn passwords(urls: &[String]) -> Vec<String> {
    let mut secrets = Vec::new();
    for url in urls {
        let start = url.find("://").map_or(0, |i| i + 3);
        let Some(at) = url[start..].rfind('@').map(|i| start + i) else {
            continue;
        };
        let userinfo = &url[start..at];
        let password = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
        if password.is_empty() {
            continue;
        }
        let decoded = percent_encoding::percent_decode_str(password)
            .decode_utf8_lossy()
            .into_owned();
        secrets.push(password.to_owned());
        if decoded != password {
            secrets.push(decoded);
        }
    }
    // Longest first, so that a password containing another is replaced whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

/// `text` (an error from connecting to `urls`, say) with every secret of `urls` hidden: each
/// URL as [`redact_url`] shows it, the user information of any other URL it quotes (a cluster
/// node's), and any other occurrence of a password, as written or decoded, as `***`.
pub fn redact_redis_text(text: &str, urls: &[String]) -> String {
    let mut text = urls.iter().fold(text.to_owned(), |text, url| {
        text.replace(url.as_str(), &redact_url(url))
    });
    // Other URLs: each `://` with what surrounds it up to a separator.
    let separator = |c: char| c.is_whitespace() || ",\"'()<>".contains(c);
    let mut from = 0;
    while let Some(found) = text[from..].find("://").map(|i| from + i) {
        let end = text[found..]
            .find(separator)
            .map_or(text.len(), |i| found + i);
        let token_start = text[..found].rfind(separator).map_or(0, |i| i + 1);
        let redacted = redact_url(&text[token_start..end]);
        let next = token_start + redacted.len();
        text.replace_range(token_start..end, &redacted);
        from = next.max(found + 3).min(text.len());
    }
    for secret in passwords(urls) {
        if secret != "***" {
            text = text.replace(&secret, "***");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact_url("redis://:s3cret@10.0.0.5:6379/0"),
            "redis://:***@10.0.0.5:6379/0"
        );
        assert_eq!(
            redact_url("rediss://app:pw@r.example:6380"),
            "rediss://app:***@r.example:6380"
        );
        assert_eq!(redact_url("redis://token@host"), "redis://***@host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        // Characters that end a URL's authority, in a password: the URL does not parse, and
        // the error quotes it.
        assert_eq!(
            redact_url("redis://:pa#ss@127.0.0.1:6380"),
            "redis://:***@127.0.0.1:6380"
        );
        assert_eq!(redact_url("redis://:p/a?s@s@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact_url(":pw@127.0.0.1:1"), ":***@127.0.0.1:1");
        // Over-cautious when a query holds `@`: nothing secret shows either way.
        assert_eq!(redact_url("redis://host/0?x=@y"), "redis://***@y");
    }

    #[test]
    fn messages_quoting_urls_or_passwords_are_redacted() {
        let urls = [
            "redis://:pa#ss@h:1".to_owned(),
            "redis://u:p%40w@h:2".to_owned(),
        ];
        assert_eq!(
            redact_redis_text("cannot connect to redis://:pa#ss@h:1: refused", &urls),
            "cannot connect to redis://:***@h:1: refused"
        );
        // Another URL (a cluster node), and a password outside any URL, decoded or not.
        assert_eq!(
            redact_redis_text(
                "node redis://u:other@h:3 failed; auth pa#ss, p@w, p%40w",
                &urls
            ),
            "node redis://u:***@h:3 failed; auth ***, ***, ***"
        );
        let list = urls.join(",");
        assert_eq!(
            redact_redis_text(&format!("seeds ({list}) down"), &urls),
            "seeds (redis://:***@h:1,redis://u:***@h:2) down"
        );
        assert_eq!(redact_redis_text("no URL here", &urls), "no URL here");
    }
}
