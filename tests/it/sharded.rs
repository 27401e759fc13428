//! Sharded elections on the memory backend, under paused time: members join and leave (and
//! one is cut off from the store), the map stays balanced, moves stay few, and a ledger of
//! every shard's terms shows no two owners at once and tokens that only grow. The same on
//! real stores, with separate processes, kill -9 and SIGSTOP: `tools/tests/sharded.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use incumbent::memory::{MemoryBackend, Reachability};
use incumbent::sharded::{ShardEvent, ShardedRunner};
use incumbent::{DemotionReason, Error, ShardedElection};
use tokio::time::{Instant, timeout};

const TTL: Duration = Duration::from_secs(3);
const SHARDS: u32 = 64;

/// One term of one shard: `(shard, token, member, start, end)`.
type TermRow = (u32, u64, String, Instant, Option<Instant>);

/// Every term of every shard.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<Vec<TermRow>>>);

struct Entry(Ledger, usize);

impl Drop for Entry {
    fn drop(&mut self) {
        self.0.0.lock().unwrap()[self.1].4 = Some(Instant::now());
    }
}

impl Ledger {
    fn start(&self, shard: u32, token: u64, member: &str) -> Entry {
        let mut terms = self.0.lock().unwrap();
        terms.push((shard, token, member.to_owned(), Instant::now(), None));
        Entry(self.clone(), terms.len() - 1)
    }

    /// No shard had two terms at once; each shard's tokens grew with its terms.
    fn check(&self) {
        let terms = self.0.lock().unwrap();
        let mut by_shard: BTreeMap<u32, Vec<_>> = BTreeMap::new();
        for t in terms.iter() {
            by_shard.entry(t.0).or_default().push(t.clone());
        }
        for (shard, mut terms) in by_shard {
            terms.sort_by_key(|t| (t.3, t.1));
            for pair in terms.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                let a_end = a.4.expect("a term that another followed has ended");
                assert!(
                    a_end <= b.3,
                    "shard {shard}: {} (token {}) until {a_end:?} overlaps {} (token {}) from {:?}",
                    a.2,
                    a.1,
                    b.2,
                    b.1,
                    b.3
                );
                assert!(b.1 > a.1, "shard {shard}: token {} after {}", b.1, a.1);
            }
        }
    }
}

fn member(backend: &MemoryBackend, id: &str, ledger: &Ledger) -> ShardedRunner {
    let group = ShardedElection::builder(backend.clone(), "jobs", SHARDS)
        .candidate(id)
        .ttl(TTL)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .grace(Duration::from_millis(500))
        .build()
        .expect("valid settings");
    let ledger = ledger.clone();
    let id = id.to_owned();
    group.start(move |shard, term| {
        let entry = ledger.start(shard, term.fencing_token(), &id);
        async move {
            term.cancelled().await;
            drop(entry);
        }
    })
}

/// Who owns each shard, once every shard has exactly one owner and the owners are balanced
/// (within one of `SHARDS / members`); panics after `limit`.
async fn settled(members: &[(&str, &ShardedRunner)], limit: Duration) -> BTreeMap<u32, String> {
    let deadline = Instant::now() + limit;
    loop {
        let mut owners: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        let mut counts = Vec::new();
        for (id, runner) in members {
            let owned = runner.status().borrow().owned();
            counts.push(owned.len());
            for k in owned {
                owners.entry(k).or_default().push((*id).to_owned());
            }
        }
        let per = SHARDS as usize / members.len();
        let balanced = counts.iter().all(|&c| c == per || c == per + 1);
        if owners.len() == SHARDS as usize && owners.values().all(|o| o.len() == 1) && balanced {
            return owners.into_iter().map(|(k, o)| (k, o[0].clone())).collect();
        }
        assert!(
            Instant::now() < deadline,
            "not settled after {limit:?}: owned {counts:?}, {} shards owned",
            owners.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn moves(before: &BTreeMap<u32, String>, after: &BTreeMap<u32, String>) -> usize {
    (0..SHARDS)
        .filter(|k| before.get(k) != after.get(k))
        .count()
}

#[tokio::test(start_paused = true)]
async fn shards_spread_over_three_then_four_then_two_members_and_never_have_two_owners() {
    let store = MemoryBackend::new();
    let ledger = Ledger::default();
    let clients: Vec<MemoryBackend> = (0..4).map(|_| store.client()).collect();
    let a = member(&clients[0], "a", &ledger);
    let b = member(&clients[1], "b", &ledger);
    let c = member(&clients[2], "c", &ledger);
    let three = settled(&[("a", &a), ("b", &b), ("c", &c)], TTL * 2).await;
    // One session per process, whatever the number of shards: the member slot and every
    // shard's campaign share it.
    assert_eq!(store.session_count(), 3, "one session per member");

    // A join moves only what the newcomer gets: 16 of 64, at most ⌈64/3⌉.
    let d = member(&clients[3], "d", &ledger);
    let four = settled(&[("a", &a), ("b", &b), ("c", &c), ("d", &d)], TTL * 2).await;
    let joined = moves(&three, &four);
    assert!(joined <= 22, "{joined} moves on a join");
    assert_eq!(four.values().filter(|o| *o == "d").count(), 16);

    // A graceful leave moves only the leaver's shards.
    c.shutdown().await.expect("c leaves");
    let three_again = settled(&[("a", &a), ("b", &b), ("d", &d)], TTL * 2).await;
    let left = moves(&four, &three_again);
    assert_eq!(left, 16, "the leaver's 16 shards move, nothing else");

    // A member cut off from the store: its terms end by the renew deadline, and the others
    // take its shards once the store expires its session.
    clients[3].set_reachability(Reachability::Hanging);
    let two = settled(&[("a", &a), ("b", &b)], TTL * 4).await;
    let cut = moves(&three_again, &two);
    assert!(cut <= 32, "{cut} moves when one of three is cut off");
    assert!(
        d.status().borrow().owned().is_empty(),
        "the cut-off member's terms ended"
    );

    clients[3].set_reachability(Reachability::Reachable);
    let three_last = settled(&[("a", &a), ("b", &b), ("d", &d)], TTL * 4).await;
    assert!(moves(&two, &three_last) <= 32);

    for runner in [a, b, d] {
        runner.shutdown().await.expect("shutdown");
    }
    ledger.check();
    let terms = ledger.0.lock().unwrap().len();
    assert!(terms >= 64 + 16 + 16, "{terms} terms in the ledger");
    assert!(
        ledger.0.lock().unwrap().iter().all(|t| t.4.is_some()),
        "every worker stopped"
    );
}

/// A member's leave starts at `shutdown()`, not when its future is first polled: every
/// shard's term ends before the future is awaited; the future returns once every shard's lock
/// and the member's slot are released.
#[tokio::test(start_paused = true)]
async fn a_members_leave_starts_when_shutdown_is_called() {
    let store = MemoryBackend::new();
    let ledger = Ledger::default();
    let a = member(&store, "a", &ledger);
    settled(&[("a", &a)], TTL * 4).await;
    let leaving = a.shutdown();
    let deadline = Instant::now() + TTL;
    while ledger.0.lock().unwrap().iter().any(|t| t.4.is_none()) {
        assert!(
            Instant::now() < deadline,
            "a shard's term went on while the leave waited to be polled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    timeout(TTL, leaving)
        .await
        .expect("the member leaves")
        .expect("shutdown");
    for k in 0..SHARDS {
        assert_eq!(store.holder(&format!("jobs/{k}")), None, "shard {k}");
    }
    assert_eq!(store.session_count(), 0, "the member's sessions are closed");
    ledger.check();
}

#[tokio::test(start_paused = true)]
async fn a_shards_demotion_is_told_before_its_worker_has_stopped() {
    let store = MemoryBackend::new();
    // Each worker takes 400 ms to wind down after its term ends (the grace is 500 ms).
    let stopped: Arc<Mutex<BTreeSet<u32>>> = Arc::default();
    let a = {
        let stopped = stopped.clone();
        ShardedElection::builder(store.client(), "jobs", SHARDS)
            .candidate("a")
            .ttl(TTL)
            .backoff(Duration::from_millis(100), Duration::from_secs(1))
            .grace(Duration::from_millis(500))
            .build()
            .expect("valid settings")
            .start(move |shard, term| {
                let stopped = stopped.clone();
                async move {
                    term.cancelled().await;
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    stopped.lock().unwrap().insert(shard);
                }
            })
    };
    let mut events = a.subscribe();
    let mut elected = 0;
    while elected < SHARDS {
        if let ShardEvent::Elected { .. } = timeout(TTL, events.recv())
            .await
            .expect("an event")
            .expect("open")
        {
            elected += 1;
        }
    }
    // b takes half of a's shards: each demotion reaches a's subscribers as its term ends,
    // while its worker still winds down, not once the worker has stopped.
    let b = member(&store.client(), "b", &Ledger::default());
    let mut demoted = 0;
    while demoted < SHARDS / 2 {
        if let ShardEvent::Demoted { shard, .. } = timeout(TTL, events.recv())
            .await
            .expect("an event")
            .expect("open")
        {
            assert!(
                !stopped.lock().unwrap().contains(&shard),
                "shard {shard}: its demotion was told only after its worker stopped"
            );
            demoted += 1;
        }
    }
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

#[tokio::test(start_paused = true)]
async fn events_say_which_shard_was_elected_and_why_it_was_demoted() {
    let store = MemoryBackend::new();
    let ledger = Ledger::default();
    let a = member(&store.client(), "a", &ledger);
    let mut events = a.subscribe();
    let mut elected = BTreeSet::new();
    while elected.len() < SHARDS as usize {
        match timeout(TTL, events.recv())
            .await
            .expect("an event")
            .expect("open")
        {
            ShardEvent::Elected { shard, term } => {
                assert!(term.election().ends_with(&format!("/{shard}")));
                elected.insert(shard);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // A second member takes half: a's shards move with reason `shutdown`.
    let b = member(&store.client(), "b", &ledger);
    let mut moved = BTreeSet::new();
    while moved.len() < SHARDS as usize / 2 {
        match timeout(TTL, events.recv())
            .await
            .expect("an event")
            .expect("open")
        {
            ShardEvent::Demoted { shard, reason, .. } => {
                assert_eq!(reason, DemotionReason::Shutdown);
                moved.insert(shard);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    settled(&[("a", &a), ("b", &b)], TTL).await;
    let status = a.status().borrow().clone();
    assert_eq!(status.members.len(), 2);
    assert_eq!(status.assigned, status.owned());
    assert!(status.problem.is_none(), "{:?}", status.problem);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
    ledger.check();
}

#[tokio::test(start_paused = true)]
async fn a_member_without_a_free_slot_says_so_and_takes_nothing() {
    let store = MemoryBackend::new();
    let build = |id: &str| {
        ShardedElection::builder(store.client(), "jobs", 8)
            .candidate(id)
            .ttl(TTL)
            .max_members(1)
            .build()
            .expect("valid settings")
    };
    let a = build("a").start(|_, term| async move { term.cancelled().await });
    let mut status = a.status();
    timeout(TTL, status.wait_for(|s| s.owned().len() == 8))
        .await
        .expect("a owns every shard")
        .expect("running");
    let b = build("b").start(|_, term| async move { term.cancelled().await });
    let mut b_status = b.status();
    let problem = timeout(TTL, b_status.wait_for(|s| s.problem.is_some()))
        .await
        .expect("b says why")
        .expect("running")
        .problem
        .clone()
        .unwrap();
    assert!(problem.contains("raise max_members"), "{problem}");
    assert!(b.status().borrow().owned().is_empty());
    assert_eq!(a.status().borrow().owned().len(), 8);
    b.shutdown().await.expect("shutdown");
    a.shutdown().await.expect("shutdown");
}

#[tokio::test(start_paused = true)]
async fn a_member_built_with_another_shard_count_is_left_out() {
    let store = MemoryBackend::new();
    let a = ShardedElection::builder(store.client(), "jobs", 8)
        .candidate("a")
        .ttl(TTL)
        .build()
        .expect("valid")
        .start(|_, term| async move { term.cancelled().await });
    let b = ShardedElection::builder(store.client(), "jobs", 16)
        .candidate("b")
        .ttl(TTL)
        .build()
        .expect("valid")
        .start(|_, term| async move { term.cancelled().await });
    let mut status = a.status();
    let seen = timeout(TTL, status.wait_for(|s| s.problem.is_some()))
        .await
        .expect("a says why")
        .expect("running")
        .clone();
    assert!(
        seen.problem
            .as_deref()
            .unwrap()
            .contains("another number of shards"),
        "{:?}",
        seen.problem
    );
    timeout(TTL, status.wait_for(|s| s.owned().len() == 8))
        .await
        .expect("a keeps every shard of its own count")
        .expect("running");
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

#[test]
fn settings_out_of_range_are_typed_errors() {
    let store = MemoryBackend::new();
    let err = ShardedElection::builder(store.clone(), "jobs", 0)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidSharding { .. }), "{err}");
    assert!(err.to_string().contains("use 1 to 65536"), "{err}");
    let err = ShardedElection::builder(store.clone(), "jobs", 8)
        .weight(0)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidSharding { .. }), "{err}");
    let err = ShardedElection::builder(store.clone(), "jobs", 8)
        .max_members(5000)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidSharding { .. }), "{err}");
    let err = ShardedElection::builder(store.clone(), "jobs/", 8)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidElectionName { .. }), "{err}");
    let err = ShardedElection::builder(store, "x".repeat(120), 8)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidElectionName { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn weights_share_the_shards_in_proportion() {
    let store = MemoryBackend::new();
    let start = |id: &str, weight: u32| {
        ShardedElection::builder(store.client(), "jobs", SHARDS)
            .candidate(id)
            .ttl(TTL)
            .weight(weight)
            .build()
            .expect("valid")
            .start(|_, term| async move { term.cancelled().await })
    };
    let (a, b, c) = (start("a", 2), start("b", 1), start("c", 1));
    let deadline = Instant::now() + TTL * 2;
    loop {
        let counts: Vec<usize> = [&a, &b, &c]
            .iter()
            .map(|r| r.status().borrow().owned().len())
            .collect();
        if counts == [32, 16, 16] {
            break;
        }
        assert!(Instant::now() < deadline, "owned {counts:?}, not 32/16/16");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = a.status().borrow().members.clone();
    assert_eq!(
        seen.iter()
            .map(|m| (m.id.as_str(), m.weight))
            .collect::<Vec<_>>(),
        [("a", 2), ("b", 1), ("c", 1)]
    );
    for runner in [a, b, c] {
        runner.shutdown().await.expect("shutdown");
    }
}

/// Records when it is dropped: when a worker's future went, whether it returned or was
/// stopped.
struct Dropped(u32, Arc<Mutex<BTreeMap<u32, Instant>>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.1.lock().unwrap().insert(self.0, Instant::now());
    }
}

/// A member whose workers never look at their terms: each records in `dropped` when it was
/// dropped (stopped).
fn stuck_member(
    backend: &MemoryBackend,
    id: &str,
    grace: Duration,
    dropped: &Arc<Mutex<BTreeMap<u32, Instant>>>,
) -> ShardedRunner {
    let dropped = dropped.clone();
    ShardedElection::builder(backend.clone(), "jobs", SHARDS)
        .candidate(id)
        .ttl(TTL)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .grace(grace)
        .build()
        .expect("valid settings")
        .start(move |shard, _term| {
            let flag = Dropped(shard, dropped.clone());
            async move {
                let _flag = flag;
                std::future::pending::<()>().await
            }
        })
}

/// A worker that never looks at its term is dropped at the hard stop, the grace after its
/// term ended, and before the shard's next owner starts: the move waits for it.
#[tokio::test(start_paused = true)]
async fn a_worker_that_ignores_its_terms_end_is_stopped_at_the_grace_before_the_shard_moves() {
    let store = MemoryBackend::new();
    let grace = Duration::from_millis(500);
    let dropped: Arc<Mutex<BTreeMap<u32, Instant>>> = Arc::default();
    let a = stuck_member(&store.client(), "a", grace, &dropped);
    settled(&[("a", &a)], TTL * 4).await;
    let mut events = a.subscribe();
    let ledger = Ledger::default();
    let b = member(&store.client(), "b", &ledger);
    let mut demoted_at = BTreeMap::new();
    while demoted_at.len() < SHARDS as usize / 2 {
        if let ShardEvent::Demoted { shard, reason, .. } = timeout(TTL, events.recv())
            .await
            .expect("an event")
            .expect("open")
        {
            assert_eq!(reason, DemotionReason::Shutdown);
            demoted_at.insert(shard, Instant::now());
        }
    }
    settled(&[("a", &a), ("b", &b)], TTL * 4).await;
    let dropped = dropped.lock().unwrap().clone();
    let b_started: BTreeMap<u32, Instant> = ledger
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|t| (t.0, t.3))
        .collect();
    for (shard, demoted) in &demoted_at {
        let gone = dropped
            .get(shard)
            .unwrap_or_else(|| panic!("shard {shard}: its worker was never stopped"));
        let waited = gone.duration_since(*demoted);
        assert!(
            waited >= grace && waited <= grace + Duration::from_millis(50),
            "shard {shard}: the worker was stopped {waited:?} after its term ended (grace {grace:?})"
        );
        assert!(
            b_started[shard] >= *gone,
            "shard {shard}: b began before a's worker was stopped"
        );
    }
    assert!(
        dropped.keys().all(|k| demoted_at.contains_key(k)),
        "only the moved shards' workers stopped"
    );
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
    ledger.check();
}

/// A member cut off from the store: its workers that never look at their terms are dropped
/// at the terms' `stop_by`, before the store can hand a shard on, and the shards' next owner
/// starts after that.
#[tokio::test(start_paused = true)]
async fn a_cut_off_members_stuck_workers_are_stopped_before_its_shards_can_move() {
    let store = MemoryBackend::new();
    let dropped: Arc<Mutex<BTreeMap<u32, Instant>>> = Arc::default();
    let a_client = store.client();
    let a = stuck_member(&a_client, "a", TTL * 10, &dropped);
    settled(&[("a", &a)], TTL * 4).await;
    let ledger = Ledger::default();
    let b = member(&store.client(), "b", &ledger);
    settled(&[("a", &a), ("b", &b)], TTL * 4).await;
    let mut events = a.subscribe();
    let held: BTreeSet<u32> = a.status().borrow().owned();
    dropped.lock().unwrap().clear();
    let cut = Instant::now();
    a_client.set_reachability(Reachability::Hanging);
    let mut stop_by = BTreeMap::new();
    while stop_by.len() < held.len() {
        if let ShardEvent::Demoted {
            shard, stop_by: at, ..
        } = timeout(TTL * 2, events.recv())
            .await
            .expect("an event")
            .expect("open")
        {
            stop_by.insert(shard, at.expect("an involuntary loss has a stop_by"));
        }
    }
    settled(&[("b", &b)], TTL * 4).await;
    let dropped = dropped.lock().unwrap().clone();
    let b_started: BTreeMap<u32, Instant> = ledger
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|t| t.3 > cut)
        .map(|t| (t.0, t.3))
        .collect();
    for shard in &held {
        let gone = dropped
            .get(shard)
            .unwrap_or_else(|| panic!("shard {shard}: its stuck worker was never stopped"));
        assert!(
            *gone <= stop_by[shard],
            "shard {shard}: stopped at {gone:?}, after its stop_by {:?}",
            stop_by[shard]
        );
        assert!(
            b_started[shard] > *gone,
            "shard {shard}: b began before a's stuck worker was stopped"
        );
    }
    drop(a);
    b.shutdown().await.expect("shutdown");
    ledger.check();
}

/// A worker that returns, fails or panics (in its future, or in its own code before it) while
/// its shard's term lasts: under the default policy the shard steps down (`WorkerExited`,
/// `WorkerFailed`) and leads again with a greater token, and the other shards go on; under
/// `OnWorkerExit::Stop` it stays down while it is assigned here.
#[tokio::test(start_paused = true)]
async fn a_worker_that_returns_steps_its_shard_down_and_the_policy_says_what_follows() {
    use incumbent::OnWorkerExit;
    let store = MemoryBackend::new();
    let start = |id: &str, policy: OnWorkerExit| {
        let runs: Arc<Mutex<BTreeMap<u32, u32>>> = Arc::default();
        ShardedElection::builder(store.client(), format!("jobs-{id}"), 5)
            .candidate(id)
            .ttl(TTL)
            .backoff(Duration::from_millis(100), Duration::from_secs(1))
            .on_worker_exit(policy)
            .build()
            .expect("valid")
            .start(move |shard, term| {
                let first = {
                    let mut runs = runs.lock().unwrap();
                    let n = runs.entry(shard).or_default();
                    *n += 1;
                    *n == 1
                };
                // Each shard's first term: shard 3's worker panics before its future, 0
                // returns, 1 fails, 2 panics; shard 4 works.
                if shard == 3 && first {
                    panic!("the worker's own code panicked");
                }
                async move {
                    match shard {
                        0 if first => return Ok(()),
                        1 if first => return Err("the job failed"),
                        2 if first => panic!("the job panicked"),
                        _ => {}
                    }
                    term.cancelled().await;
                    Ok::<(), &str>(())
                }
            })
    };
    // The default: each steps down with why, and leads again.
    let resigning = start("resigning", OnWorkerExit::Resign);
    let mut events = resigning.subscribe();
    let mut first = BTreeMap::new();
    let mut reasons = BTreeMap::new();
    let mut again = BTreeMap::new();
    timeout(TTL * 4, async {
        while again.len() < 4 {
            match events.recv().await.expect("open") {
                ShardEvent::Elected { shard, term } if shard < 4 => {
                    if let Some(earlier) = first.get(&shard) {
                        again.insert(shard, (*earlier, term.fencing_token()));
                    } else {
                        first.insert(shard, term.fencing_token());
                    }
                }
                ShardEvent::Demoted { shard, reason, .. } => {
                    reasons.insert(shard, reason);
                }
                _ => {}
            }
        }
    })
    .await
    .expect("every shard led again");
    assert_eq!(
        reasons,
        BTreeMap::from([
            (0, DemotionReason::WorkerExited),
            (1, DemotionReason::WorkerFailed),
            (2, DemotionReason::WorkerFailed),
            (3, DemotionReason::WorkerFailed),
        ])
    );
    for (shard, (earlier, later)) in again {
        assert!(
            later > earlier,
            "shard {shard}: token {later} after {earlier}"
        );
    }

    // Stop: the shards step down and stay down, though the map still gives them here.
    let stopping = start("stopping", OnWorkerExit::Stop);
    let mut events = stopping.subscribe();
    let mut reasons = BTreeMap::new();
    timeout(TTL * 4, async {
        while reasons.len() < 4 {
            if let ShardEvent::Demoted { shard, reason, .. } = events.recv().await.expect("open") {
                reasons.insert(shard, reason);
            }
        }
    })
    .await
    .expect("four shards stepped down");
    assert_eq!(reasons[&0], DemotionReason::WorkerExited);
    assert_eq!(reasons[&1], DemotionReason::WorkerFailed);
    tokio::time::sleep(TTL * 2).await;
    let status = stopping.status().borrow().clone();
    assert_eq!(status.assigned, BTreeSet::from([0, 1, 2, 3, 4]));
    assert_eq!(
        status.owned(),
        BTreeSet::from([4]),
        "stopped shards stay down"
    );
    for k in 0..4 {
        assert_eq!(
            store.holder(&format!("jobs-stopping/{k}")),
            None,
            "shard {k}"
        );
    }
    resigning.shutdown().await.expect("shutdown");
    stopping.shutdown().await.expect("shutdown");
}
