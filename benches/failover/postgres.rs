//! PostgreSQL: one server on loopback (`initdb` in a temp dir), started with the test harness
//! (tests/support), and PgBouncer in transaction mode in front of it. The store's floor is a
//! plain client's `NOTIFY` reaching another plain client's `LISTEN`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use incumbent::postgres::PostgresBackend;
use incumbent::postgres::tokio_postgres::{self, AsyncMessage};

use crate::polled;
use crate::support::postgres::{backend, client_at, config_at};
use crate::support::{PgBouncer, PostgresServer};

/// Hand-off rounds while followers `LISTEN`, and floor rounds.
const HANDOFF_ROUNDS: usize = 100;
/// Hand-off rounds by polling (the median of a uniform phase moves by about
/// 50 ms / sqrt(rounds)).
const POLLED_ROUNDS: usize = 200;
/// The poll interval of the polled rounds.
const POLL: Duration = Duration::from_millis(100);
/// The ttl of every round.
const TTL: Duration = Duration::from_secs(2);
/// Crash rounds: each waits for the lease to run out.
const CRASH_ROUNDS: usize = 6;

async fn connect(addr: SocketAddr, listen: bool) -> PostgresBackend {
    backend(addr)
        .listen(listen)
        .poll_interval(POLL)
        .connect()
        .await
        .expect("connect to postgres")
}

pub async fn run() {
    println!("\n## postgres");
    let server = PostgresServer::start().await;
    let addr = server.addr();
    let bouncer = PgBouncer::transaction_mode(addr, 4).await;
    println!(
        "postgres on {addr} (fsync off), pgbouncer on {} (pool_mode = transaction)",
        bouncer.addr()
    );
    let floor = notify_floor(addr).await;
    crate::common::print_latencies("floor: a plain client's NOTIFY to another's LISTEN", &floor);
    for (mode, addr, listen, rounds, target) in [
        (
            "LISTEN/NOTIFY",
            addr,
            true,
            HANDOFF_ROUNDS,
            "median <= floor + 3 ms",
        ),
        (
            "polling every 100 ms",
            addr,
            false,
            POLLED_ROUNDS,
            "median <= poll/2 + 3 ms = 53 ms",
        ),
        (
            "through pgbouncer, polling every 100 ms",
            bouncer.addr(),
            false,
            POLLED_ROUNDS,
            "median <= poll/2 + 3 ms = 53 ms",
        ),
    ] {
        let backends = [connect(addr, listen).await, connect(addr, listen).await];
        let samples = polled::handoff(backends, TTL, rounds, POLL * 2).await;
        crate::common::print_latencies_against(
            &format!("hand-off after resign, {mode} (two backends)"),
            &samples,
            target,
        );
        let members = vec![
            connect(addr, listen).await,
            connect(addr, listen).await,
            connect(addr, listen).await,
        ];
        let switchovers = match listen {
            true => rounds,
            false => polled::SWITCHOVER_POLLED_ROUNDS,
        };
        let (gaps, calls) = crate::switchover::rounds(members, TTL, switchovers).await;
        let window = Duration::from_millis(500);
        let dead = move || connect(addr, listen);
        let fallback = crate::switchover::dead_target(dead, TTL, window, 3).await;
        crate::switchover::print(
            &format!("postgres, {mode}"),
            &gaps,
            &calls,
            &fallback,
            window,
        );
    }
    for (mode, addr, listen) in [
        ("LISTEN/NOTIFY", addr, true),
        (
            "through pgbouncer, polling every 100 ms",
            bouncer.addr(),
            false,
        ),
    ] {
        polled::crash(
            move || connect(addr, listen),
            TTL,
            CRASH_ROUNDS,
            &format!("runtime and connection dropped, {mode}"),
            "<= ttl + 10 ms: followers retry when the lease runs out",
        )
        .await;
    }
    for (mode, listen) in [("LISTEN/NOTIFY", true), ("polling every 100 ms", false)] {
        polled::idle(
            || connect(addr, listen),
            TTL,
            || transactions(addr),
            &format!(
                "{mode}, transactions from pg_stat_database; target: per process 1 statement \
                 per renew interval ({:.1}/s) plus the poll",
                3.0 / TTL.as_secs_f64()
            ),
        )
        .await;
    }
}

/// `NOTIFY` on one plain connection to a `LISTEN` on another: the time from sending it to
/// the notification's arrival.
async fn notify_floor(addr: SocketAddr) -> Vec<std::time::Duration> {
    let (listener, mut connection) = config_at(addr)
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect the listener");
    let (heard, mut hearing) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(_) = message {
                let _ = heard.send(Instant::now());
            }
        }
    });
    listener
        .batch_execute("LISTEN floor")
        .await
        .expect("listen");
    let notifier = client_at(addr).await;
    let mut samples = Vec::with_capacity(HANDOFF_ROUNDS);
    for _ in 0..HANDOFF_ROUNDS {
        let sent = Instant::now();
        notifier
            .batch_execute("NOTIFY floor")
            .await
            .expect("notify");
        match tokio::time::timeout(Duration::from_secs(5), hearing.recv()).await {
            Ok(Some(at)) => samples.push(at - sent),
            _ => break,
        }
    }
    samples
}

/// Transactions committed in the database so far (each of the backend's statements is one),
/// from `pg_stat_database`, less this read's own.
async fn transactions(addr: SocketAddr) -> Option<u64> {
    let client = client_at(addr).await;
    // The statistics are flushed at most once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let row = client
        .query_one(
            "SELECT xact_commit::int8 FROM pg_stat_database WHERE datname = 'postgres'",
            &[],
        )
        .await
        .ok()?;
    u64::try_from(row.get::<_, i64>(0)).ok()
}
