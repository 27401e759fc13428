//! Sharded elections at scale: 1,024 shards over 8 members.
//!
//! ```text
//! cargo bench --bench shards --features etcd            # memory, then etcd
//! cargo bench --bench shards -- memory                  # no server needed
//! cargo bench --bench shards --features etcd -- etcd --shards 1024 --members 8 --rounds 5
//! ```
//!
//! - `etcd`: each member is a process of its own (this program again, as `shards member URL
//!   ID SHARDS`), with its own connection, identity and lease, on one etcd member on disk.
//!   Each member prints its owned shards (a bitmap), the `CLOCK_MONOTONIC` instant and its
//!   resident memory at every change of its [`ShardStatus`](incumbent::ShardStatus); this
//!   program reads the lines.
//! - `memory`: the members are tasks of this process on one in-process store, for a figure
//!   without a network or processes.
//!
//! Per section: the time until 7 members hold a balanced map (every shard owned by exactly
//! one member, each within one of `S / N`); then `--rounds` times an 8th member joins, and
//! leaves again (SIGTERM: a clean shutdown): the time from the start of the change to the
//! last member's change that made the map balanced, and the shards that moved (against the
//! least possible: what the newcomer gets, what the leaver had); then one member is killed
//! with kill -9 (etcd): the time until the others hold its shards. Memory per owned shard:
//! each member's resident memory once balanced, less its own before it joined, over its
//! shards (etcd); this process's live heap over the shards (memory). Nothing is asserted;
//! every wait is bounded.

#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::sharded::encode_claims;
use incumbent::{ShardedElection, ShardedRunner};

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator, counting the bytes live.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as the caller promised for `layout`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const GROUP: &str = "bench/shards";
const TTL: Duration = Duration::from_secs(5);
const LIMIT: Duration = Duration::from_secs(60);

struct Options {
    sections: Vec<String>,
    shards: u32,
    members: usize,
    rounds: usize,
}

fn options(args: &[String]) -> Options {
    let mut o = Options {
        sections: Vec::new(),
        shards: 1024,
        members: 8,
        rounds: 5,
    };
    let mut args = args.iter().filter(|a| *a != "--bench");
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match arg.as_str() {
            "--shards" => o.shards = number("--shards") as u32,
            "--members" => o.members = number("--members"),
            "--rounds" => o.rounds = number("--rounds"),
            s if !s.starts_with('-') => o.sections.push(s.to_owned()),
            other => panic!("unknown option {other}"),
        }
    }
    if o.sections.is_empty() {
        o.sections = vec!["memory".into()];
        if cfg!(feature = "etcd") {
            o.sections.push("etcd".into());
        }
    }
    o
}

/// `CLOCK_MONOTONIC` in nanoseconds: comparable between processes on one host.
fn mono_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn build<B: Backend>(backend: B, id: &str, shards: u32) -> ShardedRunner {
    ShardedElection::builder(backend, GROUP, shards)
        .candidate(id)
        .ttl(TTL)
        .build()
        .expect("valid settings")
        .start(|_, term| async move { term.cancelled().await })
}

/// What a member holds, as last reported: when, its shards, and its resident memory.
#[derive(Clone, Default)]
struct Report {
    at_ns: u64,
    owned: BTreeSet<u32>,
    rss: u64,
    rss_before: u64,
    heap: i64,
    heap_before: i64,
}

/// A group of members the bench can grow and shrink.
trait Group {
    /// Each member's latest report.
    fn reports(&self) -> Vec<(String, Report)>;
    fn join(&mut self, id: &str);
    /// The newest member leaves cleanly; returns when it has exited.
    fn leave(&mut self);
    /// Kills the newest member (kill -9), where members are processes.
    fn kill(&mut self) -> bool;
    fn stop(&mut self);
}

/// The map, once balanced over the group's members: each shard's owner, and the instant of
/// the last report that made it so.
fn balanced_now(group: &dyn Group, shards: u32) -> Option<(BTreeMap<u32, String>, u64)> {
    let reports = group.reports();
    let per = shards as usize / reports.len().max(1);
    let mut owners = BTreeMap::new();
    let mut last = 0;
    for (id, r) in &reports {
        if r.owned.len() != per && r.owned.len() != per + 1 {
            return None;
        }
        for &k in &r.owned {
            if owners.insert(k, id.clone()).is_some() {
                return None;
            }
        }
        last = last.max(r.at_ns);
    }
    (owners.len() == shards as usize).then_some((owners, last))
}

/// Waits for a balanced map; returns it and the milliseconds from `since_ns`.
async fn balanced(
    group: &dyn Group,
    shards: u32,
    since_ns: u64,
) -> Option<(BTreeMap<u32, String>, f64)> {
    let deadline = Instant::now() + LIMIT;
    while Instant::now() < deadline {
        if let Some((map, at)) = balanced_now(group, shards) {
            return Some((map, at.saturating_sub(since_ns) as f64 / 1e6));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for (id, r) in group.reports() {
        println!("  {id}: owns {}", r.owned.len());
    }
    None
}

fn moves(a: &BTreeMap<u32, String>, b: &BTreeMap<u32, String>) -> usize {
    a.iter().filter(|(k, o)| b.get(k) != Some(o)).count()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

async fn section(name: &str, group: &mut dyn Group, o: &Options) {
    let began = Instant::now();
    let heap_before = LIVE.load(Ordering::Relaxed);
    let start = mono_ns();
    for i in 0..o.members - 1 {
        group.join(&format!("m{i}"));
    }
    let Some((mut map, ms)) = balanced(group, o.shards, start).await else {
        println!(
            "{name}: {} members: no balanced map within {LIMIT:?}",
            o.members - 1
        );
        group.stop();
        return;
    };
    println!(
        "{name}: {} shards over {} members: balanced {ms:.0} ms after the start",
        o.shards,
        o.members - 1
    );
    let reports = group.reports();
    if reports.iter().all(|(_, r)| r.rss > 0) {
        let per_shard: Vec<f64> = reports
            .iter()
            .map(|(_, r)| r.rss.saturating_sub(r.rss_before) as f64 / r.owned.len().max(1) as f64)
            .collect();
        let heap: Vec<f64> = reports
            .iter()
            .map(|(_, r)| (r.heap - r.heap_before) as f64 / r.owned.len().max(1) as f64)
            .collect();
        println!(
            "{name}: per owned shard, each member's growth over its shards, median (min, max): \
             live heap {:.0} B ({:.0}, {:.0}); resident memory {:.0} B ({:.0}, {:.0})",
            median(heap.clone()),
            heap.iter().copied().fold(f64::INFINITY, f64::min),
            heap.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            median(per_shard.clone()),
            per_shard.iter().copied().fold(f64::INFINITY, f64::min),
            per_shard.iter().copied().fold(0.0, f64::max),
        );
    } else {
        let heap = (LIVE.load(Ordering::Relaxed) - heap_before) as f64 / f64::from(o.shards);
        println!("{name}: live heap per owned shard (every member in this process): {heap:.0} B");
    }
    let (mut join_ms, mut leave_ms, mut join_moves, mut leave_moves) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..o.rounds {
        let id = format!("n{round}");
        let at = mono_ns();
        group.join(&id);
        let Some((after, ms)) = balanced(group, o.shards, at).await else {
            println!("{name}: round {round}: no balanced map after the join within {LIMIT:?}");
            group.stop();
            return;
        };
        join_ms.push(ms);
        join_moves.push(moves(&map, &after) as f64);
        let had = after.values().filter(|o| **o == id).count();
        map = after;
        let at = mono_ns();
        group.leave();
        let Some((after, ms)) = balanced(group, o.shards, at).await else {
            println!("{name}: round {round}: no balanced map after the leave within {LIMIT:?}");
            group.stop();
            return;
        };
        leave_ms.push(ms);
        leave_moves.push(moves(&map, &after) as f64);
        println!(
            "{name}: round {round}: join {:.0} ms, {} moves; leave {:.0} ms, {} moves (it had {had})",
            join_ms[round], join_moves[round], leave_ms[round], leave_moves[round]
        );
        map = after;
    }
    println!(
        "{name}: median over {} rounds: join {:.0} ms, {} moves [least {}, at most ⌈S/N⌉ = {}]; \
         leave {:.0} ms, {} moves",
        o.rounds,
        median(join_ms),
        median(join_moves),
        o.shards as usize / o.members,
        (o.shards as usize).div_ceil(o.members - 1),
        median(leave_ms),
        median(leave_moves),
    );
    let at = mono_ns();
    if o.members < 3 {
        // The section runs `members - 1` members outside the rounds: killing one of them
        // must leave another to take its shards.
        println!(
            "{name}: a member killed: not run (--members {} leaves nobody to take over; use 3 or more)",
            o.members
        );
    } else if group.kill() {
        match balanced(group, o.shards, at).await {
            Some((after, ms)) => println!(
                "{name}: a member killed (kill -9): balanced over the others {ms:.0} ms later \
                 (ttl {TTL:?}), {} moves",
                moves(&map, &after)
            ),
            None => println!("{name}: a member killed: no balanced map within {LIMIT:?}"),
        }
    }
    group.stop();
    println!(
        "{name}: section took {:.0} s",
        began.elapsed().as_secs_f64()
    );
}

/// Members as tasks of this process, on one in-process store.
struct InProcess {
    store: incumbent::memory::MemoryBackend,
    shards: u32,
    members: Vec<(String, ShardedRunner)>,
}

impl Group for InProcess {
    fn reports(&self) -> Vec<(String, Report)> {
        self.members
            .iter()
            .map(|(id, r)| {
                let owned = r.status().borrow().owned();
                (
                    id.clone(),
                    Report {
                        at_ns: mono_ns(),
                        owned,
                        ..Report::default()
                    },
                )
            })
            .collect()
    }

    fn join(&mut self, id: &str) {
        let runner = build(self.store.client(), id, self.shards);
        self.members.push((id.to_owned(), runner));
    }

    fn leave(&mut self) {
        if let Some((_, runner)) = self.members.pop() {
            drop(runner); // leaves in the background, as a clean shutdown
        }
    }

    fn kill(&mut self) -> bool {
        false
    }

    fn stop(&mut self) {
        self.members.clear();
    }
}

/// Members as processes: this program again, as `shards member URL ID SHARDS`.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
struct Processes {
    url: String,
    shards: u32,
    members: Vec<(String, Child, Arc<Mutex<Report>>)>,
}

impl Group for Processes {
    fn reports(&self) -> Vec<(String, Report)> {
        self.members
            .iter()
            .map(|(id, _, r)| (id.clone(), r.lock().unwrap().clone()))
            .collect()
    }

    fn join(&mut self, id: &str) {
        let mut child = Command::new(std::env::current_exe().expect("this program"))
            .args(["member", &self.url, id, &self.shards.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a member");
        let report = Arc::new(Mutex::new(Report::default()));
        let stdout = child.stdout.take().expect("stdout");
        let shared = report.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let words: Vec<&str> = line.split(' ').collect();
                let mut r = shared.lock().unwrap();
                match words[..] {
                    ["memory", rss, heap] => {
                        r.rss_before = rss.parse().unwrap_or(0);
                        r.heap_before = heap.parse().unwrap_or(0);
                    }
                    ["owned", at, rss, heap, bitmap] => {
                        r.at_ns = at.parse().unwrap_or(0);
                        r.rss = rss.parse().unwrap_or(0);
                        r.heap = heap.parse().unwrap_or(0);
                        r.owned = incumbent::sharded::decode_claims(bitmap, u32::MAX);
                    }
                    ["owned", at, rss, heap] => {
                        r.at_ns = at.parse().unwrap_or(0);
                        r.rss = rss.parse().unwrap_or(0);
                        r.heap = heap.parse().unwrap_or(0);
                        r.owned.clear();
                    }
                    _ => {}
                }
            }
        });
        self.members.push((id.to_owned(), child, report));
    }

    fn leave(&mut self) {
        if let Some((_, mut child, _)) = self.members.pop() {
            // SAFETY: kill(2) on our child, by its pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    fn kill(&mut self) -> bool {
        if let Some((_, mut child, _)) = self.members.pop() {
            let _ = child.kill();
            let _ = child.wait();
        }
        true
    }

    fn stop(&mut self) {
        while !self.members.is_empty() {
            self.leave();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.members {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `member URL ID SHARDS`: one member, until SIGTERM; reports on stdout.
fn member(args: &[String]) {
    let [url, id, shards] = args else {
        panic!("member URL ID SHARDS");
    };
    let shards: u32 = shards.parse().expect("a shard count");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let backend = incumbent::AnyBackend::connect(url).await.expect("connect");
        println!("memory {} {}", rss(), LIVE.load(Ordering::Relaxed));
        let runner = build(backend, id, shards);
        let mut status = runner.status();
        let report = tokio::spawn(async move {
            loop {
                let owned = status.borrow_and_update().owned();
                let line = format!(
                    "owned {} {} {} {}\n",
                    mono_ns(),
                    rss(),
                    LIVE.load(Ordering::Relaxed),
                    encode_claims(&owned)
                );
                let written = {
                    let mut out = std::io::stdout().lock();
                    out.write_all(line.as_bytes()).and_then(|()| out.flush())
                };
                if written.is_err() {
                    return;
                }
                if status.changed().await.is_err() {
                    return;
                }
            }
        });
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signals");
        term.recv().await;
        let _ = runner.shutdown().await;
        report.abort();
    });
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("member") {
        member(&args[1..]);
        return;
    }
    let o = options(&args);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "machine: {} cores; {} shards, {} members, {} rounds",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        o.shards,
        o.members,
        o.rounds
    );
    runtime.block_on(async {
        for name in &o.sections {
            match name.as_str() {
                "memory" => {
                    let mut group = InProcess {
                        store: incumbent::memory::MemoryBackend::new(),
                        shards: o.shards,
                        members: Vec::new(),
                    };
                    section("memory (tasks of one process)", &mut group, &o).await;
                }
                #[cfg(feature = "etcd")]
                "etcd" => {
                    let server = support::EtcdServer::single().await;
                    let mut group = Processes {
                        url: format!("etcd://{}", server.client_addr()),
                        shards: o.shards,
                        members: Vec::new(),
                    };
                    section("etcd (a process per member)", &mut group, &o).await;
                }
                other => println!("unknown section {other} (memory, etcd with feature etcd)"),
            }
        }
    });
}
