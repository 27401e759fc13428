//! The memcached backend against real memcached servers: what is particular to memcached (a
//! restart that loses the lock and the counter, whole-second ttls, operators deleting keys).
//! The behaviour every backend shares is in the conformance suite.

mod support;

use std::time::Duration;

use incumbent::backend::{Backend, SessionOptions, Wakeup};
use incumbent::memcached::MemcachedBackend;
use incumbent::{DemotionReason, Election, Error};
use support::MemcachedServer;
use support::events::{demoted, elected};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

/// The ttl of most tests.
const TTL: Duration = Duration::from_secs(2);
/// How long any expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);
/// The poll interval of the tests.
const POLL: Duration = Duration::from_millis(100);

async fn connect(server: &MemcachedServer) -> MemcachedBackend {
    MemcachedBackend::builder(server.addr().to_string())
        .poll_interval(POLL)
        .connect()
        .await
        .expect("connect to memcached")
}

fn election(backend: &MemcachedBackend, name: &str, candidate: &str) -> Election<MemcachedBackend> {
    Election::builder(backend.clone(), name)
        .candidate(candidate)
        .ttl(TTL)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100))
        .build()
        .expect("valid election")
}

/// One text-protocol command, as an operator would send it with `nc`; the first reply line.
async fn operator(server: &MemcachedServer, command: &str) -> String {
    let stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("operator connection");
    let mut stream = BufReader::new(stream);
    stream
        .get_mut()
        .write_all(format!("{command}\r\n").as_bytes())
        .await
        .expect("send");
    let mut line = String::new();
    stream.read_line(&mut line).await.expect("reply");
    line.trim_end().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_demotes_the_leader_at_its_next_renewal_and_tokens_still_grow() {
    let mut server = MemcachedServer::start().await;
    let backend = connect(&server).await;
    let mut a = election(&backend, "restart", "a").campaign();
    let first = elected(&mut a, PATIENCE).await;
    server.process().restart().await;
    let restarted = Instant::now();
    // Key and counter are gone: the next renewal finds out, and the explanation says the
    // store lost the session, not that someone deleted the key.
    assert_eq!(
        demoted(&mut a, PATIENCE).await,
        DemotionReason::SessionExpired
    );
    println!("demoted {:?} after the restart", restarted.elapsed());
    // The counter went back to zero: it is raised past the last token, and the next term
    // comes a ttl later.
    let second = elected(&mut a, PATIENCE).await;
    assert!(second.fencing_token() > first.fencing_token());
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_a_new_process_gets_a_token_above_every_earlier_one() {
    let mut server = MemcachedServer::start().await;
    let mut a = election(&connect(&server).await, "fresh", "a").campaign();
    let mut last = elected(&mut a, PATIENCE).await.fencing_token();
    for _ in 0..2 {
        a.resign().await.expect("resign");
        last = elected(&mut a, PATIENCE).await.fencing_token();
    }
    a.shutdown().await.expect("shutdown");
    server.process().restart().await;
    // A candidate that never saw those tokens: nothing in it can raise the counter past them.
    let mut c = election(&connect(&server).await, "fresh", "c").campaign();
    let next = elected(&mut c, PATIENCE).await.fencing_token();
    assert!(
        next > last,
        "the counter came back below the tokens before the restart: {last} then {next}"
    );
    c.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_key_ends_the_term_as_key_deleted() {
    let server = MemcachedServer::start().await;
    let backend = connect(&server).await;
    let mut a = election(&backend, "deleted", "a").campaign();
    let term = elected(&mut a, PATIENCE).await;
    let reply = operator(&server, &format!("delete {}", backend.key("deleted"))).await;
    assert_eq!(reply, "DELETED");
    assert_eq!(demoted(&mut a, PATIENCE).await, DemotionReason::KeyDeleted);
    assert!(term.is_cancelled());
    let again = elected(&mut a, PATIENCE).await;
    assert!(again.fencing_token() > term.fencing_token());
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_must_be_whole_seconds() {
    let server = MemcachedServer::start().await;
    let backend = connect(&server).await;
    let options = SessionOptions {
        ttl: Duration::from_millis(2500),
        renew_interval: Duration::from_millis(800),
        lock_delay: None,
        name: "t".into(),
    };
    let error = backend.open_session(&options).await.unwrap_err();
    assert!(matches!(error, Error::InvalidTiming { .. }), "{error}");
    assert!(error.to_string().contains("whole seconds"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_poll_and_say_so() {
    let server = MemcachedServer::start().await;
    let backend = connect(&server).await;
    assert_eq!(backend.info().wakeup, Wakeup::Poll(POLL));
    // A hand-off between two processes (two backends): the follower's poll finds it.
    let other = connect(&server).await;
    let mut a = election(&backend, "poll", "a").campaign();
    elected(&mut a, PATIENCE).await;
    let mut b = election(&other, "poll", "b").campaign();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    a.shutdown().await.expect("shutdown");
    elected(&mut b, PATIENCE).await;
    println!(
        "hand-off by polling every {POLL:?}: {:?}",
        released.elapsed()
    );
    b.shutdown().await.expect("shutdown");
}

/// Floods the server with `count` items of every size from `size / 8` to `size` bytes (so
/// every small slab class fills, the lock's among them), pipelined without replies, as a
/// cache under memory pressure would see; returns its `evictions` counter afterwards.
async fn flood(server: &MemcachedServer, count: usize, size: usize) -> u64 {
    let stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("flood connection");
    let mut stream = BufReader::new(stream);
    let value = "x".repeat(size);
    let mut batch = String::new();
    for i in 0..count {
        let len = size / 8 + i % (size - size / 8);
        let value = &value[..len];
        batch.push_str(&format!("set flood:{i} 0 0 {len} noreply\r\n{value}\r\n"));
        if batch.len() > 1 << 20 {
            stream
                .get_mut()
                .write_all(batch.as_bytes())
                .await
                .expect("flood");
            batch.clear();
        }
    }
    stream
        .get_mut()
        .write_all(format!("{batch}stats\r\n").as_bytes())
        .await
        .expect("flood");
    let mut evictions = 0;
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.expect("stats") == 0 || line.starts_with("END") {
            break;
        }
        if let Some(n) = line.trim_end().strip_prefix("STAT evictions ") {
            evictions = n.parse().unwrap_or(0);
        }
    }
    evictions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_lock_demotes_the_leader_and_the_next_token_still_grows() {
    // A small cache, flooded with items of the lock's size: the lock and its counter go.
    let server = MemcachedServer::with_memory_mb(2).await;
    let backend = connect(&server).await;
    let mut a = election(&backend, "evicted", "a").campaign();
    let first = elected(&mut a, PATIENCE).await;
    let evictions = flood(&server, 200_000, 800).await;
    assert!(evictions > 0, "the flood evicted nothing");
    let reason = demoted(&mut a, PATIENCE).await;
    assert!(
        matches!(
            reason,
            DemotionReason::KeyDeleted | DemotionReason::SessionExpired
        ),
        "an evicted lock ends the term as lost: {reason:?}"
    );
    assert!(first.is_cancelled());
    let second = elected(&mut a, PATIENCE * 2).await;
    assert!(
        second.fencing_token() > first.fencing_token(),
        "the counter was evicted too, yet the token grows: {} then {}",
        first.fencing_token(),
        second.fencing_token()
    );
}
