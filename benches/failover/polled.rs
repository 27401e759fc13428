//! What the Redis, memcached and PostgreSQL sections share: hand-offs at a random phase of the
//! follower's poll, crash failover, and the idle request rate read from the server.

use std::future::Future;
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::{Campaign, Election, LeadershipEvent, Role};
use tokio::time::timeout;

use crate::common;

/// The election every round contends for.
const ELECTION: &str = "bench/polled";
/// Candidates that sit idle: one leader and nine followers, one backend (process) each.
const IDLE_CANDIDATES: usize = 10;
/// How long the idle request rate is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(10);

fn election<B: Backend>(backend: B, id: &str, ttl: Duration) -> Election<B> {
    Election::builder(backend, ELECTION)
        .candidate(id)
        .ttl(ttl)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .expect("valid settings")
}

async fn elected(campaign: &mut Campaign, limit: Duration) -> bool {
    let next = async {
        while let Some(event) = campaign.recv().await {
            if let LeadershipEvent::Elected(_) = event {
                return true;
            }
        }
        false
    };
    timeout(limit, next).await.unwrap_or(false)
}

/// Switchover rounds where followers poll: the target sees the escrow at its next poll.
pub const SWITCHOVER_POLLED_ROUNDS: usize = 40;

/// Two candidates on two backends (as two processes); the leader resigns at a random moment
/// of the follower's poll (uniform over `phase` after it reports it follows), and the time
/// until the follower reports `Elected` is recorded.
pub async fn handoff<B: Backend>(
    backends: [B; 2],
    ttl: Duration,
    rounds: usize,
    phase: Duration,
) -> Vec<Duration> {
    let [a, b] = backends;
    let mut a = election(a, "a", ttl).campaign();
    let mut b = election(b, "b", ttl).campaign();
    let mut a_leads = tokio::select! {
        true = elected(&mut a, ttl * 5) => true,
        true = elected(&mut b, ttl * 5) => false,
    };
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let (leader, follower) = match a_leads {
            true => (&mut a, &mut b),
            false => (&mut b, &mut a),
        };
        let mut status = follower.status();
        let _ = timeout(ttl * 5, status.wait_for(|s| s.role == Role::Follower)).await;
        tokio::time::sleep(phase.mul_f64(fastrand::f64())).await;
        let start = Instant::now();
        let handle = leader.handle();
        let resign = tokio::spawn(async move { handle.resign().await });
        if !elected(follower, ttl * 5).await {
            println!("  a round timed out");
            break;
        }
        samples.push(start.elapsed());
        let _ = resign.await;
        a_leads = !a_leads;
    }
    let _ = a.shutdown().await;
    let _ = b.shutdown().await;
    samples
}

/// The leader's runtime and connection are dropped (as on kill -9): the key expires after
/// the ttl, and a follower's poll finds it gone.
pub async fn crash<B, F, Fut>(connect: F, ttl: Duration, rounds: usize, what: &str, target: &str)
where
    B: Backend,
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = B>,
{
    let crashes = common::crash_rounds(connect, ttl, rounds, ttl * 4).await;
    common::print_latencies_against(
        &format!("failover after a crash ({what}; ttl {ttl:?})"),
        &crashes,
        target,
    );
}

/// One leader and nine followers, each on its own backend (process); `requests` reads the
/// server's count of requests so far. Prints requests per second per process.
pub async fn idle<B, F, Fut, R, RFut>(connect: F, ttl: Duration, requests: R, what: &str)
where
    B: Backend,
    F: Fn() -> Fut,
    Fut: Future<Output = B>,
    R: Fn() -> RFut,
    RFut: Future<Output = Option<u64>>,
{
    let mut members = Vec::with_capacity(IDLE_CANDIDATES);
    for i in 0..IDLE_CANDIDATES {
        members.push((connect().await, format!("idle-{i}")));
    }
    let campaigns = common::idle_election(members, ttl).await;
    // Past the first tries and settled into following.
    tokio::time::sleep(ttl).await;
    let before = requests().await;
    tokio::time::sleep(IDLE_WINDOW).await;
    let after = requests().await;
    common::stop_all(campaigns).await;
    let (Some(before), Some(after)) = (before, after) else {
        println!("idle: the server's counters could not be read");
        return;
    };
    let rate = after.saturating_sub(before) as f64 / IDLE_WINDOW.as_secs_f64();
    println!(
        "idle, 1 leader + 9 followers, {IDLE_CANDIDATES} backends (one per process), ttl \
         {ttl:?}, {what}: {rate:.1} requests/s at the server, {:.2}/s per process",
        rate / IDLE_CANDIDATES as f64,
    );
}
