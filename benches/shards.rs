//! Sharded elections at scale: 1,024 shards over 8 members.
//!
//! ```text
//! cargo bench --bench shards --features etcd            # memory and etcd
//! cargo bench --bench shards -- memory                  # no server needed
//! cargo bench --bench shards --features etcd -- etcd --shards 1024 --members 8 --rounds 5
//! ```
//!
//! Each member is a [`ShardedElection`] with its own backend (its own connection, identity
//! and session, as a separate process would have) in this process. Per section: the time
//! until 7 members hold a balanced map (every shard owned once, each member within one of
//! `S / N`), then `--rounds` times: an 8th member joins, and leaves again (a clean
//! shutdown): the time to a balanced map after each, and the shards that moved (against the
//! least possible: what the newcomer gets, what the leaver had). Balance is read from each
//! member's [`ShardStatus`](incumbent::ShardStatus) every 5 ms. Then the heap per owned shard
//! (live bytes of this process once balanced, minus those before the members started, over
//! the shards: the members' campaigns, terms, workers and clients together). Nothing is
//! asserted; every wait is bounded.

#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
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

struct Options {
    sections: Vec<String>,
    shards: u32,
    members: usize,
    rounds: usize,
}

fn options() -> Options {
    let mut o = Options {
        sections: Vec::new(),
        shards: 1024,
        members: 8,
        rounds: 5,
    };
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
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

fn member<B: Backend>(backend: B, id: &str, shards: u32) -> ShardedRunner {
    ShardedElection::builder(backend, "bench/shards", shards)
        .candidate(id)
        .ttl(Duration::from_secs(5))
        .build()
        .expect("valid settings")
        .start(|_, term| async move { term.cancelled().await })
}

/// Who owns each shard, once the map is balanced over `members`; `None` after `limit`.
async fn balanced(
    members: &[(String, ShardedRunner)],
    shards: u32,
    limit: Duration,
) -> Option<BTreeMap<u32, String>> {
    let deadline = Instant::now() + limit;
    let per = shards as usize / members.len();
    while Instant::now() < deadline {
        let mut owners = BTreeMap::new();
        let mut ok = true;
        for (id, runner) in members {
            let owned = runner.status().borrow().owned();
            ok &= owned.len() == per || owned.len() == per + 1;
            for k in owned {
                ok &= owners.insert(k, id.clone()).is_none();
            }
        }
        if ok && owners.len() == shards as usize {
            return Some(owners);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for (id, runner) in members {
        let s = runner.status().borrow().clone();
        println!(
            "  {id}: owns {}, assigned {}, sees {} members, registered {}, problem {:?}",
            s.owned().len(),
            s.assigned.len(),
            s.members.len(),
            s.registered,
            s.problem
        );
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

async fn section<B: Backend>(name: &str, connect: impl Fn() -> B, o: &Options) {
    let began = Instant::now();
    let limit = Duration::from_secs(60);
    let heap_before = LIVE.load(Ordering::Relaxed);
    let mut members: Vec<(String, ShardedRunner)> = Vec::new();
    for i in 0..o.members - 1 {
        let id = format!("m{i}");
        members.push((id.clone(), member(connect(), &id, o.shards)));
    }
    let start = Instant::now();
    let Some(mut map) = balanced(&members, o.shards, limit).await else {
        println!(
            "{name}: {} members: no balanced map within {limit:?}",
            o.members - 1
        );
        return;
    };
    println!(
        "{name}: {} shards over {} members: balanced {:.0} ms after the start",
        o.shards,
        o.members - 1,
        start.elapsed().as_secs_f64() * 1e3
    );
    let heap = (LIVE.load(Ordering::Relaxed) - heap_before) as f64 / f64::from(o.shards);
    println!(
        "{name}: heap per owned shard: {heap:.0} B (all members in this process, clients included)"
    );
    let (mut join_ms, mut leave_ms, mut join_moves, mut leave_moves) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let least_join = o.shards as usize / o.members;
    for round in 0..o.rounds {
        let id = format!("n{round}");
        let at = Instant::now();
        members.push((id.clone(), member(connect(), &id, o.shards)));
        let Some(after) = balanced(&members, o.shards, limit).await else {
            println!("{name}: round {round}: no balanced map after the join within {limit:?}");
            return;
        };
        join_ms.push(at.elapsed().as_secs_f64() * 1e3);
        join_moves.push(moves(&map, &after) as f64);
        let leaver_had = after.values().filter(|o| **o == id).count();
        map = after;
        let (_, leaver) = members.pop().expect("the newcomer");
        let at = Instant::now();
        leaver.shutdown().await.expect("leave");
        let Some(after) = balanced(&members, o.shards, limit).await else {
            println!("{name}: round {round}: no balanced map after the leave within {limit:?}");
            return;
        };
        leave_ms.push(at.elapsed().as_secs_f64() * 1e3);
        leave_moves.push(moves(&map, &after) as f64);
        println!(
            "{name}: round {round}: join {:.0} ms, {} moves; leave {:.0} ms, {} moves (it had {leaver_had})",
            join_ms[round], join_moves[round], leave_ms[round], leave_moves[round]
        );
        map = after;
    }
    println!(
        "{name}: median over {} rounds: join {:.0} ms, {} moves [least {least_join}, at most ⌈S/N⌉ = {}]; \
         leave {:.0} ms, {} moves",
        o.rounds,
        median(join_ms),
        median(join_moves),
        (o.shards as usize).div_ceil(o.members - 1),
        median(leave_ms),
        median(leave_moves),
    );
    for (_, runner) in members {
        let _ = runner.shutdown().await;
    }
    println!(
        "{name}: section took {:.0} s",
        began.elapsed().as_secs_f64()
    );
}

fn main() {
    let o = options();
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
                    let store = incumbent::memory::MemoryBackend::new();
                    section("memory", || store.client(), &o).await;
                }
                #[cfg(feature = "etcd")]
                "etcd" => {
                    let server = support::EtcdServer::single().await;
                    let endpoints = server.endpoints();
                    let mut backends = Vec::new();
                    for _ in 0..o.members + o.rounds {
                        backends.push(
                            incumbent::etcd::EtcdBackend::connect(endpoints.clone())
                                .await
                                .expect("connect to etcd"),
                        );
                    }
                    let next = std::sync::Mutex::new(backends.into_iter());
                    section(
                        "etcd",
                        || next.lock().unwrap().next().expect("a backend per member"),
                        &o,
                    )
                    .await;
                }
                other => println!("unknown section {other} (memory, etcd with feature etcd)"),
            }
        }
    });
}
