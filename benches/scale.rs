//! Elections at scale: many elections in one process, and what they ask of the store.
//!
//! ```text
//! cargo bench --bench scale --features etcd,consul,zookeeper             # every section
//! cargo bench --bench scale -- memory file --counts 100,1000,10000       # no server needed
//! cargo bench --bench scale --features etcd -- etcd-followers --processes 5 --count 1000
//! ```
//!
//! Sections:
//! - `memory`, `file`, `etcd`, `zookeeper` (up to 10,000), `consul` (up to 1,000): one process (one backend, one candidate identity,
//!   so one lease or session) runs `E` elections for each `E` of `--counts`: time until all
//!   lead, live heap and resident memory per election once settled, the heap's live blocks
//!   by size (where the bytes go), CPU and store requests while idle, and the time to shut
//!   all down (every lock released); for the start and the shutdown, the CPU this process
//!   and the store's server used (when the benchmark started the server) and the
//!   allocations per election.
//! - `memory-set`, `etcd-set`: the same, with the elections the members of one
//!   `ElectionSet` (one task for all) instead of a campaign each. `etcd-set` runs of at
//!   least 10,000 print issue 27's bounds too.
//! - `etcd-followers`: `--processes` backends (each its own connection, identity and lease,
//!   as separate processes would have) contend for the same `--count` elections; how
//!   leadership spreads, the live heap per campaign once settled (leaders and followers
//!   together), etcd's write rate and watch count while settled and during a rolling restart
//!   of the backends.
//! - `etcd-set-followers`: the same, with each backend's elections the members of one
//!   `ElectionSet`.
//! - `consul-followers`: two backends contend for `--count` Consul elections: the blocking
//!   queries open on the agent (TCP connections from this process) while settled.
//!
//! `--no-restart` ends `etcd-followers` and `etcd-set-followers` with a shutdown of every process at once, timed,
//! instead of the rolling restart.
//!
//! `--without-switchover` builds every election with `switchover_requests(false)` and
//! `accept_hand_overs(false)`: what the switchover's request watch and presence records cost.
//!
//! Every figure is printed and appended to a CSV (`--csv`, default `target/scale.csv`) that
//! `scripts/plot-scale` draws. Nothing is asserted. Every wait is bounded. Runs of at least
//! 10,000 etcd elections in one process (`etcd`), and of at least 100,000 elections with
//! followers (`etcd-followers`, `etcd-set-followers`), also print issue 27's bounds, each `met` or `not met`, from
//! the figures of the same run (`bound: …` lines).

#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::{Campaign, Election, ElectionSet, Role};

/// Counts live heap bytes and live blocks, by size class, so that a figure per election
/// says where the bytes go.
struct Counting;

const CLASSES: usize = 80;
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
/// Allocations made (`alloc` and `realloc` calls), ever.
static ALLOCATIONS: AtomicI64 = AtomicI64::new(0);
static LIVE_BLOCKS: [AtomicI64; CLASSES] = [const { AtomicI64::new(0) }; CLASSES];

/// Size classes: 16-byte steps to 1 KiB (64 classes), then powers of two.
fn class(size: usize) -> usize {
    if size <= 1024 {
        size.div_ceil(16).max(1) - 1
    } else {
        (63 + (usize::BITS - (size - 1).leading_zeros()) as usize - 10).min(CLASSES - 1)
    }
}

fn class_label(class: usize) -> String {
    if class < 64 {
        format!("{}-{} B", class * 16 + 1, (class + 1) * 16)
    } else {
        let high = 1usize << (class - 63 + 10);
        format!("{}-{} B", high / 2 + 1, high)
    }
}

// SAFETY: forwards every call to the system allocator; only counts on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
            LIVE_BLOCKS[class(layout.size())].fetch_add(1, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        LIVE_BLOCKS[class(layout.size())].fetch_sub(1, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        if !p.is_null() {
            LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
            LIVE_BLOCKS[class(layout.size())].fetch_sub(1, Ordering::Relaxed);
            LIVE_BLOCKS[class(new_size)].fetch_add(1, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn blocks() -> [i64; CLASSES] {
    std::array::from_fn(|i| LIVE_BLOCKS[i].load(Ordering::Relaxed))
}

/// Command-line settings.
struct Args {
    sections: Vec<String>,
    counts: Vec<usize>,
    count: usize,
    processes: usize,
    idle: Duration,
    csv: String,
    /// `etcd-followers`: shut everything down after the idle window instead of the rolling
    /// restart.
    no_restart: bool,
}

fn args() -> Args {
    let mut args = Args {
        sections: Vec::new(),
        counts: vec![100, 1_000, 10_000],
        count: 1_000,
        processes: 5,
        idle: Duration::from_secs(10),
        csv: "target/scale.csv".into(),
        no_restart: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_default();
        match a.as_str() {
            "--counts" => {
                args.counts = value()
                    .split(',')
                    .filter_map(|n| n.trim().parse().ok())
                    .collect()
            }
            "--count" => args.count = value().parse().unwrap_or(args.count),
            "--processes" => args.processes = value().parse().unwrap_or(args.processes),
            "--idle" => args.idle = Duration::from_secs(value().parse().unwrap_or(10)),
            "--csv" => args.csv = value(),
            "--no-restart" => args.no_restart = true,
            "--without-switchover" => {
                WITHOUT_SWITCHOVER.store(true, std::sync::atomic::Ordering::Relaxed)
            }
            "--bench" => {}
            s if s.starts_with('-') => {}
            s => args.sections.push(s.to_owned()),
        }
    }
    args
}

/// The ttl of every election here: renewals every 2 s, so an idle window of 10 s holds five.
const TTL: Duration = Duration::from_secs(6);
/// The ttl of Consul elections (its minimum).
#[cfg(feature = "consul")]
const CONSUL_TTL: Duration = Duration::from_secs(10);
/// The longest any step may take before the bench gives up on it and says so.
const STEP_LIMIT: Duration = Duration::from_secs(120);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let wanted = |name: &str| {
        (args.sections.is_empty() && !name.ends_with("-followers"))
            || args.sections.iter().any(|s| s == name)
    };
    println!("machine: {}", support::machine());
    if let Some(dir) = std::path::Path::new(&args.csv).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let run = Instant::now();
    for (name, set) in [("memory", false), ("memory-set", true)] {
        if wanted(name) {
            let store = incumbent::memory::MemoryBackend::new();
            for &n in &args.counts {
                let r = one_process(name, set, n, || store.clone(), TTL, Store::None, &args).await;
                r.save(&args.csv);
            }
        }
    }
    #[cfg(unix)]
    if wanted("file") {
        let dir = tempfile::tempdir().expect("a temp dir");
        for &n in &args.counts {
            let backend = || incumbent::file::FileBackend::in_dir(dir.path());
            let r = one_process("file", false, n, backend, TTL, Store::None, &args).await;
            r.save(&args.csv);
        }
    }
    #[cfg(feature = "etcd")]
    // The set first: its figures are then those of a fresh process, not helped by the memory
    // the campaigns' sections freed.
    for (name, set) in [("etcd-set", true), ("etcd", false)] {
        if !wanted(name) {
            continue;
        }
        let mut server = support::EtcdServer::single().await;
        watch_server(server.process().pid());
        let backend = etcd_connect(&server.endpoints()).await;
        let store = Store::Etcd(server.client_addr());
        for &n in &args.counts {
            let r = one_process(name, set, n, || backend.clone(), TTL, store, &args).await;
            println!("  leases held: {}", backend.lease_ids().len());
            if n >= 10_000 {
                r.bounds();
            }
            r.save(&args.csv);
        }
        watch_server(None);
    }
    #[cfg(feature = "etcd")]
    for (name, set) in [("etcd-followers", false), ("etcd-set-followers", true)] {
        if wanted(name) {
            etcd_followers(&args, set).await;
        }
    }
    #[cfg(feature = "zookeeper")]
    if wanted("zookeeper") {
        let mut server = support::ZookeeperServer::single().await;
        watch_server(server.process().pid());
        let backend = incumbent::zookeeper::ZookeeperBackend::connect(server.connect_string())
            .await
            .expect("connect to zookeeper");
        let store = Store::Zookeeper(server.admin_addr());
        for &n in args.counts.iter().filter(|&&n| n <= 10_000) {
            let r = one_process("zookeeper", false, n, || backend.clone(), TTL, store, &args).await;
            println!("  sessions held: {}", backend.session_ids().len());
            r.save(&args.csv);
        }
        watch_server(None);
    }
    #[cfg(feature = "consul")]
    if wanted("consul") {
        let (_agent, addr, _dir) = consul_agent().await;
        let backend = consul_connect(&format!("http://{addr}"));
        let store = Store::Consul(addr);
        for &n in args.counts.iter().filter(|&&n| n <= 1_000) {
            let r = one_process(
                "consul",
                false,
                n,
                || backend.clone(),
                CONSUL_TTL,
                store,
                &args,
            )
            .await;
            println!("  sessions held: {}", backend.session_ids().len());
            r.save(&args.csv);
        }
    }
    #[cfg(feature = "consul")]
    if wanted("consul-followers") {
        consul_followers(&args).await;
    }
    println!("(the whole run took {:.0} s)", run.elapsed().as_secs_f64());
}

/// What a backend's store can tell about the load on it.
#[derive(Clone, Copy)]
#[cfg_attr(
    not(all(feature = "etcd", feature = "consul", feature = "zookeeper")),
    allow(dead_code)
)]
enum Store {
    None,
    Etcd(SocketAddr),
    Consul(SocketAddr),
    /// ZooKeeper's AdminServer: the packets the server received (`srvr`).
    Zookeeper(SocketAddr),
}

/// One row of figures.
struct Row {
    backend: &'static str,
    elections: usize,
    led: usize,
    to_all_led: Duration,
    heap_per: f64,
    rss_per: f64,
    idle_cpu_ms_per_s: f64,
    idle_requests_per_s: f64,
    shutdown: Duration,
}

impl Row {
    /// Issue 27's bounds for one process of `E` elections on one lease.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    fn bounds(&self) {
        let limit = Duration::from_secs(10);
        bound(
            "every election leads within 10 s",
            format!(
                "{} of {} in {:.1} s",
                self.led,
                self.elections,
                self.to_all_led.as_secs_f64()
            ),
            self.led == self.elections && self.to_all_led < limit,
        );
        bound(
            "under 2 KB resident per election",
            format!(
                "{:.1} KB; live heap {:.1} KB",
                self.rss_per / 1e3,
                self.heap_per / 1e3
            ),
            self.rss_per < 2_000.0,
        );
        bound(
            "idle CPU under 1 ms/s",
            format!("{:.2} ms/s", self.idle_cpu_ms_per_s),
            self.idle_cpu_ms_per_s < 1.0,
        );
        bound(
            "shutdown of all in under 2 s",
            format!("{:.2} s", self.shutdown.as_secs_f64()),
            self.shutdown < Duration::from_secs(2),
        );
    }

    fn save(&self, path: &str) {
        let new = !std::path::Path::new(path).exists();
        let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        else {
            println!("  (could not write {path})");
            return;
        };
        if new {
            let _ = writeln!(
                f,
                "backend,elections,led,to_all_led_s,heap_bytes_per_election,rss_bytes_per_election,idle_cpu_ms_per_s,idle_store_requests_per_s,shutdown_s"
            );
        }
        let _ = writeln!(
            f,
            "{},{},{},{:.4},{:.0},{:.0},{:.3},{:.2},{:.4}",
            self.backend,
            self.elections,
            self.led,
            self.to_all_led.as_secs_f64(),
            self.heap_per,
            self.rss_per,
            self.idle_cpu_ms_per_s,
            self.idle_requests_per_s,
            self.shutdown.as_secs_f64()
        );
    }
}

/// One of issue 27's bounds against its figure, printed as `met` or `not met`: the bounds
/// are printed by the run that measures them, never asserted.
fn bound(what: &str, figure: String, met: bool) {
    println!(
        "  bound: {what}: {} ({figure})",
        if met { "met" } else { "not met" }
    );
}

/// `--without-switchover`: elections built with `switchover_requests(false)` and
/// `accept_hand_overs(false)` (no request watch, no presence record), to tell their cost.
static WITHOUT_SWITCHOVER: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn election<B: Backend>(backend: B, name: String, id: &str, ttl: Duration) -> Election<B> {
    let plain = WITHOUT_SWITCHOVER.load(std::sync::atomic::Ordering::Relaxed);
    Election::builder(backend, name)
        .candidate(id)
        .ttl(ttl)
        .backoff(Duration::from_millis(50), Duration::from_secs(2))
        .switchover_requests(!plain)
        .accept_hand_overs(!plain)
        .build()
        .expect("valid settings")
}

/// `count` elections in one process, one candidate identity: a campaign each, or (`set`)
/// the members of one `ElectionSet`.
#[allow(clippy::too_many_arguments)]
async fn one_process<B: Backend>(
    name: &'static str,
    set: bool,
    count: usize,
    connect: impl Fn() -> B,
    ttl: Duration,
    store: Store,
    args: &Args,
) -> Row {
    let how = if set {
        "members of one ElectionSet"
    } else {
        "a campaign each"
    };
    println!("\n## {name}: {count} elections in one process, {how} (ttl {ttl:?})");
    trim();
    let rss_before = rss_bytes();
    let heap_before = LIVE_BYTES.load(Ordering::Relaxed);
    let blocks_before = blocks();
    let start = Instant::now();
    let cpu_at_start = (cpu_time(), server_cpu_time());
    let allocations_at_start = ALLOCATIONS.load(Ordering::Relaxed);
    let held = Held::start(set, count, connect, ttl);
    let led = held.until_all_lead(count).await;
    let to_all_led = start.elapsed();
    println!(
        "  {led} of {count} led in {:.3} s",
        to_all_led.as_secs_f64()
    );
    print_cpu_since("all led", cpu_at_start);
    print_allocations_since("all led", allocations_at_start, count);
    // Settle: the leaders' marks written, their watches in place.
    tokio::time::sleep(Duration::from_secs(2)).await;
    until_quiet(store, count).await;
    trim();
    let heap_per = (LIVE_BYTES.load(Ordering::Relaxed) - heap_before) as f64 / count as f64;
    let rss_per = rss_bytes().saturating_sub(rss_before) as f64 / count as f64;
    println!("  settled: live heap {heap_per:.0} B per election, RSS {rss_per:.0} B per election");
    where_the_bytes_go(&blocks_before, count);

    let before = store_counters(store).await;
    let cpu_before = cpu_time();
    tokio::time::sleep(args.idle).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    let after = store_counters(store).await;
    let idle_cpu_ms_per_s = cpu.as_secs_f64() * 1e3 / args.idle.as_secs_f64();
    let requests = diff(&before, &after);
    let total = sum(&requests);
    let idle_requests_per_s = total / args.idle.as_secs_f64();
    println!(
        "  idle {:?}: {idle_cpu_ms_per_s:.2} ms CPU per s; store received {total:.0} requests \
         ({idle_requests_per_s:.2}/s){}",
        args.idle,
        describe(&requests)
    );
    if let Store::Consul(addr) = store {
        println!(
            "  blocking queries open on the agent (TCP connections to it): {}",
            connections_to(addr)
        );
    }
    if let Store::Etcd(addr) = store {
        print_etcd_gauges(addr).await;
    }
    let requests_at_stop = store_counters(store).await;
    let stopping = Instant::now();
    let cpu_at_stop = (cpu_time(), server_cpu_time());
    let allocations_at_stop = ALLOCATIONS.load(Ordering::Relaxed);
    let timeline = Timeline::start();
    held.stop().await;
    let shutdown = stopping.elapsed();
    println!("  shutdown (all released): {:.3} s", shutdown.as_secs_f64());
    timeline.print("shutdown");
    print_cpu_since("all released", cpu_at_stop);
    print_allocations_since("all released", allocations_at_stop, count);
    let requests = diff(&requests_at_stop, &store_counters(store).await);
    println!("  requests during the shutdown{}", describe(&requests));
    Row {
        backend: name,
        elections: count,
        led,
        to_all_led,
        heap_per,
        rss_per,
        idle_cpu_ms_per_s,
        idle_requests_per_s,
        shutdown,
    }
}

/// The elections of one process: a campaign each, or one set's members (with how they are
/// named and the candidate id, to tell its followers: the names are made again when needed,
/// not kept, since their bytes would count per election).
enum Held {
    Campaigns(Vec<Campaign>),
    Set {
        set: ElectionSet,
        prefix: String,
        count: usize,
        id: String,
    },
}

impl Held {
    fn start<B: Backend>(set: bool, count: usize, connect: impl Fn() -> B, ttl: Duration) -> Held {
        Held::named(set, "scale", count, connect, "bench", ttl)
    }

    /// Elections `<prefix>/0` to `<prefix>/<count - 1>` as candidate `id`.
    fn named<B: Backend>(
        set: bool,
        prefix: &str,
        count: usize,
        connect: impl Fn() -> B,
        id: &str,
        ttl: Duration,
    ) -> Held {
        let names = (0..count).map(|i| format!("{prefix}/{i}"));
        if set {
            let set = election(connect(), prefix.into(), id, ttl).set();
            for name in names {
                set.join(&name).expect("a valid name");
            }
            Held::Set {
                set,
                prefix: prefix.into(),
                count,
                id: id.into(),
            }
        } else {
            Held::Campaigns(
                names
                    .map(|name| election(connect(), name, id, ttl).campaign())
                    .collect(),
            )
        }
    }

    /// How many lead, and how many follow (a set's member follows once it has seen another
    /// candidate hold its election).
    fn roles(&self) -> (usize, usize) {
        match self {
            Held::Campaigns(campaigns) => roles(campaigns.iter()),
            Held::Set {
                set,
                prefix,
                count,
                id,
            } => {
                let followers = (0..*count)
                    .filter(|i| {
                        (set.leader(&format!("{prefix}/{i}")))
                            .is_some_and(|l| l.candidate.id != *id)
                    })
                    .count();
                (set.leading(), followers)
            }
        }
    }

    /// Waits until all `count` lead, or [`STEP_LIMIT`]; returns how many lead then.
    async fn until_all_lead(&self, count: usize) -> usize {
        match self {
            Held::Campaigns(campaigns) => {
                until_roles(campaigns, |leaders, _| leaders == count, STEP_LIMIT).await
            }
            Held::Set { set, .. } => {
                let deadline = Instant::now() + STEP_LIMIT;
                while set.leading() < count && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                set.leading()
            }
        }
    }

    /// Shuts every election down; returns once every lock is released.
    async fn stop(self) {
        match self {
            Held::Campaigns(campaigns) => stop_all(campaigns).await,
            Held::Set { set, .. } => {
                let _ = tokio::time::timeout(STEP_LIMIT, set.shutdown()).await;
            }
        }
    }
}

/// The size classes that grew most, per election.
fn where_the_bytes_go(before: &[i64; CLASSES], count: usize) {
    let now = blocks();
    let mut grew: Vec<(usize, f64)> = (0..CLASSES)
        .map(|c| (c, (now[c] - before[c]) as f64 / count as f64))
        .filter(|(_, per)| *per >= 0.05)
        .collect();
    grew.sort_by(|a, b| {
        let upper = |c: usize| {
            if c < 64 {
                (c + 1) * 16
            } else {
                1 << (c - 63 + 10)
            }
        };
        (b.1 * upper(b.0) as f64).total_cmp(&(a.1 * upper(a.0) as f64))
    });
    let top: Vec<String> = grew
        .iter()
        .take(10)
        .map(|(c, per)| format!("{per:.2} x {}", class_label(*c)))
        .collect();
    println!("  live blocks per election, by size: {}", top.join(", "));
}

/// Waits until `done(leaders, followers)`, or `limit`; returns the leaders then.
async fn until_roles(
    campaigns: &[Campaign],
    done: impl Fn(usize, usize) -> bool,
    limit: Duration,
) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        let scan = Instant::now();
        let (leaders, followers) = roles(campaigns.iter());
        if done(leaders, followers) || Instant::now() > deadline {
            return leaders;
        }
        pause_after(scan, Duration::from_millis(5)).await;
    }
}

/// How many of `campaigns` lead, and how many follow.
fn roles<'a>(campaigns: impl Iterator<Item = &'a Campaign>) -> (usize, usize) {
    let (mut leaders, mut followers) = (0, 0);
    for c in campaigns {
        match c.status().borrow().role {
            Role::Leader => leaders += 1,
            Role::Follower => followers += 1,
            _ => {}
        }
    }
    (leaders, followers)
}

/// Sleeps between two scans of the campaigns' roles: at least `floor`, and nine times as
/// long as the scan that began at `scan` took, so that the benchmark's own counting (100,000
/// statuses take milliseconds) uses at most a tenth of a core.
async fn pause_after(scan: Instant, floor: Duration) {
    tokio::time::sleep(floor.max(scan.elapsed() * 9)).await;
}

/// Shuts the campaigns down as the crate advises for many ([`Campaign::shutdown_all`]): all
/// asked at once, their ends awaited in this task. (A task each cost this benchmark more CPU
/// than the shutdowns it measured: 2.6 s against 1.8 s for 100,000 in one process.)
async fn stop_all(campaigns: Vec<Campaign>) {
    let _ = tokio::time::timeout(STEP_LIMIT, Campaign::shutdown_all(campaigns)).await;
}

/// The sum of the counts, from +0.0: a sum of no floats is -0.0, which prints as "-0".
fn sum(counts: &BTreeMap<String, f64>) -> f64 {
    counts.values().fold(0.0, |total, v| total + v)
}

fn describe(requests: &BTreeMap<String, f64>) -> String {
    let parts: Vec<String> = requests
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .map(|(k, v)| format!("{k} {v:.0}"))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join(", "))
    }
}

fn diff(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Waits (at most [`STEP_LIMIT`]) until the store receives fewer requests in a second than
/// 1 % of the elections (at least 10), and says how long that took when it was not at once:
/// what a start leaves in flight (ZooKeeper's leaders mark their terms in the background)
/// is not idle load.
async fn until_quiet(store: Store, count: usize) {
    let quiet = (count as f64 / 100.0).max(10.0);
    let start = Instant::now();
    let mut last = store_counters(store).await;
    if last.is_empty() {
        return;
    }
    while start.elapsed() < STEP_LIMIT {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = store_counters(store).await;
        if sum(&diff(&last, &now)) < quiet {
            if start.elapsed() > Duration::from_secs(1) {
                println!(
                    "  the store was quiet {:.0} s later (under {quiet:.0} requests a second)",
                    start.elapsed().as_secs_f64()
                );
            }
            return;
        }
        last = now;
    }
    println!("  the store was still busy after {STEP_LIMIT:?}");
}

/// Requests the store has received so far, by kind: etcd's gRPC messages received by method;
/// Consul's completed HTTP requests by route.
async fn store_counters(store: Store) -> BTreeMap<String, f64> {
    match store {
        Store::None => BTreeMap::new(),
        Store::Etcd(addr) => {
            metrics_lines(addr, "/metrics", |name, rest| {
                (name == "grpc_server_msg_received_total").then(|| label(rest, "grpc_method"))
            })
            .await
        }
        Store::Zookeeper(admin) => {
            let body = support::http::get(admin, "/commands/srvr")
                .await
                .map(|r| r.body)
                .unwrap_or_default();
            let packets = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|json| json["server_stats"]["packets_received"].as_f64());
            packets
                .map(|n| BTreeMap::from([("packets".to_owned(), n)]))
                .unwrap_or_default()
        }
        Store::Consul(addr) => {
            metrics_lines(addr, "/v1/agent/metrics?format=prometheus", |name, _| {
                (name.starts_with("consul_http_") && name.ends_with("_count"))
                    .then(|| name["consul_http_".len()..name.len() - "_count".len()].to_owned())
            })
            .await
        }
    }
}

fn label(rest: &str, name: &str) -> String {
    rest.split_once(&format!("{name}=\""))
        .and_then(|(_, m)| m.split_once('"'))
        .map_or("?", |(m, _)| m)
        .to_owned()
}

/// Sums the Prometheus samples that `pick` names, by the name it gives.
async fn metrics_lines(
    addr: SocketAddr,
    path: &str,
    pick: impl Fn(&str, &str) -> Option<String>,
) -> BTreeMap<String, f64> {
    let body = support::http::get(addr, path)
        .await
        .map(|r| r.body)
        .unwrap_or_default();
    let mut sums = BTreeMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(p) => p,
            None => continue,
        };
        let (name, rest) = series.split_once('{').unwrap_or((series, ""));
        if let Some(key) = pick(name, rest) {
            *sums.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    sums
}

/// etcd's own gauges: keys, watchers, watch streams.
async fn etcd_gauges(addr: SocketAddr) -> BTreeMap<String, f64> {
    const GAUGES: [&str; 4] = [
        "etcd_debugging_mvcc_keys_total",
        "etcd_debugging_mvcc_watcher_total",
        "etcd_debugging_mvcc_watch_stream_total",
        "etcd_server_proposals_committed_total",
    ];
    metrics_lines(addr, "/metrics", |name, _| {
        GAUGES.contains(&name).then(|| name.to_owned())
    })
    .await
}

async fn print_etcd_gauges(addr: SocketAddr) {
    let g = etcd_gauges(addr).await;
    let get = |k: &str| g.get(k).copied().unwrap_or(f64::NAN);
    println!(
        "  etcd: {} keys, {} watchers on {} watch streams",
        get("etcd_debugging_mvcc_keys_total"),
        get("etcd_debugging_mvcc_watcher_total"),
        get("etcd_debugging_mvcc_watch_stream_total"),
    );
}

/// Established TCP connections from this host to `addr` (this process's, on a test agent).
fn connections_to(addr: SocketAddr) -> usize {
    let port = format!("{:04X}", addr.port());
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[2].ends_with(&format!(":{port}")) && f[3] == "01"
        })
        .count()
}

#[cfg(feature = "etcd")]
async fn etcd_connect(endpoints: &[String]) -> incumbent::etcd::EtcdBackend {
    incumbent::etcd::EtcdBackend::connect(endpoints.to_vec())
        .await
        .expect("connect to etcd")
}

/// HTTP connections the agent accepts from one client address: each election holds one
/// blocking query, so one connection, open; Consul's default (200) stops a process at about
/// 200 elections.
#[cfg(feature = "consul")]
const CONSUL_CONNS_PER_CLIENT: usize = 5_000;

/// A `consul agent -dev` that serves its metrics in Prometheus' format, and takes
/// [`CONSUL_CONNS_PER_CLIENT`] connections from this process.
#[cfg(feature = "consul")]
async fn consul_agent() -> (
    support::process::ServerProcess,
    SocketAddr,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let telemetry = r#"-hcl=telemetry { prometheus_retention_time = "120s" }"#.to_owned();
    let limits = format!("-hcl=limits {{ http_max_conns_per_client = {CONSUL_CONNS_PER_CLIENT} }}");
    let (agent, addr) =
        support::consul::spawn_dev("consul", dir.path(), &[telemetry, limits]).await;
    (agent, addr, dir)
}

#[cfg(feature = "consul")]
fn consul_connect(url: &str) -> incumbent::consul::ConsulBackend {
    incumbent::consul::ConsulBackend::new(incumbent::consul::ConsulConfig::new(url))
        .expect("valid consul settings")
}

/// `--processes` backends contend for the same `--count` elections.
#[cfg(feature = "etcd")]
async fn etcd_followers(args: &Args, set: bool) {
    let (p, e) = (args.processes, args.count);
    let (section, how, each) = if set {
        (
            "etcd-set-followers",
            "an ElectionSet per process",
            "election",
        )
    } else {
        ("etcd-followers", "a campaign each", "campaign")
    };
    println!("\n## {section}: {p} processes x {e} elections, {how}, contending (ttl {TTL:?})");
    let mut server = support::EtcdServer::single().await;
    watch_server(server.process().pid());
    let addr = server.client_addr();
    let endpoints = server.endpoints();
    let cpu_at_start = (cpu_time(), server_cpu_time());
    let start_one = |backend: incumbent::etcd::EtcdBackend, id: usize| -> Held {
        Held::named(
            set,
            "contend",
            e,
            || backend.clone(),
            &format!("p{id}"),
            TTL,
        )
    };
    let mut procs = Vec::new();
    let heap_before = LIVE_BYTES.load(Ordering::Relaxed);
    let start = Instant::now();
    for id in 0..p {
        procs.push(start_one(etcd_connect(&endpoints).await, id));
    }
    let settled = settle(&procs, e, p * e - e).await;
    let settle_time = start.elapsed();
    println!(
        "  settled in {:.2} s: {settled}; leaders per process: {:?}",
        settle_time.as_secs_f64(),
        leaders_per_process(&procs)
    );
    print_cpu_since("settled", cpu_at_start);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let heap_per = (LIVE_BYTES.load(Ordering::Relaxed) - heap_before) as f64 / (p * e) as f64;
    println!(
        "  settled: live heap {heap_per:.0} B per {each}, leaders and followers together \
         (and the backends' connections)"
    );
    print_etcd_gauges(addr).await;
    let window = |from: &BTreeMap<String, f64>, to: &BTreeMap<String, f64>, secs: f64| {
        let d = diff(from, to);
        let total = sum(&d);
        format!("{:.1} requests/s{}", total / secs, describe(&d))
    };
    let before = store_counters(Store::Etcd(addr)).await;
    let g0 = etcd_gauges(addr).await;
    let cpu_before = cpu_time();
    tokio::time::sleep(args.idle).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    let after = store_counters(Store::Etcd(addr)).await;
    let g1 = etcd_gauges(addr).await;
    let writes = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
        b.get("etcd_server_proposals_committed_total")
            .unwrap_or(&0.0)
            - a.get("etcd_server_proposals_committed_total")
                .unwrap_or(&0.0)
    };
    let secs = args.idle.as_secs_f64();
    let idle_cpu = cpu.as_secs_f64() * 1e3 / secs / p as f64;
    println!(
        "  settled, {:?}: {}; {:.2} writes (proposals committed)/s; {:.2} ms CPU per s per process",
        args.idle,
        window(&before, &after, secs),
        writes(&g0, &g1) / secs,
        idle_cpu
    );
    if p * e >= 100_000 {
        let all_followed = settled == format!("{e} leaders, {} followers", p * e - e);
        let others: f64 = diff(&before, &after)
            .iter()
            .filter(|(name, _)| name.as_str() != "LeaseKeepAlive")
            .map(|(_, n)| n)
            .sum::<f64>()
            .max(0.0);
        bound(
            "every election led, every other candidate following, within 10 s",
            format!("{:.1} s: {settled}", settle_time.as_secs_f64()),
            all_followed && settle_time < Duration::from_secs(10),
        );
        bound(
            "idle CPU under 1 ms/s per process",
            format!("{idle_cpu:.2} ms/s"),
            idle_cpu < 1.0,
        );
        bound(
            "store load O(1) per process once settled: keep-alives alone",
            format!("{others:.0} other requests in {secs:.0} s"),
            others == 0.0,
        );
    }
    if args.no_restart {
        let stopping = Instant::now();
        let cpu_at_stop = (cpu_time(), server_cpu_time());
        let requests_at_stop = store_counters(Store::Etcd(addr)).await;
        let timeline = Timeline::start();
        let all = procs.into_iter().map(|held| tokio::spawn(held.stop()));
        for process in all.collect::<Vec<_>>() {
            let _ = process.await;
        }
        let shutdown = stopping.elapsed();
        println!(
            "  shutdown of every process at once (all released): {:.2} s",
            shutdown.as_secs_f64()
        );
        timeline.print("shutdown");
        if p * e >= 100_000 {
            bound(
                "shutdown of all in under 2 s",
                format!("{:.2} s", shutdown.as_secs_f64()),
                shutdown < Duration::from_secs(2),
            );
        }
        print_cpu_since("all released", cpu_at_stop);
        let requests = diff(&requests_at_stop, &store_counters(Store::Etcd(addr)).await);
        println!("  requests during the shutdown{}", describe(&requests));
        return;
    }

    // Rolling restart: each process in turn shuts down (releasing its locks), and comes back
    // with a new connection and lease, then waits until every election has a leader again.
    let before = store_counters(Store::Etcd(addr)).await;
    let g0 = etcd_gauges(addr).await;
    let rolling = Instant::now();
    let mut peak_watchers = 0.0f64;
    for id in 0..p {
        let old = std::mem::replace(&mut procs[id], Held::Campaigns(Vec::new()));
        old.stop().await;
        procs[id] = start_one(etcd_connect(&endpoints).await, id);
        settle(&procs, e, p * e - e).await;
        let w = etcd_gauges(addr).await;
        peak_watchers = peak_watchers.max(
            w.get("etcd_debugging_mvcc_watcher_total")
                .copied()
                .unwrap_or(0.0),
        );
    }
    let secs = rolling.elapsed().as_secs_f64();
    let after = store_counters(Store::Etcd(addr)).await;
    let g1 = etcd_gauges(addr).await;
    println!(
        "  rolling restart of {p} processes took {secs:.1} s: {}; {:.1} writes/s ({:.0} in all, {:.2} per election per restarted process); watchers at most {peak_watchers}",
        window(&before, &after, secs),
        writes(&g0, &g1) / secs,
        writes(&g0, &g1),
        writes(&g0, &g1) / (e * p) as f64
    );
    println!(
        "  leaders per process after the rolling restart: {:?}",
        leaders_per_process(&procs)
    );
    print_etcd_gauges(addr).await;
    for held in procs {
        held.stop().await;
    }
}

/// Waits until `leaders` lead and `followers` follow (bounded), over every process; says
/// how it ended.
#[cfg(any(feature = "etcd", feature = "consul"))]
async fn settle(procs: &[Held], leaders: usize, followers: usize) -> String {
    let deadline = Instant::now() + STEP_LIMIT;
    loop {
        let scan = Instant::now();
        let (l, f) = procs
            .iter()
            .map(Held::roles)
            .fold((0, 0), |(l, f), (a, b)| (l + a, f + b));
        if (l == leaders && f == followers) || Instant::now() > deadline {
            return format!("{l} leaders, {f} followers");
        }
        pause_after(scan, Duration::from_millis(20)).await;
    }
}

#[cfg(feature = "etcd")]
fn leaders_per_process(procs: &[Held]) -> Vec<usize> {
    procs.iter().map(|held| held.roles().0).collect()
}

/// Two backends contend for `--count` Consul elections: blocking queries held open.
#[cfg(feature = "consul")]
async fn consul_followers(args: &Args) {
    let e = args.count;
    println!("\n## consul-followers: 2 processes x {e} elections, contending (ttl {CONSUL_TTL:?})");
    let (_agent, addr, _dir) = consul_agent().await;
    let url = format!("http://{addr}");
    let a = consul_connect(&url);
    let leaders = [Held::named(
        false,
        "contend",
        e,
        || a.clone(),
        "a",
        CONSUL_TTL,
    )];
    settle(&leaders, e, 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let only_leaders = connections_to(addr);
    let b = consul_connect(&url);
    let followers = [Held::named(
        false,
        "contend",
        e,
        || b.clone(),
        "b",
        CONSUL_TTL,
    )];
    let state = settle(&followers, 0, e).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let both = connections_to(addr);
    println!(
        "  blocking queries open (TCP connections to the agent): {only_leaders} with {e} leaders; \
         {both} with {e} followers too ({state}): {:.2} per follower",
        (both - only_leaders) as f64 / e as f64
    );
    let before = store_counters(Store::Consul(addr)).await;
    let cpu_before = cpu_time();
    tokio::time::sleep(args.idle).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    let after = store_counters(Store::Consul(addr)).await;
    let d = diff(&before, &after);
    let total = sum(&d);
    println!(
        "  idle {:?}: {:.2} requests/s completed at the agent{}; {:.2} ms CPU per s; sessions {} + {}",
        args.idle,
        total / args.idle.as_secs_f64(),
        describe(&d),
        cpu.as_secs_f64() * 1e3 / args.idle.as_secs_f64(),
        a.session_ids().len(),
        b.session_ids().len()
    );
    for held in followers.into_iter().chain(leaders) {
        held.stop().await;
    }
}

/// Returns the allocator's free memory to the system, so that RSS counts what is in use.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// The pid of the store's server, when this benchmark started one: its CPU time is printed.
static SERVER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn watch_server(pid: Option<u32>) {
    SERVER_PID.store(pid.unwrap_or(0), Ordering::Relaxed);
}

/// User + system CPU time of the store's server (see [`SERVER_PID`]), from `/proc`.
fn server_cpu_time() -> Option<Duration> {
    let pid = SERVER_PID.load(Ordering::Relaxed);
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's name: state is the 3rd of the line, utime the 14th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    Some(Duration::from_millis(ticks * 1000 / hz.max(1)))
}

/// Prints how many allocations this process made since there were `from`, per election.
fn print_allocations_since(until: &str, from: i64, elections: usize) {
    let made = ALLOCATIONS.load(Ordering::Relaxed) - from;
    println!(
        "  allocations until {until}: {:.0} per election",
        made as f64 / elections as f64
    );
}

/// Prints the CPU time this process and the store's server used since `from`.
fn print_cpu_since(until: &str, from: (Duration, Option<Duration>)) {
    let ours = cpu_time().saturating_sub(from.0).as_secs_f64();
    match (server_cpu_time(), from.1) {
        (Some(now), Some(then)) => println!(
            "  CPU until {until}: this process {ours:.1} s, the store's server {:.1} s",
            now.saturating_sub(then).as_secs_f64()
        ),
        _ => println!("  CPU until {until}: this process {ours:.1} s"),
    }
}

/// The CPU this process and the store's server use in each 100 ms of a step, sampled on a
/// thread of its own until the step ends (at most [`STEP_LIMIT`]): where both are busy, or
/// this process waits for the store, or the other way round.
struct Timeline {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<Vec<(f64, Option<f64>)>>,
}

impl Timeline {
    const STEP: Duration = Duration::from_millis(100);

    fn start() -> Timeline {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let sampler = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut last = (cpu_time(), server_cpu_time());
            let until = Instant::now() + STEP_LIMIT;
            while !flag.load(Ordering::Relaxed) && Instant::now() < until {
                std::thread::sleep(Self::STEP);
                let now = (cpu_time(), server_cpu_time());
                let share = |a: Duration, b: Duration| {
                    a.saturating_sub(b).as_secs_f64() * 100.0 / Self::STEP.as_secs_f64()
                };
                let server = match (now.1, last.1) {
                    (Some(now), Some(then)) => Some(share(now, then)),
                    _ => None,
                };
                samples.push((share(now.0, last.0), server));
                last = now;
            }
            samples
        });
        Timeline { done, sampler }
    }

    fn print(self, step: &str) {
        self.done.store(true, Ordering::Relaxed);
        let Ok(samples) = self.sampler.join() else {
            return;
        };
        let cells: Vec<String> = samples
            .iter()
            .map(|(ours, server)| match server {
                Some(server) => format!("{ours:.0}/{server:.0}"),
                None => format!("{ours:.0}"),
            })
            .collect();
        println!(
            "  {step}, CPU per 100 ms in % of a core (this process/the store's server): {}",
            cells.join(" ")
        );
    }
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we hand it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}
