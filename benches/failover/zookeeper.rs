//! ZooKeeper: one standalone server on loopback (tick 200 ms), started with the test harness
//! (tests/support).

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use incumbent::zookeeper::ZookeeperBackend;

use crate::common;
use crate::support::{ZookeeperServer, http};

/// Hand-off rounds (at least 50 for a p99 worth printing).
const HANDOFF_ROUNDS: usize = 100;
/// The session timeout of the hand-off and crash rounds: kazoo's reference figures were
/// taken at 4 s.
const TTL: Duration = Duration::from_secs(4);
/// Crash rounds: each waits for the session to expire, about the session timeout.
const CRASH_ROUNDS: usize = 5;
/// Candidates that sit idle: one leader and nine followers.
const IDLE_CANDIDATES: usize = 10;
/// How long the request rate is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// Elections held at once by one process.
const SCALE: usize = 1_000;

pub async fn run() {
    println!("\n## zookeeper");
    let server = ZookeeperServer::single().await;
    let connect_string = server.connect_string();
    let admin = server.admin_addr();
    let version = srvr(admin)
        .await
        .and_then(|json| json["version"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "version unknown".into());
    println!("zookeeper {version} standalone on {connect_string}, tick 200 ms, data on disk");

    handoff(&connect_string).await;
    {
        let members = vec![
            connect(connect_string.clone()).await,
            connect(connect_string.clone()).await,
            connect(connect_string.clone()).await,
        ];
        let (gaps, calls) = crate::switchover::rounds(members, TTL, 100).await;
        let window = std::time::Duration::from_millis(500);
        let string = connect_string.clone();
        let dead = move || connect(string.clone());
        let fallback = crate::switchover::dead_target(dead, TTL, window, 3).await;
        crate::switchover::print("zookeeper", &gaps, &calls, &fallback, window);
    }
    crash(&connect_string).await;
    idle(&connect_string, admin).await;
    scale(&connect_string).await;
}

async fn connect(connect_string: String) -> ZookeeperBackend {
    ZookeeperBackend::connect(connect_string)
        .await
        .expect("connect to zookeeper")
}

/// Two candidates, each on its own connection (as two processes would be).
async fn handoff(connect_string: &str) {
    let pool = Mutex::new(vec![
        connect(connect_string.to_owned()).await,
        connect(connect_string.to_owned()).await,
    ]);
    let next = || {
        pool.lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("two connections")
    };
    let samples = common::handoff_rounds(next, TTL, HANDOFF_ROUNDS).await;
    common::print_latencies_against(
        &format!("hand-off after resign (session timeout {TTL:?}, two connections)"),
        &samples,
        "median <= 2.5 ms",
    );
}

/// The leader's runtime, with its connection, is dropped mid-flight: the server expires its
/// session a session timeout after it last heard from it.
async fn crash(connect_string: &str) {
    let connect_string = connect_string.to_owned();
    let candidate = move || {
        let connect_string = connect_string.clone();
        async move { connect(connect_string).await }
    };
    let crashes = common::crash_rounds(candidate, TTL, CRASH_ROUNDS, TTL * 3).await;
    common::print_latencies_against(
        &format!(
            "failover after a crash (runtime and connection dropped, as on kill -9; session timeout {TTL:?})"
        ),
        &crashes,
        &format!(
            "<= session timeout + 300 ms = {:?}",
            TTL + Duration::from_millis(300)
        ),
    );
}

/// Ten candidates, each with its own backend (as ten processes would be): packets the server
/// received per second, from its own counters.
async fn idle(connect_string: &str, admin: SocketAddr) {
    let mut members = Vec::with_capacity(IDLE_CANDIDATES);
    for i in 0..IDLE_CANDIDATES {
        members.push((
            connect(connect_string.to_owned()).await,
            format!("idle-{i}"),
        ));
    }
    let campaigns = common::idle_election(members, TTL).await;
    let before = received(admin).await;
    let cpu = common::cpu_time();
    tokio::time::sleep(IDLE_WINDOW).await;
    let cpu = common::cpu_time().saturating_sub(cpu);
    let after = received(admin).await;
    common::stop_all(campaigns).await;
    let (Some(before), Some(after)) = (before, after) else {
        println!("idle: the server's counters could not be read");
        return;
    };
    let secs = IDLE_WINDOW.as_secs_f64();
    // The two reads of the counters are requests too, but to the AdminServer, not counted.
    let rate = after.saturating_sub(before) as f64 / secs;
    println!(
        "idle, 1 leader + 9 followers, {IDLE_CANDIDATES} backends (one per process, each with \
         one session, which its observers read through), session timeout {TTL:?}: {rate:.2} \
         packets/s received by the server, {:.2}/s per process; this process {:.2} ms CPU/s{}",
        rate / IDLE_CANDIDATES as f64,
        cpu.as_secs_f64() * 1e3 / secs,
        common::bracket(&format!(
            "no polling: per process, the renewal every ttl/3 (a sync, {:.2}/s), and no ping \
             between two renewals",
            3.0 / TTL.as_secs_f64()
        ))
    );
}

async fn scale(connect_string: &str) {
    let backend = connect(connect_string.to_owned()).await;
    common::elections_at_scale(
        "zookeeper (one connection)",
        SCALE,
        || backend.clone(),
        "< 2 s, < 20 MB",
        || format!("{} session(s) held", backend.session_ids().len()),
    )
    .await;
}

/// The server's `srvr` command, as JSON, from the AdminServer.
async fn srvr(admin: SocketAddr) -> Option<serde_json::Value> {
    let body = http::get(admin, "/commands/srvr").await.ok()?.body;
    serde_json::from_str(&body).ok()
}

/// Packets the server has received from clients since it started.
async fn received(admin: SocketAddr) -> Option<u64> {
    srvr(admin).await?["server_stats"]["packets_received"].as_u64()
}
