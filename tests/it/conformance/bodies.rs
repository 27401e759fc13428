//! The behavioural tests, written once, generic over the store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use incumbent::backend::{
    Attempt, Backend, Candidate, Contender, Leader, Observer, Session, SessionOptions,
};
use incumbent::{CampaignHandle, DemotionReason, Election, LeadershipEvent, Term};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, timeout};

use super::stores::Store;
use crate::support::beats::{Beats, first_beat_of_another, first_token, last_beat, stubborn};
use crate::support::events::{demoted, elected};

pub const ELECTION: &str = "conformance/leader";

/// The options of a session opened straight from the backend, as a campaign with `ttl`
/// would open it.
fn session_options(ttl: Duration, name: &str) -> SessionOptions {
    SessionOptions {
        ttl,
        renew_interval: ttl / 3,
        lock_delay: None,
        name: name.into(),
    }
}

fn election<B: Backend>(backend: B, id: &str, ttl: Duration) -> Election<B> {
    Election::builder(backend, ELECTION)
        .candidate(id)
        .ttl(ttl)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_secs(2))
        .build()
        .expect("valid settings")
}

/// A campaign whose events (all of them, from the start) are forwarded to a channel.
struct Local {
    campaign: CampaignHandle,
    events: mpsc::UnboundedReceiver<LeadershipEvent>,
}

impl Local {
    fn start<B: Backend>(election: Election<B>) -> Local {
        Local::of(&election)
    }

    /// Another campaign of `election` (an election may run many).
    fn of<B: Backend>(election: &Election<B>) -> Local {
        let mut campaign = election.campaign();
        let handle = campaign.handle();
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = campaign.recv() => match event {
                        Some(e) => { let _ = tx.send(e); }
                        None => return,
                    },
                    // Dropping the `Local` drops the receiver: shut the campaign down.
                    () = tx.closed() => return,
                }
            }
        });
        Local {
            campaign: handle,
            events,
        }
    }
}

/// A candidate on a runtime and thread of its own, which can crash: its runtime is dropped
/// at once, with no release and no revoke. Its connections and file descriptors close, as
/// they do when a process is killed with SIGKILL.
struct Crashable {
    crash: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    events: mpsc::UnboundedReceiver<LeadershipEvent>,
}

impl Crashable {
    fn start<S: Store>(store: &S, id: &str) -> Crashable {
        let (events_tx, events) = mpsc::unbounded_channel();
        let (crash, crashed) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (store, id) = (store.clone(), id.to_owned());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            std::thread::spawn(move || {
                let _ = crashed.recv();
                let _ = stop_tx.send(());
            });
            runtime.block_on(async move {
                let backend = store.connect().await;
                let mut campaign = election(backend, &id, store.ttl()).campaign();
                let _ = started_tx.send(());
                tokio::select! {
                    _ = stop_rx => {}
                    () = async {
                        while let Some(e) = campaign.recv().await {
                            let _ = events_tx.send(e);
                        }
                    } => {}
                }
                std::mem::forget(campaign); // no graceful shutdown: this is a crash
            });
            // Dropping the runtime drops every task mid-flight.
        });
        started.recv().expect("the candidate started");
        Crashable {
            crash: Some(crash),
            thread: Some(thread),
            events,
        }
    }

    fn crash(&mut self) {
        drop(self.crash.take());
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the crashed candidate's thread");
        }
    }
}

impl Drop for Crashable {
    fn drop(&mut self) {
        self.crash();
    }
}

pub async fn one_leader_among_many<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut candidates = Vec::new();
    for i in 0..3 {
        candidates.push(Local::start(election(
            store.connect().await,
            &format!("c{i}"),
            ttl,
        )));
    }
    let deadline = Instant::now() + ttl * 5;
    loop {
        let leaders = candidates
            .iter()
            .filter(|c| c.campaign.status().borrow().is_leader())
            .count();
        assert!(leaders <= 1, "{leaders} leaders at once");
        if leaders == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no leader within {:?}", ttl * 5);
        sleep(Duration::from_millis(10)).await;
    }
    // Stable: still exactly one, and every follower names it.
    sleep(ttl * 2).await;
    let statuses: Vec<_> = candidates
        .iter()
        .map(|c| c.campaign.status().borrow().clone())
        .collect();
    let leaders: Vec<_> = statuses.iter().filter(|s| s.is_leader()).collect();
    assert_eq!(leaders.len(), 1);
    let leader = leaders[0].candidate.id.clone();
    for s in &statuses {
        assert_eq!(
            s.leader.as_ref().map(|l| l.candidate.id.clone()),
            Some(leader.clone()),
            "{s:?}"
        );
    }
}

pub async fn hand_off_on_resign<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Local::start(election(store.connect().await, "a", ttl));
    let first = elected(&mut a.events, ttl * 5).await;
    let mut b = Local::start(election(store.connect().await, "b", ttl));
    sleep(ttl / 2).await;
    a.campaign.resign().await.expect("resign");
    assert!(first.is_cancelled());
    assert_eq!(demoted(&mut a.events, ttl).await, DemotionReason::Resigned);
    // The follower is woken by the store, not by a timer: well within a ttl.
    let second = elected(&mut b.events, ttl).await;
    assert!(
        second.fencing_token() > first.fencing_token(),
        "{} then {}",
        first.fencing_token(),
        second.fencing_token()
    );
}

pub async fn failover_after_the_leader_crashes<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Crashable::start(&store, "a");
    let first = elected(&mut a.events, ttl * 5).await;
    let mut b = Local::start(election(store.connect().await, "b", ttl));
    sleep(ttl / 2).await;
    let crashed = Instant::now();
    a.crash();
    // The store frees the lock when the session expires: a ttl at the most (2 x ttl for
    // stores that only promise ttl as a lower bound), plus a margin for the hand-off.
    let second = elected(&mut b.events, ttl * 2 + Duration::from_secs(2)).await;
    assert!(second.fencing_token() > first.fencing_token());
    println!("failover after crash: {:?}", crashed.elapsed());
}

/// A ledger of terms as the workers saw them: (token, start, end).
type Ledger = Arc<Mutex<Vec<(u64, Instant, Instant)>>>;

pub async fn a_partitioned_leader_fences_itself_and_terms_never_overlap<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let ledger: Ledger = Arc::default();
    let worker = |ledger: Ledger| {
        move |term: Term| {
            let ledger = ledger.clone();
            async move {
                let start = Instant::now();
                term.cancelled().await;
                ledger
                    .lock()
                    .unwrap()
                    .push((term.fencing_token(), start, Instant::now()));
            }
        }
    };
    let (a_backend, partition) = store.connect_partitionable().await;
    let a = election(a_backend, "a", ttl);
    let b = election(store.connect().await, "b", ttl);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut runs = Vec::new();
    for e in [a, b] {
        let w = worker(ledger.clone());
        let mut stopped = stopped.clone();
        runs.push(tokio::spawn(async move {
            e.run_until(w, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
        }));
        sleep(ttl / 2).await;
    }
    // Cut the leader (a, the first) off for long enough that the store expires its session
    // (Consul may take up to 2 x ttl) and b takes over; then let a rejoin as a follower.
    partition.cut();
    sleep(ttl * 3).await;
    partition.heal();
    sleep(ttl * 2).await;
    stop.send_replace(true);
    for run in runs {
        timeout(ttl * 5, run)
            .await
            .expect("stopped in time")
            .expect("join")
            .expect("run_until");
    }
    let mut terms = ledger.lock().unwrap().clone();
    assert!(
        terms.len() >= 2,
        "leadership moved during the partitions: {terms:?}"
    );
    terms.sort_by_key(|t| t.1);
    for pair in terms.windows(2) {
        assert!(pair[0].2 <= pair[1].1, "terms overlap: {pair:?}");
        assert!(pair[0].0 < pair[1].0, "tokens did not grow: {pair:?}");
    }
}

pub async fn a_session_expired_while_waiting_never_leads<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Local::start(election(store.connect().await, "a", ttl));
    let a_term = elected(&mut a.events, ttl * 5).await;
    let b_backend = store.connect().await;
    let mut b = Local::start(election(b_backend.clone(), "b", ttl));
    sleep(ttl / 2).await;
    store.expire_sessions(&b_backend).await;
    a.campaign.shutdown().await.expect("shutdown");
    let b_term = elected(&mut b.events, ttl * 5).await;
    assert!(b_term.fencing_token() > a_term.fencing_token());
    // What the store says agrees: b holds the lock, with b's token, and keeps it.
    sleep(ttl * 2).await;
    assert!(!b_term.is_cancelled(), "b lost the term it was given");
    let mut observer = store
        .connect()
        .await
        .observe(ELECTION)
        .await
        .expect("observe");
    let holder = observer.next().await.expect("read").expect("a holder");
    assert_eq!(holder.candidate.id, "b");
    if let Some(token) = holder.fencing_token {
        assert_eq!(token, b_term.fencing_token());
    }
}

pub async fn observe_reports_every_leader_change<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut observer = store
        .connect()
        .await
        .observe(ELECTION)
        .await
        .expect("observe");
    let (tx, mut seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(leader) = observer.next().await {
            if tx.send(leader.map(|l| l.candidate.id)).is_err() {
                return;
            }
        }
    });
    let mut order = Vec::new();
    for id in ["a", "b", "c"] {
        let mut c = Local::start(election(store.connect().await, id, ttl));
        elected(&mut c.events, ttl * 5).await;
        // Give a polling observer time to read it before the next change.
        sleep(ttl).await;
        c.campaign.shutdown().await.expect("shutdown");
        order.push(id.to_owned());
    }
    sleep(ttl).await;
    let mut reported = Vec::new();
    while let Ok(leader) = seen.try_recv() {
        if let Some(id) = leader
            && reported.last() != Some(&id)
        {
            reported.push(id);
        }
    }
    assert_eq!(reported, order, "observed leaders in order");
}

pub async fn two_campaigns_of_one_election_never_both_lead<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    // Two campaigns of one `Election` value: they share the backend's pooled session.
    let backend = store.connect().await;
    let one = election(backend.clone(), "twin", ttl);
    let (a, b) = (Local::of(&one), Local::of(&one));
    take_turns([a, b], ttl).await;
    // Two `Election`s built with equal settings on one backend value: the same again.
    let (first, second) = (
        election(backend.clone(), "twin", ttl),
        election(backend, "twin", ttl),
    );
    take_turns([Local::start(first), Local::start(second)], ttl).await;
}

/// Runs two campaigns of one election through a few hand-offs: one leads at a time, each
/// new term only after the other's term was cancelled and with a greater token, and after
/// each resignation the other campaign leads.
async fn take_turns(campaigns: [Local; 2], ttl: Duration) {
    let [mut a, mut b] = campaigns;
    // Never two leaders, sampled all along.
    let statuses = [a.campaign.status(), b.campaign.status()];
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(async move {
        while !*stopped.borrow_and_update() {
            let leaders = statuses.iter().filter(|s| s.borrow().is_leader()).count();
            assert!(leaders <= 1, "both campaigns of one election lead at once");
            let _ = timeout(Duration::from_millis(2), stopped.changed()).await;
        }
    });
    let mut terms: [Option<Term>; 2] = [None, None];
    let mut last_token = None;
    let mut leader = None;
    for round in 0..4 {
        // Whoever leads first; after a resignation, the other one.
        let (index, term) = tokio::select! {
            term = elected(&mut a.events, ttl * 5), if leader != Some(0) => (0, term),
            term = elected(&mut b.events, ttl * 5), if leader != Some(1) => (1, term),
        };
        let other = 1 - index;
        if let Some(previous) = &terms[other] {
            assert!(
                previous.is_cancelled(),
                "round {round}: campaign {index} leads with token {} while campaign {other} \
                 still leads with token {}",
                term.fencing_token(),
                previous.fencing_token()
            );
        }
        if let Some(last) = last_token {
            assert!(
                term.fencing_token() > last,
                "round {round}: token {} after {last}",
                term.fencing_token()
            );
        }
        last_token = Some(term.fencing_token());
        // The other campaign stays a follower meanwhile.
        sleep(ttl / 2).await;
        assert!(
            !term.is_cancelled(),
            "round {round}: the leader lost its term"
        );
        let others = [&mut a, &mut b];
        let follower = &mut *others.into_iter().nth(other).expect("two campaigns");
        while let Ok(event) = follower.events.try_recv() {
            assert!(
                !matches!(event, LeadershipEvent::Elected(_)),
                "round {round}: campaign {other} was elected while {index} leads"
            );
        }
        terms[index] = Some(term);
        let resigning = [&a, &b][index];
        resigning.campaign.resign().await.expect("resign");
        leader = Some(index);
    }
    stop.send_replace(true);
    sampler.await.expect("never two leaders");
    for c in [a, b] {
        c.campaign.shutdown().await.expect("shutdown");
    }
}

/// A released lock goes to another campaign at once, also one of the same backend (process)
/// that tries again without having been woken by the release (its poll ended just then). A
/// backend whose followers poll holds a released key back from the campaign that released
/// it (followers elsewhere need a poll to notice): that campaign only, by its session handle.
#[cfg_attr(not(any(feature = "redis", feature = "memcached")), allow(dead_code))]
pub async fn a_released_lock_goes_to_another_campaign_not_back<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let backend = store.connect().await;
    // Two campaigns' sessions, opened with equal options as two campaigns of one election's.
    let options = session_options(ttl, "conformance");
    let resigning = backend.open_session(&options).await.expect("a session");
    let other = backend
        .open_session(&options)
        .await
        .expect("another session");
    let candidate = |id: &str| Candidate {
        id: id.into(),
        metadata: Default::default(),
    };
    let mut leader = resigning
        .contend(ELECTION, &candidate("a"))
        .await
        .expect("claim");
    let won = leader.acquire().await;
    assert!(matches!(won, Ok(Attempt::Won { .. })), "{won:?}");
    let mut follower = other
        .contend(ELECTION, &candidate("b"))
        .await
        .expect("claim");
    let held = follower.acquire().await;
    assert!(matches!(held, Ok(Attempt::Held { .. })), "{held:?}");
    leader.release().await.expect("release");
    drop(leader);
    if S::HOLDS_BACK_THE_RELEASER {
        // The campaign that released it retries at once, with a new claim: held back, also
        // where the store pushes the release to the others (their push may be slow).
        let mut again = resigning
            .contend(ELECTION, &candidate("a"))
            .await
            .expect("claim");
        let attempt = again.acquire().await;
        assert!(
            matches!(attempt, Ok(Attempt::Delayed { .. })),
            "the releasing campaign's own retry: {attempt:?}"
        );
    }
    let attempt = follower.acquire().await;
    assert!(
        matches!(attempt, Ok(Attempt::Won { .. })),
        "the other campaign's next attempt after the release: {attempt:?}"
    );
    follower.release().await.expect("release");
    resigning.close().await.expect("close");
    other.close().await.expect("close");
}

/// The term ends the instant the leader sees its lock gone, not after it asked the store
/// why: here the store cannot hear the leader (its requests are held back) from the moment
/// the lock is taken away, yet the loss reaches it. Once the store hears it again, the
/// `Demoted` event gives the reason the store tells.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub async fn a_loss_ends_the_term_before_the_store_is_asked_why<S: Store>() {
    let (store, _server) = S::start().await;
    // A long ttl: the renew deadline (2/3 of it) is far from the instants measured here.
    let ttl = Duration::from_secs(10).max(store.ttl());
    let (backend, deaf) = store.connect_deaf_store().await;
    let mut leader = Local::start(election(backend.clone(), "a", ttl));
    let term = elected(&mut leader.events, ttl).await;
    // Let the leader settle, so that its watch is in place before its requests are held.
    sleep(Duration::from_millis(500)).await;
    deaf.cut();
    let reason = store.take_the_lock_away(&backend).await;
    let taken = Instant::now();
    // Asking the store why would hang until the heal below.
    let heal_after = Duration::from_secs(2);
    assert!(
        timeout(heal_after / 2, term.cancelled()).await.is_ok(),
        "the term outlived the loss by {:?}: it waits for the store",
        taken.elapsed()
    );
    println!("term cancelled {:?} after the loss", taken.elapsed());
    sleep(heal_after.saturating_sub(taken.elapsed())).await;
    deaf.heal();
    assert_eq!(demoted(&mut leader.events, ttl).await, reason);
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only etcd restarts with its data
pub async fn re_election_after_the_store_restarts<S: Store>() {
    let (store, mut server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Local::start(election(store.connect().await, "a", ttl));
    let first = elected(&mut a.events, ttl * 5).await;
    let b = Local::start(election(store.connect().await, "b", ttl));
    sleep(ttl / 2).await;
    S::restart(&mut server).await;
    // Whatever the store lost, within a few ttls exactly one candidate leads again, and the
    // store agrees on who. Leadership may still move once meanwhile (a leader whose renewals
    // stopped during the restart fences itself, and its lease expires), so the two views are
    // compared until they agree, never two leaders at once.
    let probe = store.connect().await;
    let deadline = Instant::now() + ttl * 6;
    let leader = loop {
        let leaders: Vec<_> = [&a, &b]
            .iter()
            .map(|c| c.campaign.status().borrow().clone())
            .filter(|s| s.is_leader())
            .collect();
        assert!(leaders.len() <= 1, "two leaders after the restart");
        if let [status] = leaders.as_slice()
            && let Some(holder) = holder_now(&probe, ttl).await
            && holder.candidate.id == status.candidate.id
        {
            break status.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no leader that the store agrees on within {:?} of the restart",
            ttl * 6
        );
        sleep(Duration::from_millis(50)).await;
    };
    let term = leader.term.expect("a leader has a term");
    let same_term =
        term.fencing_token() == first.fencing_token() && term.started() == first.started();
    if !same_term {
        assert!(
            term.fencing_token() > first.fencing_token(),
            "a new term needs a greater token"
        );
    }
}

/// The holder as the store names it now, through a new observer's first answer.
async fn holder_now<B: Backend>(backend: &B, ttl: Duration) -> Option<Leader> {
    let mut observer = backend.observe(ELECTION).await.ok()?;
    timeout(ttl, observer.next()).await.ok()?.ok()?
}

pub async fn a_worker_ignoring_cancellation_is_stopped_before_another_leads<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let beats: Beats = Arc::default();
    let (a_backend, partition) = store.connect_partitionable().await;
    // A grace far beyond the ttl: the hard stop must come from the lease, not the grace.
    let settings = |backend, id| {
        Election::builder(backend, ELECTION)
            .candidate(id)
            .ttl(ttl)
            .backoff(Duration::from_millis(50), Duration::from_millis(500))
            .grace(Duration::from_secs(60))
            .build()
            .expect("valid settings")
    };
    let a = settings(a_backend, "a");
    let run_a = tokio::spawn({
        let w = stubborn(beats.clone());
        async move { a.run(w).await }
    });
    let deadline = Instant::now() + ttl * 3;
    while first_token(&beats).is_none() {
        assert!(Instant::now() < deadline, "a never led");
        sleep(Duration::from_millis(10)).await;
    }
    let a_token = first_token(&beats).expect("a led");
    let b = settings(store.connect().await, "b");
    let run_b = tokio::spawn({
        let w = stubborn(beats.clone());
        async move { b.run(w).await }
    });
    sleep(ttl / 2).await;
    partition.cut();
    let deadline = Instant::now() + ttl * 4;
    let b_first = loop {
        if let Some(at) = first_beat_of_another(&beats, a_token) {
            break at;
        }
        assert!(Instant::now() < deadline, "b never led");
        sleep(Duration::from_millis(10)).await;
    };
    let a_last = last_beat(&beats, a_token).expect("a's beats");
    assert!(
        a_last < b_first,
        "a's worker still ran {:?} after b's began",
        a_last - b_first
    );
    partition.heal();
    run_a.abort();
    run_b.abort();
}

pub async fn the_status_stops_saying_leader_with_the_term<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = election(store.connect().await, "a", ttl).campaign();
    let term = elected(&mut a, ttl * 3).await;
    let guard = term.hold(); // the work winds down slowly: the hand-off waits for it
    let status = a.status();
    let snapshot = status.borrow().clone();
    assert!(snapshot.is_leader());
    let resigning = tokio::spawn({
        let handle = a.handle();
        async move { handle.resign().await }
    });
    term.cancelled().await;
    assert!(
        !snapshot.is_leader(),
        "a snapshot stops saying leader with the term"
    );
    assert_eq!(snapshot.current_role(), incumbent::Role::SteppingDown);
    sleep(Duration::from_millis(200)).await;
    let now = status.borrow().clone();
    assert!(!now.is_leader());
    assert_eq!(
        now.role,
        incumbent::Role::SteppingDown,
        "winding down, visibly"
    );
    assert!(!resigning.is_finished(), "the release waits for the guard");
    drop(guard);
    timeout(ttl * 2, resigning)
        .await
        .expect("resigned in time")
        .expect("join")
        .expect("resign");
    a.shutdown().await.expect("shutdown");
}

pub async fn the_leader_proclaims_metadata_that_everyone_reads<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut observer = store
        .connect()
        .await
        .observe(ELECTION)
        .await
        .expect("observe");
    let mut a = election(store.connect().await, "a", ttl).campaign();
    let term = elected(&mut a, ttl * 5).await;
    let mut b = election(store.connect().await, "b", ttl).campaign();
    let metadata: std::collections::BTreeMap<String, String> =
        [("addr".to_owned(), "10.0.0.7:9000".to_owned())].into();

    let refused = b.proclaim(metadata.clone()).await;
    assert!(
        matches!(refused, Err(incumbent::Error::NotLeader)),
        "a follower cannot proclaim: {refused:?}"
    );
    a.proclaim(metadata.clone())
        .await
        .expect("the leader proclaims");
    assert!(!term.is_cancelled(), "proclaiming does not end the term");
    let status = a.status().borrow().clone();
    assert_eq!(status.candidate.metadata, metadata);
    assert_eq!(
        status.leader.map(|l| l.candidate.metadata),
        Some(metadata.clone())
    );

    // Observers (a polling one included) read the new metadata, under the same term.
    let seen = timeout(ttl * 5, async {
        loop {
            match observer.next().await.expect("observer") {
                Some(l) if l.candidate.metadata == metadata => return l,
                _ => {}
            }
        }
    })
    .await
    .expect("the observer reads the proclaimed metadata");
    assert_eq!(seen.candidate.id, "a");
    if let Some(token) = seen.fencing_token {
        assert_eq!(token, term.fencing_token(), "same term, same token");
    }

    // The metadata stays for the campaign's later terms.
    a.resign().await.expect("resign");
    elected(&mut b, ttl * 5).await;
    b.shutdown().await.expect("shutdown b");
    let again = elected(&mut a, ttl * 5).await;
    assert!(again.fencing_token() > term.fencing_token());
    assert_eq!(again.leader().candidate.metadata, metadata);
    a.shutdown().await.expect("shutdown a");
}

// --- Planned switchover ----------------------------------------------------------------

/// Waits until the campaign says follower.
async fn follows(campaign: &CampaignHandle, patience: Duration) {
    let mut status = campaign.status();
    timeout(
        patience,
        status.wait_for(|s| s.role == incumbent::Role::Follower),
    )
    .await
    .expect("follows in time")
    .expect("the campaign lives");
}

/// Whether any of the events waiting in `events` is an election.
fn led(events: &mut mpsc::UnboundedReceiver<LeadershipEvent>) -> bool {
    let mut led = false;
    while let Ok(event) = events.try_recv() {
        led |= matches!(event, LeadershipEvent::Elected(_));
    }
    led
}

/// `a` leads, `b` and `c` follow; `a` hands over to `c`, whose work waits 300 ms to stop: `c`
/// leads, with a greater token, only after `a`'s work has stopped; `a`'s term ends as
/// handed over; `b` never leads meanwhile, and everyone follows `c` afterwards.
pub async fn hand_over_to_a_named_candidate<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Local::start(election(store.connect().await, "a", ttl));
    let first = elected(&mut a.events, ttl * 5).await;
    let stopped: Arc<Mutex<Option<Instant>>> = Arc::default();
    let guard = first.hold();
    let (term, record) = (first.clone(), stopped.clone());
    tokio::spawn(async move {
        term.cancelled().await;
        sleep(Duration::from_millis(300)).await;
        *record.lock().expect("not poisoned") = Some(Instant::now());
        drop(guard);
    });
    let mut b = Local::start(election(store.connect().await, "b", ttl));
    let mut c = Local::start(election(store.connect().await, "c", ttl));
    follows(&b.campaign, ttl * 5).await;
    follows(&c.campaign, ttl * 5).await;
    let asked = Instant::now();
    let done = a.campaign.hand_over("c").await.expect("handed over");
    assert_eq!(done.to, "c");
    assert!(first.is_cancelled());
    assert_eq!(
        demoted(&mut a.events, ttl).await,
        DemotionReason::HandedOver
    );
    let second = elected(&mut c.events, ttl).await;
    let work_stopped = stopped
        .lock()
        .expect("not poisoned")
        .expect("the old work stopped before the hand-over returned");
    assert!(
        second.started() >= work_stopped,
        "c began {:?} before a's work stopped",
        work_stopped - second.started()
    );
    assert!(
        second.fencing_token() > first.fencing_token(),
        "{} then {}",
        first.fencing_token(),
        second.fencing_token()
    );
    assert_eq!(
        done.fencing_token.unwrap_or(second.fencing_token()),
        second.fencing_token()
    );
    println!("hand-over to c: {:?}", asked.elapsed());
    assert!(!led(&mut b.events), "b led during the hand-over to c");
    follows(&b.campaign, ttl * 5).await;
    follows(&a.campaign, ttl * 5).await;
    assert!(c.campaign.status().borrow().is_leader());
    assert!(!led(&mut b.events) && !led(&mut a.events));
}

/// A hand-over to a candidate that is not live (never was, or yields) is refused with
/// `NotACandidate`, and the leader's term goes on.
pub async fn a_hand_over_to_a_candidate_that_is_not_live_is_refused<S: Store>() {
    use incumbent::{Error, HandOverError};
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Local::start(election(store.connect().await, "a", ttl));
    let first = elected(&mut a.events, ttl * 5).await;
    let b = Local::start(election(store.connect().await, "b", ttl));
    follows(&b.campaign, ttl * 5).await;
    let refused = a.campaign.hand_over("nobody").await;
    assert!(
        matches!(refused, Err(Error::HandOver(HandOverError::NotACandidate { ref to, .. })) if to == "nobody"),
        "{refused:?}"
    );
    assert!(!first.is_cancelled(), "a refused hand-over ended the term");
    b.campaign
        .resign_for(ttl * 10)
        .await
        .expect("b yields for a while");
    let refused = a.campaign.hand_over("b").await;
    assert!(
        matches!(
            refused,
            Err(Error::HandOver(HandOverError::NotACandidate { .. }))
        ),
        "{refused:?}"
    );
    assert!(!first.is_cancelled(), "a refused hand-over ended the term");
    assert!(a.campaign.status().borrow().is_leader());
    // A hand-over to the leader itself is done at once, and changes nothing.
    let itself = a.campaign.hand_over("a").await.expect("a leads already");
    assert_eq!(itself.fencing_token, Some(first.fencing_token()));
    assert!(!first.is_cancelled());
}

/// The target dies right before the hand-over (its record still in the store): the
/// reservation lapses after the window, and an open election follows, won by another with
/// a greater token. Where the store frees a dead process's records at once (the file
/// backend), the hand-over is refused instead, and `a` leads on.
pub async fn a_hand_over_to_a_target_that_died_lapses_into_an_open_election<S: Store>() {
    use incumbent::{Error, HandOverError};
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Local::start(election(store.connect().await, "a", ttl));
    let first = elected(&mut a.events, ttl * 5).await;
    let mut b = Local::start(election(store.connect().await, "b", ttl));
    follows(&b.campaign, ttl * 5).await;
    let mut c = Crashable::start(&store, "c");
    // c campaigns, and follows.
    sleep(ttl / 2).await;
    c.crash();
    let asked = Instant::now();
    match a.campaign.hand_over("c").await {
        Err(Error::HandOver(HandOverError::Lapsed { to, now, .. })) => {
            assert_eq!(to, "c");
            println!(
                "a hand-over to a dead target lapsed after {:?} (now: {now:?})",
                asked.elapsed()
            );
            let next = tokio::select! {
                term = elected(&mut a.events, ttl * 3) => term,
                term = elected(&mut b.events, ttl * 3) => term,
            };
            assert!(next.fencing_token() > first.fencing_token());
            println!("an open election after the lapse: {:?}", asked.elapsed());
        }
        Err(Error::HandOver(HandOverError::NotACandidate { .. })) => {
            assert!(!first.is_cancelled(), "a refused hand-over ended the term");
        }
        other => panic!("a hand-over to a dead target: {other:?}"),
    }
}

/// Two more hand-overs, to another target, while one is under way (the old leader's work
/// takes 500 ms to stop): one asked of the leader, one through the store. The first is done;
/// both others get a clear error (in progress, or superseded once it is done), and one
/// candidate leads.
pub async fn two_concurrent_hand_overs_give_one_winner_and_one_error<S: Store>() {
    use incumbent::{Error, HandOverError};
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Local::start(election(store.connect().await, "a", ttl));
    let first = elected(&mut a.events, ttl * 5).await;
    let guard = first.hold();
    let term = first.clone();
    tokio::spawn(async move {
        term.cancelled().await;
        sleep(Duration::from_millis(500)).await;
        drop(guard);
    });
    let b = Local::start(election(store.connect().await, "b", ttl));
    let c = Local::start(election(store.connect().await, "c", ttl));
    follows(&b.campaign, ttl * 5).await;
    follows(&c.campaign, ttl * 5).await;
    let bystander = election(store.connect().await, "bystander", ttl);
    let refused = |outcome: &incumbent::Result<incumbent::HandedOver>| {
        matches!(
            outcome,
            Err(Error::HandOver(
                HandOverError::InProgress { .. } | HandOverError::Superseded { .. }
            ))
        )
    };
    let (first_asked, again, through_store) = tokio::join!(
        a.campaign.hand_over("b"),
        async {
            sleep(Duration::from_millis(100)).await;
            a.campaign.hand_over("c").await
        },
        async {
            sleep(Duration::from_millis(100)).await;
            bystander.hand_over("c", None, ttl * 10).await
        }
    );
    assert_eq!(first_asked.expect("the first hand-over is done").to, "b");
    assert!(refused(&again), "asked of the leader again: {again:?}");
    assert!(
        refused(&through_store),
        "through the store: {through_store:?}"
    );
    sleep(ttl / 2).await;
    let leaders: Vec<bool> = [&a, &b, &c]
        .iter()
        .map(|l| l.campaign.status().borrow().is_leader())
        .collect();
    assert_eq!(leaders, [false, true, false]);
}

/// `b` has a higher priority than `a`, which leads: once `b` has followed for its settle
/// time, `a` hands over to it; `a` does not take it back.
pub async fn a_preferred_candidate_gets_the_lead<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let mut a = Local::start(election(store.connect().await, "a", ttl));
    let first = elected(&mut a.events, ttl * 5).await;
    let settle = ttl;
    let preferred = Election::builder(store.connect().await, ELECTION)
        .candidate("b")
        .ttl(ttl)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .priority_with_settle(1, settle)
        .build()
        .expect("valid settings");
    let started = Instant::now();
    let mut b = Local::start(preferred);
    let second = elected(&mut b.events, settle + ttl * 5).await;
    assert!(
        started.elapsed() >= settle,
        "b asked before its settle time"
    );
    assert!(second.fencing_token() > first.fencing_token());
    assert_eq!(
        demoted(&mut a.events, ttl).await,
        DemotionReason::HandedOver
    );
    sleep(settle * 2).await;
    assert!(
        b.campaign.status().borrow().is_leader(),
        "leadership flapped"
    );
    assert!(!second.is_cancelled());
}

/// A campaign shut down at any moment of its start, its first write maybe in flight, leaves
/// nothing in the store: no key or node in the line, held by nobody's campaign while the
/// process's session lives on (another election keeps it). Sharded elections start and stop
/// campaigns at this pace when shards move.
pub async fn a_campaign_stopped_as_it_begins_leaves_nothing_behind<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let backend = store.connect().await;
    // Keeps the process's session alive, as the other shards of a member do.
    let keeper = Election::builder(backend.clone(), "conformance/keeper")
        .candidate("a")
        .ttl(ttl)
        .build()
        .expect("valid")
        .campaign();
    for round in 0..40u64 {
        let campaign = election(backend.clone(), "a", ttl).campaign();
        // From no wait at all to a few milliseconds: the shutdown lands before, during and
        // after the first write.
        sleep(Duration::from_micros((round * 337) % 6_000)).await;
        timeout(ttl * 2, campaign.shutdown())
            .await
            .expect("shut down in time")
            .expect("shutdown");
    }
    let holder = holder_after_settling(&store, ttl / 2).await;
    assert!(holder.is_none(), "left behind as holder: {holder:?}");
    if let Some(line) = backend.participants(ELECTION).await.expect("list") {
        assert!(line.is_empty(), "left in the line: {line:?}");
    }
    // And another process wins at once, long before the keeper's session could expire.
    let mut b = election(store.connect().await, "b", ttl).campaign();
    elected(&mut b, ttl / 2).await;
    b.shutdown().await.expect("shutdown b");
    keeper.shutdown().await.expect("shutdown keeper");
}

/// The contract under a cancelled `acquire`: whenever the future is dropped (before its first
/// write, with a write in flight, after the answer), `release` leaves nothing in the store,
/// and the next candidate wins at once. Each round polls `acquire` a few more times before
/// dropping it, with the store's answers arriving in between.
pub async fn a_release_after_a_cancelled_acquire_leaves_nothing<S: Store>() {
    let (store, _server) = S::start().await;
    let ttl = store.ttl();
    let backend = store.connect().await;
    let options = session_options(ttl, "cancelled");
    let session = backend.open_session(&options).await.expect("a session");
    let candidate = Candidate {
        id: "a".into(),
        metadata: Default::default(),
    };
    for polls in 0..48 {
        let mut contender = session
            .contend(ELECTION, &candidate)
            .await
            .expect("contend");
        {
            let acquire = contender.acquire();
            tokio::pin!(acquire);
            for _ in 0..polls {
                tokio::select! {
                    biased;
                    _ = &mut acquire => break,
                    () = std::future::ready(()) => {}
                }
                // Let the store's answer (if any) come in on the runtime's other thread.
                std::thread::sleep(Duration::from_micros(150));
            }
        }
        timeout(ttl, contender.release())
            .await
            .expect("released in time")
            .expect("release");
        drop(contender);
        let holder = holder_after_settling(&store, ttl / 2).await;
        assert!(
            holder.is_none(),
            "after {polls} polls: left behind: {holder:?}"
        );
        if let Some(line) = backend.participants(ELECTION).await.expect("list") {
            assert!(
                line.is_empty(),
                "after {polls} polls: left in the line: {line:?}"
            );
        }
    }
    session.close().await.expect("close");
}

/// The holder of [`ELECTION`] once it is nobody, or after `limit`. Nobody at once on most
/// stores; the file backend takes its lock on a blocking thread that a dropped future does
/// not stop, and lets go as soon as that thread is done. The session lives on in these
/// tests: anything still there after `limit` would stay for as long as it does.
async fn holder_after_settling<S: Store>(store: &S, limit: Duration) -> Option<Leader> {
    let deadline = Instant::now() + limit;
    let mut holder = store_holder(store).await;
    while holder.is_some() && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
        holder = store_holder(store).await;
    }
    holder
}

/// The holder of [`ELECTION`], read once through a new observer.
async fn store_holder<S: Store>(store: &S) -> Option<Leader> {
    let mut observer = store
        .connect()
        .await
        .observe(ELECTION)
        .await
        .expect("observe");
    observer.next().await.expect("read")
}
