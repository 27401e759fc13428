//! The checker's sharded mode: member processes of one [`ShardedElection`] on a real store,
//! a scenario of joins, a kill -9 and a SIGSTOP, and a check of every shard's terms.
//!
//! Each member is this program again, `shard-member URL ID SHARDS TTL_MS SLOTS LEDGER FENCE`:
//! for each shard it leads, its worker appends to `<ledger>/s-<pid>-<shard>-<token>.log`
//! (one `write(2)` per line, so a kill -9 loses nothing written):
//!
//! ```text
//! start <mono ns>
//! term <mono ns>              (when the term began: its Term::started, before the worker)
//! beat <mono ns> ok|stale     (every 50 ms: one write through the shard's fence)
//! stop <mono ns>              (when the term's task ends, returned or aborted)
//! ```
//!
//! Terms are ordered by when they began (`term`), not by when their worker started: a
//! process frozen between its win and its worker's start starts the worker after the thaw,
//! on a term that began before the freeze (the set mode freezes members right after their
//! wins). Its writes are then a frozen leader's, which the fence must refuse.
//!
//! The shard's fence (`<fence>/<shard>/`, [`Fence`]) refuses a token below the highest it
//! accepted. The check, per shard: tokens strictly grow with the terms' starts; a term ends
//! before the next begins, unless its process was frozen (SIGSTOP), and then the fence must
//! have refused each of its writes after the next term's first. The driver checks, at each
//! settled map read from the store: every shard held, by a live member, each member within one
//! of `S / N`, and at most `⌈S / N⌉` moves per change (`N` the smaller member count).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::sharded::{ShardMap, read_map};
use incumbent::url::{BackendUrl, WithBackend};
use incumbent::{AnyBackend, ShardedElection, Term};

use super::processes::Processes;
use super::worker::{Fence, mono_ns};

/// How often a shard's worker writes through its fence.
pub const BEAT: Duration = Duration::from_millis(50);

/// Runs one member until SIGTERM; returns the exit code.
pub fn member(args: &[String]) -> i32 {
    let usage = "URL ID SHARDS TTL_MS SLOTS LEDGER FENCE";
    let Some((url, args)) = MemberArgs::parse("chaos shard-member", usage, args, true) else {
        return 2;
    };
    let member = Member {
        id: args.id,
        shards: args.count,
        ttl: args.ttl,
        slots: args.slots,
        ledger: args.ledger,
        fence: args.fence,
    };
    super::candidate::run_library("chaos shard-member", &url, member)
}

/// What a member process of the sharded or the set mode is started with:
/// `URL ID COUNT TTL_MS [SLOTS] LEDGER FENCE`.
pub struct MemberArgs {
    /// The member's candidate id.
    pub id: String,
    /// Shards, or elections.
    pub count: u32,
    /// The ttl.
    pub ttl: Duration,
    /// Member slots (the sharded mode's; 0 without).
    pub slots: u32,
    /// Where the terms' ledgers go.
    pub ledger: PathBuf,
    /// Where the fences are.
    pub fence: PathBuf,
}

impl MemberArgs {
    /// Parses `args` (with `SLOTS` if `with_slots`); `None`, with `usage` printed, if they
    /// do not parse.
    pub fn parse(
        what: &str,
        usage: &str,
        args: &[String],
        with_slots: bool,
    ) -> Option<(BackendUrl, MemberArgs)> {
        let parsed = match (args, with_slots) {
            ([url, id, count, ttl, slots, ledger, fence], true) => {
                Some((url, id, count, ttl, Some(slots), ledger, fence))
            }
            ([url, id, count, ttl, ledger, fence], false) => {
                Some((url, id, count, ttl, None, ledger, fence))
            }
            _ => None,
        };
        let parsed = parsed.and_then(|(url, id, count, ttl, slots, ledger, fence)| {
            let slots = match slots {
                Some(s) => s.parse::<u32>().ok()?,
                None => 0,
            };
            let args = MemberArgs {
                id: id.clone(),
                count: count.parse().ok()?,
                ttl: Duration::from_millis(ttl.parse().ok()?),
                slots,
                ledger: PathBuf::from(ledger),
                fence: PathBuf::from(fence),
            };
            Some((url.parse::<BackendUrl>().ok()?, args))
        });
        if parsed.is_none() {
            eprintln!("{what}: {usage} (got {args:?})");
        }
        parsed
    }
}

struct Member {
    id: String,
    shards: u32,
    ttl: Duration,
    slots: u32,
    ledger: PathBuf,
    fence: PathBuf,
}

impl WithBackend for Member {
    type Output = Result<(), incumbent::Error>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let group = ShardedElection::builder(backend, GROUP, self.shards)
            .candidate(&self.id)
            .ttl(self.ttl)
            .grace(Duration::from_secs(1))
            .max_members(self.slots)
            .build()?;
        let (ledger, fence) = (Arc::new(self.ledger), Arc::new(self.fence));
        let runner = group.start(move |shard, term| {
            let (ledger, fence) = (ledger.clone(), fence.clone());
            async move { work(shard, term, &ledger, &fence).await }
        });
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
        } else {
            std::future::pending::<()>().await;
        }
        runner.shutdown().await
    }
}

/// The group every member joins.
pub const GROUP: &str = "chaos/sharded";

/// Writes `stop` when the term's task ends, returned or aborted.
struct Stop(std::fs::File);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.write_all(format!("stop {}\n", mono_ns()).as_bytes());
    }
}

/// One shard's term: beats through the shard's fence until the term is cancelled. The set
/// mode's workers run it too, an election's index for the shard.
pub async fn work(shard: u32, term: Term, ledger: &Path, fence: &Path) {
    let token = term.fencing_token();
    let pid = std::process::id();
    let dir = fence.join(shard.to_string());
    let (Ok(()), Ok(mut log)) = (
        std::fs::create_dir_all(&dir),
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(ledger.join(format!("s-{pid}-{shard}-{token}.log"))),
    ) else {
        return;
    };
    let Ok(fence) = Fence::open(&dir) else {
        return;
    };
    let now = mono_ns();
    let began = now.saturating_sub(u64::try_from(term.started().elapsed().as_nanos()).unwrap_or(0));
    if log
        .write_all(format!("start {now}\nterm {began}\n").as_bytes())
        .is_err()
    {
        return;
    }
    let Ok(copy) = log.try_clone() else {
        return;
    };
    let _stop = Stop(copy);
    while !term.is_cancelled() {
        let line = match fence.write(token, pid) {
            Ok((at, true)) => format!("beat {at} ok\n"),
            Ok((at, false)) => format!("beat {at} stale\n"),
            Err(_) => return,
        };
        if log.write_all(line.as_bytes()).is_err() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(BEAT) => {}
            () = term.cancelled() => {}
        }
    }
}

/// One term of one shard, read back from the ledger.
#[derive(Clone, Debug)]
pub struct ShardTerm {
    /// The member's process.
    pub pid: u32,
    /// The shard.
    pub shard: u32,
    /// The term's fencing token.
    pub token: u64,
    /// When the term began (`term`; for a ledger without it, when the worker started).
    pub start: u64,
    /// When its task ended (`None`: the process was killed first).
    pub stop: Option<u64>,
    /// Each write through the fence: when, and whether it was accepted.
    pub beats: Vec<(u64, bool)>,
}

impl ShardTerm {
    /// The last instant the term did anything.
    fn end(&self) -> u64 {
        self.stop
            .or(self.beats.last().map(|b| b.0))
            .unwrap_or(self.start)
    }
}

/// Reads every term in `ledger`.
pub fn read_ledger(ledger: &Path) -> Vec<ShardTerm> {
    let mut terms = Vec::new();
    let Ok(entries) = std::fs::read_dir(ledger) else {
        return terms;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_prefix("s-").and_then(|n| n.strip_suffix(".log")) else {
            continue;
        };
        let parts: Vec<u64> = stem.split('-').filter_map(|p| p.parse().ok()).collect();
        let [pid, shard, token] = parts[..] else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut term = ShardTerm {
            pid: pid as u32,
            shard: shard as u32,
            token,
            start: 0,
            stop: None,
            beats: Vec::new(),
        };
        for line in text.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["start", at] if term.start == 0 => term.start = at.parse().unwrap_or(0),
                // When the term began, if the worker said: the terms' order.
                ["term", at] => term.start = at.parse().unwrap_or(term.start),
                ["stop", at] => term.stop = at.parse().ok(),
                ["beat", at, verdict] => {
                    if let Ok(at) = at.parse() {
                        term.beats.push((at, verdict == "ok"));
                    }
                }
                _ => {}
            }
        }
        terms.push(term);
    }
    terms
}

/// The violations in `terms`: see the [module docs](self). `frozen`: the pids that were
/// stopped with SIGSTOP at some point.
pub fn check(terms: &[ShardTerm], frozen: &BTreeSet<u32>) -> Vec<String> {
    let mut violations = Vec::new();
    let mut by_shard: BTreeMap<u32, Vec<&ShardTerm>> = BTreeMap::new();
    for t in terms {
        by_shard.entry(t.shard).or_default().push(t);
    }
    for (shard, mut terms) in by_shard {
        terms.sort_by_key(|t| (t.start, t.token));
        for pair in terms.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.token <= a.token {
                violations.push(format!(
                    "shard {shard}: token {} (pid {}) began after token {} (pid {})",
                    b.token, b.pid, a.token, a.pid
                ));
            }
            if a.end() <= b.start {
                continue;
            }
            if !frozen.contains(&a.pid) {
                violations.push(format!(
                    "shard {shard}: token {} (pid {}) ran until {:.1} ms after token {} (pid {}) began",
                    a.token,
                    a.pid,
                    (a.end() - b.start) as f64 / 1e6,
                    b.token,
                    b.pid
                ));
                continue;
            }
            let first = b.beats.iter().find(|beat| beat.1).map(|beat| beat.0);
            if let Some(first) = first
                && let Some(late) = a.beats.iter().find(|beat| beat.1 && beat.0 > first)
            {
                violations.push(format!(
                    "shard {shard}: the fence accepted token {} (frozen pid {}) {:.1} ms after token {} wrote",
                    a.token,
                    a.pid,
                    (late.0 - first) as f64 / 1e6,
                    b.token
                ));
            }
        }
    }
    violations
}

/// What a scenario saw: one line per step, and the violations.
#[derive(Debug, Default)]
pub struct Report {
    /// Each step: what changed, members after it, moves, time to a balanced map.
    pub steps: Vec<String>,
    /// Terms in the ledger.
    pub terms: usize,
    /// Stale writes the fences refused.
    pub refused: usize,
    /// Everything that broke a promise.
    pub violations: Vec<String>,
}

/// The member processes of a scenario, with what each is started with.
struct Members {
    processes: Processes,
    url: String,
    shards: u32,
    ttl: Duration,
    slots: u32,
    dir: PathBuf,
}

impl Members {
    fn spawn(&mut self, id: &str) -> Result<u32, String> {
        let args: [std::ffi::OsString; 8] = [
            "shard-member".into(),
            self.url.clone().into(),
            id.into(),
            self.shards.to_string().into(),
            self.ttl.as_millis().to_string().into(),
            self.slots.to_string().into(),
            self.dir.join("ledger").into(),
            self.dir.join("fence").into(),
        ];
        self.processes.spawn(id, args)
    }
}

impl std::ops::Deref for Members {
    type Target = Processes;

    fn deref(&self) -> &Processes {
        &self.processes
    }
}

impl std::ops::DerefMut for Members {
    fn deref_mut(&mut self) -> &mut Processes {
        &mut self.processes
    }
}

/// Whether `map` is settled over `live`: every shard held by one of them, each within one
/// of `S / N`, the slots show exactly them, and each claims exactly what it holds.
fn settled(map: &ShardMap, live: &BTreeSet<String>, shards: u32) -> bool {
    let members: BTreeSet<String> = map.members.iter().map(|m| m.id.clone()).collect();
    if &members != live || live.is_empty() {
        return false;
    }
    let counts = map.counts();
    let per = shards as usize / live.len();
    let extra = if (shards as usize).is_multiple_of(live.len()) {
        0
    } else {
        1
    };
    // Settled means the fixed point too: each member claims exactly what it holds (a map
    // balanced by counts can still be converging, two members trading shards).
    let claims_held = map.members.iter().all(|m| {
        m.claims.iter().all(|&k| {
            map.holders[k as usize]
                .as_ref()
                .is_some_and(|h| h.candidate.id == m.id)
        }) && m.claims.len() == *counts.get(&m.id).unwrap_or(&0)
    });
    claims_held
        && map
            .holders
            .iter()
            .all(|h| h.as_ref().is_some_and(|h| live.contains(&h.candidate.id)))
        && live
            .iter()
            .all(|id| (per..=per + extra).contains(counts.get(id).unwrap_or(&0)))
}

/// Reads the map until it is settled over `live`; returns it and how long that took.
async fn wait_settled(
    backend: &AnyBackend,
    live: &BTreeSet<String>,
    shards: u32,
    slots: u32,
    limit: Duration,
) -> Result<(BTreeMap<u32, String>, Duration), String> {
    let began = Instant::now();
    let mut last = String::new();
    while began.elapsed() < limit {
        match read_map(backend, GROUP, shards, slots).await {
            Ok(map) if settled(&map, live, shards) => {
                let owners = map
                    .holders
                    .iter()
                    .enumerate()
                    .filter_map(|(k, h)| h.as_ref().map(|h| (k as u32, h.candidate.id.clone())))
                    .collect();
                return Ok((owners, began.elapsed()));
            }
            Ok(map) => {
                let claims: Vec<(String, usize)> = map
                    .members
                    .iter()
                    .map(|m| (m.id.clone(), m.claims.len()))
                    .collect();
                let unheld = map.holders.iter().filter(|h| h.is_none()).count();
                let astray: Vec<String> = map
                    .holders
                    .iter()
                    .enumerate()
                    .filter_map(|(k, h)| {
                        let h = h.as_ref()?;
                        let claimed = map
                            .members
                            .iter()
                            .any(|m| m.id == h.candidate.id && m.claims.contains(&(k as u32)));
                        (!claimed).then(|| format!("{k}@{}", h.candidate.id))
                    })
                    .collect();
                last = format!(
                    "held {:?}, claimed {claims:?}, {unheld} unheld, held unclaimed {astray:?}",
                    map.counts()
                );
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "no balanced map over {live:?} within {limit:?}; last read: {last}"
    ))
}

/// Runs the scenario on the store at `url`, with `this` (a program that runs
/// [`member`] as `shard-member …`) as the members, keeping the ledger in `dir`:
/// 3 members, a 4th joins, one is killed (kill -9), one is frozen (SIGSTOP) past the ttl and
/// then resumed, and all leave with SIGTERM. On the file backend (`file:` URLs) the frozen
/// member keeps its shards (the kernel keeps its locks), and the map must not change.
pub async fn scenario(
    this: &Path,
    url: &str,
    shards: u32,
    ttl: Duration,
    dir: &Path,
) -> Result<Report, String> {
    std::fs::create_dir_all(dir.join("ledger")).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir.join("fence")).map_err(|e| e.to_string())?;
    let backend = AnyBackend::connect(url)
        .await
        .map_err(|e| format!("connect to {url}: {e}"))?;
    let slots = 8;
    let mut members = Members {
        processes: Processes::new(this.to_path_buf(), dir.to_path_buf()),
        url: url.to_owned(),
        shards,
        ttl,
        slots,
        dir: dir.to_path_buf(),
    };
    let mut report = Report::default();
    let mut frozen = BTreeSet::new();
    let mut killed = BTreeSet::new();
    let mut live: BTreeSet<String> = BTreeSet::new();
    let limit = ttl * 4 + Duration::from_secs(10);
    let mut before: Option<BTreeMap<u32, String>> = None;
    let mut step = |report: &mut Report,
                    what: &str,
                    n_before: usize,
                    map: BTreeMap<u32, String>,
                    took: Duration| {
        let moves = before
            .as_ref()
            .map(|b| (0..shards).filter(|k| b.get(k) != map.get(k)).count());
        // Moves between two members that own shards before and after: none is needed by a
        // join or a leave; say which, to tell why.
        let owners_after: BTreeSet<&String> = map.values().collect();
        let between: Vec<String> = before
            .as_ref()
            .map(|b| {
                let owners_before: BTreeSet<&String> = b.values().collect();
                (0..shards)
                    .filter_map(|k| {
                        let (from, to) = (b.get(&k)?, map.get(&k)?);
                        (from != to && owners_after.contains(from) && owners_before.contains(to))
                            .then(|| format!("{k}: {from} -> {to}"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let n = n_before
            .min(map.values().collect::<BTreeSet<_>>().len())
            .max(1);
        let bound = (shards as usize).div_ceil(n);
        if let Some(moves) = moves
            && moves > bound
        {
            report.violations.push(format!(
                "{what}: {moves} moves, more than ⌈{shards}/{n}⌉ = {bound}"
            ));
        }
        report.steps.push(format!(
            "{what}: balanced over {} members in {:.0} ms, {} moves{}",
            map.values().collect::<BTreeSet<_>>().len(),
            took.as_secs_f64() * 1e3,
            moves.map_or("-".into(), |m| m.to_string()),
            if between.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} between members that stayed: {})",
                    between.len(),
                    between.join(", ")
                )
            }
        ));
        before = Some(map);
    };

    for id in ["m1", "m2", "m3"] {
        members.spawn(id)?;
        live.insert(id.into());
    }
    let (map, took) = wait_settled(&backend, &live, shards, slots, limit).await?;
    step(&mut report, "3 members start", 0, map, took);

    members.spawn("m4")?;
    live.insert("m4".into());
    let (map, took) = wait_settled(&backend, &live, shards, slots, limit).await?;
    step(&mut report, "m4 joins", 3, map, took);

    killed.insert(members.pid("m1"));
    members.signal("m1", libc::SIGKILL);
    live.remove("m1");
    let (map, took) = wait_settled(&backend, &live, shards, slots, limit).await?;
    step(&mut report, "m1 is killed (kill -9)", 4, map, took);

    frozen.insert(members.pid("m2"));
    members.signal("m2", libc::SIGSTOP);
    if url.starts_with("file:") {
        // The kernel keeps a frozen process's locks: on the file backend its shards stay
        // with it, and nothing may move while it is frozen.
        tokio::time::sleep(ttl * 2).await;
        let (map, took) = wait_settled(&backend, &live, shards, slots, limit).await?;
        step(
            &mut report,
            "m2 is frozen (SIGSTOP; its file locks stay with it)",
            3,
            map,
            took,
        );
    } else {
        live.remove("m2");
        let (map, took) = wait_settled(&backend, &live, shards, slots, limit).await?;
        step(&mut report, "m2 is frozen (SIGSTOP)", 3, map, took);
    }

    members.signal("m2", libc::SIGCONT);
    live.insert("m2".into());
    let (map, took) = wait_settled(&backend, &live, shards, slots, limit).await?;
    step(&mut report, "m2 resumes and joins again", 2, map, took);

    members.stop_all();
    let terms = read_ledger(&dir.join("ledger"));
    report.terms = terms.len();
    report.refused = terms
        .iter()
        .flat_map(|t| t.beats.iter())
        .filter(|b| !b.1)
        .count();
    report.violations.extend(check(&terms, &frozen));
    for t in &terms {
        if t.stop.is_none() && !killed.contains(&t.pid) {
            report.violations.push(format!(
                "shard {}: token {} (pid {}) never stopped though its member left with SIGTERM",
                t.shard, t.token, t.pid
            ));
        }
    }
    Ok(report)
}

/// A store started for a scenario, stopped on drop, and the URL members use.
pub struct StartedStore {
    _server: Box<dyn std::any::Any + Send>,
    /// The members' backend URL.
    pub url: String,
}

/// Starts `name` (`etcd`, `zookeeper`, `postgres`, `consul`, `redis` or `memcached`) on a
/// free loopback port in a temp dir, or makes a lock directory (`file`). Panics, naming the install command, when it is missing.
pub async fn start_store(name: &str) -> Result<StartedStore, String> {
    use crate::support::{consul, etcd, memcached, postgres, redis, zookeeper};
    let (server, url): (Box<dyn std::any::Any + Send>, String) = match name {
        "etcd" => {
            let s = etcd::EtcdServer::single().await;
            let url = format!("etcd://{}", s.client_addr());
            (Box::new(s), url)
        }
        "zookeeper" => {
            let s = zookeeper::ZookeeperServer::single().await;
            let url = format!("zk://{}", s.client_addr());
            (Box::new(s), url)
        }
        "postgres" => {
            let s = postgres::PostgresServer::start().await;
            let url = s.url();
            (Box::new(s), url)
        }
        "consul" => {
            // The members are processes on 127.0.0.1: the agent counts their connections as
            // one client's, and each shard a member waits for or holds keeps a blocking query
            // open. At the default limit (200) a join's churn could exceed it, and the agent
            // closed connections without an answer: one run's join left 2 shards unheld for
            // 50 s while their member backed off (RELIABILITY.md, "Runs of 2026-11-29").
            let s = consul::ConsulDev::start_with(&[consul::many_connections()]).await;
            let url = format!("consul://{}", s.http_addr());
            (Box::new(s), url)
        }
        "redis" => {
            let s = redis::RedisServer::start().await;
            let url = format!("redis://{}", s.addr());
            (Box::new(s), url)
        }
        "memcached" => {
            let s = memcached::MemcachedServer::start().await;
            let url = format!("memcached://{}", s.addr());
            (Box::new(s), url)
        }
        "file" => {
            let dir = tempfile::tempdir().map_err(|e| format!("a temp dir: {e}"))?;
            let url = format!("file://{}", dir.path().display());
            (Box::new(dir), url)
        }
        other => return Err(format!("no sharded scenario for the store {other:?}")),
    };
    Ok(StartedStore {
        _server: server,
        url,
    })
}

/// The ttl a scenario uses on `store`: short, within what the store accepts.
pub fn ttl_for(store: &str) -> Duration {
    match store {
        "consul" => Duration::from_secs(10),
        _ => Duration::from_secs(2),
    }
}
