//! Every metric named in `incumbent::metrics` is recorded, with its labels. A test binary of
//! its own: it installs the process-wide recorder.

#[cfg(feature = "etcd")]
mod support;

use std::sync::OnceLock;
use std::time::Duration;

use incumbent::memory::MemoryBackend;
use incumbent::{Election, LeadershipEvent, metrics as names};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

type Snapshot = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The process-wide recorder's snapshotter, installing the recorder on first use.
fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    })
}

/// Held by each test for its whole run: a snapshot drains what the others recorded.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One snapshot (taking it drains counters and histograms, so take one per check-point).
fn snapshot(snapshotter: &Snapshotter) -> Snapshot {
    snapshotter.snapshot().into_vec()
}

fn find<'a>(snapshot: &'a Snapshot, name: &str, labels: &[(&str, &str)]) -> Option<&'a DebugValue> {
    snapshot
        .iter()
        .find(|(key, _, _, _)| {
            key.key().name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.key().labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, _, _, value)| value)
}

/// `election` leads, after one term won with one attempt.
fn won_once(snap: &Snapshot, election: &str) {
    let who = [("election", election)];
    assert_eq!(
        find(snap, names::IS_LEADER, &who),
        Some(&DebugValue::Gauge(1.0.into()))
    );
    assert_eq!(
        find(snap, names::ELECTIONS_WON, &who),
        Some(&DebugValue::Counter(1))
    );
    assert_eq!(
        find(
            snap,
            names::CAMPAIGN_ATTEMPTS,
            &[("election", election), ("result", "won")]
        ),
        Some(&DebugValue::Counter(1))
    );
}

#[tokio::test(start_paused = true)]
async fn a_term_records_every_metric() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let snapshotter = recorder();
    // What the tests before this one recorded after their last snapshot goes.
    snapshot(snapshotter);

    let store = MemoryBackend::new();
    let mut campaign = Election::builder(store.clone(), "metered")
        .candidate("a")
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid")
        .campaign();
    while !matches!(campaign.recv().await, Some(LeadershipEvent::Elected(_))) {}
    tokio::time::sleep(Duration::from_secs(3)).await; // a few renewals

    let who = [("election", "metered")];
    let snap = snapshot(snapshotter);
    won_once(&snap, "metered");
    match find(
        &snap,
        names::RENEWALS,
        &[("backend", "memory"), ("result", "ok")],
    ) {
        Some(DebugValue::Counter(n)) => assert!(*n >= 2, "{n} renewals"),
        other => panic!("renewals: {other:?}"),
    }
    assert!(!renewal_session(&snap, "memory").is_empty());
    assert!(matches!(
        find(&snap, names::RENEW_LATENCY, &[("backend", "memory")]),
        Some(DebugValue::Histogram(h)) if !h.is_empty()
    ));
    assert!(matches!(
        find(&snap, names::TIME_TO_LEADER, &who),
        Some(DebugValue::Histogram(h)) if h.len() == 1
    ));

    campaign.resign().await.expect("resign");
    let snap = snapshot(snapshotter);
    assert_eq!(
        find(&snap, names::IS_LEADER, &who),
        Some(&DebugValue::Gauge(0.0.into()))
    );
    assert_eq!(
        find(
            &snap,
            names::DEMOTIONS,
            &[("election", "metered"), ("reason", "resigned")]
        ),
        Some(&DebugValue::Counter(1))
    );
    // No candidate label unless asked for: the default id holds the pid.
    assert!(
        snap.iter()
            .all(|(key, ..)| key.key().labels().all(|l| l.key() != "candidate")),
        "a candidate label by default"
    );

    // A follower exports 0 from the start, before it ever led.
    while !matches!(campaign.recv().await, Some(LeadershipEvent::Elected(_))) {}
    let mut follower = Election::builder(store.clone(), "metered")
        .candidate("b")
        .ttl(Duration::from_secs(3))
        .label_metrics_with_candidate(true)
        .build()
        .expect("valid")
        .campaign();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = [("election", "metered"), ("candidate", "b")];
    let snap = snapshot(snapshotter);
    assert_eq!(
        find(&snap, names::IS_LEADER, &b),
        Some(&DebugValue::Gauge(0.0.into())),
        "a follower that never led exports 0, with its candidate label when asked"
    );

    // Time to leader is the failover time, not the wait behind a healthy leader: b followed
    // for 10 s, then took over at a resign. The lock was free for milliseconds (the lower
    // bound); the upper bound adds the ttl, since b cannot tell a release from an expiry.
    tokio::time::sleep(Duration::from_secs(10)).await;
    campaign.shutdown().await.expect("shutdown");
    let term = loop {
        if let Some(LeadershipEvent::Elected(term)) = follower.recv().await {
            break term;
        }
    };
    let gap = term.gap();
    assert!(!gap.exact, "{gap:?}");
    assert!(gap.lock_free < Duration::from_secs(1), "{gap:?}");
    assert_eq!(gap.without_leader, gap.lock_free + Duration::from_secs(3));
    let snap = snapshot(snapshotter);
    for (name, figure) in [
        (names::TIME_TO_LEADER, gap.without_leader),
        (names::LOCK_FREE_TO_LEADER, gap.lock_free),
    ] {
        match find(&snap, name, &b) {
            Some(DebugValue::Histogram(h)) => {
                assert_eq!(h.len(), 1, "{name}");
                assert_eq!(h[0].into_inner(), figure.as_secs_f64(), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// A set's members record the per-election metrics a campaign does, from their first win;
/// so does each shard of a sharded election, whose members are a set's.
#[tokio::test(start_paused = true)]
async fn a_sets_members_and_a_groups_shards_record_the_election_metrics() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let snapshotter = recorder();
    snapshot(snapshotter);
    let store = MemoryBackend::new();
    let set = Election::builder(store.clone(), "metered-set")
        .candidate("a")
        .build()
        .expect("valid")
        .set();
    let mut events = set.events();
    set.join("metered-set/acme").expect("valid");
    while !matches!(
        events.recv().await.map(|e| e.event),
        Some(LeadershipEvent::Elected(_))
    ) {}
    let who = [("election", "metered-set/acme")];
    let snap = snapshot(snapshotter);
    won_once(&snap, "metered-set/acme");
    for name in [names::TIME_TO_LEADER, names::LOCK_FREE_TO_LEADER] {
        assert!(
            matches!(find(&snap, name, &who), Some(DebugValue::Histogram(h)) if h.len() == 1),
            "{name}"
        );
    }
    set.resign("metered-set/acme").await.expect("resigned");
    let snap = snapshot(snapshotter);
    assert_eq!(
        find(&snap, names::IS_LEADER, &who),
        Some(&DebugValue::Gauge(0.0.into())),
        "0 the instant the term ended"
    );
    assert_eq!(
        find(
            &snap,
            names::DEMOTIONS,
            &[("election", "metered-set/acme"), ("reason", "resigned")]
        ),
        Some(&DebugValue::Counter(1))
    );
    set.shutdown().await.expect("stops");

    let group = incumbent::ShardedElection::builder(store.clone(), "metered-group", 2)
        .candidate("a")
        .build()
        .expect("valid")
        .start(|_, term| async move { term.cancelled().await });
    let mut status = group.status();
    status
        .wait_for(|s| s.owned().len() == 2)
        .await
        .expect("both shards led");
    let snap = snapshot(snapshotter);
    for k in 0..2 {
        let shard = format!("metered-group/{k}");
        assert_eq!(
            find(&snap, names::IS_LEADER, &[("election", shard.as_str())]),
            Some(&DebugValue::Gauge(1.0.into())),
            "{shard}"
        );
    }
    group.shutdown().await.expect("stops");
    let snap = snapshot(snapshotter);
    assert_eq!(
        find(&snap, names::IS_LEADER, &[("election", "metered-group/0")]),
        Some(&DebugValue::Gauge(0.0.into()))
    );
    assert_eq!(
        find(
            &snap,
            names::DEMOTIONS,
            &[("election", "metered-group/1"), ("reason", "shutdown")]
        ),
        Some(&DebugValue::Counter(1))
    );
}

/// After the leader's crash (here: cut off from the store, so it never renews again), the
/// failover time is the gap a user sees, from the crash to the next leader, to within one
/// renewal interval: not the milliseconds from the store freeing the lock to the win.
#[tokio::test(start_paused = true)]
async fn after_a_crash_time_to_leader_counts_from_the_last_renewal() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let store = MemoryBackend::new();
    let ttl = Duration::from_secs(6);
    let election = |client: MemoryBackend, id: &str| {
        Election::builder(client, "crashed")
            .candidate(id)
            .ttl(ttl)
            .build()
            .expect("valid")
    };
    let a_client = store.client();
    let mut a = election(a_client.clone(), "a").campaign();
    while !matches!(a.recv().await, Some(LeadershipEvent::Elected(_))) {}
    let mut b = election(store.client(), "b").campaign();
    tokio::time::sleep(Duration::from_secs(20)).await;

    let crashed = tokio::time::Instant::now();
    a_client.set_reachability(incumbent::memory::Reachability::Hanging);
    let term = loop {
        if let Some(LeadershipEvent::Elected(term)) = b.recv().await {
            break term;
        }
    };
    let real = crashed.elapsed();
    let gap = term.gap();
    let renew_interval = ttl / 3;
    assert!(!gap.exact, "{gap:?}");
    assert!(
        gap.lock_free < Duration::from_secs(1),
        "b won at once after the lock was freed: {gap:?}"
    );
    assert!(
        gap.without_leader >= real && gap.without_leader <= real + renew_interval,
        "without a leader for {real:?} since the crash, reported {gap:?}"
    );

    // b resigns and wins again alone: its own term's end is known, so the gap is exact.
    drop(a);
    b.resign().await.expect("resign");
    let again = loop {
        if let Some(LeadershipEvent::Elected(term)) = b.recv().await {
            break term;
        }
    };
    assert!(again.gap().exact, "{:?}", again.gap());
    assert_eq!(again.gap().without_leader, again.gap().lock_free);
}

/// The `session` label of a snapshot's renewal series for `backend` that recorded since the
/// last snapshot (an earlier test's sessions stay registered, at 0), checking they all carry
/// the same one.
fn renewal_session(snap: &Snapshot, backend: &str) -> String {
    let sessions: std::collections::BTreeSet<String> = snap
        .iter()
        .filter(|(key, _, _, value)| {
            let recorded = match value {
                DebugValue::Counter(n) => *n > 0,
                DebugValue::Histogram(h) => !h.is_empty(),
                DebugValue::Gauge(_) => true,
            };
            recorded
                && [names::RENEWALS, names::RENEW_LATENCY].contains(&key.key().name())
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "backend" && l.value() == backend)
        })
        .map(|(key, ..)| {
            key.key()
                .labels()
                .find(|l| l.key() == "session")
                .map(|l| l.value().to_owned())
                .unwrap_or_else(|| panic!("a renewal series without a session: {key:?}"))
        })
        .collect();
    assert_eq!(
        sessions.len(),
        1,
        "one session, one label value: {sessions:?}"
    );
    sessions.into_iter().next().expect("one")
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn renewals_carry_the_session_the_store_knows() {
    use incumbent::etcd::EtcdBackend;

    let _alone = ONE_AT_A_TIME.lock().await;
    let snapshotter = recorder();
    // What the tests before this one recorded after their last snapshot goes.
    snapshot(snapshotter);
    let etcd = support::EtcdServer::single().await;
    let backend = EtcdBackend::connect(etcd.endpoints())
        .await
        .expect("connect");
    let mut campaign = Election::builder(backend.clone(), "metered-etcd")
        .candidate("a")
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid")
        .campaign();
    support::events::elected(&mut campaign, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(2500)).await; // two renewals, at a third of the ttl

    let snap = snapshot(snapshotter);
    let session = renewal_session(&snap, "etcd");
    match find(
        &snap,
        names::RENEWALS,
        &[("backend", "etcd"), ("session", &session), ("result", "ok")],
    ) {
        Some(DebugValue::Counter(n)) => assert!(*n >= 1, "{n} renewals"),
        other => panic!("renewals: {other:?}"),
    }
    assert_eq!(
        find(
            &snap,
            names::RENEWALS,
            &[
                ("backend", "etcd"),
                ("session", &session),
                ("result", "error")
            ]
        ),
        Some(&DebugValue::Counter(0)),
        "the failure series exist at 0, so a rate of failures is 0 rather than absent"
    );

    // The label is the lease that holds the leader's key, as etcdctl prints it.
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .expect("an operator's client");
    let options = etcd_client::GetOptions::new().with_prefix();
    let keys = client
        .get(backend.election_range("metered-etcd"), Some(options))
        .await
        .expect("read the election")
        .take_kvs();
    assert_eq!(keys.len(), 1, "one candidate");
    assert_eq!(session, format!("{:x}", keys[0].lease()));
    campaign.shutdown().await.expect("shutdown");
}
