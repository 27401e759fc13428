//! memcached: one server on loopback, started with the test harness (tests/support).

use std::net::SocketAddr;
use std::time::Duration;

use incumbent::memcached::MemcachedBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::polled;
use crate::support::MemcachedServer;

/// Hand-off rounds: the median of a uniform phase over 100 ms moves by about
/// 50 ms / sqrt(rounds), so many rounds.
const POLLED_ROUNDS: usize = 300;
/// The poll interval (redis-py's `Lock` reference polls every 100 ms).
const POLL: Duration = Duration::from_millis(100);
/// The ttl of every round (memcached's expiry is in whole seconds).
const TTL: Duration = Duration::from_secs(2);
/// Crash rounds: each waits for the key to expire.
const CRASH_ROUNDS: usize = 6;

async fn connect(addr: SocketAddr) -> MemcachedBackend {
    MemcachedBackend::builder(addr.to_string())
        .poll_interval(POLL)
        .connect()
        .await
        .expect("connect to memcached")
}

pub async fn run() {
    println!("\n## memcached");
    let server = MemcachedServer::start().await;
    let addr = server.addr();
    println!("memcached on {addr}, 64 MB");
    let samples = polled::handoff(
        [connect(addr).await, connect(addr).await],
        TTL,
        POLLED_ROUNDS,
        POLL * 2,
    )
    .await;
    crate::common::print_latencies_against(
        "hand-off after resign, polling every 100 ms (two backends)",
        &samples,
        "median <= poll/2 + 3 ms = 53 ms; redis-py's Lock: 56 ms",
    );
    {
        let members = vec![
            connect(addr).await,
            connect(addr).await,
            connect(addr).await,
        ];
        let (gaps, calls) =
            crate::switchover::rounds(members, TTL, polled::SWITCHOVER_POLLED_ROUNDS).await;
        let window = Duration::from_millis(500);
        let fallback = crate::switchover::dead_target(move || connect(addr), TTL, window, 3).await;
        crate::switchover::print(
            "memcached, polling every 100 ms",
            &gaps,
            &calls,
            &fallback,
            window,
        );
    }
    polled::crash(
        move || connect(addr),
        TTL,
        CRASH_ROUNDS,
        "runtime and connection dropped; the key lives ttl + 1 s at most",
        "<= ttl + 1 s + poll",
    )
    .await;
    polled::idle(
        || connect(addr),
        TTL,
        || requests(addr),
        &format!(
            "from `stats` (get, set/add/cas, incr, delete, touch; memcached does not count \
             `version`, the ping of a session that holds no key, 1 per renew interval = \
             {:.1}/s per follower process)",
            3.0 / TTL.as_secs_f64()
        ),
    )
    .await;
}

/// Requests the server has counted, from `stats`.
async fn requests(addr: SocketAddr) -> Option<u64> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut stream = BufReader::new(stream);
    stream.get_mut().write_all(b"stats\r\n").await.ok()?;
    let mut total = 0;
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.ok()? == 0 || line.starts_with("END") {
            return Some(total);
        }
        let mut fields = line.split_whitespace().skip(1);
        let (Some(name), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        let counted = [
            "cmd_get",
            "cmd_set",
            "cmd_touch",
            "incr_hits",
            "incr_misses",
            "delete_hits",
            "delete_misses",
        ];
        if counted.contains(&name) {
            total += value.parse::<u64>().unwrap_or(0);
        }
    }
}
