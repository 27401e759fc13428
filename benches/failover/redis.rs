//! Redis: one `redis-server` on loopback without persistence, started with the test harness
//! (tests/support), with and without keyspace notifications.

use std::net::SocketAddr;
use std::time::Duration;

use incumbent::redis::{Notifications, RedisBackend, RedisConfig};

use crate::polled;
use crate::support::RedisServer;

/// Hand-off rounds with keyspace notifications.
const HANDOFF_ROUNDS: usize = 100;
/// Hand-off rounds by polling: the median of a uniform phase over 100 ms moves by about
/// 50 ms / sqrt(rounds), so many rounds.
const POLLED_ROUNDS: usize = 300;
/// The poll interval of the polled rounds (redis-py's `Lock` reference polls every 100 ms).
const POLL: Duration = Duration::from_millis(100);
/// The ttl of every round.
const TTL: Duration = Duration::from_secs(2);
/// Crash rounds: each waits for the key to expire.
const CRASH_ROUNDS: usize = 6;

async fn connect(addr: SocketAddr, notifications: Notifications) -> RedisBackend {
    RedisBackend::builder(RedisConfig::new(addr.to_string()))
        .notifications(notifications)
        .poll_interval(POLL)
        .connect()
        .await
        .expect("connect to redis")
}

pub async fn run() {
    println!("\n## redis");
    let server = RedisServer::with_notifications().await;
    let addr = server.addr();
    println!("redis-server on {addr}, no persistence, notify-keyspace-events Kg$x");
    for (mode, notifications, rounds, target) in [
        (
            "keyspace notifications",
            Notifications::IfEnabled,
            HANDOFF_ROUNDS,
            "median <= 3 ms",
        ),
        (
            "polling every 100 ms",
            Notifications::Off,
            POLLED_ROUNDS,
            "median <= poll/2 + 3 ms = 53 ms; redis-py's Lock: 56 ms",
        ),
    ] {
        let backends = [
            connect(addr, notifications).await,
            connect(addr, notifications).await,
        ];
        let samples = polled::handoff(backends, TTL, rounds, POLL * 2).await;
        crate::common::print_latencies_against(
            &format!("hand-off after resign, {mode} (two backends)"),
            &samples,
            target,
        );
    }
    for (mode, notifications, rounds) in [
        (
            "keyspace notifications",
            Notifications::IfEnabled,
            HANDOFF_ROUNDS,
        ),
        (
            "polling every 100 ms",
            Notifications::Off,
            polled::SWITCHOVER_POLLED_ROUNDS,
        ),
    ] {
        let members = vec![
            connect(addr, notifications).await,
            connect(addr, notifications).await,
            connect(addr, notifications).await,
        ];
        let (gaps, calls) = crate::switchover::rounds(members, TTL, rounds).await;
        let window = Duration::from_millis(500);
        let dead = move || connect(addr, notifications);
        let fallback = crate::switchover::dead_target(dead, TTL, window, 3).await;
        crate::switchover::print(&format!("redis, {mode}"), &gaps, &calls, &fallback, window);
    }
    for (mode, notifications) in [
        ("keyspace notifications", Notifications::IfEnabled),
        ("polling every 100 ms", Notifications::Off),
    ] {
        polled::crash(
            move || connect(addr, notifications),
            TTL,
            CRASH_ROUNDS,
            &format!("runtime and connection dropped, {mode}"),
            "<= ttl + poll",
        )
        .await;
    }
    for (mode, notifications) in [
        ("keyspace notifications", Notifications::IfEnabled),
        ("polling every 100 ms", Notifications::Off),
    ] {
        polled::idle(
            || connect(addr, notifications),
            TTL,
            || commands(addr),
            &format!(
                "{mode}, scripts + PING + GET from INFO commandstats; target: per process 1 \
                 request per renew interval ({:.1}/s) plus the poll; redis-py's Lock: 8.8/s \
                 per idle candidate",
                3.0 / TTL.as_secs_f64()
            ),
        )
        .await;
    }
}

/// Requests the server has had from clients, from `INFO commandstats`: scripts
/// (`EVALSHA`, `EVAL`), `PING`, and `GET`s. commandstats counts the commands a script runs
/// too: each script here (an acquire that finds the key held, a renewal of one key) runs one
/// `GET`, so the clients' own `GET`s are the `GET`s less the scripts. The counter reads'
/// own commands (`INFO`, and `HELLO`/`CLIENT` at connect) are not counted.
async fn commands(addr: SocketAddr) -> Option<u64> {
    let client = redis::Client::open(format!("redis://{addr}")).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .ok()?;
    let calls = |command: &str| -> u64 {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let scripts = calls("evalsha") + calls("eval");
    Some(scripts + calls("ping") + calls("get").saturating_sub(scripts))
}
