//! The WebSocket limiter's layers, ladder and bookkeeping, on a manual clock and the memory
//! store (the Redis store is exercised through the gateway's tests).
#![cfg(feature = "ws")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use flowgate::Quota;
use flowgate::clock::ManualClock;
use flowgate::store::MemoryStore;
use flowgate::ws::{
    Action, Client, LayerDecision, MessageInfo, PenaltyConfig, Scope, Session, WsLimiter,
    WsPolicyError, close_code,
};

const START: u64 = 1_700_000_000_000_000_000;

fn clock_and_store() -> (ManualClock, MemoryStore<ManualClock>) {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (clock, store)
}

fn chat() -> MessageInfo<'static> {
    MessageInfo::new(10).kind("chat")
}

async fn send(
    session: &mut Session<ManualClock>,
    store: &MemoryStore<ManualClock>,
    n: usize,
) -> Vec<Action> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(session.check(store, &chat()).await);
    }
    out
}

fn forwarded(verdicts: &[Action]) -> usize {
    verdicts.iter().filter(|v| **v == Action::Forward).count()
}

#[tokio::test]
async fn a_flood_is_rejected_beyond_the_burst_then_closed_and_its_state_released() {
    let (clock, store) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock.clone())
        .messages(Quota::per_second(5).with_burst(10).unwrap())
        .close_after(5, Duration::from_secs(10))
        .close_code(4008, "slow down")
        .build()
        .unwrap();
    let mut flooder = limiter
        .admit(Client::new("10.0.0.1").room("lobby"))
        .unwrap();
    let mut quiet = limiter
        .admit(Client::new("10.0.0.2").room("lobby"))
        .unwrap();
    assert_eq!(limiter.live(), (2, 2, 0));
    // 50 messages within one second: 10 pass (the burst), 5 get error frames, then a close.
    let mut verdicts = Vec::new();
    for i in 0..50 {
        verdicts.push(flooder.check(&store, &chat()).await);
        if i % 5 == 4 {
            clock.advance(Duration::from_millis(100));
        }
    }
    assert_eq!(forwarded(&verdicts[..10]), 10);
    let rejections = verdicts
        .iter()
        .filter(|v| matches!(v, Action::Reject(r) if r.scope == Scope::Connection))
        .count();
    assert!((4..=6).contains(&rejections), "{verdicts:?}");
    let close = verdicts
        .iter()
        .find_map(|v| match v {
            Action::Close(c) => Some(c.clone()),
            _ => None,
        })
        .expect("closed after the violations");
    assert_eq!((close.code, close.reason.as_str()), (4008, "slow down"));
    // Every later message gets the same close.
    assert_eq!(verdicts.last(), Some(&Action::Close(close)));
    // The other client in the room is unaffected.
    assert_eq!(forwarded(&send(&mut quiet, &store, 10).await), 10);
    let Action::Reject(rejection) = send(&mut quiet, &store, 1).await.remove(0) else {
        panic!("the quiet client's own burst is 10");
    };
    assert!(
        limiter
            .error_frame(&rejection)
            .contains(r#""scope":"connection""#)
    );
    drop(flooder);
    drop(quiet);
    assert_eq!(limiter.live(), (0, 0, 0));
    let stats = limiter.stats();
    assert_eq!(stats.live, 0);
    assert_eq!(stats.closes(4008), 1);
    // What was forwarded is what the connection layer allowed: the flood's burst (and what
    // refilled while it went on) and the quiet client's 10.
    assert_eq!(
        stats.decisions(Scope::Connection, LayerDecision::Allowed),
        forwarded(&verdicts) as u64 + 10
    );
}

#[tokio::test]
async fn many_members_trip_the_room_limit_slowmode_spaces_and_moderators_are_exempt() {
    let (clock, store) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock.clone())
        .messages(Quota::per_second(10))
        .room_messages(Quota::per_minute(150))
        .build()
        .unwrap();
    let mut sessions: Vec<_> = (0..200)
        .map(|i| {
            limiter
                .admit(Client::new(format!("10.0.{}.{}", i / 250, i % 250)).room("big"))
                .unwrap()
        })
        .collect();
    let mut passed = 0;
    for session in &mut sessions {
        if session.check(&store, &chat()).await == Action::Forward {
            passed += 1;
        }
    }
    // Each member sent one message, well within its own 10 per second: the room's 150 bind.
    assert_eq!(passed, 150);
    let Action::Reject(rejection) = sessions[199].check(&store, &chat()).await else {
        panic!("the room is full");
    };
    assert_eq!(rejection.scope, Scope::Room);
    // Another room is not affected.
    sessions[0].join("other");
    assert_eq!(sessions[0].check(&store, &chat()).await, Action::Forward);

    let slow = WsLimiter::builder()
        .clock(clock.clone())
        .slowmode(Duration::from_secs(3))
        .slowmode_exempt("moderator")
        .build()
        .unwrap();
    let mut user = slow
        .admit(Client::new("10.1.0.1").user("ann").room("r"))
        .unwrap();
    let mut moderator = slow
        .admit(
            Client::new("10.1.0.2")
                .user("mo")
                .role("moderator")
                .room("r"),
        )
        .unwrap();
    assert_eq!(user.check(&store, &chat()).await, Action::Forward);
    let Action::Reject(r) = user.check(&store, &chat()).await else {
        panic!("slowmode")
    };
    assert_eq!(
        (r.scope, r.retry_after),
        (Scope::Slowmode, Duration::from_secs(3))
    );
    clock.advance(Duration::from_secs(3));
    assert_eq!(user.check(&store, &chat()).await, Action::Forward);
    // Slowmode is per room: another room is free.
    assert_eq!(
        user.check(&store, &chat().room("elsewhere")).await,
        Action::Forward
    );
    assert_eq!(forwarded(&send(&mut moderator, &store, 20).await), 20);

    // A room of its own: slowmode only there, with its own interval.
    let per_room = WsLimiter::builder()
        .clock(clock.clone())
        .slowmode_for_room("announcements", Duration::from_secs(60))
        .build()
        .unwrap();
    let mut bo = per_room
        .admit(Client::new("10.1.0.3").user("bo").room("chat"))
        .unwrap();
    assert_eq!(forwarded(&send(&mut bo, &store, 5).await), 5);
    bo.join("announcements");
    assert_eq!(forwarded(&send(&mut bo, &store, 5).await), 1);
}

#[tokio::test]
async fn new_connections_per_ip_and_the_concurrency_caps_hold() {
    let (clock, _) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock.clone())
        .connections_per_ip(Quota::per_second(10).with_burst(20).unwrap())
        .concurrent_per_ip(25)
        .concurrent_per_user(2)
        .max_connections(40)
        .build()
        .unwrap();
    // 30 attempts within a second from one IP: 20 (the burst) are admitted.
    let mut open = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..30 {
        match limiter.admit(Client::new("198.51.100.1")) {
            Ok(session) => open.push(session),
            Err(refusal) => refused.push(refusal),
        }
    }
    assert_eq!((open.len(), refused.len()), (20, 10));
    assert!(refused.iter().all(|r| r.scope == Scope::Connect));
    assert!(refused[0].retry_after_secs() >= 1);
    assert_eq!(
        refused[0].to_string(),
        format!(
            "connection refused by the connect limit; retry in {} s",
            refused[0].retry_after_secs()
        )
    );
    assert!(
        refused[0]
            .decision
            .is_some_and(|d| d.limit == 10 && d.remaining == 0)
    );
    // Later, the concurrent cap of 25 holds even though the rate allows more.
    clock.advance(Duration::from_secs(5));
    for _ in 0..10 {
        if let Ok(session) = limiter.admit(Client::new("198.51.100.1")) {
            open.push(session);
        }
    }
    assert_eq!(open.len(), 25);
    assert_eq!(
        limiter
            .admit(Client::new("198.51.100.1"))
            .unwrap_err()
            .scope,
        Scope::ConcurrentIp
    );
    // Per user, across IPs.
    let a = limiter.admit(Client::new("203.0.113.1").user("u")).unwrap();
    let b = limiter.admit(Client::new("203.0.113.2").user("u")).unwrap();
    assert_eq!(
        limiter
            .admit(Client::new("203.0.113.3").user("u"))
            .unwrap_err()
            .scope,
        Scope::ConcurrentUser
    );
    drop(a);
    let c = limiter.admit(Client::new("203.0.113.3").user("u")).unwrap();
    // The node cap: 25 + 2 open; 13 more from elsewhere fill it to 40.
    let others: Vec<_> = (0..13)
        .map(|i| limiter.admit(Client::new(format!("192.0.2.{i}"))).unwrap())
        .collect();
    assert_eq!(
        limiter.admit(Client::new("192.0.2.200")).unwrap_err().scope,
        Scope::Node
    );
    drop((open, b, c, others));
    assert_eq!(limiter.live(), (0, 0, 0));
    assert_eq!(limiter.stats().refused(Scope::Connect), 10);
}

/// A connection layer in dry run admits what it would refuse, and records it as the message
/// layers record theirs: `dry_run` in the decisions, never a refusal.
#[tokio::test]
async fn upgrade_layers_in_dry_run_admit_and_record_what_they_would_refuse() {
    let (clock, _) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock)
        .connections_per_ip(Quota::per_minute(2))
        .concurrent_per_ip(3)
        .concurrent_per_user(10)
        .dry_run(Scope::Connect)
        .dry_run(Scope::ConcurrentIp)
        .build()
        .unwrap();
    let open: Vec<_> = (0..5)
        .map(|_| limiter.admit(Client::new("198.51.100.7")).unwrap())
        .collect();
    let stats = limiter.stats();
    // The rate would have refused the 3rd to 5th; the cap of 3 the 4th and 5th.
    assert_eq!(stats.decisions(Scope::Connect, LayerDecision::Allowed), 2);
    assert_eq!(stats.decisions(Scope::Connect, LayerDecision::DryRun), 3);
    assert_eq!(
        stats.decisions(Scope::ConcurrentIp, LayerDecision::Allowed),
        3
    );
    assert_eq!(
        stats.decisions(Scope::ConcurrentIp, LayerDecision::DryRun),
        2
    );
    // Clients without a user are not counted by the per-user cap.
    assert_eq!(
        stats.decisions(Scope::ConcurrentUser, LayerDecision::Allowed),
        0
    );
    assert_eq!(
        stats.refused(Scope::Connect) + stats.refused(Scope::ConcurrentIp),
        0
    );
    assert_eq!(stats.opened, 5);
    drop(open);

    // Enforced, the same layers record `rejected` beside the refusal count.
    let enforced = WsLimiter::builder()
        .connections_per_ip(Quota::per_minute(1))
        .build()
        .unwrap();
    let _first = enforced.admit(Client::new("198.51.100.8")).unwrap();
    assert!(enforced.admit(Client::new("198.51.100.8")).is_err());
    let stats = enforced.stats();
    assert_eq!(stats.decisions(Scope::Connect, LayerDecision::Rejected), 1);
    assert_eq!(stats.refused(Scope::Connect), 1);
}

/// `close_after: {violations: K}`: K rejections are answered with error frames, the next
/// violation closes — and a window later, K more are tolerated again.
#[tokio::test]
async fn close_after_tolerates_k_rejections_and_closes_on_the_next() {
    let (clock, store) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock.clone())
        .messages(Quota::per_hour(1))
        .close_after(3, Duration::from_secs(10))
        .build()
        .unwrap();
    let mut s = limiter.admit(Client::new("10.7.0.1")).unwrap();
    let verdicts = send(&mut s, &store, 5).await;
    assert_eq!(verdicts[0], Action::Forward);
    for v in &verdicts[1..4] {
        assert!(
            matches!(v, Action::Reject(r) if r.scope == Scope::Connection),
            "{v:?}"
        );
    }
    assert!(matches!(&verdicts[4], Action::Close(c) if c.code == close_code::POLICY_VIOLATION));

    let mut patient = limiter.admit(Client::new("10.7.0.2")).unwrap();
    let _ = send(&mut patient, &store, 3).await; // one forwarded, two rejected
    clock.advance(Duration::from_secs(10));
    let verdicts = send(&mut patient, &store, 4).await;
    assert_eq!(
        verdicts
            .iter()
            .filter(|v| matches!(v, Action::Reject(_)))
            .count(),
        3,
        "{verdicts:?}"
    );
    assert!(matches!(verdicts[3], Action::Close(_)));
}

#[tokio::test]
async fn a_users_connections_share_one_budget_and_roles_get_theirs() {
    let (clock, store) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock)
        .user_messages(Quota::new(20, Duration::from_secs(30)).unwrap())
        .user_messages_for_role(
            "moderator",
            Quota::new(100, Duration::from_secs(30)).unwrap(),
        )
        .build()
        .unwrap();
    let mut tabs: Vec<_> = (0..3)
        .map(|i| {
            limiter
                .admit(Client::new(format!("10.2.0.{i}")).user("ann"))
                .unwrap()
        })
        .collect();
    let mut passed = 0;
    for round in 0..10 {
        for tab in &mut tabs {
            if tab.check(&store, &chat()).await == Action::Forward {
                passed += 1;
            }
            let _ = round;
        }
    }
    assert_eq!(passed, 20, "three sockets share one budget of 20");
    let mut moderator = limiter
        .admit(Client::new("10.2.1.1").user("mo").role("moderator"))
        .unwrap();
    assert_eq!(forwarded(&send(&mut moderator, &store, 120).await), 100);
}

#[tokio::test]
async fn sizes_costs_releases_and_dry_runs() {
    let (clock, store) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock.clone())
        .messages(Quota::per_minute(10))
        .bytes(Quota::per_minute(1_000))
        .cost("subscribe", 5)
        .cost("ping", 0)
        .release("unsubscribe")
        .max_message_size(500)
        .build()
        .unwrap();
    let mut s = limiter.admit(Client::new("10.3.0.1")).unwrap();
    // A type's cost is charged: two subscribes use the whole minute.
    for _ in 0..2 {
        assert_eq!(
            s.check(&store, &MessageInfo::new(10).kind("subscribe"))
                .await,
            Action::Forward
        );
    }
    assert!(matches!(
        s.check(&store, &MessageInfo::new(10).kind("subscribe")).await,
        Action::Reject(r) if r.scope == Scope::Connection && r.remaining == 0
    ));
    // Pings are free; unsubscribes are never rejected.
    for _ in 0..20 {
        assert_eq!(
            s.check(&store, &MessageInfo::new(2).kind("ping")).await,
            Action::Forward
        );
        assert_eq!(
            s.check(&store, &MessageInfo::new(10).kind("unsubscribe"))
                .await,
            Action::Forward
        );
    }
    let stats = limiter.stats();
    assert_eq!(
        stats.decisions(Scope::Connection, LayerDecision::Released),
        20
    );
    // An oversized message closes with 1009.
    let Action::Close(close) = s.check(&store, &MessageInfo::new(501)).await else {
        panic!("too big")
    };
    assert_eq!(close.code, close_code::MESSAGE_TOO_BIG);
    assert!(close.reason.len() <= 123);

    // Dry run: counts exactly as enforcement would, but forwards.
    let dry = WsLimiter::builder()
        .clock(clock)
        .messages(Quota::per_minute(3))
        .dry_run(Scope::Connection)
        .build()
        .unwrap();
    let mut d = dry.admit(Client::new("10.3.0.2")).unwrap();
    assert_eq!(forwarded(&send(&mut d, &store, 10).await), 10);
    let stats = dry.stats();
    assert_eq!(
        (
            stats.decisions(Scope::Connection, LayerDecision::Allowed),
            stats.decisions(Scope::Connection, LayerDecision::DryRun)
        ),
        (3, 7)
    );
}

#[tokio::test]
async fn a_rejection_by_a_later_layer_gives_the_earlier_ones_units_back() {
    let (clock, store) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock)
        .messages(Quota::per_minute(100))
        .user_messages(Quota::per_minute(2))
        .build()
        .unwrap();
    let mut s = limiter.admit(Client::new("10.4.0.1").user("bo")).unwrap();
    assert_eq!(forwarded(&send(&mut s, &store, 10).await), 2);
    // The 8 rejected by the user layer took nothing from the connection's 100.
    assert_eq!(
        limiter
            .stats()
            .decisions(Scope::Connection, LayerDecision::Allowed),
        10
    );
    let mut other = limiter.admit(Client::new("10.4.0.1").user("cy")).unwrap();
    let _ = &mut other;
    let verdicts = send(&mut s, &store, 1).await;
    assert!(matches!(&verdicts[0], Action::Reject(r) if r.scope == Scope::User));
}

#[tokio::test]
async fn repeat_offenders_sit_in_the_penalty_box_for_longer_each_time() {
    let (clock, store) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock.clone())
        .messages(Quota::per_hour(1))
        .close_after(1, Duration::from_secs(60))
        .penalty_box(PenaltyConfig {
            after_closes: 1,
            first: Duration::from_secs(120),
            ..PenaltyConfig::default()
        })
        .build()
        .unwrap();
    let offend = || async {
        let mut s = limiter.admit(Client::new("10.5.0.1").user("eve")).unwrap();
        let _ = send(&mut s, &store, 3).await;
    };
    offend().await;
    let refusal = limiter
        .admit(Client::new("10.5.0.9").user("eve"))
        .unwrap_err();
    assert_eq!(
        (refusal.scope, refusal.retry_after_secs()),
        (Scope::Penalty, 120)
    );
    clock.advance(Duration::from_secs(121));
    offend().await;
    let refusal = limiter
        .admit(Client::new("10.5.0.9").user("eve"))
        .unwrap_err();
    assert_eq!(refusal.retry_after_secs(), 240);
    assert_eq!(limiter.penalized(), 1);
    assert!(
        limiter
            .admit(Client::new("10.5.0.9").user("someone-else"))
            .is_ok()
    );
    assert_eq!(limiter.stats().banned, 2);
}

#[tokio::test]
async fn too_many_errors_or_a_flood_far_over_the_rate_close_the_connection() {
    let (clock, store) = clock_and_store();
    let limiter = WsLimiter::builder()
        .clock(clock)
        .messages(Quota::per_second(5))
        .close_at_multiple(4)
        .errors(Quota::per_minute(3))
        .build()
        .unwrap();
    let mut s = limiter.admit(Client::new("10.6.0.1")).unwrap();
    assert!(s.error().is_none() && s.error().is_none() && s.error().is_none());
    let close = s.error().expect("the fourth error in a minute closes");
    assert_eq!(close.scope, Scope::Errors);
    let mut f = limiter.admit(Client::new("10.6.0.2")).unwrap();
    let verdicts = send(&mut f, &store, 21).await;
    assert_eq!(forwarded(&verdicts), 5);
    assert!(
        matches!(verdicts[20], Action::Close(_)),
        "{:?}",
        verdicts[20]
    );
}

#[test]
fn invalid_settings_are_refused() {
    assert_eq!(
        WsLimiter::builder()
            .close_code(1005, "x")
            .build()
            .unwrap_err(),
        WsPolicyError::InvalidCloseCode(1005)
    );
    assert_eq!(
        WsLimiter::builder()
            .close_code(4008, &"x".repeat(124))
            .build()
            .unwrap_err(),
        WsPolicyError::ReasonTooLong(124)
    );
    assert!(matches!(
        WsLimiter::builder()
            .messages(Quota::per_second(10))
            .cost("snapshot", 40)
            .build()
            .unwrap_err(),
        WsPolicyError::CostExceedsBurst { cost: 40, .. }
    ));
}

/// A refusal renders through the one renderer: the rate of new connections with its
/// `RateLimit` fields, a cap with `Retry-After` alone; both are 429s.
#[cfg(feature = "tower")]
#[test]
fn refusals_render_as_429_with_retry_after_and_the_rate_limit_fields_when_counted() {
    use flowgate::answer::headers::policy_item_value;
    let clock = ManualClock::new(START);
    let quota = Quota::new(2, Duration::from_secs(60)).unwrap();
    let limiter = WsLimiter::builder()
        .clock(clock.clone())
        .connections_per_ip(quota)
        .concurrent_per_ip(3)
        .build()
        .unwrap();
    // The rate of new connections is one policy named after its layer, everywhere.
    let name = Scope::Connect.name();
    assert_eq!(name, "connect");
    let item = policy_item_value(name, &quota);
    let _a = limiter.admit(Client::new("ip")).unwrap();
    let _b = limiter.admit(Client::new("ip")).unwrap();
    let refusal = limiter.admit(Client::new("ip")).unwrap_err();
    assert_eq!(refusal.scope, Scope::Connect);
    let response = match refusal.answer(name, &item).render(false) {
        flowgate::answer::Rendered::Refuse(response) => response,
        flowgate::answer::Rendered::Pass(_) => panic!("a refusal must refuse"),
    };
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "30");
    assert_eq!(
        response.headers()["ratelimit-policy"],
        r#""connect";q=2;w=60"#
    );
    let fields = response.headers()["ratelimit"].to_str().unwrap();
    assert!(fields.starts_with(r#""connect";r=0;t="#), "{fields}");
    assert_eq!(
        limiter.refusal_response(&refusal).headers()["ratelimit-policy"],
        r#""connect";q=2;w=60"#
    );

    let capped = WsLimiter::builder().concurrent_per_ip(1).build().unwrap();
    let _held = capped.admit(Client::new("ip")).unwrap();
    let refusal = capped.admit(Client::new("ip")).unwrap_err();
    assert_eq!(refusal.scope, Scope::ConcurrentIp);
    let response = match refusal.answer(name, &item).render(false) {
        flowgate::answer::Rendered::Refuse(response) => response,
        flowgate::answer::Rendered::Pass(_) => panic!("a refusal must refuse"),
    };
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    assert!(response.headers().get("ratelimit").is_none());
    assert_eq!(response.headers()["cache-control"], "no-store");
}

/// `check_local` leaves a message to the store exactly when a layer kept there applies — the
/// user's (a user layer and a user), the room's (a room layer and a room), a slowmode the role
/// is not exempt from (in a room) — as each case's settings say, not as `check` (which is built
/// on `check_local`) does; and the two steps decide as `check` does. Every combination of
/// those layers, of the client's user, role and room and of the message's room.
#[tokio::test]
async fn check_local_asks_the_store_exactly_when_a_store_layer_applies() {
    use flowgate::ws::Checked;
    let mut asked = 0;
    for bits in 0u32..(1 << 8) {
        let on = |bit: u32| bits & (1 << bit) != 0;
        let (user_layer, room_layer, slowmode, room_slowmode) = (on(0), on(1), on(2), on(3));
        let (has_user, moderator, client_room, message_room) = (on(4), on(5), on(6), on(7));
        let in_room = client_room || message_room;
        let store_layer_applies = (user_layer && has_user)
            || (in_room && room_layer)
            || (in_room && (slowmode || room_slowmode) && !moderator);
        let build = || {
            let mut builder = WsLimiter::builder()
                .clock(ManualClock::new(START))
                .messages(Quota::per_second(100))
                .slowmode_exempt("moderator");
            if user_layer {
                builder = builder.user_messages(Quota::per_second(100));
            }
            if room_layer {
                builder = builder.room_messages(Quota::per_second(100));
            }
            if slowmode {
                builder = builder.slowmode(Duration::from_secs(1));
            }
            if room_slowmode {
                builder = builder.slowmode_for_room("lobby", Duration::from_secs(1));
            }
            builder.build().unwrap()
        };
        let client = || {
            let mut client = Client::new("192.0.2.1");
            if has_user {
                client = client.user("ann");
            }
            if moderator {
                client = client.role("moderator");
            }
            if client_room {
                client = client.room("lobby");
            }
            client
        };
        let message = if message_room {
            chat().room("lobby")
        } else {
            chat()
        };
        // What `check` does, on its own limiter and store.
        let (_, whole_store) = clock_and_store();
        let whole = build();
        let action = whole
            .admit(client())
            .unwrap()
            .check(&whole_store, &message)
            .await;
        // The two steps, on another.
        let (_, store) = clock_and_store();
        let split = build();
        let mut session = split.admit(client()).unwrap();
        let decided = match session.check_local(&message) {
            Checked::Decided(decided) => {
                assert!(
                    !store_layer_applies,
                    "case {bits:#010b}: a store layer skipped"
                );
                decided
            }
            Checked::AskStore(pending) => {
                assert!(store_layer_applies, "case {bits:#010b}: asked for no layer");
                asked += 1;
                let decided = session.check_store(&store, &message, pending).await;
                assert!(
                    store.stats().keys > 0,
                    "case {bits:#010b}: the store unused"
                );
                decided
            }
        };
        assert_eq!(decided, action, "case {bits:#010b}");
        assert_eq!(
            store.stats().keys,
            whole_store.stats().keys,
            "case {bits:#010b}"
        );
        assert_eq!(
            split.stats().decisions,
            whole.stats().decisions,
            "case {bits:#010b}"
        );
    }
    // Both answers occur: the cases are not all of one kind.
    assert!(asked > 0 && asked < 256, "{asked} of 256 asked the store");
}
