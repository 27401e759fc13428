//! Consul: a `consul agent -dev` on loopback, started with the test harness (tests/support).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use incumbent::backend::Backend;
use incumbent::consul::client::{ConsulClient, QueryOptions};
use incumbent::consul::{BLOCKING_WAIT, ConsulBackend, ConsulConfig, MIN_TTL};

use crate::common;
use crate::support::{ConsulDev, http};

/// Hand-off rounds (at least 50 for a p99 worth printing).
const HANDOFF_ROUNDS: usize = 100;
/// Crash rounds per lock-delay: each takes tens of seconds.
const CRASH_ROUNDS: usize = 2;
/// The lock-delays that crash rounds run with: Consul's default, and none.
const LOCK_DELAYS: [Duration; 2] = [Duration::from_secs(15), Duration::ZERO];
/// Candidates that sit idle: one leader and nine followers.
const IDLE_CANDIDATES: usize = 10;
/// The agent aggregates its metrics over intervals of this length, aligned to the clock.
const METRICS_INTERVAL: u64 = 10;

pub async fn run() {
    println!("\n## consul");
    let agent = ConsulDev::start().await;
    let url = agent.http_url();
    let addr = agent.http_addr();
    let version = http::get(addr, "/v1/agent/self")
        .await
        .ok()
        .and_then(|r| serde_json::from_str::<serde_json::Value>(&r.body).ok())
        .and_then(|json| json["Config"]["Version"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "version unknown".into());
    println!("consul agent -dev {version} on {addr}");

    handoff(&url).await;
    {
        let members = vec![
            backend(&url, None),
            backend(&url, None),
            backend(&url, None),
        ];
        let (gaps, calls) = crate::switchover::rounds(members, MIN_TTL, 100).await;
        let window = Duration::from_millis(500);
        let dead_url = url.clone();
        // A dead target's session lingers ttl to 2 x ttl; the escrow lapses after the window
        // whatever happens to it. No lock-delay: the old leader keeps its session.
        let dead = move || {
            let url = dead_url.clone();
            async move { backend(&url, None) }
        };
        let fallback = crate::switchover::dead_target(dead, MIN_TTL, window, 3).await;
        crate::switchover::print("consul", &gaps, &calls, &fallback, window);
    }
    // The lock-delay series run at the same time, each on its own key: they only wait.
    println!(
        "(crash rounds: Consul invalidates a crashed session ttl to 2 x ttl after its last \
         renewal, then keeps the lock for the lock-delay; {CRASH_ROUNDS} rounds with each \
         lock-delay, run side by side, take about {} s)",
        (MIN_TTL * 2 + LOCK_DELAYS[0] + MIN_TTL / 3).as_secs() * CRASH_ROUNDS as u64
    );
    let [long, short] = LOCK_DELAYS;
    let (long, short) = tokio::join!(
        crash(&url, long, "bench/crash-a"),
        crash(&url, short, "bench/crash-b")
    );
    long();
    short();
    idle(&url, addr).await;
}

/// A backend with its own HTTP client (as a process would have), and this lock-delay (`None`:
/// Consul's default, 15 s).
fn backend(url: &str, lock_delay: Option<Duration>) -> ConsulBackend {
    let builder = ConsulBackend::builder(ConsulConfig::new(url));
    match lock_delay {
        Some(delay) => builder.lock_delay(delay),
        None => builder,
    }
    .build()
    .expect("valid consul settings")
}

/// Two candidates, each with its own client; Consul's default lock-delay, which a release
/// does not incur.
async fn handoff(url: &str) {
    let pool = Mutex::new(vec![backend(url, None), backend(url, None)]);
    let next = || {
        pool.lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("two backends")
    };
    let samples = common::handoff_rounds(next, MIN_TTL, HANDOFF_ROUNDS).await;
    common::print_latencies_against(
        &format!("hand-off after release (ttl {MIN_TTL:?}, default lock-delay, two clients)"),
        &samples,
        "median <= 4 ms",
    );
}

/// The leader's runtime, with its HTTP connections, is dropped mid-flight. Returns the
/// printing of the figures, to keep the output of series run side by side apart.
async fn crash(url: &str, lock_delay: Duration, election: &str) -> impl FnOnce() + use<> {
    let ttl = MIN_TTL;
    let admin_backend = backend(url, None);
    let admin = admin_backend.client().clone();
    let key = admin_backend.key(election);
    let watch = move |session: String| {
        let admin = admin.clone();
        let key = key.clone();
        async move { session_cleared(&admin, &key, &session).await }
    };
    let url = url.to_owned();
    let candidate = move || {
        let url = url.clone();
        async move { backend(&url, Some(lock_delay)) }
    };
    let session_of = |b: &ConsulBackend| b.session_ids().first().cloned();
    let limit = ttl * 2 + lock_delay + Duration::from_secs(10);
    let crashes = common::crash_rounds_watched(
        election,
        candidate,
        ttl,
        CRASH_ROUNDS,
        limit,
        ttl / 3,
        session_of,
        watch,
    )
    .await;
    move || {
        let margin = Duration::from_millis(200);
        common::print_crashes(
            &format!(
                "failover after a crash (runtime and connections dropped, as on kill -9; ttl {ttl:?}, lock-delay {} s)",
                lock_delay.as_secs()
            ),
            &crashes,
            &format!(
                "<= invalidation + lock-delay + 200 ms, i.e. <= {:.1} s after the invalidation, which comes ttl to 2 x ttl after the last renewal",
                (lock_delay + margin).as_secs_f64()
            ),
            "session invalidated (key's Session cleared)",
        );
    }
}

/// Resolves when `key` is no longer locked by `session`, watched with blocking queries.
async fn session_cleared(admin: &ConsulClient, key: &str, session: &str) -> Option<Instant> {
    let mut index = None;
    loop {
        let options = QueryOptions {
            index,
            wait: Some(Duration::from_secs(60)),
            consistent: false,
        };
        match admin.kv_get(key, &options).await {
            Ok(answer) => {
                let holder = answer.entry.as_ref().and_then(|e| e.session.as_deref());
                if holder != Some(session) {
                    return Some(Instant::now());
                }
                index = Some(answer.index.max(1));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Ten candidates, each with its own client: ten processes' worth. Counted by the agent's own
/// metrics over one whole aggregation interval.
async fn idle(url: &str, addr: SocketAddr) {
    let ttl = MIN_TTL;
    let members = (0..IDLE_CANDIDATES)
        .map(|i| (backend(url, None), format!("idle-{i}")))
        .collect();
    let campaigns = common::idle_election(members, ttl).await;

    // The next interval of the agent's metrics that starts after everyone settled.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let start = now.as_secs() / METRICS_INTERVAL * METRICS_INTERVAL + METRICS_INTERVAL;
    let interval = Duration::from_secs(METRICS_INTERVAL);
    tokio::time::sleep(Duration::from_secs(start).saturating_sub(now)).await;
    let cpu = common::cpu_time();
    tokio::time::sleep(interval).await;
    let cpu = common::cpu_time().saturating_sub(cpu);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let label = format!(
        " {:02}:{:02}:{:02} ",
        start / 3600 % 24,
        start / 60 % 60,
        start % 60
    );
    let mut counts = None;
    for _ in 0..20 {
        if let Some((stamp, found)) = agent_http_counts(addr).await
            && stamp.contains(&label)
        {
            counts = Some(found);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    common::stop_all(campaigns).await;
    let Some(counts) = counts else {
        println!("idle: the agent's metrics never showed the interval at{label}(UTC)");
        return;
    };
    let total: u64 = counts.values().sum();
    let secs = interval.as_secs_f64();
    let per_process = total as f64 / secs / IDLE_CANDIDATES as f64;
    let routes = if counts.is_empty() {
        "nothing".to_owned()
    } else {
        counts
            .iter()
            .map(|(route, n)| format!("{route} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let divisor = backend(url, None).info().renew_divisor;
    let renew = ttl / divisor;
    println!(
        "idle, 1 leader + 9 followers, {IDLE_CANDIDATES} clients (one per process), ttl {ttl:?}, renew every {renew:.3?} (ttl/{divisor}, the Consul default): \
         {:.2} HTTP requests/s to the agent, {per_process:.3}/s per process ({routes} completed in the agent's {METRICS_INTERVAL} s interval at{label}UTC); \
         this process {:.2} ms CPU/s{}",
        total as f64 / secs,
        cpu.as_secs_f64() * 1e3 / secs,
        common::bracket(&format!(
            "<= 1 renew per ttl/2 ({:?}) per process = {:.2}/s, plus one blocking query per candidate re-asked every {BLOCKING_WAIT:?} = {:.3}/s",
            ttl / 2,
            2.0 / ttl.as_secs_f64(),
            1.0 / BLOCKING_WAIT.as_secs_f64()
        ))
    );
}

/// The agent's HTTP request counts (`consul.http.<METHOD>.<route>` samples) of its last
/// finished metrics interval, with that interval's timestamp. The bench's own GET of
/// `/v1/agent/metrics` falls in the current interval, not the one shown.
async fn agent_http_counts(addr: SocketAddr) -> Option<(String, BTreeMap<String, u64>)> {
    let body = http::get(addr, "/v1/agent/metrics").await.ok()?.body;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let stamp = json["Timestamp"].as_str()?.to_owned();
    let mut counts = BTreeMap::new();
    for sample in json["Samples"].as_array()? {
        if let Some(route) = sample["Name"]
            .as_str()
            .and_then(|n| n.strip_prefix("consul.http."))
        {
            let count = sample["Count"].as_u64().unwrap_or(0);
            *counts.entry(route.to_owned()).or_default() += count;
        }
    }
    Some((stamp, counts))
}
