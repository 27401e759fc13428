//! Two nodes share 1,000 partitions through `ElectionSet`s: each partition is an election of
//! its own, and each node's set campaigns in all of them on one session, driven by one task.
//! Node A starts first and leads them all; node B follows; A shuts down and B takes every
//! partition over, each term with a greater fencing token.
//!
//! ```text
//! cargo run --example partitions
//! ```
//!
//! No server is needed: both nodes are in this process, on the in-process memory store (two
//! clients of it). On etcd, swap the backend: `incumbent::etcd::EtcdBackend::connect(..)`.
//! The program exits by itself in a second or two.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use incumbent::memory::MemoryBackend;
use incumbent::{Election, ElectionSet, LeadershipEvent, Term};
use tokio::time::{sleep, timeout};

const PARTITIONS: usize = 1000;

fn node(store: &MemoryBackend, id: &str) -> incumbent::Result<ElectionSet> {
    let set = Election::builder(store.client(), "partitions")
        .candidate(id)
        .ttl(Duration::from_secs(3))
        .build()?
        .set();
    for p in 0..PARTITIONS {
        set.join(&format!("partitions/{p}"))?;
    }
    Ok(set)
}

/// One partition's work while its term lasts: stamped with the term's token, holding the
/// term's guard (the lock is released only once it is dropped), stopped at `must_stop`.
async fn own(term: Term) {
    let _guard = term.hold();
    tokio::select! {
        () = term.cancelled() => {}   // the term ended: stop now
        () = term.must_stop() => {}   // never later than this
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryBackend::new();
    let started = Instant::now();
    let a = node(&store, "node-a")?;
    until(|| a.leading() == PARTITIONS, "node-a leads every partition").await?;
    println!(
        "{:>6.0} ms  node-a leads {} partitions",
        ms(started),
        a.leading()
    );

    let b = node(&store, "node-b")?;
    let mut b_events = b.events();
    until(
        || b.leader("partitions/7").is_some(),
        "node-b sees who leads",
    )
    .await?;
    let first_token = a.term("partitions/7").map(|t| t.fencing_token());
    println!(
        "{:>6.0} ms  node-b follows: partitions/7 is led by {} (token {first_token:?})",
        ms(started),
        b.leader("partitions/7")
            .map(|l| l.candidate.id.clone())
            .unwrap_or_default(),
    );

    let stopping = Instant::now();
    a.shutdown().await?; // every term ends, every lock is released
    let mut tokens = HashMap::new();
    timeout(Duration::from_secs(10), async {
        while tokens.len() < PARTITIONS {
            let Some(e) = b_events.recv().await else {
                break;
            };
            if let LeadershipEvent::Elected(term) = e.event {
                tokens.insert(e.election, term.fencing_token());
                tokio::spawn(own(term));
            }
        }
    })
    .await?;
    println!(
        "{:>6.0} ms  node-a shut down; node-b took {} partitions over in {:.0} ms (partitions/7: token {:?})",
        ms(started),
        tokens.len(),
        ms(stopping),
        tokens.get("partitions/7"),
    );
    b.shutdown().await?;
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

async fn until(done: impl Fn() -> bool, what: &str) -> Result<(), String> {
    timeout(Duration::from_secs(10), async {
        while !done() {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .map_err(|_| format!("{what}: not within 10 s"))
}
