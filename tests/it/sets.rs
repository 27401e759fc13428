//! `ElectionSet`: many elections on one session, driven by one task. Its promises, checked
//! deterministically on the memory backend with paused time (and on etcd in `etcd.rs`).

use std::collections::HashMap;
use std::time::Duration;

use incumbent::memory::{MemoryBackend, Reachability};
use incumbent::{
    DemotionReason, Election, ElectionSet, Error, LeadershipEvent, SetEvent, SetEvents, Term,
};
use tokio::time::{Instant, sleep, timeout};

use crate::support::events::{self, EventSource, demotion, member};

const TTL: Duration = Duration::from_secs(3);
const LIMIT: Duration = Duration::from_secs(30);

fn set(backend: &MemoryBackend, id: &str) -> ElectionSet {
    Election::builder(backend.clone(), "tenants")
        .candidate(id)
        .ttl(TTL)
        .backoff(Duration::from_millis(100), Duration::from_secs(2))
        .grace(Duration::from_secs(1))
        .build()
        .expect("valid settings")
        .set()
}

/// A set of `id` on `store` that leads `name`: the set, its events, and the term.
async fn leading(store: &MemoryBackend, id: &str, name: &str) -> (ElectionSet, SetEvents, Term) {
    let set = set(store, id);
    let mut events = set.events();
    set.join(name).expect("a valid name");
    let term = elected(&mut events, name).await;
    (set, events, term)
}

/// The next event of `election`, skipping the others'.
async fn next_of(events: &mut SetEvents, election: &str) -> LeadershipEvent {
    timeout(LIMIT, member(events, election).next_event())
        .await
        .unwrap_or_else(|_| panic!("no event of {election} within {LIMIT:?}"))
        .expect("the set runs")
}

async fn elected(events: &mut SetEvents, election: &str) -> Term {
    events::elected(&mut member(events, election), LIMIT).await
}

async fn demoted(events: &mut SetEvents, election: &str) -> (DemotionReason, Option<Instant>) {
    demotion(&mut member(events, election), LIMIT).await
}

/// Reads events until each of `names` was demoted (`.0`: with why, and by when its work must
/// stop), and, if `again`, elected after that (`.1`), in whatever order the set reports them.
async fn demotions(
    events: &mut SetEvents,
    names: &[&str],
    again: bool,
) -> (
    HashMap<String, (DemotionReason, Option<Instant>)>,
    HashMap<String, Term>,
) {
    let (mut demoted, mut elected) = (HashMap::new(), HashMap::new());
    timeout(LIMIT, async {
        while demoted.len() < names.len() || (again && elected.len() < names.len()) {
            let SetEvent { election, event } = events.recv().await.expect("the set runs");
            match event {
                LeadershipEvent::Demoted {
                    reason, stop_by, ..
                } => {
                    demoted.insert(election.to_string(), (reason, stop_by));
                }
                LeadershipEvent::Elected(term) if demoted.contains_key(&*election) => {
                    elected.insert(election.to_string(), term);
                }
                _ => {}
            }
        }
    })
    .await
    .expect("every member demoted (and elected again)");
    (demoted, elected)
}

#[tokio::test(start_paused = true)]
async fn every_member_leads_with_a_term_of_its_own_election() {
    let store = MemoryBackend::new();
    let a = set(&store, "a");
    let mut events = a.events();
    let names = ["tenants/acme", "tenants/globex", "tenants/initech"];
    for name in names {
        a.join(name).expect("a valid name");
    }
    a.join(names[0]).expect("joining again does nothing");
    assert_eq!(a.len(), 3);
    for name in names {
        let term = elected(&mut events, name).await;
        assert_eq!(term.election(), name);
        assert_eq!(term.leader().candidate.id, "a");
        assert!(term.fencing_token() > 0);
        assert!(a.is_leader(name));
        assert_eq!(store.holder(name).map(|l| l.candidate.id), Some("a".into()));
        assert_eq!(
            a.leader(name).map(|l| l.candidate.id.clone()),
            Some("a".into())
        );
    }
    assert_eq!(a.leading(), 3);
    assert!(!a.is_leader("tenants/other"), "not a member");
    assert_eq!(store.session_count(), 1, "one session for every member");
    a.shutdown().await.expect("shuts down");
    for name in names {
        assert_eq!(store.holder(name), None, "{name} released");
    }
}

#[tokio::test(start_paused = true)]
async fn a_bad_name_is_a_typed_error_and_a_stopped_set_takes_no_member() {
    let store = MemoryBackend::new();
    let a = set(&store, "a");
    assert!(matches!(a.join(""), Err(Error::InvalidElectionName { .. })));
    assert!(matches!(
        a.join(&"x".repeat(1000)),
        Err(Error::InvalidElectionName { .. })
    ));
    let mut events = a.events();
    a.join("tenants/acme").expect("valid");
    elected(&mut events, "tenants/acme").await;
    let b = set(&store, "b");
    drop(b); // dropped: it shuts down in the background, and holds nothing
    a.shutdown().await.expect("shuts down");
    assert!(
        timeout(LIMIT, async { while events.recv().await.is_some() {} })
            .await
            .is_ok(),
        "the events end once the set has stopped"
    );
}

#[tokio::test(start_paused = true)]
async fn a_follower_set_takes_over_when_the_leader_leaves_and_its_term_begins_after() {
    let store = MemoryBackend::new();
    let a = set(&store.client(), "a");
    let b = set(&store.client(), "b");
    let (mut a_events, mut b_events) = (a.events(), b.events());
    a.join("tenants/acme").expect("valid");
    let a_term = elected(&mut a_events, "tenants/acme").await;
    b.join("tenants/acme").expect("valid");
    loop {
        if let LeadershipEvent::LeaderChanged(Some(leader)) =
            next_of(&mut b_events, "tenants/acme").await
        {
            assert_eq!(leader.candidate.id, "a");
            break;
        }
    }
    assert!(!b.is_leader("tenants/acme"));
    assert_eq!(
        b.leader("tenants/acme").map(|l| l.candidate.id.clone()),
        Some("a".into())
    );
    let leaving = a.leave("tenants/acme");
    assert!(a_term.is_cancelled(), "the term ends at the call");
    assert!(!a.is_leader("tenants/acme"));
    let (reason, stop_by) = demoted(&mut a_events, "tenants/acme").await;
    assert_eq!((reason, stop_by), (DemotionReason::Shutdown, None));
    leaving.await.expect("left");
    assert_eq!(a.len(), 0);
    let b_term = elected(&mut b_events, "tenants/acme").await;
    assert!(b_term.fencing_token() > a_term.fencing_token());
    assert!(b_term.started() >= Instant::now() - Duration::from_secs(1));
    a.shutdown().await.expect("stops");
    b.shutdown().await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn a_leave_waits_for_the_terms_guards_up_to_the_grace_before_the_release() {
    let store = MemoryBackend::new();
    let (a, mut events, term) = leading(&store, "a", "tenants/acme").await;
    let guard = term.hold();
    let started = Instant::now();
    let leaving = tokio::spawn(a.leave("tenants/acme"));
    sleep(Duration::from_millis(500)).await;
    assert!(term.is_cancelled());
    assert!(
        store.holder("tenants/acme").is_some(),
        "held while the guard is"
    );
    drop(guard);
    leaving.await.expect("joins").expect("left");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "released once the guard went"
    );
    assert_eq!(store.holder("tenants/acme"), None);

    // A guard that is never dropped holds the lock for the grace, then the work must stop.
    a.join("tenants/globex").expect("valid");
    let term = elected(&mut events, "tenants/globex").await;
    let _stuck = term.hold();
    let started = Instant::now();
    a.leave("tenants/globex").await.expect("left");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited for the grace"
    );
    assert!(
        timeout(Duration::ZERO, term.must_stop()).await.is_ok(),
        "halted at the grace's end"
    );
    assert_eq!(store.holder("tenants/globex"), None);
    a.shutdown().await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn a_deleted_key_ends_only_that_members_term_and_it_leads_again_with_a_greater_token() {
    let store = MemoryBackend::new();
    let a = set(&store, "a");
    let mut events = a.events();
    a.join("tenants/acme").expect("valid");
    a.join("tenants/globex").expect("valid");
    let acme = elected(&mut events, "tenants/acme").await;
    let globex = elected(&mut events, "tenants/globex").await;
    store.delete("tenants/acme");
    let (reason, stop_by) = demoted(&mut events, "tenants/acme").await;
    assert_eq!(reason, DemotionReason::KeyDeleted);
    assert!(
        stop_by.is_some(),
        "an involuntary loss says when the work must stop"
    );
    assert!(acme.is_cancelled());
    assert!(
        timeout(Duration::ZERO, acme.must_stop()).await.is_ok(),
        "at once: the lock is gone"
    );
    assert!(!globex.is_cancelled(), "the other member's term goes on");
    let again = elected(&mut events, "tenants/acme").await;
    assert!(again.fencing_token() > acme.fencing_token());
    a.shutdown().await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn a_lock_taken_by_another_ends_the_term_and_the_member_follows() {
    let store = MemoryBackend::new();
    let (a, mut events, term) = leading(&store, "a", "tenants/acme").await;
    let intruder = incumbent::Leader {
        candidate: incumbent::Candidate {
            id: "intruder".into(),
            metadata: Default::default(),
        },
        fencing_token: None,
        since_unix_ms: None,
    };
    store.force_holder("tenants/acme", intruder);
    let (reason, _) = demoted(&mut events, "tenants/acme").await;
    assert_eq!(reason, DemotionReason::LockTaken);
    assert!(term.is_cancelled());
    assert!(!a.is_leader("tenants/acme"));
    loop {
        if let LeadershipEvent::LeaderChanged(Some(l)) = next_of(&mut events, "tenants/acme").await
        {
            assert_eq!(l.candidate.id, "intruder");
            break;
        }
    }
    store.delete("tenants/acme");
    let again = elected(&mut events, "tenants/acme").await;
    assert!(again.fencing_token() > term.fencing_token());
    a.shutdown().await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn an_expired_session_ends_every_term_and_the_set_starts_over_on_a_new_one() {
    let store = MemoryBackend::new();
    let a = set(&store, "a");
    let mut events = a.events();
    let names = ["tenants/acme", "tenants/globex"];
    let mut terms = Vec::new();
    for name in names {
        a.join(name).expect("valid");
        terms.push(elected(&mut events, name).await);
    }
    store.expire_sessions();
    let (demoted, again) = demotions(&mut events, &names, true).await;
    for (name, term) in names.iter().zip(&terms) {
        let (reason, stop_by) = demoted[*name];
        assert_eq!(reason, DemotionReason::SessionExpired);
        assert!(stop_by.is_some());
        assert!(term.is_cancelled());
        assert!(again[*name].fencing_token() > term.fencing_token());
    }
    assert_eq!(
        store.session_count(),
        1,
        "the old session is gone, one new one"
    );
    a.shutdown().await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn a_cut_off_set_ends_every_term_at_the_renew_deadline_before_the_lease_can_lapse() {
    let store = MemoryBackend::new();
    let client = store.client();
    let a = set(&client, "a");
    let mut events = a.events();
    let names = ["tenants/acme", "tenants/globex"];
    let mut terms = Vec::new();
    for name in names {
        a.join(name).expect("valid");
        terms.push(elected(&mut events, name).await);
    }
    client.set_reachability(Reachability::Hanging);
    let cut = Instant::now();
    let (demoted, _) = demotions(&mut events, &names, false).await;
    for (name, term) in names.iter().zip(&terms) {
        let (reason, stop_by) = demoted[*name];
        assert_eq!(reason, DemotionReason::RenewDeadlineExceeded);
        assert!(term.is_cancelled());
        let stop_by = stop_by.expect("an involuntary loss says when the work must stop");
        // The lease lapses a ttl after the last renewal confirmed before the cut: the term
        // ended, and the work must stop, before that.
        assert!(
            stop_by < cut + TTL,
            "the work stops before the lease can lapse"
        );
        assert!(
            Instant::now() < stop_by,
            "ended {:?} after the cut",
            cut.elapsed()
        );
        assert_eq!(term.stop_by(), Some(stop_by));
    }
    for term in &terms {
        let stop_by = term.stop_by().expect("set");
        assert!(
            tokio::time::timeout_at(stop_by + Duration::from_millis(1), term.must_stop())
                .await
                .is_ok(),
            "must_stop completes at stop_by"
        );
    }
    assert_eq!(a.leading(), 0);
    client.set_reachability(Reachability::Reachable);
    let mut again = HashMap::new();
    timeout(LIMIT, async {
        while again.len() < names.len() {
            if let Some(SetEvent {
                election,
                event: LeadershipEvent::Elected(term),
            }) = events.recv().await
            {
                again.insert(election.to_string(), term);
            }
        }
    })
    .await
    .expect("every member elected again");
    for (name, term) in names.iter().zip(&terms) {
        assert!(again[*name].fencing_token() > term.fencing_token());
    }
    a.shutdown().await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn a_member_joined_again_while_leaving_campaigns_again_once_released() {
    let store = MemoryBackend::new();
    let (a, mut events, first) = leading(&store, "a", "tenants/acme").await;
    let guard = first.hold();
    let leaving = a.leave("tenants/acme");
    a.join("tenants/acme").expect("joins again");
    drop(guard);
    leaving.await.expect("the leave completes");
    let again = elected(&mut events, "tenants/acme").await;
    assert!(again.fencing_token() > first.fencing_token());
    assert_eq!(a.len(), 1);
    a.shutdown().await.expect("stops");
    assert_eq!(store.holder("tenants/acme"), None);
}

/// A resign ends the term at the call (reported as `Resigned`), gives a follower the lock
/// first, and the member campaigns again: it leads once the follower leaves, with a greater
/// token.
#[tokio::test(start_paused = true)]
async fn a_resign_ends_the_term_at_the_call_hands_the_lock_on_and_campaigns_again() {
    let store = MemoryBackend::new();
    let (a, mut a_events, first) = leading(&store, "a", "tenants/acme").await;
    let b = set(&store, "b");
    let mut b_events = b.events();
    b.join("tenants/acme").expect("valid");
    sleep(Duration::from_millis(100)).await;
    let resigning = a.resign("tenants/acme");
    assert!(first.is_cancelled(), "the term ended at the call");
    assert!(!a.is_leader("tenants/acme"));
    resigning.await.expect("resigned");
    assert_eq!(
        demoted(&mut a_events, "tenants/acme").await.0,
        DemotionReason::Resigned
    );
    let b_term = elected(&mut b_events, "tenants/acme").await;
    assert!(b_term.fencing_token() > first.fencing_token());
    assert_eq!(a.len(), 1, "still a member");
    b.leave("tenants/acme").await.expect("left");
    let again = elected(&mut a_events, "tenants/acme").await;
    assert!(again.fencing_token() > b_term.fencing_token());
    assert!(
        a.resign("tenants/other").await.is_ok(),
        "not a member: nothing to do"
    );
    a.shutdown().await.expect("stops");
    b.shutdown().await.expect("stops");
}

/// A join that comes while a leave ends, from another thread, is never lost: the member
/// either goes and is joined anew, or stays and campaigns again. Two ways lost it before: a
/// member left before its first claim was made went, whatever a join had asked meanwhile;
/// and a join could find the member between the set's decision that it goes and its
/// removal. Sharded members then held shards in their map that they never campaigned for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_racing_the_end_of_a_leave_is_never_lost() {
    let store = MemoryBackend::new();
    let a = Election::builder(store.clone(), "tenants")
        .candidate("a")
        .ttl(TTL)
        .backoff(Duration::from_millis(1), Duration::from_millis(10))
        .build()
        .expect("valid settings")
        .set();
    let names: Vec<String> = (0..64).map(|i| format!("tenants/{i}")).collect();
    for name in &names {
        a.join(name).expect("valid");
    }
    for round in 0..50 {
        for name in &names {
            drop(a.leave(name));
        }
        // Spread the joins over the leaves' ends.
        if round % 2 == 0 {
            tokio::task::yield_now().await;
        }
        for name in &names {
            a.join(name).expect("valid");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.leading() < names.len() && Instant::now() < deadline {
        sleep(Duration::from_millis(10)).await;
    }
    let lost: Vec<&String> = names.iter().filter(|n| !a.is_leader(n)).collect();
    assert!(lost.is_empty(), "joined last, not leading: {lost:?}");
    assert_eq!(a.len(), names.len());
    a.shutdown().await.expect("stops");
}

#[tokio::test(start_paused = true)]
async fn a_thousand_members_lead_on_one_session_without_polling() {
    let store = MemoryBackend::new();
    let a = set(&store, "a");
    for i in 0..1000 {
        a.join(&format!("shards/{i}")).expect("valid");
    }
    timeout(LIMIT, async {
        while a.leading() < 1000 {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("all lead");
    assert_eq!(store.session_count(), 1);
    let requests = store.requests();
    sleep(TTL * 10).await;
    let idle = store.requests() - requests;
    // The session's renewals only (three per ttl): nothing per member.
    assert!(idle <= 40, "{idle} requests in 10 ttls while idle");
    a.shutdown().await.expect("stops");
    assert_eq!(store.holder("shards/999"), None);
}
