//! etcd: one real server on loopback, started with the test harness (tests/support).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, WatchOptions};
use incumbent::etcd::{EtcdBackend, MIN_TTL};

use crate::common;
use crate::support::etcd::TMPFS;
use crate::support::{EtcdServer, http};

/// Hand-off rounds (at least 50 for a p99 worth printing).
const HANDOFF_ROUNDS: usize = 100;
/// Rounds of the store's part of a hand-off, with a plain client.
const FLOOR_ROUNDS: usize = 50;
/// Crash rounds: each waits for the lease to expire, about the ttl.
const CRASH_ROUNDS: usize = 5;
/// Candidates that sit idle: one leader and nine followers.
const IDLE_CANDIDATES: usize = 10;
/// The ttl while idle: renewals every second, so the window holds enough to count.
const IDLE_TTL: Duration = Duration::from_secs(3);
/// How long the request rate is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// How long a follower's watch has been in place when the leader resigns, in the settled
/// hand-off rounds and in the floor's rounds.
const SETTLE: Duration = Duration::from_millis(20);
/// Elections held at once by one process.
const SCALE: usize = 1_000;

pub async fn run() {
    println!("\n## etcd");
    let server = EtcdServer::single().await;
    let endpoints = server.endpoints();
    let addr = server.client_addr();
    let version = http::get(addr, "/version")
        .await
        .map(|r| r.body)
        .unwrap_or_default();
    println!("etcd on {addr}, its data on disk: {}", version.trim());

    let on_disk = handoff(&endpoints, addr, "disk").await;
    let on_tmpfs = {
        let tmpfs = EtcdServer::single_on_tmpfs().await;
        let addr = tmpfs.client_addr();
        println!("a second etcd on {addr}, its data on tmpfs ({TMPFS}), for the same rounds:");
        handoff(&tmpfs.endpoints(), addr, "tmpfs").await
    };
    on_disk.print_against_floor();
    on_tmpfs.print_against_floor();
    switchover(&endpoints).await;

    crash(&endpoints).await;
    idle_separate(&endpoints, addr).await;
    idle_shared(&endpoints, addr).await;
    scale(&endpoints).await;
}

/// Planned switchover among three candidates, and to a dead target.
async fn switchover(endpoints: &[String]) {
    let members = vec![
        connect(endpoints.to_vec()).await,
        connect(endpoints.to_vec()).await,
        connect(endpoints.to_vec()).await,
    ];
    let (gaps, calls) = crate::switchover::rounds(members, MIN_TTL, 100).await;
    let window = std::time::Duration::from_millis(500);
    let endpoints = endpoints.to_vec();
    let dead = move || connect(endpoints.clone());
    let fallback = crate::switchover::dead_target(dead, MIN_TTL, window, 3).await;
    crate::switchover::print("etcd (data on disk)", &gaps, &calls, &fallback, window);
}

async fn connect(endpoints: Vec<String>) -> EtcdBackend {
    EtcdBackend::connect(endpoints)
        .await
        .expect("connect to etcd")
}

/// Two candidates, each on its own connection (as two processes would be); then the store's
/// floor for the same steps. `store` says where etcd keeps its data.
async fn handoff(endpoints: &[String], addr: SocketAddr, store: &'static str) -> Handoff {
    let before = scrape(addr).await;
    let pool = Mutex::new(vec![
        connect(endpoints.to_vec()).await,
        connect(endpoints.to_vec()).await,
    ]);
    let next = || {
        pool.lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("two connections")
    };
    let (racing, samples) =
        common::handoff_rounds_racing_and_settled(next, MIN_TTL, HANDOFF_ROUNDS, SETTLE).await;
    common::print_latencies_against(
        &format!(
            "hand-off after resign, etcd on {store} (ttl {MIN_TTL:?}, two connections), \
             the follower settled for {SETTLE:?}"
        ),
        &samples,
        "median <= 2 ms",
    );
    common::print_latencies(
        "  the same, resigning as soon as the follower reports Follower (racing its watch's set-up)",
        &racing,
    );
    // A hand-off waits for two writes to etcd's WAL (the release, the new term), each fsynced.
    let after = scrape(addr).await;
    let fsyncs = after.fsyncs - before.fsyncs;
    let fsync = (fsyncs > 0.0)
        .then(|| Duration::from_secs_f64((after.fsync_seconds - before.fsync_seconds) / fsyncs));
    if let Some(fsync) = fsync {
        println!(
            "  etcd's WAL fsync meanwhile: mean {:.3} ms over {fsyncs:.0} fsyncs",
            fsync.as_secs_f64() * 1e3
        );
    }
    Handoff {
        store,
        library: common::median(&samples),
        floor: store_floor(endpoints).await,
        fsync,
    }
}

/// Medians of one etcd's hand-off rounds, to set the library against the store.
struct Handoff {
    /// Where etcd keeps its data.
    store: &'static str,
    library: Option<Duration>,
    /// The plain client's delete -> watch event.
    floor: Option<Duration>,
    /// etcd's mean WAL fsync during the library's rounds.
    fsync: Option<Duration>,
}

impl Handoff {
    /// One line: the library's median, the floor's, and their ratio.
    fn print_against_floor(&self) {
        let ms = |d: Option<Duration>| {
            d.map_or_else(
                || "-".to_owned(),
                |d| format!("{:.3} ms", d.as_secs_f64() * 1e3),
            )
        };
        let ratio = match (self.library, self.floor) {
            (Some(library), Some(floor)) if !floor.is_zero() => {
                format!("{:.2}", library.as_secs_f64() / floor.as_secs_f64())
            }
            _ => "-".to_owned(),
        };
        println!(
            "settled hand-off against the floor (delete -> watch event), etcd on {} (WAL fsync {}): median {} / {} = {ratio}",
            self.store,
            ms(self.fsync),
            ms(self.library),
            ms(self.floor),
        );
    }
}

/// The store's part of a hand-off, with a plain etcd client: the leader deletes its key, and
/// the follower, watching it, receives the delete. That is all a settled hand-off needs from
/// etcd (the follower next in line wins on the event), so it is what the library cannot go
/// below on this machine. Also printed: the delete's own answer, and the longer sequence with
/// a read and a transaction after the event (the recipe of etcd's own concurrency package).
/// Returns the median of delete -> watch event.
async fn store_floor(endpoints: &[String]) -> Option<Duration> {
    let client = || etcd_client::Client::connect(endpoints, None);
    let (Ok(mut leader), Ok(mut follower)) = (client().await, client().await) else {
        println!("  etcd floor: could not connect");
        return None;
    };
    let mut events = Vec::with_capacity(FLOOR_ROUNDS);
    let mut deletes = Vec::with_capacity(FLOOR_ROUNDS);
    let mut sequences = Vec::with_capacity(FLOOR_ROUNDS);
    for round in 0..FLOOR_ROUNDS {
        let Ok(Some(sample)) = floor_round(&mut leader, &mut follower, round).await else {
            println!("  etcd floor: round {round} failed");
            break;
        };
        events.push(sample.event);
        deletes.push(sample.deleted);
        sequences.push(sample.sequence);
    }
    common::print_latencies("  etcd floor, plain client: delete -> watch event", &events);
    common::print_latencies("  etcd floor, plain client: the delete's answer", &deletes);
    common::print_latencies(
        "  etcd floor, plain client: delete -> watch event -> range -> txn",
        &sequences,
    );
    common::median(&events)
}

/// One round of [`store_floor`], each time from the delete's start.
struct FloorSample {
    /// Until the follower's watch delivered the delete.
    event: Duration,
    /// Until the delete was answered.
    deleted: Duration,
    /// Until the follower also read the range and rewrote its key in a transaction.
    sequence: Duration,
}

/// One round of [`store_floor`].
async fn floor_round(
    leader: &mut etcd_client::Client,
    follower: &mut etcd_client::Client,
    round: usize,
) -> Result<Option<FloorSample>, etcd_client::Error> {
    let range = format!("bench/floor/{round}@");
    let (mine, theirs) = (format!("{range}b"), format!("{range}a"));
    leader.put(theirs.clone(), "a", None).await?;
    let put = follower.put(mine.clone(), "b", None).await?;
    let revision = put.header().map_or(0, |h| h.revision());
    let options = WatchOptions::new().with_start_revision(revision + 1);
    let mut watch = follower.watch(theirs.clone(), Some(options)).await?;
    // The first answer confirms the watch; then let it settle.
    watch.message().await?;
    tokio::time::sleep(SETTLE).await;
    let start = Instant::now();
    let (deleted, event) = tokio::join!(
        async {
            let answer = leader.delete(theirs, None).await;
            answer.map(|_| start.elapsed())
        },
        async {
            loop {
                let Some(answer) = watch.message().await? else {
                    return Ok::<_, etcd_client::Error>(None);
                };
                if answer
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(Some(start.elapsed()));
                }
            }
        }
    );
    let (deleted, Some(event)) = (deleted?, event?) else {
        return Ok(None);
    };
    let options = GetOptions::new().with_prefix();
    follower.get(range.clone(), Some(options)).await?;
    let txn = Txn::new()
        .when([Compare::create_revision(
            mine.clone(),
            CompareOp::Equal,
            revision,
        )])
        .and_then([TxnOp::put(mine.clone(), "b, leading", None)]);
    follower.txn(txn).await?;
    let sequence = start.elapsed();
    follower.delete(mine, None).await?;
    Ok(Some(FloorSample {
        event,
        deleted,
        sequence,
    }))
}

/// The leader's runtime, with its connection, is dropped mid-flight at etcd's smallest ttl.
async fn crash(endpoints: &[String]) {
    let ttl = MIN_TTL;
    let range = connect(endpoints.to_vec())
        .await
        .election_range(common::ELECTION);
    let admin = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("an etcd client to watch the keys");
    // Resolves when the crashed leader's key is deleted: its lease expired.
    let watch = move |lease: String| {
        let mut admin = admin.clone();
        let range = range.clone();
        async move {
            let key = format!("{range}{lease}");
            let options = WatchOptions::new().with_prefix();
            let mut stream = admin.watch(range, Some(options)).await.ok()?;
            while let Some(response) = stream.message().await.ok()? {
                let gone = response.events().iter().any(|event| {
                    event.event_type() == EventType::Delete
                        && event
                            .kv()
                            .is_some_and(|kv| kv.key().starts_with(key.as_bytes()))
                });
                if gone {
                    return Some(Instant::now());
                }
            }
            None
        }
    };
    let eps = endpoints.to_vec();
    let candidate = move || connect(eps.clone());
    let lease_of = |b: &EtcdBackend| b.lease_ids().first().map(|id| format!("{id:x}"));
    let phase = ttl / 3;
    let crashes = common::crash_rounds_watched(
        common::ELECTION,
        candidate,
        ttl,
        CRASH_ROUNDS,
        ttl * 3,
        phase,
        lease_of,
        watch,
    )
    .await;
    common::print_crashes(
        &format!(
            "failover after a crash (runtime and connection dropped, as on kill -9; ttl {ttl:?})"
        ),
        &crashes,
        &format!(
            "<= ttl + 300 ms = {} ms",
            (ttl + Duration::from_millis(300)).as_millis()
        ),
        "lease expired (key deleted)",
    );
}

/// Ten candidates, each on its own connection: ten processes' worth.
async fn idle_separate(endpoints: &[String], addr: SocketAddr) {
    let mut members = Vec::with_capacity(IDLE_CANDIDATES);
    for i in 0..IDLE_CANDIDATES {
        members.push((connect(endpoints.to_vec()).await, format!("idle-{i}")));
    }
    let campaigns = common::idle_election(members, IDLE_TTL).await;
    let rate = measure(addr).await;
    rate.print(
        &format!("idle, 1 leader + 9 followers on {IDLE_CANDIDATES} connections (one per process)"),
        IDLE_CANDIDATES,
    );
    common::stop_all(campaigns).await;
}

/// The same ten candidates on one connection, with one identity: one lease, one keep-alive.
async fn idle_shared(endpoints: &[String], addr: SocketAddr) {
    let backend = connect(endpoints.to_vec()).await;
    let members = (0..IDLE_CANDIDATES)
        .map(|_| (backend.clone(), "bench".to_owned()))
        .collect();
    let campaigns = common::idle_election(members, IDLE_TTL).await;
    let leases = backend.lease_ids().len();
    let rate = measure(addr).await;
    rate.print(
        &format!("idle, the same 10 candidates on ONE connection, one identity ({leases} lease)"),
        1,
    );
    common::stop_all(campaigns).await;
}

async fn scale(endpoints: &[String]) {
    let backend = connect(endpoints.to_vec()).await;
    common::elections_at_scale(
        "etcd (one connection)",
        SCALE,
        || backend.clone(),
        "< 2 s, < 20 MB",
        || format!("{} lease(s) held", backend.lease_ids().len()),
    )
    .await;
}

/// What etcd received during the window, from its gRPC counters.
struct Rate {
    window: Duration,
    /// Per gRPC method: messages received (unary requests and each stream message).
    received: BTreeMap<String, f64>,
    /// Calls completed (unary calls; streams only when they end).
    handled: f64,
    /// CPU used by this process per second of the window.
    cpu_ms_per_s: f64,
}

async fn measure(addr: SocketAddr) -> Rate {
    let before = scrape(addr).await;
    let cpu = common::cpu_time();
    let start = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let cpu = common::cpu_time().saturating_sub(cpu);
    let after = scrape(addr).await;
    let window = start.elapsed();
    let received = after
        .received
        .iter()
        .map(|(method, n)| {
            let was = before.received.get(method).copied().unwrap_or(0.0);
            (method.clone(), n - was)
        })
        .filter(|(_, n)| *n > 0.0)
        .collect();
    let handled: f64 = after.handled.values().sum::<f64>() - before.handled.values().sum::<f64>();
    Rate {
        window,
        received,
        handled,
        cpu_ms_per_s: cpu.as_secs_f64() * 1e3 / window.as_secs_f64(),
    }
}

impl Rate {
    fn print(&self, what: &str, processes: usize) {
        let secs = self.window.as_secs_f64();
        let total: f64 = self.received.values().sum();
        let per_process = total / secs / processes as f64;
        let methods = if self.received.is_empty() {
            "nothing".to_owned()
        } else {
            self.received
                .iter()
                .map(|(m, n)| format!("{m} {n:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let renew = IDLE_TTL / 3;
        println!(
            "{what}: {:.2} gRPC messages/s to etcd, {per_process:.2}/s per process ({methods} in {secs:.1} s; {:.0} calls completed); \
             this process {:.2} ms CPU/s (ttl {IDLE_TTL:?}){}",
            total / secs,
            self.handled,
            self.cpu_ms_per_s,
            common::bracket(&format!(
                "<= 1 keep-alive per ttl/3 ({renew:?}) per process = {:.2}/s, no polling",
                1.0 / renew.as_secs_f64()
            ))
        );
    }
}

/// gRPC counters from etcd's Prometheus `/metrics`, summed per method, and its WAL fsyncs.
#[derive(Default)]
struct Grpc {
    received: BTreeMap<String, f64>,
    handled: BTreeMap<String, f64>,
    fsync_seconds: f64,
    fsyncs: f64,
}

async fn scrape(addr: SocketAddr) -> Grpc {
    let body = http::get(addr, "/metrics")
        .await
        .expect("etcd's /metrics")
        .body;
    let mut grpc = Grpc::default();
    for line in body.lines() {
        if let Some(value) = line.strip_prefix("etcd_disk_wal_fsync_duration_seconds_sum ") {
            grpc.fsync_seconds = value.parse().unwrap_or(0.0);
        }
        if let Some(value) = line.strip_prefix("etcd_disk_wal_fsync_duration_seconds_count ") {
            grpc.fsyncs = value.parse().unwrap_or(0.0);
        }
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        let counter = match name {
            "grpc_server_msg_received_total" => &mut grpc.received,
            "grpc_server_handled_total" => &mut grpc.handled,
            _ => continue,
        };
        let method = rest
            .split_once("grpc_method=\"")
            .and_then(|(_, m)| m.split_once('"'))
            .map_or("?", |(m, _)| m);
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *counter.entry(method.to_owned()).or_default() += value;
    }
    grpc
}
