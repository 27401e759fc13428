//! Measurements shared by every backend's section.

use std::future::Future;
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::{Campaign, Election, LeadershipEvent, Role};
use tokio::time::timeout;

/// The election that hand-off and crash rounds use.
pub const ELECTION: &str = "bench/leader";

fn election<B: Backend>(backend: B, id: &str, ttl: Duration) -> Election<B> {
    election_named(backend, ELECTION, id, ttl)
}

fn election_named<B: Backend>(backend: B, name: &str, id: &str, ttl: Duration) -> Election<B> {
    Election::builder(backend, name)
        .candidate(id)
        .ttl(ttl)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .expect("valid settings")
}

async fn next_elected(campaign: &mut Campaign, limit: Duration) -> Option<u64> {
    timeout(limit, async {
        loop {
            match campaign.recv().await {
                Some(LeadershipEvent::Elected(term)) => return Some(term.fencing_token()),
                Some(_) => {}
                None => return None,
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Two candidates; the leader resigns; time until the other reports `Elected`. Each round
/// starts as soon as the follower reports [`Role::Follower`].
pub async fn handoff_rounds<B: Backend>(
    connect: impl Fn() -> B,
    ttl: Duration,
    rounds: usize,
) -> Vec<Duration> {
    let (a, b) = (connect(), connect());
    let mut pair = Pair::start(a, b, ttl).await;
    let samples = pair.rounds(rounds, Duration::ZERO).await;
    pair.stop().await;
    samples
}

/// Like [`handoff_rounds`], twice with the same two candidates: first as soon as the
/// follower reports [`Role::Follower`] (so the resign races the set-up of its wait), then
/// `settle` after it did (so its wait is in place, as a follower's is most of the time).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub async fn handoff_rounds_racing_and_settled<B: Backend>(
    connect: impl Fn() -> B,
    ttl: Duration,
    rounds: usize,
    settle: Duration,
) -> (Vec<Duration>, Vec<Duration>) {
    let (a, b) = (connect(), connect());
    let mut pair = Pair::start(a, b, ttl).await;
    let racing = pair.rounds(rounds, Duration::ZERO).await;
    let settled = pair.rounds(rounds, settle).await;
    pair.stop().await;
    (racing, settled)
}

/// Two campaigns of one election, and which of them leads.
struct Pair {
    a: Campaign,
    b: Campaign,
    ttl: Duration,
    leader_is_a: bool,
}

impl Pair {
    async fn start<B: Backend>(a: B, b: B, ttl: Duration) -> Pair {
        let mut a = election(a, "a", ttl).campaign();
        let mut b = election(b, "b", ttl).campaign();
        let leader_is_a = tokio::select! {
            _ = next_elected(&mut a, ttl * 5) => true,
            _ = next_elected(&mut b, ttl * 5) => false,
        };
        Pair {
            a,
            b,
            ttl,
            leader_is_a,
        }
    }

    /// Whoever leads resigns, `settle` after the other reports it follows; the other must
    /// take over.
    async fn rounds(&mut self, rounds: usize, settle: Duration) -> Vec<Duration> {
        let ttl = self.ttl;
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let (leader, follower) = if self.leader_is_a {
                (&mut self.a, &mut self.b)
            } else {
                (&mut self.b, &mut self.a)
            };
            // Start only once the follower waits for the lock (not in a cool-down).
            let mut status = follower.status();
            let _ = timeout(
                ttl * 5,
                status.wait_for(|s| s.role == incumbent::Role::Follower),
            )
            .await;
            tokio::time::sleep(settle).await;
            let start = Instant::now();
            let handle = leader.handle();
            let resign = tokio::spawn(async move { handle.resign().await });
            if next_elected(follower, ttl * 5).await.is_none() {
                println!("  a round timed out");
                break;
            }
            samples.push(start.elapsed());
            let _ = resign.await;
            self.leader_is_a = !self.leader_is_a;
        }
        samples
    }

    async fn stop(self) {
        let _ = self.a.shutdown().await;
        let _ = self.b.shutdown().await;
    }
}

/// One crash round.
#[derive(Clone, Copy, Debug)]
pub struct Crash {
    /// From the crash until the follower reports `Elected`.
    pub failover: Duration,
    /// From the crash until the store dropped the crashed leader's session, when watched.
    #[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
    pub invalidated: Option<Duration>,
}

/// A leader on its own runtime is dropped mid-flight; time until the follower leads.
///
/// See [`crash_rounds_watched`]; this one does not watch the store.
#[cfg_attr(not(feature = "file"), allow(dead_code))]
pub async fn crash_rounds<B, F, Fut>(
    connect: F,
    ttl: Duration,
    rounds: usize,
    limit: Duration,
) -> Vec<Duration>
where
    B: Backend,
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = B>,
{
    let no_watch = |_: String| async { None };
    let phase = Duration::ZERO;
    let session_of = |_: &B| None;
    crash_rounds_watched(
        ELECTION, connect, ttl, rounds, limit, phase, session_of, no_watch,
    )
    .await
    .iter()
    .map(|c| c.failover)
    .collect()
}

/// A leader on its own runtime is dropped mid-flight; time until the follower leads.
///
/// The crashing leader connects on its own current-thread runtime, in its own thread, so
/// that dropping the runtime drops everything it has: the campaign, the keep-alive, and the
/// connection tasks. Nothing is released or revoked, and the sockets close, as when the
/// process is killed with SIGKILL. The follower then waits `limit` at most.
///
/// The crash comes 100 ms after the follower started waiting, plus a random part of `phase`:
/// pass the renew interval so that the crash falls anywhere between two renewals, as a real
/// one would, rather than always just after the session was created.
///
/// `session_of` names the leader's session in the store (read once it leads), and `watch`
/// resolves when the store drops that session (started just before the crash), to split the
/// failover into the store's part and the follower's. Series on different `election`s may run
/// at the same time.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(
    not(any(feature = "file", feature = "etcd", feature = "consul")),
    allow(dead_code)
)]
pub async fn crash_rounds_watched<B, F, Fut, S, W, WFut>(
    election: &str,
    connect: F,
    ttl: Duration,
    rounds: usize,
    limit: Duration,
    phase: Duration,
    session_of: S,
    watch: W,
) -> Vec<Crash>
where
    B: Backend,
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = B>,
    S: Fn(&B) -> Option<String> + Clone + Send + 'static,
    W: Fn(String) -> WFut,
    WFut: Future<Output = Option<Instant>> + Send + 'static,
{
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let (ready_tx, ready) = tokio::sync::oneshot::channel::<Option<String>>();
        let (crash_tx, crash) = std::sync::mpsc::channel::<()>();
        let leader_connect = connect.clone();
        let leader_session = session_of.clone();
        let name = election.to_owned();
        let leader = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
            std::thread::spawn(move || {
                let _ = crash.recv();
                let _ = stop_tx.send(());
            });
            runtime.block_on(async move {
                let backend = leader_connect().await;
                let id = format!("crasher-{round}");
                let mut c = election_named(backend.clone(), &name, &id, ttl).campaign();
                if next_elected(&mut c, ttl * 5).await.is_some() {
                    let _ = ready_tx.send(leader_session(&backend));
                } else {
                    drop(ready_tx);
                }
                let _ = stop.await;
                // No shutdown, no release: the runtime is dropped with everything in it.
                std::mem::forget(c);
            });
            drop(runtime);
        });
        let Ok(session) = ready.await else {
            println!("  round {round}: the leader-to-crash was not elected");
            drop(crash_tx);
            let _ = leader.join();
            continue;
        };
        let mut follower = election_named(connect().await, election, "follower", ttl).campaign();
        // Crash only once the follower waits for the lock (and has seen the leader).
        let mut status = follower.status();
        let _ = timeout(limit, status.wait_for(|s| s.role == Role::Follower)).await;
        let watcher = session.map(|id| tokio::spawn(watch(id)));
        let phase = phase.mul_f64(fastrand::f64());
        tokio::time::sleep(Duration::from_millis(100) + phase).await;
        let start = Instant::now();
        drop(crash_tx);
        let _ = tokio::task::spawn_blocking(move || leader.join()).await;
        let elected = next_elected(&mut follower, limit).await;
        let failover = start.elapsed();
        let invalidated = match watcher {
            Some(mut w) => match timeout(Duration::from_secs(5), &mut w).await {
                Ok(Ok(at)) => at.map(|at| at.saturating_duration_since(start)),
                _ => {
                    w.abort();
                    None
                }
            },
            None => None,
        };
        if elected.is_some() {
            samples.push(Crash {
                failover,
                invalidated,
            });
        } else {
            println!("  round {round}: no new leader within {limit:?}");
        }
        let _ = follower.shutdown().await;
    }
    samples
}

/// Prints the failover times of crash rounds and, when the store was watched, their split:
/// crash to the store dropping the session, and from there to the new leader.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub fn print_crashes(what: &str, crashes: &[Crash], target: &str, store_part: &str) {
    let failover: Vec<Duration> = crashes.iter().map(|c| c.failover).collect();
    print_latencies_against(what, &failover, target);
    let watched: Vec<(Duration, Duration)> = crashes
        .iter()
        .filter_map(|c| c.invalidated.map(|i| (i, c.failover.saturating_sub(i))))
        .collect();
    if watched.is_empty() {
        return;
    }
    for (round, (invalidated, after)) in watched.iter().enumerate() {
        println!(
            "  round {}: {store_part} after {:.3} s, new leader {:.3} ms later",
            round + 1,
            invalidated.as_secs_f64(),
            after.as_secs_f64() * 1e3
        );
    }
    let split = |pick: fn(&(Duration, Duration)) -> Duration| -> Vec<Duration> {
        watched.iter().map(pick).collect()
    };
    print_latencies(&format!("  crash -> {store_part}"), &split(|w| w.0));
    print_latencies(&format!("  {store_part} -> new leader"), &split(|w| w.1));
}

/// `count` elections in one process: time to lead them all, and resident memory per election.
/// `detail` is called while all are held, and its answer printed (e.g. how many leases).
pub async fn elections_at_scale<B: Backend>(
    name: &str,
    count: usize,
    connect: impl Fn() -> B,
    target: &str,
    detail: impl Fn() -> String,
) {
    // Give back what earlier sections freed, so that it is not reused unseen.
    trim();
    let before = rss_bytes();
    let start = Instant::now();
    let mut campaigns = Vec::with_capacity(count);
    for i in 0..count {
        let e = Election::builder(connect(), format!("scale/{i}"))
            .candidate("bench")
            .ttl(Duration::from_secs(30))
            .build()
            .expect("valid settings");
        campaigns.push(e.campaign());
    }
    let mut led = 0;
    for c in &mut campaigns {
        if next_elected(c, Duration::from_secs(60)).await.is_some() {
            led += 1;
        }
    }
    let took = start.elapsed();
    let peak = rss_bytes();
    // What the elections hold, without what starting them used and freed (request buffers
    // of a thousand concurrent calls, say) that the allocator has not given back yet.
    trim();
    let after = rss_bytes();
    let per = after.saturating_sub(before) / count as u64;
    let detail = detail();
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!("; {detail}")
    };
    let mib = |bytes: u64| bytes.saturating_sub(before) as f64 / 1048576.0;
    println!(
        "{count} elections on {name}: {led} led in {:.2} s; extra RSS {:.1} MiB, {:.1} KB per election \
         ({:.1} MiB before freed memory was given back){detail}{}",
        took.as_secs_f64(),
        mib(after),
        per as f64 / 1000.0,
        mib(peak),
        bracket(target)
    );
    stop_all(campaigns).await;
}

/// Shuts campaigns down, all at once.
pub async fn stop_all(campaigns: Vec<Campaign>) {
    let _ = Campaign::shutdown_all(campaigns).await;
}

/// Candidates of one election, one per `(backend, candidate id)`, all started at once; returns
/// once one leads and all others follow, and a second has passed for things to settle.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub async fn idle_election<B: Backend>(members: Vec<(B, String)>, ttl: Duration) -> Vec<Campaign> {
    let count = members.len();
    let campaigns: Vec<Campaign> = members
        .into_iter()
        .map(|(backend, id)| election(backend, &id, ttl).campaign())
        .collect();
    let deadline = Instant::now() + ttl * 5;
    loop {
        let roles: Vec<Role> = campaigns.iter().map(|c| c.status().borrow().role).collect();
        let leaders = roles.iter().filter(|r| **r == Role::Leader).count();
        let followers = roles.iter().filter(|r| **r == Role::Follower).count();
        if leaders == 1 && followers + 1 == count {
            break;
        }
        if Instant::now() > deadline {
            println!("  not settled: {leaders} leader(s), {followers} follower(s) of {count}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    campaigns
}

/// One leader and nine followers sit idle: CPU used by this process per second.
pub async fn idle_cpu<B: Backend>(
    name: &str,
    connect: impl Fn() -> B,
    ttl: Duration,
    window: Duration,
) {
    let mut campaigns: Vec<Campaign> = (0..10)
        .map(|i| election(connect(), &format!("idle-{i}"), ttl).campaign())
        .collect();
    next_elected_any(&mut campaigns, ttl * 5).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu_before = cpu_time();
    tokio::time::sleep(window).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    println!(
        "idle, 1 leader + 9 followers on {name}: {:.2} ms of CPU per second (ttl {:?}, renew every {:?})",
        cpu.as_secs_f64() * 1e3 / window.as_secs_f64(),
        ttl,
        ttl / 3
    );
    for c in campaigns {
        let _ = c.shutdown().await;
    }
}

async fn next_elected_any(campaigns: &mut [Campaign], limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if campaigns.iter().any(|c| c.status().borrow().is_leader()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn print_latencies(what: &str, samples: &[Duration]) {
    print_latencies_against(what, samples, "");
}

/// Like [`print_latencies`], with the target in brackets after the figures.
pub fn print_latencies_against(what: &str, samples: &[Duration], target: &str) {
    if samples.is_empty() {
        println!("{what}: no samples{}", bracket(target));
        return;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| quantile(&sorted, q);
    println!(
        "{what}: median {:.3} ms, p99 {:.3} ms, min {:.3} ms, max {:.3} ms ({} rounds){}",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        sorted[0].as_secs_f64() * 1e3,
        sorted[sorted.len() - 1].as_secs_f64() * 1e3,
        sorted.len(),
        bracket(target)
    );
}

/// The median of `samples`, as [`print_latencies`] prints it; `None` without samples.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub fn median(samples: &[Duration]) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    Some(quantile(&sorted, 0.5))
}

/// The sample at quantile `q` (0 to 1) of non-empty sorted samples, to the nearest rank.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// ` [target: …]`, or nothing.
pub fn bracket(target: &str) -> String {
    if target.is_empty() {
        String::new()
    } else {
        format!(" [target: {target}]")
    }
}

/// Prints how long a section took.
pub fn took(what: &str, since: Instant) {
    println!("({what} took {:.0} s)", since.elapsed().as_secs_f64());
}

/// This process's resident set size.
/// Returns the allocator's free memory to the system, so that RSS counts what is in use.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// User + system CPU time of this process, to the microsecond.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we hand it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}
