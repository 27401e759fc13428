//! The Redis backend against real Redis servers: what is particular to Redis (a restart that
//! loses the lock, keyspace notifications or polling, operators deleting keys, one renewal
//! for every held key). The behaviour every backend shares is in the conformance suite.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::RedisServer;
use crate::support::events::{demoted, elected, problem};
use incumbent::backend::{Backend, Wakeup};
use incumbent::redis::{Notifications, RedisBackend, RedisConfig};
use incumbent::{DemotionReason, Election};
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

/// A backend whose requests time out after `timeout`, as in a process of its own.
async fn connect_with_timeout(addr: SocketAddr, timeout: Duration) -> RedisBackend {
    RedisBackend::builder(RedisConfig::new(addr.to_string()).timeout(timeout))
        .notifications(Notifications::Off)
        .poll_interval(POLL)
        .connect()
        .await
        .expect("connect to redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_without_persistence_a_new_process_gets_a_token_above_every_earlier_one() {
    // The floor lives in each process's memory: a process started after the restart knows
    // nothing of the tokens handed out before. The token comes from the server's clock.
    let mut server = RedisServer::start().await;
    let mut tokens = Vec::new();
    for round in 0..3 {
        let backend = connect(server.addr(), Notifications::Off).await;
        let mut a = election(&backend, "forgetful", &format!("a{round}")).campaign();
        let term = elected(&mut a, PATIENCE).await;
        tokens.push(term.fencing_token());
        a.shutdown().await.expect("shutdown");
        drop(backend);
        server.process().restart().await;
    }
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "every term's token is above every earlier one's, across restarts that lost the \
         counter and processes that never saw it: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_beyond_two_to_the_53_is_refused_not_rounded() {
    // Lua's numbers are doubles: past 2^53 a counter rounds, and at 2^63 it turns negative.
    let server = RedisServer::start().await;
    let mut op = operator(server.addr()).await;
    let hostile = (1_u64 << 53) + 1;
    let _: () = redis::cmd("SET")
        .arg("incumbent/hostile:fencing")
        .arg(hostile)
        .query_async(&mut op)
        .await
        .expect("set");
    let backend = connect(server.addr(), Notifications::Off).await;
    let mut a = election(&backend, "hostile", "a").campaign();
    let status = a.status();
    let problem = problem(&status, PATIENCE).await;
    assert!(problem.contains("corrupt or hostile"), "{problem}");
    assert!(!status.borrow().is_leader());
    let _: () = redis::cmd("DEL")
        .arg("incumbent/hostile:fencing")
        .query_async(&mut op)
        .await
        .expect("del");
    let term = elected(&mut a, PATIENCE).await;
    assert!(term.fencing_token() <= incumbent::redis::MAX_TOKEN);
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_answer_was_lost_is_adopted_at_the_next_try() {
    // The server freezes while `a` tries to take a free key: the script times out for `a`,
    // but runs when the server thaws, and the key names `a`. Without adoption, nobody
    // renews it and nobody leads for a whole ttl, while the key names a non-leader.
    let mut server = RedisServer::start().await;
    let ttl = Duration::from_secs(4);
    let backend = connect_with_timeout(server.addr(), Duration::from_millis(300)).await;
    let mut op = operator(server.addr()).await;
    // Someone else holds the key for another 400 ms; `a` polls for it.
    let _: () = redis::cmd("SET")
        .arg("incumbent/lost-answer")
        .arg("{\"fencing_token\":1,\"candidate\":{\"id\":\"z\"}}")
        .arg("PX")
        .arg(400)
        .query_async(&mut op)
        .await
        .expect("set");
    let mut a = Election::builder(backend.clone(), "lost-answer")
        .candidate("a")
        .ttl(ttl)
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .expect("valid election")
        .campaign();
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.process().pause();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.process().resume();
    let thawed = Instant::now();
    let term = elected(&mut a, PATIENCE).await;
    let took = thawed.elapsed();
    assert!(
        took < ttl / 2,
        "a leads {took:?} after the thaw: the key its lost acquire wrote was left to expire"
    );
    let value: String = redis::cmd("GET")
        .arg("incumbent/lost-answer")
        .query_async(&mut op)
        .await
        .expect("get");
    assert!(
        value.contains("\"id\":\"a\""),
        "the key names the leader: {value}"
    );
    assert!(value.contains(&term.fencing_token().to_string()));
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_whose_answer_was_lost_does_not_end_the_term() {
    // The leader's link stalls while it proclaims: the proclaim times out for it, but
    // reaches the server once the link flows again, and runs. The next renewal finds the new value, which is the
    // leader's own, not a sign that someone took the lock.
    let server = RedisServer::start().await;
    let proxy = crate::support::proxy::Proxy::start(server.addr());
    let backend = connect_with_timeout(proxy.addr(), Duration::from_millis(300)).await;
    let ttl = Duration::from_secs(6);
    let mut a = Election::builder(backend.clone(), "lost-proclaim")
        .candidate("a")
        .ttl(ttl)
        .build()
        .expect("valid election")
        .campaign();
    let term = elected(&mut a, PATIENCE).await;
    // A first proclaim loads the script into the server (a script is run by its hash once
    // loaded): the late one then runs as sent.
    let first = [("zone".to_owned(), "a".to_owned())].into();
    a.proclaim(first).await.expect("proclaim");
    proxy.blackhole(true);
    let metadata = [("zone".to_owned(), "b".to_owned())].into();
    let proclaimed = a.proclaim(metadata).await;
    assert!(proclaimed.is_err(), "the answer was lost: {proclaimed:?}");
    proxy.blackhole(false);
    let mut op = operator(server.addr()).await;
    let ran = tokio::time::timeout(PATIENCE, async {
        loop {
            let value: String = redis::cmd("GET")
                .arg("incumbent/lost-proclaim")
                .query_async(&mut op)
                .await
                .expect("get");
            if value.contains("\"zone\":\"b\"") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(ran.is_ok(), "the late proclaim ran in the store");
    // Two renewals (a third of the ttl apart) later, the term still holds.
    tokio::time::sleep(ttl * 2 / 3 + Duration::from_millis(500)).await;
    assert!(
        !term.is_cancelled(),
        "a late proclaim was taken for the lock being taken"
    );
    assert!(a.status().borrow().is_leader());
    a.shutdown().await.expect("shutdown");
}

#[test]
fn credentials_in_an_address_never_reach_debug() {
    let config = RedisConfig::new("user:s3cret@cache.internal:6380");
    let shown = format!("{config:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("cache.internal"), "{shown}");
    assert!(shown.contains("6380"), "{shown}");
}

/// `GET key` on the server at `addr`, as an operator.
async fn get(addr: SocketAddr, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut operator(addr).await)
        .await
        .expect("get")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_to_a_replica_that_missed_the_last_term_tokens_still_grow() {
    // A primary and its replica. The replica is cut from the primary (promoted early, as an
    // asynchronous failover would find it) and misses the last term's counter; the primary
    // dies. A process that never saw the last token must still get a greater one.
    let mut primary = RedisServer::start().await;
    let replica = RedisServer::replica_of(primary.addr()).await;
    let counter = "incumbent/failover:fencing";
    let term = |addr: SocketAddr, id: &'static str| async move {
        let backend = connect(addr, Notifications::Off).await;
        let mut campaign = election(&backend, "failover", id).campaign();
        let token = elected(&mut campaign, PATIENCE).await.fencing_token();
        campaign.shutdown().await.expect("shutdown");
        token
    };
    let first = term(primary.addr(), "a").await;
    let replicated = tokio::time::timeout(PATIENCE, async {
        while get(replica.addr(), counter).await != Some(first.to_string()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        replicated.is_ok(),
        "the replica never caught up with token {first}"
    );
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut operator(replica.addr()).await)
        .await
        .expect("promote the replica");
    let second = term(primary.addr(), "b").await;
    assert!(second > first);
    primary.process().kill9();
    assert_eq!(
        get(replica.addr(), counter).await,
        Some(first.to_string()),
        "the promoted replica missed the last term's counter"
    );
    let third = term(replica.addr(), "c").await;
    assert!(
        third > second,
        "after the failover the token went from {second} to {third}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_backend_from_a_redis_url_elects_and_hands_over() {
    let server = RedisServer::start().await;
    let url = format!("redis://{}", server.addr());
    let connect = || async {
        incumbent::AnyBackend::connect(&url)
            .await
            .expect("connect from the URL")
    };
    let (one, other) = (connect().await, connect().await);
    assert_eq!(one.info().name, "redis");
    let make = |backend: incumbent::AnyBackend, id: &str| {
        Election::builder(backend, "any")
            .candidate(id)
            .ttl(TTL)
            .build()
            .expect("valid election")
    };
    let a = make(one, "a");
    let mut a_campaign = a.campaign();
    let first = elected(&mut a_campaign, PATIENCE).await;
    assert_eq!(
        a.leader().await.expect("leader").map(|l| l.candidate.id),
        Some("a".to_owned()),
        "leader() reads the holder without campaigning"
    );
    assert_eq!(
        a.participants().await.expect("read"),
        None,
        "Redis keeps only the holder: no queue to list"
    );
    let mut b = make(other, "b").campaign();
    a_campaign.shutdown().await.expect("shutdown");
    let second = elected(&mut b, PATIENCE).await;
    assert!(second.fencing_token() > first.fencing_token());
    b.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn any_backend_refuses_a_malformed_url_with_a_typed_error() {
    let error = incumbent::AnyBackend::connect("redis://")
        .await
        .expect_err("no address");
    assert!(
        matches!(error, incumbent::Error::InvalidConfig { .. }),
        "{error:?}"
    );
}
