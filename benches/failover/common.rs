//! Measurements shared by every backend's section.

use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::{Campaign, Election, LeadershipEvent};
use tokio::time::timeout;

const ELECTION: &str = "bench/leader";

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!("{cores} cores, {cpu}")
}

fn election<B: Backend>(backend: B, id: &str, ttl: Duration) -> Election<B> {
    Election::builder(backend, ELECTION)
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

/// Two candidates; the leader resigns; time until the other reports `Elected`.
pub async fn handoff_rounds<B: Backend>(
    connect: impl Fn() -> B,
    ttl: Duration,
    rounds: usize,
) -> Vec<Duration> {
    let mut a = election(connect(), "a", ttl).campaign();
    let mut b = election(connect(), "b", ttl).campaign();
    let mut samples = Vec::with_capacity(rounds);
    // Whoever leads first resigns; the other must take over.
    let mut leader_is_a = tokio::select! {
        _ = next_elected(&mut a, ttl * 5) => true,
        _ = next_elected(&mut b, ttl * 5) => false,
    };
    for _ in 0..rounds {
        let (leader, follower) = if leader_is_a {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        // Start only once the follower waits for the lock (not in a cool-down).
        let mut status = follower.status();
        let _ = timeout(
            ttl * 5,
            status.wait_for(|s| s.role == incumbent::Role::Follower),
        )
        .await;
        let start = Instant::now();
        let handle = leader.handle();
        let resign = tokio::spawn(async move { handle.resign().await });
        if next_elected(follower, ttl * 5).await.is_none() {
            println!("  a round timed out");
            break;
        }
        samples.push(start.elapsed());
        let _ = resign.await;
        leader_is_a = !leader_is_a;
    }
    let _ = a.shutdown().await;
    let _ = b.shutdown().await;
    samples
}

/// A leader on its own runtime is dropped mid-flight; time until the follower leads.
pub async fn crash_rounds<B: Backend>(
    connect: impl Fn() -> B,
    ttl: Duration,
    rounds: usize,
) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let backend = connect();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let (crash_tx, crash) = std::sync::mpsc::channel::<()>();
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
                let mut c = election(backend, &format!("crasher-{round}"), ttl).campaign();
                next_elected(&mut c, ttl * 5).await;
                let _ = ready_tx.send(());
                let _ = stop.await;
                std::mem::forget(c);
            });
        });
        ready.recv().expect("the leader was elected");
        let mut follower = election(connect(), "follower", ttl).campaign();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let start = Instant::now();
        drop(crash_tx);
        leader.join().expect("the crashed leader's thread");
        if next_elected(&mut follower, ttl * 3).await.is_some() {
            samples.push(start.elapsed());
        }
        let _ = follower.shutdown().await;
    }
    samples
}

/// `count` elections in one process: time to lead them all, and resident memory per election.
pub async fn elections_at_scale<B: Backend>(name: &str, count: usize, connect: impl Fn() -> B) {
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
    for c in &mut campaigns {
        next_elected(c, Duration::from_secs(60)).await;
    }
    let took = start.elapsed();
    let after = rss_bytes();
    let per = after.saturating_sub(before) / count as u64;
    println!(
        "{count} elections on {name}: all led in {:.2} s; extra RSS {:.1} MiB, {:.1} KB per election",
        took.as_secs_f64(),
        after.saturating_sub(before) as f64 / 1048576.0,
        per as f64 / 1000.0
    );
    for c in campaigns {
        drop(c);
    }
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
    if samples.is_empty() {
        println!("{what}: no samples");
        return;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what}: median {:.3} ms, p99 {:.3} ms, min {:.3} ms, max {:.3} ms ({} rounds)",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        sorted[0].as_secs_f64() * 1e3,
        sorted[sorted.len() - 1].as_secs_f64() * 1e3,
        sorted.len()
    );
}

/// This process's resident set size.
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
