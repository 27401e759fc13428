//! On Consul the term's start is written by the request that makes a candidate leader: an
//! observer never sees a leader's `since` earlier than the moment its term could begin (the
//! previous leader's release), nor later than the term's start the new leader reports, and
//! never a correction of it during the term.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::ConsulDev;
use crate::support::events::elected;
use incumbent::backend::{Backend, Leader, Observer};
use incumbent::consul::{ConsulBackend, ConsulConfig};
use incumbent::{Campaign, Election, Role};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout};

const ELECTION: &str = "since/handoff";
const PATIENCE: Duration = Duration::from_secs(10);
/// How long the follower campaigns before it can win: a `since` stamped when it began
/// campaigning would be at least this much too early.
const FOLLOWING: Duration = Duration::from_millis(1500);

fn backend(url: &str) -> ConsulBackend {
    ConsulBackend::builder(ConsulConfig::new(url))
        .build()
        .expect("valid backend settings")
}

fn campaign(url: &str, id: &str) -> Campaign {
    Election::builder(backend(url), ELECTION)
        .candidate(id)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid election settings")
        .campaign()
}

fn unix_ms(at: SystemTime) -> u64 {
    let ms = at
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    u64::try_from(ms).expect("in range")
}

/// Every leader the observer reports, in order.
fn observe(url: &str) -> mpsc::UnboundedReceiver<Leader> {
    let backend = backend(url);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut observer = backend.observe(ELECTION).await.expect("observer");
        while let Ok(next) = observer.next().await {
            if let Some(leader) = next
                && tx.send(leader).is_err()
            {
                return;
            }
        }
    });
    rx
}

async fn follows(campaign: &Campaign) {
    let mut status = campaign.status();
    timeout(PATIENCE, status.wait_for(|s| s.role == Role::Follower))
        .await
        .expect("following in time")
        .expect("campaign running");
}

#[tokio::test]
async fn an_observer_never_sees_a_since_earlier_than_the_terms_start() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let mut seen = observe(&url);
    let mut leader = campaign(&url, "c0");
    let mut term = elected(&mut leader, PATIENCE).await;
    // The earliest instant each candidate's term could begin: the previous release.
    let mut could_begin = vec![(
        String::from("c0"),
        SystemTime::UNIX_EPOCH,
        term.started_at(),
    )];
    for round in 1..=3 {
        let id = format!("c{round}");
        let mut next = campaign(&url, &id);
        follows(&next).await;
        sleep(FOLLOWING).await;
        let released_after = SystemTime::now();
        leader.resign().await.expect("resign");
        term = elected(&mut next, PATIENCE).await;
        could_begin.push((id, released_after, term.started_at()));
        leader.shutdown().await.expect("shutdown");
        leader = next;
    }
    sleep(Duration::from_millis(300)).await; // the observer's last report
    leader.shutdown().await.expect("shutdown");

    let mut sightings = Vec::new();
    while let Ok(leader) = seen.try_recv() {
        sightings.push(leader);
    }
    for (id, earliest, started) in &could_begin {
        let since: Vec<Option<u64>> = sightings
            .iter()
            .filter(|l| l.candidate.id == *id)
            .map(|l| l.since_unix_ms)
            .collect();
        assert!(
            !since.is_empty(),
            "the observer never saw {id}: {sightings:?}"
        );
        let first = since[0].unwrap_or_else(|| panic!("{id} seen without a since"));
        assert!(
            since.iter().all(|s| *s == Some(first)),
            "{id}'s since changed during its term: {since:?}"
        );
        assert!(
            first >= unix_ms(*earliest),
            "{id}'s since is {} ms before its predecessor released",
            unix_ms(*earliest) - first
        );
        // The key is written before the campaign learns it won: never later than its term.
        assert!(
            first <= unix_ms(*started),
            "{id}'s since is {} ms after its term's start",
            first - unix_ms(*started)
        );
    }
}
