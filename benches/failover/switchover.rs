//! Planned switchover: the gap from the old leader's work stopping to the target's first
//! instruction, and the fallback when the target is dead.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::{Campaign, Election, LeadershipEvent, Role};
use tokio::time::timeout;

use crate::common;

const ELECTION: &str = "bench/switchover";

fn election<B: Backend>(backend: B, id: &str, ttl: Duration, window: Duration) -> Election<B> {
    Election::builder(backend, ELECTION)
        .candidate(id)
        .ttl(ttl)
        .hand_over_window(window)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .expect("valid settings")
}

/// When each term's work stopped, by fencing token: every campaign records its terms' ends.
type Stopped = Arc<Mutex<Vec<(u64, Instant)>>>;

/// Forwards a campaign's events, and for each term holds it until it is cancelled, then
/// records that instant as the work's exit.
fn watch(
    mut campaign: Campaign,
    stopped: Stopped,
) -> tokio::sync::mpsc::UnboundedReceiver<(u64, Instant)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(event) = campaign.recv().await {
            if let LeadershipEvent::Elected(term) = event {
                let _ = tx.send((term.fencing_token(), Instant::now()));
                let stopped = stopped.clone();
                let guard = term.hold();
                tokio::spawn(async move {
                    term.cancelled().await;
                    stopped
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((term.fencing_token(), Instant::now()));
                    drop(guard);
                });
            }
        }
    });
    rx
}

/// The hand-over window of the rounds: long enough for a polling target to take office, short
/// enough that a candidate kept out by a gate (the file backend) is back in the next round.
pub const WINDOW: Duration = Duration::from_millis(500);

/// Three candidates; the leader hands over to the next one, round after round. Returns the
/// gaps from the old work's exit to the target's election (its first instruction), and the
/// whole calls.
pub async fn rounds<B: Backend>(
    members: Vec<B>,
    ttl: Duration,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let stopped: Stopped = Arc::default();
    let ids = ["a", "b", "c"];
    let mut handles = Vec::new();
    let mut elected = Vec::new();
    for (backend, id) in members.into_iter().zip(ids) {
        let campaign = election(backend, id, ttl, WINDOW).campaign();
        handles.push(campaign.handle());
        elected.push(watch(campaign, stopped.clone()));
    }
    // Who leads first.
    let mut leader = None;
    let deadline = Instant::now() + ttl * 5;
    while leader.is_none() && Instant::now() < deadline {
        leader = handles.iter().position(|h| h.status().borrow().is_leader());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Some(mut leader) = leader else {
        println!("  nobody was elected");
        return (Vec::new(), Vec::new());
    };
    for rx in &mut elected {
        while rx.try_recv().is_ok() {}
    }
    let (mut gaps, mut calls) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let target = (leader + 1 + round % 2) % 3;
        for (i, h) in handles.iter().enumerate() {
            if i != leader {
                let mut status = h.status();
                let _ = timeout(ttl * 5, status.wait_for(|s| s.role == Role::Follower)).await;
            }
        }
        let asked = Instant::now();
        let done = handles[leader].hand_over(ids[target]).await;
        let call = asked.elapsed();
        let Ok(done) = done else {
            println!("  round {round}: {done:?}");
            break;
        };
        let Ok(Some((token, at))) = timeout(ttl, elected[target].recv()).await else {
            println!("  round {round}: the target's election was not seen");
            break;
        };
        debug_assert_eq!(done.fencing_token.unwrap_or(token), token);
        let exit = stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(t, _)| *t < token)
            .map(|(_, at)| *at)
            .max();
        if let Some(exit) = exit {
            gaps.push(at.saturating_duration_since(exit));
        }
        calls.push(call);
        leader = target;
    }
    for h in &handles {
        let _ = h.shutdown().await;
    }
    (gaps, calls)
}

/// The target dies (its runtime is dropped, nothing released) right before a hand-over to
/// it: time from the hand-over call until another candidate leads (the window, plus the
/// store's ttl where the dead target's key can lead first).
pub async fn dead_target<B, F, Fut>(
    connect: F,
    ttl: Duration,
    window: Duration,
    rounds: usize,
) -> Vec<Duration>
where
    B: Backend,
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = B>,
{
    let mut samples = Vec::new();
    for round in 0..rounds {
        let name_a = format!("a{round}");
        let mut a = election(connect().await, &name_a, ttl, window).campaign();
        let Ok(Some(LeadershipEvent::Elected(first))) = timeout(ttl * 5, a.recv()).await else {
            println!("  round {round}: a was not elected");
            continue;
        };
        let mut b = election(connect().await, &format!("b{round}"), ttl, window).campaign();
        let (ready_tx, ready) = tokio::sync::oneshot::channel::<()>();
        let (crash_tx, crash) = std::sync::mpsc::channel::<()>();
        let target = format!("t{round}");
        let (target_connect, target_id) = (connect.clone(), target.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let c = election(target_connect().await, &target_id, ttl, window).campaign();
                let mut status = c.status();
                let _ = timeout(ttl * 5, status.wait_for(|s| s.role == Role::Follower)).await;
                let _ = ready_tx.send(());
                let _ = tokio::task::spawn_blocking(move || crash.recv()).await;
                std::mem::forget(c);
            });
            drop(runtime);
        });
        let _ = ready.await;
        let mut status = b.status();
        let _ = timeout(ttl * 5, status.wait_for(|s| s.role == Role::Follower)).await;
        drop(crash_tx);
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        let asked = Instant::now();
        match a.hand_over(target.clone()).await {
            Ok(_) => println!("  round {round}: the dead target took office?"),
            Err(incumbent::Error::HandOver(incumbent::HandOverError::NotACandidate { .. })) => {
                println!(
                    "  round {round}: refused: the store dropped the dead target's records at once"
                );
                let _ = a.shutdown().await;
                let _ = b.shutdown().await;
                continue;
            }
            Err(_) => {}
        }
        let next = async {
            loop {
                let event = tokio::select! {
                    event = a.recv() => event,
                    event = b.recv() => event,
                };
                match event {
                    Some(LeadershipEvent::Elected(t)) => return t,
                    Some(_) => {}
                    // A campaign that stopped: the timeout ends the wait.
                    None => std::future::pending::<()>().await,
                }
            }
        };
        match timeout(window + ttl * 4, next).await {
            Ok(term) if term.fencing_token() > first.fencing_token() => {
                samples.push(asked.elapsed())
            }
            _ => println!("  round {round}: nobody led after the lapse"),
        }
        let _ = a.shutdown().await;
        let _ = b.shutdown().await;
    }
    samples
}

/// Prints both figures for one store.
pub fn print(
    store: &str,
    gaps: &[Duration],
    calls: &[Duration],
    fallback: &[Duration],
    window: Duration,
) {
    common::print_latencies_against(
        &format!("switchover on {store}: old work's exit to the target's election"),
        gaps,
        "median <= 5 ms (etcd)",
    );
    common::print_latencies(&format!("  the whole hand_over call on {store}"), calls);
    common::print_latencies(
        &format!("  a dead target: the call until another leads (window {window:?})"),
        fallback,
    );
}
