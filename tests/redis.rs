//! The Redis backend against real Redis servers: what is particular to Redis (a restart that
//! loses the lock, keyspace notifications or polling, operators deleting keys, one renewal
//! for every held key). The behaviour every backend shares is in the conformance suite.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use incumbent::backend::{Backend, Wakeup};
use incumbent::redis::{Notifications, RedisBackend, RedisConfig};
use incumbent::{DemotionReason, Election};
use support::RedisServer;
use support::events::{demoted, elected};
use tokio::time::Instant;

/// The ttl of most tests.
const TTL: Duration = Duration::from_secs(2);
/// How long any expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);
/// The poll interval of the tests without notifications.
const POLL: Duration = Duration::from_millis(200);

async fn connect(addr: SocketAddr, notifications: Notifications) -> RedisBackend {
    RedisBackend::builder(RedisConfig::new(addr.to_string()))
        .notifications(notifications)
        .poll_interval(POLL)
        .connect()
        .await
        .expect("connect to redis")
}

fn election(backend: &RedisBackend, name: &str, candidate: &str) -> Election<RedisBackend> {
    Election::builder(backend.clone(), name)
        .candidate(candidate)
        .ttl(TTL)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100))
        .build()
        .expect("valid election")
}

/// A plain connection, as an operator (or redis-cli) would use it.
async fn operator(addr: SocketAddr) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("operator connection")
}

/// `a` leads on one backend; `b` follows on another (as in another process); `a` resigns
/// (releasing the lock): how long until `b` leads.
async fn hand_off(backend: &RedisBackend, other: &RedisBackend) -> Duration {
    let mut a = election(backend, "hand-off", "a").campaign();
    elected(&mut a, PATIENCE).await;
    let mut b = election(other, "hand-off", "b").campaign();
    // Let b try once and settle into waiting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    a.resign().await.expect("resign");
    elected(&mut b, PATIENCE).await;
    let took = released.elapsed();
    b.shutdown().await.expect("shutdown");
    a.shutdown().await.expect("shutdown");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_demotes_the_leader_at_its_next_renewal() {
    let mut server = RedisServer::start().await;
    let backend = connect(server.addr(), Notifications::Off).await;
    let mut a = election(&backend, "restart", "a").campaign();
    let first = elected(&mut a, PATIENCE).await;
    server.process().restart().await;
    let restarted = Instant::now();
    // The key and the counter are gone: the next renewal (a third of the ttl) finds out, and
    // the explanation says the store lost the session, not that someone deleted the key.
    let reason = demoted(&mut a, PATIENCE).await;
    assert_eq!(reason, DemotionReason::SessionExpired);
    println!("demoted {:?} after the restart", restarted.elapsed());
    assert!(first.is_cancelled(), "the term ended with the demotion");
    // It leads again after a ttl (the counter went back: see the module docs), with a
    // greater token than before.
    let second = elected(&mut a, PATIENCE).await;
    assert!(second.fencing_token() > first.fencing_token());
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_key_ends_the_term_as_key_deleted() {
    let server = RedisServer::start().await;
    let backend = connect(server.addr(), Notifications::Off).await;
    let mut a = election(&backend, "deleted", "a").campaign();
    let term = elected(&mut a, PATIENCE).await;
    let mut admin = operator(server.addr()).await;
    let deleted: i64 = redis::cmd("DEL")
        .arg(backend.key("deleted"))
        .query_async(&mut admin)
        .await
        .expect("delete the key");
    assert_eq!(deleted, 1);
    assert_eq!(demoted(&mut a, PATIENCE).await, DemotionReason::KeyDeleted);
    assert!(term.is_cancelled());
    let again = elected(&mut a, PATIENCE).await;
    assert!(again.fencing_token() > term.fencing_token());
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_with_keyspace_notifications_needs_no_poll() {
    let server = RedisServer::with_notifications().await;
    let backend = connect(server.addr(), Notifications::IfEnabled).await;
    assert!(backend.notifications_active());
    assert_eq!(backend.info().wakeup, Wakeup::Push);
    let other = connect(server.addr(), Notifications::IfEnabled).await;
    let took = hand_off(&backend, &other).await;
    println!("hand-off with keyspace notifications: {took:?}");
    // Well before the safety-net poll (at least 3.75 s): the notification woke b.
    assert!(took < Duration::from_secs(2), "hand-off took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_without_keyspace_notifications_polls() {
    let server = RedisServer::start().await;
    let backend = connect(server.addr(), Notifications::IfEnabled).await;
    assert!(!backend.notifications_active());
    assert_eq!(backend.info().wakeup, Wakeup::Poll(POLL));
    let other = connect(server.addr(), Notifications::IfEnabled).await;
    let took = hand_off(&backend, &other).await;
    println!("hand-off by polling every {POLL:?}: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_turns_keyspace_notifications_on_with_config_set() {
    let server = RedisServer::start().await;
    let backend = connect(server.addr(), Notifications::Auto).await;
    assert!(backend.notifications_active());
    let mut admin = operator(server.addr()).await;
    let (_, flags): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(&mut admin)
        .await
        .expect("config get");
    for flag in ['K', 'g', 'x'] {
        assert!(flags.contains(flag), "{flags}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_renewal_serves_every_election_of_a_process() {
    let server = RedisServer::start().await;
    let backend = connect(server.addr(), Notifications::Off).await;
    let mut jobs = election(&backend, "shared/jobs", "host-a").campaign();
    let mut index = election(&backend, "shared/index", "host-a").campaign();
    elected(&mut jobs, PATIENCE).await;
    elected(&mut index, PATIENCE).await;
    assert_eq!(backend.session_ids().len(), 1, "one session for both");
    let mut admin = operator(server.addr()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .expect("reset stats");
    tokio::time::sleep(TTL * 2).await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin)
        .await
        .expect("info");
    let calls = |command: &str| -> u64 {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    // Renewing every ttl/3 for two ttls is about 6 renewals: one script per renewal for both
    // keys, not one per election (12), and nothing else while both lead.
    let renewals = calls("evalsha") + calls("eval");
    assert!((4..=8).contains(&renewals), "{renewals} renewals:\n{stats}");
    jobs.shutdown().await.expect("shutdown");
    index.shutdown().await.expect("shutdown");
}

/// TLS (`rediss://`) to a real Redis with a certificate signed by a CA the test made: the
/// backend checks it against the CA file, and elections work as over plain TCP, the keyspace
/// notifications' pub/sub connection included.
#[cfg(feature = "redis-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_file_elects_and_hands_over() {
    let (_server, tls) = RedisServer::with_tls().await;
    let connect = || async {
        RedisBackend::builder(RedisConfig::new(tls.addr.to_string()).ca_file(&tls.ca))
            .notifications(Notifications::IfEnabled)
            .connect()
            .await
            .expect("connect over TLS")
    };
    let (backend, other) = (connect().await, connect().await);
    assert!(backend.notifications_active());
    assert!(format!("{backend:?}").contains("CA file"), "{backend:?}");
    let took = hand_off(&backend, &other).await;
    println!("hand-off over TLS with keyspace notifications: {took:?}");
}

/// A server whose certificate the CA file does not vouch for is refused, with a message that
/// says so.
#[cfg(feature = "redis-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refuses_a_server_the_ca_file_does_not_vouch_for() {
    let (_server, tls) = RedisServer::with_tls().await;
    let refused = RedisBackend::builder(
        RedisConfig::new(tls.addr.to_string())
            .ca_file(&tls.other_ca)
            .timeout(Duration::from_secs(2)),
    )
    .connect()
    .await
    .expect_err("a certificate from another CA");
    println!("{refused}");
    assert!(
        refused.to_string().to_lowercase().contains("certificate"),
        "{refused}"
    );
    let missing = RedisBackend::builder(
        RedisConfig::new(tls.addr.to_string()).ca_file(tls.ca.with_file_name("absent.pem")),
    )
    .connect()
    .await
    .expect_err("no CA file");
    assert!(
        matches!(missing, incumbent::Error::InvalidConfig { .. }),
        "{missing}"
    );
}
