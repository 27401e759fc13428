//! The campaign's promises, checked deterministically on the memory backend with paused time.
//! One behaviour per test, named for it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use incumbent::memory::{MemoryBackend, Reachability};
use incumbent::{
    Campaign, DemotionReason, Election, Error, LeadershipEvent, OnWorkerExit, Role, Runner, Status,
    Term,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};

use crate::support::beats::{Beats, first_token, last_beat, stubborn};
use crate::support::events::{demoted, elected, elected_within};

const TTL: Duration = Duration::from_secs(3);
const NAME: &str = "jobs/index";

fn election(backend: &MemoryBackend, id: &str) -> Election<MemoryBackend> {
    Election::builder(backend.clone(), NAME)
        .candidate(id)
        .ttl(TTL)
        .backoff(Duration::from_millis(100), Duration::from_secs(2))
        .grace(Duration::from_secs(1))
        .build()
        .expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn one_candidate_becomes_leader_with_a_positive_token() {
    let store = MemoryBackend::new();
    let mut a = election(&store, "a").campaign();
    let term = elected(&mut a, TTL).await;
    assert!(term.fencing_token() > 0);
    assert_eq!(term.leader().candidate.id, "a");
    assert_eq!(term.election(), NAME);
    assert!(a.status().borrow().is_leader());
    assert_eq!(store.holder(NAME).map(|l| l.candidate.id), Some("a".into()));
}

#[tokio::test(start_paused = true)]
async fn only_one_of_many_candidates_leads() {
    let store = MemoryBackend::new();
    let mut campaigns: Vec<Campaign> = (0..5)
        .map(|i| election(&store.client(), &format!("c{i}")).campaign())
        .collect();
    sleep(TTL * 3).await;
    let leaders: Vec<_> = campaigns
        .iter()
        .filter(|c| c.status().borrow().is_leader())
        .collect();
    assert_eq!(leaders.len(), 1);
    let leader_id = store.holder(NAME).expect("a holder").candidate.id;
    for c in &mut campaigns {
        let status = c.status().borrow().clone();
        assert_eq!(
            status.leader.map(|l| l.candidate.id),
            Some(leader_id.clone())
        );
        if !status.role.eq(&Role::Leader) {
            assert_eq!(status.role, Role::Follower);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn resign_hands_off_to_a_follower_with_a_greater_token() {
    let store = MemoryBackend::new();
    let mut a = election(&store.client(), "a").campaign();
    let first = elected(&mut a, TTL).await;
    let mut b = election(&store.client(), "b").campaign();
    sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    a.resign().await.expect("resign");
    assert!(
        first.is_cancelled(),
        "the old term is cancelled before the lock is released"
    );
    let second = elected(&mut b, TTL).await;
    assert!(second.fencing_token() > first.fencing_token());
    // Push notification, no back-off: hand-off takes no timer at all.
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::Resigned);
}

#[tokio::test(start_paused = true)]
async fn a_resigned_leader_campaigns_again_after_the_back_off() {
    let store = MemoryBackend::new();
    let mut a = election(&store, "a").campaign();
    let first = elected(&mut a, TTL).await;
    a.resign().await.expect("resign");
    let second = elected(&mut a, Duration::from_secs(1)).await;
    assert!(second.fencing_token() > first.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_leader_fences_itself_before_its_lease_can_expire() {
    let store = MemoryBackend::new();
    let a_client = store.client();
    let mut a = election(&a_client, "a").campaign();
    let a_term = elected(&mut a, TTL).await;
    let mut b = election(&store.client(), "b").campaign();
    sleep(Duration::from_millis(10)).await;

    a_client.set_reachability(Reachability::Hanging);
    let partitioned = Instant::now();
    assert_eq!(
        demoted(&mut a, TTL * 2).await,
        DemotionReason::RenewDeadlineExceeded
    );
    let fenced = Instant::now();
    assert!(a_term.is_cancelled());
    let b_term = elected(&mut b, TTL * 3).await;
    let b_started = Instant::now();
    // The store can only hand the lock on once A's lease expired: a ttl after A's last
    // confirmed renewal, which was sent before the partition. A fenced itself before that.
    assert!(
        fenced < b_started,
        "A fenced at {fenced:?}, B started at {b_started:?}"
    );
    assert!(fenced - partitioned < TTL);
    assert!(b_term.fencing_token() > a_term.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn an_expired_session_demotes_the_leader_and_it_is_re_elected() {
    let store = MemoryBackend::new();
    let a_client = store.client();
    let mut a = election(&a_client, "a").campaign();
    let first = elected(&mut a, TTL).await;
    a_client.expire_sessions();
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::SessionExpired);
    assert!(first.is_cancelled());
    let second = elected(&mut a, TTL * 2).await;
    assert!(second.fencing_token() > first.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn a_deleted_key_demotes_the_leader_with_key_deleted() {
    let store = MemoryBackend::new();
    let mut a = election(&store, "a").campaign();
    let term = elected(&mut a, TTL).await;
    store.delete(NAME);
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::KeyDeleted);
    assert!(term.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn a_lock_taken_by_someone_else_demotes_the_leader_with_lock_taken() {
    let store = MemoryBackend::new();
    let mut a = election(&store, "a").campaign();
    let term = elected(&mut a, TTL).await;
    let intruder = incumbent::Leader {
        candidate: incumbent::Candidate {
            id: "intruder".into(),
            metadata: Default::default(),
        },
        fencing_token: None,
        since_unix_ms: None,
    };
    store.force_holder(NAME, intruder);
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::LockTaken);
    assert!(term.is_cancelled());
    // It follows the new holder, and takes over once the key is cleared.
    sleep(TTL).await;
    assert_eq!(a.status().borrow().role, Role::Follower);
    store.delete(NAME);
    assert!(elected(&mut a, TTL).await.fencing_token() > term.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn a_lock_delay_is_waited_out_exactly_not_polled() {
    let store = MemoryBackend::new();
    let delay = Duration::from_secs(15);
    let client = store.client();
    store.impose_lock_delay(NAME, delay);
    let start = Instant::now();
    let mut a = election(&client, "a").campaign();
    sleep(Duration::from_secs(1)).await;
    assert!(matches!(a.status().borrow().role, Role::CoolingDown { .. }));
    let requests_while_delayed = client.requests();
    elected(&mut a, delay * 2).await;
    assert_eq!(start.elapsed(), delay, "woke exactly when the delay ended");
    // Session renewals go on (15 s / 1 s interval); acquisition was not retried meanwhile.
    assert!(
        client.requests() - requests_while_delayed <= 17,
        "{}",
        client.requests()
    );
}

#[tokio::test(start_paused = true)]
async fn the_lock_delay_after_session_loss_keeps_everyone_out_until_it_ends() {
    let store = MemoryBackend::new();
    let a_client = store.client();
    let delay = Duration::from_secs(5);
    let mut a = Election::builder(a_client.clone(), NAME)
        .candidate("a")
        .ttl(TTL)
        .lock_delay(delay)
        .build()
        .expect("valid")
        .campaign();
    elected(&mut a, TTL).await;
    let mut b = election(&store.client(), "b").campaign();
    sleep(Duration::from_millis(10)).await;
    a_client.expire_sessions();
    let expired = Instant::now();
    elected(&mut b, delay * 2).await;
    assert_eq!(expired.elapsed(), delay);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_is_down_is_retried_with_back_off_and_the_status_says_why() {
    let store = MemoryBackend::new();
    let client = store.client();
    client.set_reachability(Reachability::Failing);
    let a = election(&client, "a").campaign();
    sleep(Duration::from_secs(60)).await;
    let status = a.status().borrow().clone();
    let problem = status.problem.expect("a problem is reported");
    assert!(
        problem.message.contains("unreachable"),
        "{}",
        problem.message
    );
    // Back-off doubles to 2 s, jittered down to 1 s at the least: at most ~65 tries in a
    // minute, not thousands.
    assert!(
        client.requests() <= 65,
        "{} requests in 60 s",
        client.requests()
    );
    client.set_reachability(Reachability::Reachable);
    sleep(Duration::from_secs(3)).await;
    let status = a.status().borrow().clone();
    assert!(status.is_leader());
    assert!(status.problem.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_store_that_hangs_is_reported_and_retried() {
    let store = MemoryBackend::new();
    let client = store.client();
    client.set_reachability(Reachability::Hanging);
    let a = election(&client, "a").campaign();
    sleep(TTL * 2).await;
    let status = a.status().borrow().clone();
    let problem = status.problem.expect("a hanging store is a problem");
    assert!(problem.message.contains("no answer"), "{}", problem.message);
    client.set_reachability(Reachability::Reachable);
    sleep(TTL * 2).await;
    assert!(a.status().borrow().is_leader());
}

#[tokio::test(start_paused = true)]
async fn idle_leaders_and_followers_only_renew() {
    let store = MemoryBackend::new();
    let (ca, cb) = (store.client(), store.client());
    let _a = election(&ca, "a").campaign();
    let _b = election(&cb, "b").campaign();
    sleep(TTL).await;
    let (ra, rb) = (ca.requests(), cb.requests());
    sleep(TTL * 10).await; // 30 s, renew interval 1 s
    assert!(ca.requests() - ra <= 31, "leader: {}", ca.requests() - ra);
    assert!(cb.requests() - rb <= 31, "follower: {}", cb.requests() - rb);
}

#[tokio::test(start_paused = true)]
async fn a_candidate_whose_session_expired_while_waiting_never_becomes_leader() {
    let store = MemoryBackend::new();
    let mut a = election(&store.client(), "a").campaign();
    let a_term = elected(&mut a, TTL).await;
    let b_client = store.client();
    let mut b = election(&b_client, "b").campaign();
    sleep(Duration::from_millis(10)).await;
    // B's requests now take longer than its renew interval: its renewals time out, the store
    // expires its session, and every call it makes arrives after that.
    b_client.set_latency(TTL * 2);
    sleep(TTL * 2).await;
    a.shutdown().await.expect("shutdown");
    assert!(a_term.is_cancelled());
    assert!(
        !elected_within(&mut b, TTL * 3).await,
        "B led on a dead session"
    );
    // Once its calls are fast again, B opens a new session and wins.
    b_client.set_latency(Duration::ZERO);
    let b_term = elected(&mut b, TTL * 10).await;
    assert!(b_term.fencing_token() > a_term.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn followers_see_every_leader_change() {
    let store = MemoryBackend::new();
    let mut a = election(&store.client(), "a").campaign();
    elected(&mut a, TTL).await;
    let mut c = election(&store.client(), "c").campaign();
    sleep(Duration::from_millis(10)).await;
    let mut b = election(&store.client(), "b").campaign();
    sleep(Duration::from_millis(10)).await;
    a.shutdown().await.expect("shutdown");
    sleep(Duration::from_millis(10)).await;
    // Whoever won, the other follower saw a -> nobody/winner.
    let winner = store.holder(NAME).expect("a new leader").candidate.id;
    let loser = if winner == "b" { &mut c } else { &mut b };
    let mut seen = Vec::new();
    while let Ok(Some(event)) = timeout(Duration::from_millis(1), loser.recv()).await {
        if let LeadershipEvent::LeaderChanged(leader) = event {
            seen.push(leader.map(|l| l.candidate.id.clone()));
        }
    }
    assert_eq!(seen.first(), Some(&Some("a".to_owned())), "{seen:?}");
    assert_eq!(seen.last(), Some(&Some(winner)), "{seen:?}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_the_lock_and_closes_the_session() {
    let store = MemoryBackend::new();
    let mut a = election(&store, "a").campaign();
    let term = elected(&mut a, TTL).await;
    let status = a.status();
    a.shutdown().await.expect("shutdown");
    assert!(term.is_cancelled());
    assert_eq!(store.holder(NAME), None);
    assert_eq!(store.session_count(), 0);
    assert_eq!(status.borrow().role, Role::Stopped);
}

/// `a` elected in [`NAME`], then `b` following it: `(a, a's term, b, b's status)`.
async fn leader_and_follower(
    store: &MemoryBackend,
) -> (Campaign, Term, Campaign, watch::Receiver<Status>) {
    let mut a = election(store, "a").campaign();
    let term = elected(&mut a, TTL).await;
    let b = election(store, "b").campaign();
    let mut b_status = b.status();
    b_status
        .wait_for(|s| s.role == Role::Follower)
        .await
        .expect("b follows");
    (a, term, b, b_status)
}

/// The leader's term ended and the follower stopped, without having led (it was told to
/// stop before the leader released the lock), all before their shutdowns were awaited.
async fn stopped_before_awaited(term: &Term, b_status: &mut watch::Receiver<Status>) {
    timeout(TTL, term.cancelled())
        .await
        .expect("a's term ends before its shutdown is awaited");
    timeout(TTL, b_status.wait_for(|s| s.role == Role::Stopped))
        .await
        .expect("b stops before its shutdown is awaited")
        .expect("b's status");
    assert_eq!(
        b_status.borrow().last_demotion,
        None,
        "b took office after its shutdown was called"
    );
}

/// Of many campaigns shut down together, none goes on (or takes office) while its shutdown
/// waits to be polled: the command leaves when `shutdown()` is called.
#[tokio::test(start_paused = true)]
async fn a_shutdown_starts_when_called_not_when_first_awaited() {
    let store = MemoryBackend::new();
    let (a, term, b, mut b_status) = leader_and_follower(&store).await;
    let handle_b = b.handle();
    let stopping_b = handle_b.shutdown();
    let stopping_a = a.shutdown();
    stopped_before_awaited(&term, &mut b_status).await;
    stopping_a.await.expect("shutdown");
    stopping_b.await.expect("shutdown");
    assert_eq!(store.holder(NAME), None);
}

/// `Campaign::shutdown_all` asks every campaign at the call, as `shutdown` does, and its
/// future returns once all have stopped and released.
#[tokio::test(start_paused = true)]
async fn shutdown_all_asks_every_campaign_at_the_call_and_waits_for_all() {
    let store = MemoryBackend::new();
    let (a, term, b, mut b_status) = leader_and_follower(&store).await;
    let mut others = Vec::new();
    for i in 0..3 {
        let mut c = Election::builder(store.clone(), format!("other/{i}"))
            .candidate("a")
            .ttl(TTL)
            .build()
            .expect("valid")
            .campaign();
        elected(&mut c, TTL).await;
        others.push(c);
    }
    let statuses: Vec<_> = others.iter().map(Campaign::status).collect();
    let stopping = Campaign::shutdown_all([b, a].into_iter().chain(others));
    stopped_before_awaited(&term, &mut b_status).await;
    timeout(TTL, stopping)
        .await
        .expect("every campaign stops")
        .expect("shutdown");
    assert_eq!(store.holder(NAME), None);
    for (i, status) in statuses.iter().enumerate() {
        assert_eq!(status.borrow().role, Role::Stopped, "other/{i}");
        assert_eq!(store.holder(&format!("other/{i}")), None, "other/{i}");
    }
    assert_eq!(store.session_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_campaign_shuts_it_down() {
    let store = MemoryBackend::new();
    let mut a = election(&store, "a").campaign();
    elected(&mut a, TTL).await;
    drop(a);
    sleep(Duration::from_millis(10)).await;
    assert_eq!(store.holder(NAME), None);
    assert_eq!(store.session_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_slow_subscriber_never_stalls_the_campaign() {
    let store = MemoryBackend::new();
    let mut a = election(&store, "a").campaign();
    let _never_read = a.subscribe();
    for _ in 0..20 {
        let term = elected(&mut a, TTL).await;
        a.resign().await.expect("resign");
        assert!(term.is_cancelled());
    }
}

#[tokio::test(start_paused = true)]
async fn release_waits_for_term_guards_up_to_the_grace() {
    let store = MemoryBackend::new();
    let mut a = election(&store.client(), "a").campaign();
    let term = elected(&mut a, TTL).await;
    let guard = term.hold();
    let mut b = election(&store.client(), "b").campaign();
    sleep(Duration::from_millis(10)).await;
    let resigned = tokio::spawn({
        let handle = a.handle();
        async move { handle.resign().await }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(term.is_cancelled());
    assert_eq!(
        store.holder(NAME).map(|l| l.candidate.id),
        Some("a".into()),
        "held while guarded"
    );
    drop(guard);
    resigned.await.expect("join").expect("resign");
    elected(&mut b, TTL).await;

    // A guard that is never dropped delays the release by the grace only.
    b.shutdown().await.expect("shutdown");
    let term = elected(&mut a, TTL * 10).await;
    let _stuck = term.hold();
    let started = Instant::now();
    a.shutdown().await.expect("shutdown");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

/// A shared ledger of terms: (token, start, end).
type Ledger = Arc<Mutex<Vec<(u64, Instant, Instant)>>>;

fn assert_no_overlap(ledger: &Ledger) {
    let mut terms = ledger.lock().unwrap().clone();
    terms.sort_by_key(|t| t.1);
    for pair in terms.windows(2) {
        assert!(pair[0].2 <= pair[1].1, "terms overlap: {pair:?}");
        assert!(pair[0].0 < pair[1].0, "tokens did not grow: {pair:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn run_hands_off_only_after_the_old_worker_stopped() {
    let store = MemoryBackend::new();
    let ledger: Ledger = Arc::default();
    let worker = |ledger: Ledger| {
        move |term: Term| {
            let ledger = ledger.clone();
            async move {
                let start = Instant::now();
                term.cancelled().await;
                sleep(Duration::from_millis(400)).await; // winding down takes a while
                ledger
                    .lock()
                    .unwrap()
                    .push((term.fencing_token(), start, Instant::now()));
            }
        }
    };
    let (a_client, b_client) = (store.client(), store.client());
    let a = election(&a_client, "a");
    let b = election(&b_client, "b");
    let (stop_a, a_stopped) = tokio::sync::oneshot::channel::<()>();
    let run_a = tokio::spawn({
        let w = worker(ledger.clone());
        async move {
            a.run_until(w, async {
                let _ = a_stopped.await;
            })
            .await
        }
    });
    sleep(Duration::from_millis(100)).await;
    let run_b = tokio::spawn({
        let w = worker(ledger.clone());
        async move { b.run_until(w, std::future::pending()).await }
    });
    sleep(Duration::from_millis(100)).await;
    a_client.set_reachability(Reachability::Hanging); // A fences itself, B takes over
    sleep(TTL * 3).await;
    a_client.set_reachability(Reachability::Reachable);
    stop_a.send(()).expect("a still running");
    run_a.await.expect("join").expect("run_until");
    sleep(Duration::from_secs(1)).await;
    run_b.abort();
    let terms = ledger.lock().unwrap().len();
    assert!(terms >= 1, "A's term was recorded");
    assert_no_overlap(&ledger);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_ignores_cancellation_is_aborted_after_the_grace() {
    let store = MemoryBackend::new();
    let e = election(&store, "a");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Arc::new(AtomicU32::new(0));
    let run = tokio::spawn({
        let started = started.clone();
        async move {
            e.run_until(
                move |_term| {
                    started.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>()
                },
                async {
                    let _ = stopped.await;
                },
            )
            .await
        }
    });
    sleep(Duration::from_millis(100)).await;
    assert_eq!(started.load(Ordering::SeqCst), 1);
    stop.send(()).expect("running");
    let begun = Instant::now();
    run.await.expect("join").expect("run_until");
    assert_eq!(
        begun.elapsed(),
        Duration::from_secs(1),
        "the grace, then abort"
    );
    assert_eq!(store.holder(NAME), None);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_returns_resigns_and_runs_again_when_re_elected() {
    let store = MemoryBackend::new();
    let e = election(&store, "a");
    let runs = Arc::new(AtomicU32::new(0));
    let run = tokio::spawn({
        let runs = runs.clone();
        async move {
            e.run(move |term| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    assert!(!term.is_cancelled());
                }
            })
            .await
        }
    });
    sleep(Duration::from_secs(10)).await;
    let n = runs.load(Ordering::SeqCst);
    // Each quick loss doubles the cool-down (100 ms, 200 ms, ... up to 2 s, jittered down to
    // half): a handful of runs in 10 s, never a hot loop.
    assert!((4..=14).contains(&n), "{n} runs in 10 s");
    run.abort();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_worker_is_contained_and_restarted() {
    let store = MemoryBackend::new();
    let e = election(&store, "a");
    let runs = Arc::new(AtomicU32::new(0));
    let run = tokio::spawn({
        let runs = runs.clone();
        async move {
            e.run(move |_term| {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        panic!("first run fails");
                    }
                    std::future::pending::<()>().await;
                }
            })
            .await
        }
    });
    sleep(Duration::from_secs(2)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(!run.is_finished());
    run.abort();
}

#[tokio::test(start_paused = true)]
async fn the_stop_policy_returns_the_workers_error() {
    let store = MemoryBackend::new();
    let e = Election::builder(store.clone(), NAME)
        .on_worker_exit(OnWorkerExit::Stop)
        .build()
        .expect("valid");
    let result = e.run(|_term| async { Err::<(), _>("disk full") }).await;
    match result {
        Err(Error::Worker(message)) => assert!(message.contains("disk full"), "{message}"),
        other => panic!("expected a worker error, got {other:?}"),
    }
    assert_eq!(store.holder(NAME), None, "released");
    assert_eq!(store.session_count(), 0, "session closed");
}

#[tokio::test(start_paused = true)]
async fn callbacks_are_called_in_order() {
    let store = MemoryBackend::new();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let (l1, l2, l3) = (log.clone(), log.clone(), log.clone());
    let e = Election::builder(store.clone(), NAME)
        .candidate("a")
        .on_elected(move |term| {
            let log = l1.clone();
            async move {
                log.lock()
                    .unwrap()
                    .push(format!("elected {}", term.fencing_token()))
            }
        })
        .on_demoted(move |demotion| {
            let log = l2.clone();
            async move {
                log.lock().unwrap().push(format!(
                    "demoted {} {} {:?}",
                    demotion.fencing_token, demotion.reason, demotion.stop_by
                ))
            }
        })
        .on_leader_changed(move |leader| {
            let log = l3.clone();
            async move {
                let id = leader
                    .map(|l| l.candidate.id.clone())
                    .unwrap_or_else(|| "none".into());
                log.lock().unwrap().push(format!("leader {id}"))
            }
        })
        .build()
        .expect("valid");
    let mut campaign = e.campaign();
    elected(&mut campaign, TTL).await;
    campaign.resign().await.expect("resign");
    sleep(Duration::from_millis(10)).await;
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log[..4],
        [
            "elected 1",
            "leader a",
            "demoted 1 resigned None",
            "leader none"
        ],
        "{log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn many_elections_of_one_client_share_one_session() {
    let store = MemoryBackend::new();
    let mut campaigns = Vec::new();
    for i in 0..100 {
        let e = Election::builder(store.clone(), format!("shard-{i}"))
            .candidate("a")
            .build()
            .expect("valid");
        campaigns.push(e.campaign());
    }
    for c in &mut campaigns {
        assert_eq!(elected(c, TTL).await.fencing_token(), 1);
    }
    assert_eq!(
        store.session_count(),
        1,
        "one session carries every election"
    );
    for c in campaigns {
        c.shutdown().await.expect("shutdown");
    }
    assert_eq!(store.session_count(), 0, "closed with the last election");
}

#[test]
fn the_builder_rejects_bad_settings_with_typed_errors() {
    let b = || Election::builder(MemoryBackend::new(), NAME);
    let timing = |r: incumbent::Result<Election<MemoryBackend>>| match r {
        Err(Error::InvalidTiming { reason }) => reason,
        other => panic!("expected InvalidTiming, got {other:?}"),
    };
    assert!(timing(b().ttl(Duration::ZERO).build()).contains("ttl"));
    assert!(
        timing(b().ttl(TTL).renew_deadline(TTL).build()).contains("renew_deadline"),
        "deadline must be below the ttl"
    );
    assert!(
        timing(
            b().ttl(TTL)
                .renew_deadline(Duration::from_secs(2))
                .renew_interval(Duration::from_secs(2))
                .build()
        )
        .contains("renew_interval")
    );
    assert!(
        timing(
            b().backoff(Duration::from_secs(2), Duration::from_secs(1))
                .build()
        )
        .contains("backoff")
    );
    // Durations that would overflow the clock are refused, not panicked on.
    for built in [
        b().backoff(Duration::from_secs(1), Duration::MAX).build(),
        b().lock_delay(Duration::MAX).build(),
        b().grace(Duration::MAX).build(),
    ] {
        assert!(timing(built).contains("longest setting"));
    }
    assert!(matches!(
        Election::builder(MemoryBackend::new(), "").build(),
        Err(Error::InvalidElectionName { .. })
    ));
    assert!(matches!(
        Election::builder(MemoryBackend::new(), "bad name").build(),
        Err(Error::InvalidElectionName { .. })
    ));
    assert!(matches!(
        b().candidate("").build(),
        Err(Error::InvalidCandidate { .. })
    ));
    assert!(matches!(
        b().candidate("a\nb").build(),
        Err(Error::InvalidCandidate { .. })
    ));
    assert!(matches!(
        b().metadata("", "x").build(),
        Err(Error::InvalidCandidate { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn resign_and_shutdown_after_stop_are_handled() {
    let store = MemoryBackend::new();
    let a = election(&store, "a").campaign();
    let handle = a.handle();
    a.shutdown().await.expect("shutdown");
    assert!(matches!(handle.resign().await, Err(Error::Stopped)));
    handle
        .shutdown()
        .await
        .expect("a second shutdown returns at once");
}

/// An election whose grace is far longer than the ttl: a hard stop must not wait for it.
fn patient(backend: &MemoryBackend, id: &str) -> Election<MemoryBackend> {
    Election::builder(backend.clone(), NAME)
        .candidate(id)
        .ttl(TTL)
        .grace(Duration::from_secs(30))
        .build()
        .expect("valid settings")
}

/// Asserts that A's stubborn worker (`a_token`) beat for the last time before B's term began.
fn assert_stopped_before(beats: &Beats, a_token: u64, b_started: Instant) {
    let last = last_beat(beats, a_token).expect("A's beats");
    assert!(
        last < b_started,
        "A's stubborn worker ran until {last:?}, after B started at {b_started:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_ignores_cancellation_is_aborted_before_the_lease_can_expire() {
    let store = MemoryBackend::new();
    let (a_client, b_client) = (store.client(), store.client());
    let a = patient(&a_client, "a");
    let beats: Beats = Arc::default();
    let run_a = tokio::spawn({
        let w = stubborn(beats.clone());
        async move { a.run(w).await }
    });
    sleep(Duration::from_millis(100)).await;
    let mut b = election(&b_client, "b").campaign();
    sleep(Duration::from_millis(100)).await;
    let a_token = first_token(&beats).expect("A's worker ran");

    a_client.set_reachability(Reachability::Hanging);
    let b_term = elected(&mut b, TTL * 3).await;
    let b_started = Instant::now();
    assert_stopped_before(&beats, a_token, b_started);
    assert!(b_term.fencing_token() > a_token);
    run_a.abort();
}

#[tokio::test(start_paused = true)]
async fn an_involuntary_loss_says_by_when_the_work_must_stop() {
    let store = MemoryBackend::new();
    let a_client = store.client();
    let mut a = election(&a_client, "a").campaign();
    let term = elected(&mut a, TTL).await;
    assert_eq!(term.stop_by(), None, "none while the term lasts");
    let last_renewal = a.status().borrow().last_renewal().expect("renewed");
    a_client.set_reachability(Reachability::Hanging);
    let stop_by = loop {
        match timeout(TTL * 2, a.recv()).await.expect("an event") {
            Some(LeadershipEvent::Demoted {
                reason, stop_by, ..
            }) => {
                assert_eq!(reason, DemotionReason::RenewDeadlineExceeded);
                break stop_by.expect("an involuntary loss has a hard stop");
            }
            Some(_) => {}
            None => panic!("the campaign stopped"),
        }
    };
    assert_eq!(term.stop_by(), Some(stop_by));
    // No later than a tenth of the ttl before the lease can expire in the store.
    assert!(stop_by <= a.status().borrow().last_renewal().unwrap_or(last_renewal) + TTL - TTL / 10);

    // A lock the store has taken away already: stop at once.
    a_client.set_reachability(Reachability::Reachable);
    let term = elected(&mut a, TTL * 3).await;
    store.delete(NAME);
    let deleted = Instant::now();
    term.cancelled().await;
    assert_eq!(term.stop_by(), Some(deleted));

    // A voluntary end keeps the grace: no hard stop.
    let term = elected(&mut a, TTL * 3).await;
    a.resign().await.expect("resign");
    assert!(term.is_cancelled());
    assert_eq!(term.stop_by(), None);
}

#[tokio::test(start_paused = true)]
async fn the_status_stops_saying_leader_the_instant_the_term_ends() {
    let store = MemoryBackend::new();
    let mut a = election(&store.client(), "a").campaign();
    let term = elected(&mut a, TTL).await;
    let guard = term.hold(); // the worker winds down slowly: the hand-off waits for it
    let status = a.status();
    let before = status.borrow().clone();
    assert!(before.is_leader());
    assert_eq!(before.current_role(), Role::Leader);
    let resigned = tokio::spawn({
        let handle = a.handle();
        async move { handle.resign().await }
    });
    term.cancelled().await;
    // A snapshot taken while leading stops saying leader with the term, without an update.
    assert!(!before.is_leader());
    assert_eq!(before.current_role(), Role::SteppingDown);
    sleep(Duration::from_millis(300)).await;
    let now = status.borrow().clone();
    assert!(!now.is_leader(), "still winding down, and not leader");
    assert_eq!(now.role, Role::SteppingDown);
    assert!(now.term.is_none());
    assert_eq!(
        store.holder(NAME).map(|l| l.candidate.id),
        Some("a".into()),
        "held while guarded"
    );
    drop(guard);
    resigned.await.expect("join").expect("resign");
    assert!(!status.borrow().is_leader());
}

#[tokio::test(start_paused = true)]
async fn a_worker_winding_down_after_a_shutdown_is_stopped_if_the_lease_would_lapse() {
    let store = MemoryBackend::new();
    let (a_client, b_client) = (store.client(), store.client());
    let a = patient(&a_client, "a"); // a voluntary end keeps the lock for the grace at most
    let beats: Beats = Arc::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run_a = tokio::spawn({
        let w = stubborn(beats.clone());
        async move {
            a.run_until(w, async {
                let _ = stopped.await;
            })
            .await
        }
    });
    sleep(Duration::from_millis(100)).await;
    let mut b = election(&b_client, "b").campaign();
    sleep(Duration::from_millis(100)).await;
    let a_token = first_token(&beats).expect("A's worker ran");

    // A shuts down (a voluntary end: its worker gets the grace), and loses the store at once:
    // its lease lapses long before the grace ends, and B takes over.
    stop.send(()).expect("A runs");
    a_client.set_reachability(Reachability::Hanging);
    let b_term = elected(&mut b, TTL * 3).await;
    let b_started = Instant::now();
    assert_stopped_before(&beats, a_token, b_started);
    assert!(b_term.fencing_token() > a_token);
    a_client.set_reachability(Reachability::Reachable);
    timeout(TTL * 3, run_a)
        .await
        .expect("A's run_until returns")
        .expect("join")
        .expect("run_until");
}

#[tokio::test(start_paused = true)]
async fn a_proclaim_the_store_never_answers_does_not_hold_off_self_fencing() {
    let store = MemoryBackend::new();
    let a_client = store.client();
    let mut a = election(&a_client, "a").campaign();
    let term = elected(&mut a, TTL).await;
    let mut b = election(&store.client(), "b").campaign();
    sleep(Duration::from_millis(10)).await;

    a_client.set_reachability(Reachability::Hanging);
    let partitioned = Instant::now();
    let proclaim = a.proclaim([("addr".to_owned(), "new".to_owned())].into());
    let outcome = timeout(TTL, proclaim)
        .await
        .expect("the proclaim is bounded");
    assert!(
        matches!(outcome, Err(incumbent::Error::NotLeader)),
        "{outcome:?}"
    );
    assert_eq!(
        demoted(&mut a, TTL).await,
        DemotionReason::RenewDeadlineExceeded
    );
    let fenced = Instant::now();
    assert!(term.is_cancelled());
    assert!(fenced - partitioned < TTL, "fenced within the ttl");
    let next = elected(&mut b, TTL * 3).await;
    assert!(Instant::now() > fenced);
    assert!(next.fencing_token() > term.fencing_token());
    assert!(
        next.leader().candidate.metadata.is_empty(),
        "a's metadata is b's business only"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unread_event_queue_keeps_the_newest_events_and_counts_the_rest() {
    // A campaign whose events nobody reads: each resign is a term that begins and ends, a few
    // events each. The queue keeps the newest EVENT_QUEUE_CAPACITY and counts what it drops.
    let store = MemoryBackend::new();
    let campaign = election(&store, "a").campaign();
    let status = campaign.status();
    let handle = campaign.handle();
    let terms = incumbent::EVENT_QUEUE_CAPACITY / 2;
    for _ in 0..terms {
        let mut watching = status.clone();
        timeout(TTL * 4, watching.wait_for(|s| s.is_leader()))
            .await
            .expect("leads again")
            .expect("the campaign lives");
        handle.resign().await.expect("resign");
    }
    let missed = campaign.missed_events();
    assert!(missed > 0, "more events than the capacity were sent");
    let mut campaign = campaign;
    handle.shutdown().await.expect("shutdown");
    let mut kept = 0;
    while campaign.recv().await.is_some() {
        kept += 1;
    }
    assert!(
        kept <= incumbent::EVENT_QUEUE_CAPACITY + 4,
        "{kept} events were kept unread"
    );
    assert!(missed + kept as u64 >= (terms * 2) as u64);
}

/// A runner of `election` whose worker adds each of its terms to `terms` and works until the
/// term ends; returned once it leads.
async fn recording_leader(
    election: &Election<MemoryBackend>,
    terms: &Arc<Mutex<Vec<Term>>>,
) -> Runner {
    let seen = terms.clone();
    let runner = election.start(move |term: Term| {
        seen.lock().unwrap().push(term.clone());
        async move { term.cancelled().await }
    });
    let mut status = runner.status();
    timeout(TTL, status.wait_for(|s| s.is_leader()))
        .await
        .expect("leads")
        .expect("runs");
    runner
}

#[tokio::test(start_paused = true)]
async fn a_runner_gives_the_workers_status_resign_and_shutdown_on_one_candidate() {
    let store = MemoryBackend::new();
    let terms: Arc<Mutex<Vec<Term>>> = Arc::default();
    let runner = recording_leader(&election(&store, "a"), &terms).await;
    let mut status = runner.status();
    // One candidate: the status, the worker and the handle are the same campaign's.
    let first = terms.lock().unwrap()[0].clone();
    assert_eq!(
        status.borrow().term.as_ref().map(Term::fencing_token),
        Some(first.fencing_token())
    );
    runner.resign().await.expect("resign");
    assert!(first.is_cancelled(), "resigning ended the worker's term");
    timeout(TTL * 4, status.wait_for(|s| s.is_leader()))
        .await
        .expect("leads again")
        .expect("runs");
    assert_eq!(terms.lock().unwrap().len(), 2, "the worker ran again");
    // Another candidate waits; the runner's shutdown releases the lock to it at once.
    let mut b = election(&store, "b").campaign();
    let released = Instant::now();
    runner.shutdown().await.expect("shutdown");
    assert!(terms.lock().unwrap()[1].is_cancelled());
    assert!(!status.borrow().is_leader());
    elected(&mut b, TTL).await;
    assert!(
        released.elapsed() < TTL,
        "the lock was released, not left to expire"
    );
}

/// `Runner::shutdown` starts at the call, so `Runner::shutdown_all` has every worker's term
/// ended before its future is polled; the future returns once every runner has released its
/// lock, with the error of a runner whose worker failed under `OnWorkerExit::Stop`.
#[tokio::test(start_paused = true)]
async fn runner_shutdowns_start_at_the_call_and_shutdown_all_waits_for_every_runner() {
    let store = MemoryBackend::new();
    let terms: Arc<Mutex<Vec<Term>>> = Arc::default();
    let mut runners = Vec::new();
    for i in 0..3 {
        let election = Election::builder(store.clone(), format!("runners/{i}"))
            .candidate("a")
            .ttl(TTL)
            .build()
            .expect("valid");
        runners.push(recording_leader(&election, &terms).await);
    }
    let failing = Election::builder(store.clone(), "runners/failing")
        .candidate("a")
        .ttl(TTL)
        .on_worker_exit(OnWorkerExit::Stop)
        .build()
        .expect("valid")
        .start(|_term: Term| async { Err::<(), _>("disk full") });
    sleep(Duration::from_millis(100)).await;
    let stopping = Runner::shutdown_all([failing].into_iter().chain(runners));
    let terms: Vec<Term> = terms.lock().unwrap().clone();
    assert_eq!(terms.len(), 3);
    for term in &terms {
        timeout(TTL, term.cancelled())
            .await
            .expect("every worker's term ends before the shutdown is awaited");
    }
    match timeout(TTL, stopping).await.expect("every runner stops") {
        Err(Error::Worker(message)) => assert!(message.contains("disk full"), "{message}"),
        other => panic!("expected the failed worker's error, got {other:?}"),
    }
    for i in 0..3 {
        assert_eq!(store.holder(&format!("runners/{i}")), None, "runners/{i}");
    }
    assert_eq!(store.holder("runners/failing"), None);
    assert_eq!(store.session_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_runner_releases_the_lock() {
    let store = MemoryBackend::new();
    let runner = election(&store, "a").start(|term: Term| async move { term.cancelled().await });
    let mut status = runner.status();
    timeout(TTL, status.wait_for(|s| s.is_leader()))
        .await
        .expect("leads")
        .expect("runs");
    let mut b = election(&store, "b").campaign();
    let dropped = Instant::now();
    drop(runner);
    elected(&mut b, TTL).await;
    assert!(
        dropped.elapsed() < TTL,
        "the lock was released, not left to expire"
    );
    assert!(!status.borrow().is_leader());
}

#[tokio::test(start_paused = true)]
async fn a_runners_worker_that_ignores_cancellation_is_stopped_by_stop_by() {
    // The store becomes unreachable for the leader: its term ends at the renew deadline,
    // and a worker that never looks at its token is aborted at the term's stop_by.
    let store = MemoryBackend::new();
    let client = store.client();
    let beats = Arc::new(Mutex::new(Vec::new()));
    let beating = beats.clone();
    let runner = election(&client, "a").start(move |term: Term| {
        let beating = beating.clone();
        async move {
            // Never looks at its token: only the runner's hard stop ends it.
            for _ in 0..10_000 {
                beating
                    .lock()
                    .unwrap()
                    .push((term.fencing_token(), Instant::now()));
                sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let mut status = runner.status();
    timeout(TTL, status.wait_for(|s| s.is_leader()))
        .await
        .expect("leads")
        .expect("runs");
    let term = status.borrow().term.clone().expect("a term");
    client.set_reachability(Reachability::Hanging);
    timeout(TTL * 2, term.cancelled())
        .await
        .expect("the term ends");
    let stop_by = term.stop_by().expect("an involuntary loss has a stop_by");
    sleep_until_after(stop_by).await;
    let last = beats
        .lock()
        .unwrap()
        .last()
        .map(|(_, at)| *at)
        .expect("beats");
    assert!(
        last <= stop_by,
        "the worker beat {:?} after its stop_by",
        last - stop_by
    );
    drop(runner);
}

async fn sleep_until_after(at: Instant) {
    tokio::time::sleep_until(at + Duration::from_millis(500)).await;
}
