//! Listing counters ([`ListKeys`]): the memory store's names directory (pages, prefixes,
//! resets, evictions and sweeps, what `complete` says) and Redis's `SCAN`, on one server and
//! on a 3-master Redis Cluster started by the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use flowgate::clock::ManualClock;
use flowgate::envoy::{Entry, counter_key};
use flowgate::store::list::{KeyPage, ListError, ListKeys, MAX_PAGE};
use flowgate::store::{Ask, MemoryStore, Store};
use flowgate::{Algorithm, Quota};

/// Every page of the listing of `prefix`, `limit` at a time (at most `max_pages` pages).
async fn pages(
    lister: &impl ListKeys,
    prefix: &str,
    limit: usize,
    max_pages: usize,
) -> Vec<KeyPage> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..max_pages {
        let page = lister
            .list_keys(prefix, cursor.as_deref(), limit)
            .await
            .unwrap();
        cursor = page.next.clone();
        pages.push(page);
        if cursor.is_none() {
            return pages;
        }
    }
    panic!("the listing of {prefix:?} did not end within {max_pages} pages");
}

/// The names of all `pages`.
fn names(pages: &[KeyPage]) -> Vec<String> {
    pages.iter().flat_map(|p| p.keys.iter().cloned()).collect()
}

/// The counter key of `user=<user>` in `domain` under `quota`.
fn key(domain: &str, user: &str, quota: &Quota) -> String {
    counter_key(domain, &[Entry::new("user", user)], quota)
}

fn quotas() -> [Quota; 2] {
    [
        Quota::per_minute(10),
        Quota::per_hour(5)
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap(),
    ]
}

/// Checks `n` users of domain `api` (each under both quotas: a rule with two limits), a few
/// of `other`, one key of another front end and one peeked key; answers the `api` keys.
async fn fill(store: &impl Store, n: usize) -> BTreeSet<String> {
    let mut expected = BTreeSet::new();
    for q in &quotas() {
        for i in 0..n {
            let k = key("api", &format!("u{i:04}"), q);
            let _ = store.check(Ask::new(&k, q)).await.unwrap();
            expected.insert(k);
        }
        for i in 0..5 {
            let k = key("other", &format!("u{i}"), q);
            let _ = store.check(Ask::new(&k, q)).await.unwrap();
        }
        // `api2` starts like `api`, but is another domain.
        let _ = store
            .check(Ask::new(&key("api2", "u0000", q), q))
            .await
            .unwrap();
        let _ = store
            .check(Ask::new("http:per-ip|key=10.0.0.1", q))
            .await
            .unwrap();
        // A peek stores nothing, so lists nothing.
        let _ = store
            .peek(Ask::new(&key("api", "peeked", q), q))
            .await
            .unwrap();
    }
    expected
}

#[tokio::test]
async fn memory_lists_every_name_once_in_order_a_page_at_a_time() {
    let clock = ManualClock::new(1 << 40);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .list_keys(true)
        .build();
    let expected = fill(&store, 125).await;
    assert_eq!(expected.len(), 250);

    let listed = pages(&store, "api|", 100, 10).await;
    assert_eq!(
        listed.iter().map(|p| p.keys.len()).collect::<Vec<_>>(),
        [100, 100, 50]
    );
    assert!(listed.iter().all(|p| p.complete));
    let all = names(&listed);
    // In order, each once, exactly the domain's counters.
    assert!(all.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(all.into_iter().collect::<BTreeSet<_>>(), expected);

    // A prefix in the middle of a value.
    let some = names(&pages(&store, "api|user=u001", 7, 10).await);
    assert_eq!(some.len(), 20, "{some:?}");
    assert!(some.iter().all(|k| k.starts_with("api|user=u001")));

    // Page sizes are clamped to 1..=MAX_PAGE.
    let one = store.list_keys("api|", None, 0).await.unwrap();
    assert_eq!(one.keys.len(), 1);
    let big = store.list_keys("api|", None, 1_000_000).await.unwrap();
    assert_eq!((big.keys.len(), big.next), (250, None));
    const { assert!(MAX_PAGE >= 250) };

    // A reset key's name goes at once.
    let q = quotas()[0];
    let gone = key("api", "u0000", &q);
    store.reset(Ask::new(&gone, &q)).await.unwrap();
    let all = names(&pages(&store, "api|", 1000, 2).await);
    assert_eq!(all.len(), 249);
    assert!(!all.contains(&gone));

    // A cursor this listing did not hand out.
    for bad in ["zz", "abc", "ff"] {
        assert_eq!(
            store.list_keys("api|", Some(bad), 10).await,
            Err(ListError::Cursor),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn a_key_present_the_whole_time_is_listed_while_others_come_and_go() {
    let clock = ManualClock::new(1 << 40);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .list_keys(true)
        .build();
    let q = Quota::per_minute(10);
    let stay: BTreeSet<String> = (0..300)
        .map(|i| key("api", &format!("s{i:03}"), &q))
        .collect();
    for k in &stay {
        let _ = store.check(Ask::new(k, &q)).await.unwrap();
    }
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    for round in 0..100 {
        let page = store
            .list_keys("api|", cursor.as_deref(), 16)
            .await
            .unwrap();
        listed.extend(page.keys);
        // Between pages, keys arrive before and after the cursor, and some go.
        for j in 0..5 {
            let k = key("api", &format!("{}{round:03}{j}", ["a", "t"][j % 2]), &q);
            let _ = store.check(Ask::new(&k, &q)).await.unwrap();
        }
        let k = key("api", &format!("a{:03}0", round.max(1) - 1), &q);
        store.reset(Ask::new(&k, &q)).await.unwrap();
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
    }
    assert!(cursor.is_none(), "the listing ended");
    for k in &stay {
        assert_eq!(
            listed.iter().filter(|l| *l == k).count(),
            1,
            "{k} listed exactly once"
        );
    }
}

#[tokio::test]
async fn evicted_and_swept_names_go_and_a_full_directory_says_it_is_incomplete() {
    let clock = ManualClock::new(1 << 40);
    // One shard of 16 keys per algorithm: the directory holds 16 names.
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(16)
        .list_keys(true)
        .build();
    let q = Quota::per_hour(10);
    let first: Vec<String> = (0..16)
        .map(|i| key("api", &format!("a{i:02}"), &q))
        .collect();
    for k in &first {
        let _ = store.check(Ask::new(k, &q)).await.unwrap();
    }
    let page = store.list_keys("api|", None, 100).await.unwrap();
    assert_eq!((page.keys.len(), page.complete), (16, true));

    // Eight more active keys: the table evicts eight of the first, and the directory, full,
    // cannot name the newcomers.
    let later: Vec<String> = (0..8)
        .map(|i| key("api", &format!("b{i:02}"), &q))
        .collect();
    for k in &later {
        let _ = store.check(Ask::new(k, &q)).await.unwrap();
    }
    assert_eq!(store.stats().evicted_active, 8);
    let page = store.list_keys("api|", None, 100).await.unwrap();
    assert!(!page.complete, "names were left out");
    // Exactly the first keys the store still holds are listed (an evicted key peeks as new).
    let mut held = Vec::new();
    for k in &first {
        if store.peek(Ask::new(k, &q)).await.unwrap().remaining == 9 {
            held.push(k.clone());
        }
    }
    assert!((8..16).contains(&held.len()), "{held:?}");
    assert_eq!(page.keys, held);

    // Everything goes idle and is swept: the directory names every key (none) again.
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(store.forget_idle(), 16);
    let page = store.list_keys("api|", None, 100).await.unwrap();
    assert_eq!((page.keys.len(), page.complete), (0, true));
    for k in &later {
        let _ = store.check(Ask::new(k, &q)).await.unwrap();
    }
    let page = store.list_keys("api|", None, 100).await.unwrap();
    assert_eq!(page.keys, later);
    assert!(page.complete);
}

#[tokio::test]
async fn a_memory_store_without_its_names_directory_does_not_list() {
    let store = MemoryStore::new();
    let q = Quota::per_second(1);
    let _ = store.check(Ask::new("api|user=a#x", &q)).await.unwrap();
    assert!(matches!(
        store.list_keys("api|", None, 10).await,
        Err(ListError::Unsupported(_))
    ));
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use flowgate::store::RedisStore;
    use flowgate_testing::redis::{RedisCluster, RedisServer};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_lists_with_scan_following_the_cursor_to_the_end() {
        let Some(server) = RedisServer::start("list_keys_redis") else {
            return;
        };
        let store = RedisStore::builder(server.url())
            .prefix("t:")
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let expected = fill(&store, 150).await;
        // Keys that glob characters in a prefix must not match by pattern.
        let q = Quota::per_minute(10);
        for user in ["a*b", "aXb", "a?", "[x]"] {
            let _ = store
                .check(Ask::new(&key("glob", user, &q), &q))
                .await
                .unwrap();
        }
        // Another prefix's keys are not ours.
        let other = RedisStore::builder(server.url())
            .prefix("u:")
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let _ = other
            .check(Ask::new(&key("api", "zzz", &q), &q))
            .await
            .unwrap();

        let listed = pages(&store, "api|", 40, 500).await;
        let all: BTreeSet<String> = names(&listed).into_iter().collect();
        assert_eq!(all, expected);
        assert!(listed.iter().all(|p| p.complete));
        // SCAN's COUNT is the keys still wanted: a page holds about `limit`.
        assert!(
            listed.iter().all(|p| p.keys.len() <= 2 * 40),
            "{:?}",
            listed.iter().map(|p| p.keys.len()).collect::<Vec<_>>()
        );

        assert_eq!(
            names(&pages(&store, "glob|user=a*", 10, 100).await),
            [key("glob", "a*b", &q)]
        );
        assert_eq!(
            names(&pages(&store, "glob|user=[", 10, 100).await),
            [key("glob", "[x]", &q)]
        );
        assert_eq!(
            store.list_keys("api|", Some("nonsense"), 10).await,
            Err(ListError::Cursor)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_lists_the_keys_of_every_master() {
        let Some(cluster) = RedisCluster::start("list_keys_cluster", 3, 0) else {
            return;
        };
        let store = RedisStore::cluster_builder(cluster.urls())
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let expected = fill(&store, 100).await;
        let masters: BTreeSet<usize> = expected
            .iter()
            .map(|k| {
                let algorithm = if k.contains("#gcra") {
                    Algorithm::Gcra
                } else {
                    Algorithm::FixedWindow
                };
                cluster.master_of(&store.redis_key(k, algorithm))
            })
            .collect();
        assert_eq!(masters.len(), 3, "the keys spread over every master");
        let listed = pages(&store, "api|", 25, 500).await;
        let all: BTreeSet<String> = names(&listed).into_iter().collect();
        assert_eq!(all, expected);
    }
}
