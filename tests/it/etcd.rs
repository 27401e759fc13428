//! The etcd backend against real etcd servers: what is particular to etcd (revisions as
//! fencing tokens, predecessor watches, shared leases, operators deleting keys and revoking
//! leases, paused and restarted servers, credentials). The behaviour every backend shares is
//! in the conformance suite.

use std::time::Duration;

use crate::support::events::{demoted, elected, member};
use crate::support::{EtcdCluster, EtcdServer, Proxy};
use etcd_client::{Client, GetOptions, KeyValue};
use incumbent::backend::{
    Attempt, Backend, Candidate, Contender, Observer, Session, SessionOptions,
};
use incumbent::etcd::EtcdBackend;
use incumbent::{
    Campaign, DemotionReason, Election, ElectionSet, Error, Leader, LeadershipEvent, Role, SetEvent,
};
use tokio::time::{Instant, sleep, timeout};

/// The ttl of most tests: etcd's minimum, so that expiries come fast.
const TTL: Duration = Duration::from_secs(2);
/// How long any expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);

async fn connect(endpoints: &[String]) -> EtcdBackend {
    EtcdBackend::builder(endpoints.iter().cloned())
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to etcd")
}

fn election(
    backend: &EtcdBackend,
    name: &str,
    candidate: &str,
    ttl: Duration,
) -> Election<EtcdBackend> {
    Election::builder(backend.clone(), name)
        .candidate(candidate)
        .ttl(ttl)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100))
        .build()
        .expect("valid election")
}

/// A plain etcd client, as an operator (or etcdctl) would use it.
async fn operator(endpoints: &[String]) -> Client {
    Client::connect(endpoints, None)
        .await
        .expect("operator client")
}

/// The candidate keys of `election`, oldest first.
async fn candidates(client: &mut Client, backend: &EtcdBackend, election: &str) -> Vec<KeyValue> {
    let options = GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let mut response = client
        .get(backend.election_range(election), Some(options))
        .await
        .expect("read the candidates");
    response.take_kvs()
}

/// Fails if the campaign is demoted (or stops) within `period`.
async fn stays_leader(campaign: &mut Campaign, period: Duration) {
    let until = Instant::now() + period;
    while let Ok(event) = tokio::time::timeout_at(until, campaign.recv()).await {
        match event {
            Some(LeadershipEvent::LeaderChanged(_)) => {}
            other => panic!("expected to stay leader, got {other:?}"),
        }
    }
    assert!(campaign.status().borrow().is_leader());
}

/// Waits until `campaign` follows another leader.
async fn follows(campaign: &Campaign) {
    let mut status = campaign.status();
    timeout(PATIENCE, status.wait_for(|s| s.role == Role::Follower))
        .await
        .expect("follows within the patience")
        .expect("campaign running");
}

fn token(kv: &KeyValue) -> u64 {
    u64::try_from(kv.create_revision()).expect("positive revision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_among_three_candidates_on_separate_connections() {
    let etcd = EtcdServer::single().await;
    let mut campaigns = Vec::new();
    for id in ["a", "b", "c"] {
        let backend = connect(&etcd.endpoints()).await;
        campaigns.push(election(&backend, "one-leader", id, TTL).campaign());
    }
    let deadline = Instant::now() + PATIENCE;
    let settled = loop {
        let roles: Vec<Role> = campaigns.iter().map(|c| c.status().borrow().role).collect();
        let leaders = roles.iter().filter(|r| **r == Role::Leader).count();
        let followers = roles.iter().filter(|r| **r == Role::Follower).count();
        if leaders == 1 && followers == 2 {
            break true;
        }
        assert!(leaders <= 1, "two leaders at once: {roles:?}");
        if Instant::now() >= deadline {
            break false;
        }
        sleep(Duration::from_millis(20)).await;
    };
    assert!(settled, "no single leader with two followers");
    sleep(Duration::from_millis(500)).await;
    let statuses: Vec<_> = campaigns
        .iter()
        .map(|c| c.status().borrow().clone())
        .collect();
    let leader = statuses
        .iter()
        .find(|s| s.is_leader())
        .expect("still one leader");
    for status in &statuses {
        assert_eq!(
            status.leader.as_ref().map(|l| l.candidate.id.as_str()),
            Some(leader.candidate.id.as_str()),
            "{} sees another leader",
            status.candidate.id
        );
    }
    assert_eq!(statuses.iter().filter(|s| s.is_leader()).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_token_is_the_create_revision_and_grows_on_hand_off() {
    let etcd = EtcdServer::single().await;
    let mut client = operator(&etcd.endpoints()).await;
    let a_backend = connect(&etcd.endpoints()).await;
    let b_backend = connect(&etcd.endpoints()).await;
    let mut a = election(&a_backend, "fencing", "a", TTL).campaign();
    let first = elected(&mut a, PATIENCE).await;
    let keys = candidates(&mut client, &a_backend, "fencing").await;
    assert_eq!(keys.len(), 1);
    assert_eq!(first.fencing_token(), token(&keys[0]));

    let mut b = election(&b_backend, "fencing", "b", TTL).campaign();
    follows(&b).await;
    a.resign().await.expect("resign");
    let second = elected(&mut b, PATIENCE).await;
    assert!(
        second.fencing_token() > first.fencing_token(),
        "{} then {}",
        first.fencing_token(),
        second.fencing_token()
    );
    let keys = candidates(&mut client, &b_backend, "fencing").await;
    let leader = keys.first().expect("b's key");
    assert_eq!(second.fencing_token(), token(leader));
    // The new leader marks its key with the term's token and start just after winning
    // (off the hand-off's critical path).
    let stored = timeout(PATIENCE, async {
        loop {
            let keys = candidates(&mut client, &b_backend, "fencing").await;
            let stored = Leader::from_bytes(keys.first().expect("b's key").value());
            if stored.fencing_token.is_some() {
                return stored;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the key is marked with the term");
    assert_eq!(stored.candidate.id, "b");
    assert_eq!(stored.fencing_token, Some(second.fencing_token()));
    assert!(
        stored.since_unix_ms.is_some(),
        "the key says when the term began"
    );
}

fn session_options(name: &str) -> SessionOptions {
    SessionOptions {
        ttl: Duration::from_secs(3),
        renew_interval: Duration::from_secs(1),
        lock_delay: None,
        name: name.to_owned(),
    }
}

fn candidate(id: &str) -> Candidate {
    Candidate {
        id: id.to_owned(),
        metadata: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_after_resign_wakes_only_the_successor() {
    let etcd = EtcdServer::single().await;
    let mut sessions = Vec::new();
    let mut contenders = Vec::new();
    for id in ["first", "second", "third"] {
        let backend = connect(&etcd.endpoints()).await;
        let session = backend
            .open_session(&session_options(id))
            .await
            .expect("session");
        let mut contender = session
            .contend("herd", &candidate(id))
            .await
            .expect("contend");
        let attempt = contender.acquire().await.expect("acquire");
        match (id, &attempt) {
            ("first", Attempt::Won { .. }) => {}
            ("first", other) => panic!("first should win, got {other:?}"),
            (
                _,
                Attempt::Held {
                    holder: Some(holder),
                },
            ) => assert_eq!(holder.candidate.id, "first"),
            (_, other) => panic!("{id} should wait for first, got {other:?}"),
        }
        sessions.push(session);
        contenders.push(contender);
    }
    let third = contenders.pop().expect("third");
    let second = contenders.pop().expect("second");
    let mut first = contenders.pop().expect("first");
    let first_token = match first.acquire().await.expect("acquire again") {
        Attempt::Won { fencing_token } => fencing_token,
        other => panic!("acquire is idempotent while leading, got {other:?}"),
    };

    let third_waits = waits(third);
    let second_waits = waits(second);
    // Let both watches be established before the hand-off.
    sleep(Duration::from_millis(300)).await;
    first.release().await.expect("release");
    first.release().await.expect("releasing twice is a no-op");

    let mut second = timeout(PATIENCE, second_waits)
        .await
        .expect("the successor wakes")
        .expect("second's task");
    match second.acquire().await.expect("acquire") {
        Attempt::Won { fencing_token } => assert!(fencing_token > first_token),
        other => panic!("the successor should win, got {other:?}"),
    }
    sleep(Duration::from_millis(500)).await;
    assert!(
        !third_waits.is_finished(),
        "the third in line woke up too (herd effect)"
    );
    third_waits.abort();
    for session in sessions {
        session.close().await.expect("close");
    }
}

/// Opens a session for `id` on its own connection and queues it in `election`.
async fn queued(
    etcd: &EtcdServer,
    election: &str,
    id: &str,
) -> (
    <EtcdBackend as Backend>::Session,
    <<EtcdBackend as Backend>::Session as Session>::Contender,
    Attempt,
) {
    let backend = connect(&etcd.endpoints()).await;
    let session = backend
        .open_session(&session_options(id))
        .await
        .expect("session");
    let mut contender = session
        .contend(election, &candidate(id))
        .await
        .expect("contend");
    let attempt = contender.acquire().await.expect("acquire");
    (session, contender, attempt)
}

type Queued = (
    <EtcdBackend as Backend>::Session,
    <<EtcdBackend as Backend>::Session as Session>::Contender,
);

/// Queues "a" then "b" in `election`, each on its own connection: "a" holds it, "b" waits.
async fn holder_and_follower(etcd: &EtcdServer, election: &str) -> (Queued, Queued) {
    let (a_session, a, won) = queued(etcd, election, "a").await;
    assert!(matches!(won, Attempt::Won { .. }), "{won:?}");
    let (b_session, b, held) = queued(etcd, election, "b").await;
    assert!(matches!(held, Attempt::Held { .. }), "{held:?}");
    ((a_session, a), (b_session, b))
}

/// Runs `contender.wait()` in a task that hands the contender back once it returns.
fn waits<C: Contender + Send + 'static>(mut contender: C) -> tokio::task::JoinHandle<C> {
    tokio::spawn(async move {
        contender.wait().await.expect("wait");
        contender
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_sees_a_delete_that_happened_before_it_started() {
    let etcd = EtcdServer::single().await;
    let ((_a_session, mut a), (_b_session, mut b)) =
        holder_and_follower(&etcd, "early-delete").await;
    // The predecessor goes between b's read and b's watch.
    a.release().await.expect("release");
    timeout(PATIENCE, b.wait())
        .await
        .expect("the watch replays the delete")
        .expect("wait");
    assert!(matches!(
        b.acquire().await.expect("acquire"),
        Attempt::Won { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_in_line_whose_key_went_with_the_holders_does_not_win_on_the_old_key() {
    let etcd = EtcdServer::single().await;
    let mut client = operator(&etcd.endpoints()).await;
    let ((_a_session, _a), (_b_session, b)) = holder_and_follower(&etcd, "same-revision").await;
    let b_waits = waits(b);
    sleep(Duration::from_millis(300)).await;
    // An operator deletes the whole election in one revision: the holder's key and b's.
    let range = connect(&etcd.endpoints())
        .await
        .election_range("same-revision");
    let options = etcd_client::DeleteOptions::new().with_prefix();
    let deleted = client.delete(range, Some(options)).await.expect("delete");
    assert_eq!(deleted.deleted(), 2);
    let mut b = timeout(PATIENCE, b_waits)
        .await
        .expect("b wakes")
        .expect("b's task");
    let Attempt::Won { fencing_token } = b.acquire().await.expect("acquire") else {
        panic!("b is alone in the election and should win");
    };
    let backend = connect(&etcd.endpoints()).await;
    let keys = candidates(&mut client, &backend, "same-revision").await;
    assert_eq!(keys.len(), 1, "b wrote its key again: {keys:?}");
    assert_eq!(
        fencing_token,
        token(&keys[0]),
        "b's term is its new key's, not the deleted one's"
    );
}

/// `c` queues behind `a` (the holder) and `b`. `b` leaves, so `c` reads the queue again to
/// learn its new predecessor, `a`; and `a` leaves around that read. A delete of `a` committed
/// just after `c`'s read, and delivered before `c` names `a` as the key it waits for, must
/// not be dropped: it was (the view still wanted only `b`'s delete), and `c` waited for it
/// forever while first in line, with no leader in the election. The timing is the store's
/// and the scheduler's, so the rounds spread `a`'s release around `c`'s read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_sees_its_new_predecessor_go_right_after_its_read() {
    let etcd = EtcdServer::single().await;
    for round in 0..24u32 {
        let election = format!("new-predecessor-{round}");
        let ((a_session, a), (b_session, mut b)) = holder_and_follower(&etcd, &election).await;
        let (c_session, c, held) = queued(&etcd, &election, "c").await;
        assert!(matches!(held, Attempt::Held { .. }), "{held:?}");
        let c_waits = waits(c);
        sleep(Duration::from_millis(20)).await;
        b.release().await.expect("release b");
        let mut c = timeout(PATIENCE, c_waits)
            .await
            .expect("c sees its predecessor go")
            .expect("c's task");
        let yields = round % 8 * 16;
        let a_leaves = tokio::spawn(async move {
            let mut a = a;
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            a.release().await.expect("release a");
            a
        });
        if let Attempt::Held { .. } = c.acquire().await.expect("acquire") {
            timeout(PATIENCE, c.wait())
                .await
                .unwrap_or_else(|_| {
                    panic!("round {round}: c never saw the holder's delete, first in line")
                })
                .expect("wait");
        }
        assert!(
            matches!(c.acquire().await.expect("acquire"), Attempt::Won { .. }),
            "round {round}: c is alone in the election"
        );
        let a = a_leaves.await.expect("a's task");
        drop((a, b, c));
        for session in [a_session, b_session, c_session] {
            session.close().await.expect("close");
        }
    }
}

/// Writes a few keys outside any election, and compacts etcd's history up to the last.
async fn compact_past_now(client: &mut Client) {
    for n in 0..5 {
        client.put("noise", n.to_string(), None).await.expect("put");
    }
    let revision = client
        .get("noise", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    client.compact(revision, None).await.expect("compact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_survives_a_compacted_start_revision() {
    let etcd = EtcdServer::single().await;
    let mut client = operator(&etcd.endpoints()).await;
    let ((_a_session, mut a), (_b_session, b)) = holder_and_follower(&etcd, "compacted").await;
    // Move the store on and compact past b's read: b's view of the range is on the backend's
    // watch, which is live, so the compaction costs b nothing.
    compact_past_now(&mut client).await;

    let b_waits = waits(b);
    sleep(Duration::from_millis(500)).await;
    assert!(
        !b_waits.is_finished(),
        "b woke while its predecessor is still there"
    );
    a.release().await.expect("release");
    let mut b = timeout(PATIENCE, b_waits)
        .await
        .expect("b wakes on the delete")
        .expect("b's task");
    assert!(matches!(
        b.acquire().await.expect("acquire"),
        Attempt::Won { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observer_reports_the_holder_not_the_queue() {
    let etcd = EtcdServer::single().await;
    let backend = connect(&etcd.endpoints()).await;
    let mut observer = backend.observe("observed").await.expect("observe");
    assert_eq!(observer.next().await.expect("first read"), None);

    let (_a_session, mut a, _) = queued(&etcd, "observed", "a").await;
    let seen = timeout(PATIENCE, observer.next())
        .await
        .expect("a leads")
        .expect("next");
    assert_eq!(seen.map(|l| l.candidate.id), Some("a".to_owned()));

    let (_b_session, _b, _) = queued(&etcd, "observed", "b").await;
    let quiet = timeout(Duration::from_millis(500), observer.next()).await;
    assert!(
        quiet.is_err(),
        "a follower joining is not a change of leader: {quiet:?}"
    );

    a.release().await.expect("release");
    let seen = timeout(PATIENCE, observer.next())
        .await
        .expect("b leads")
        .expect("next");
    let b = seen.expect("a leader");
    assert_eq!(b.candidate.id, "b");
    assert!(b.fencing_token.is_some(), "observers see the fencing token");
}

/// Waits until `campaign` leads.
async fn leads(campaign: &Campaign) {
    let mut status = campaign.status();
    timeout(PATIENCE, status.wait_for(|s| s.is_leader()))
        .await
        .expect("leads within the patience")
        .expect("campaign running");
}

/// The leader `observer` reports next, within the patience.
async fn next_leader(observer: &mut impl Observer) -> Option<String> {
    let seen = timeout(PATIENCE, observer.next())
        .await
        .expect("a change seen");
    seen.expect("next").map(|leader| leader.candidate.id)
}

/// Once every campaign of a backend was asked to shut down, its one watch may stop (they act
/// on no change), but not for an observer of its own, nor for a campaign started afterwards:
/// each still hears of the next leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_stops_for_campaigns_asked_to_shut_down_and_for_nobody_else() {
    let (etcd, _client, here) = etcd_alone().await;
    let there = connect(&etcd.endpoints()).await;
    let first = election(&there, "e", "first", TTL).campaign();
    leads(&first).await;
    let mut observer = here.observe("e").await.expect("observe");
    assert_eq!(next_leader(&mut observer).await.as_deref(), Some("first"));

    // Every campaign of `here` asked to shut down: the observer is not one of them.
    let asked = election(&here, "e", "asked", TTL).campaign();
    follows(&asked).await;
    asked.shutdown().await.expect("shuts down");
    let second = election(&there, "e", "second", TTL).campaign();
    follows(&second).await;
    first.shutdown().await.expect("shuts down");
    assert_eq!(next_leader(&mut observer).await.as_deref(), Some("second"));
    drop(observer);

    // A campaign started afterwards, with no other view on `here`: its views keep the watch.
    let later = election(&here, "e", "later", TTL).campaign();
    follows(&later).await;
    second.shutdown().await.expect("shuts down");
    leads(&later).await;
    later.shutdown().await.expect("shuts down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_on_one_backend_share_one_lease() {
    let (_etcd, mut client, backend) = etcd_alone().await;
    let mut jobs = election(&backend, "shared/jobs", "host-a", TTL).campaign();
    let mut index = election(&backend, "shared/index", "host-a", TTL).campaign();
    elected(&mut jobs, PATIENCE).await;
    elected(&mut index, PATIENCE).await;

    let leases = client.leases().await.expect("lease list");
    assert_eq!(leases.leases().len(), 1, "one lease for both elections");
    let lease = leases.leases()[0].id();
    let jobs_keys = candidates(&mut client, &backend, "shared/jobs").await;
    let index_keys = candidates(&mut client, &backend, "shared/index").await;
    assert_eq!(jobs_keys[0].lease(), lease);
    assert_eq!(index_keys[0].lease(), lease);
    assert_eq!(
        String::from_utf8_lossy(jobs_keys[0].key()),
        format!("incumbent/shared/jobs@{lease:x}")
    );

    jobs.shutdown().await.expect("shutdown");
    assert_eq!(lease_count(&mut client).await, 1);
    assert!(
        index.status().borrow().is_leader(),
        "the other election still leads"
    );
    index.shutdown().await.expect("shutdown");
    assert_eq!(
        lease_count(&mut client).await,
        0,
        "the last session's close revokes the lease"
    );
}

/// `count` elections on one backend (so one lease), all led.
async fn leading_on_one_lease(backend: &EtcdBackend, name: &str, count: usize) -> Vec<Campaign> {
    let campaigns: Vec<Campaign> = (0..count)
        .map(|i| {
            election(
                backend,
                &format!("{name}/{i}"),
                "host-a",
                Duration::from_secs(4),
            )
            .campaign()
        })
        .collect();
    let until = Instant::now() + PATIENCE;
    while !campaigns.iter().all(|c| c.status().borrow().is_leader()) {
        assert!(Instant::now() < until, "{count} elections did not all lead");
        sleep(Duration::from_millis(20)).await;
    }
    campaigns
}

/// Shuts every campaign down at once, and returns when all are done. Each reaches its
/// release while `proxy` lets nothing pass: the first deletes take every request slot of the
/// backend, and the others queue.
async fn shut_down_all_at_once(proxy: &Proxy, campaigns: Vec<Campaign>) {
    proxy.blackhole(true);
    let mut stopping = tokio::task::JoinSet::new();
    for campaign in campaigns {
        stopping.spawn(campaign.shutdown());
    }
    sleep(Duration::from_millis(500)).await;
    proxy.blackhole(false);
    let stopped = timeout(PATIENCE, stopping.join_all())
        .await
        .expect("every campaign shuts down");
    assert!(stopped.iter().all(Result::is_ok), "{stopped:?}");
}

/// How many leases etcd holds.
async fn lease_count(client: &mut Client) -> usize {
    client.leases().await.expect("lease list").leases().len()
}

/// The keys left under the backend's prefix.
async fn keys_left(client: &mut Client, backend: &EtcdBackend) -> Vec<String> {
    let left = client
        .get(backend.prefix(), Some(GetOptions::new().with_prefix()))
        .await
        .expect("read the prefix");
    left.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Watches every key under the backend's prefix from the current revision on; `deletes`
/// then gathers the revisions of `count` deletes.
struct Deletes {
    stream: etcd_client::WatchStream,
}

impl Deletes {
    async fn watch(client: &mut Client, backend: &EtcdBackend) -> Deletes {
        let now = client
            .get("incumbent-none", None)
            .await
            .expect("read the revision")
            .header()
            .expect("a header")
            .revision();
        let options = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(now + 1);
        let stream = client
            .watch(backend.prefix(), Some(options))
            .await
            .expect("watch the prefix");
        Deletes { stream }
    }

    /// How many keys each revision deleted, once `count` are gone.
    async fn by_revision(&mut self, count: usize) -> std::collections::BTreeMap<i64, usize> {
        let mut revisions = std::collections::BTreeMap::new();
        let mut seen = 0;
        while seen < count {
            let message = timeout(PATIENCE, self.stream.message())
                .await
                .unwrap_or_else(|_| panic!("only {seen} of {count} keys were deleted"))
                .expect("the watch")
                .expect("the watch goes on");
            for event in message.events() {
                if event.event_type() == etcd_client::EventType::Delete {
                    let revision = event.kv().expect("a deleted key").mod_revision();
                    *revisions.entry(revision).or_insert(0) += 1;
                    seen += 1;
                }
            }
        }
        revisions
    }
}

/// The largest batch of deletes the group commit sends: a revision that deletes more keys
/// than this was a revoke of their lease.
const MAX_BATCH: usize = 64;

/// That one revision of `revisions` (keys deleted per revision) deleted more keys than a
/// batch of deletes holds: a revoke of their lease.
fn assert_revoked_at_once(revisions: &std::collections::BTreeMap<i64, usize>) {
    let largest = revisions.values().copied().max().unwrap_or(0);
    assert!(
        largest > MAX_BATCH,
        "one revision deleted {largest} keys, no more than a batch of deletes: no revoke \
         ({revisions:?})"
    );
}

/// Waits for each of the shutdowns `stopping` (each in a task of its own), and that each
/// was clean.
async fn all_shut_down(stopping: Vec<tokio::task::JoinHandle<incumbent::Result<()>>>) {
    for stopped in stopping {
        timeout(PATIENCE, stopped)
            .await
            .expect("shuts down")
            .expect("its task")
            .expect("a clean shutdown");
    }
}

/// That etcd holds no lease, and no key under `backend`'s prefix.
async fn assert_all_gone(client: &mut Client, backend: &EtcdBackend) {
    assert_eq!(lease_count(client).await, 0, "the lease is revoked");
    assert_eq!(keys_left(client, backend).await, [""; 0], "no key is left");
}

/// An etcd server, an operator's client and a backend.
async fn etcd_alone() -> (EtcdServer, Client, EtcdBackend) {
    let etcd = EtcdServer::single().await;
    let client = operator(&etcd.endpoints()).await;
    let backend = connect(&etcd.endpoints()).await;
    (etcd, client, backend)
}

/// An etcd server, a proxy in front of it, an operator's client (straight to etcd) and a
/// backend through the proxy.
async fn etcd_behind_a_proxy() -> (EtcdServer, Proxy, Client, EtcdBackend) {
    let etcd = EtcdServer::single().await;
    let proxy = Proxy::start(etcd.client_addr());
    let client = operator(&etcd.endpoints()).await;
    let backend = connect(&[format!("http://{}", proxy.addr())]).await;
    (etcd, proxy, client, backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_of_every_election_on_a_lease_revokes_it_instead_of_deleting_each_key() {
    const COUNT: usize = 300;
    let (_etcd, proxy, mut client, backend) = etcd_behind_a_proxy().await;
    let campaigns = leading_on_one_lease(&backend, "mass", COUNT).await;
    assert_eq!(lease_count(&mut client).await, 1);
    let mut deletes = Deletes::watch(&mut client, &backend).await;
    // A revoke that takes its time: the campaigns tear down meanwhile, and each shutdown must
    // still return only once its key is gone (by the revoke, or by its own delete if that
    // went out before the revoke started).
    proxy.set_latency(Duration::from_millis(300));
    proxy.blackhole(true);
    let mut stopping = tokio::task::JoinSet::new();
    for (i, campaign) in campaigns.into_iter().enumerate() {
        stopping.spawn(async move { (i, campaign.shutdown().await) });
    }
    sleep(Duration::from_millis(500)).await;
    proxy.blackhole(false);
    for checked in 0..COUNT {
        let (i, stopped) = timeout(PATIENCE, stopping.join_next())
            .await
            .expect("every campaign shuts down")
            .expect("one more")
            .expect("joined");
        assert!(stopped.is_ok(), "{stopped:?}");
        // The first twenty to return are checked as they return (a read each).
        if checked < 20 {
            let own = format!("{}/mass/{i}@", backend.prefix().trim_end_matches('/'));
            let left = keys_left(&mut client, &backend).await;
            assert!(
                !left.iter().any(|key| key.starts_with(&own)),
                "the shutdown of mass/{i} returned with its key still there"
            );
        }
    }
    let revisions = deletes.by_revision(COUNT).await;
    assert_revoked_at_once(&revisions);
    assert_all_gone(&mut client, &backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaigns_asked_to_shut_down_together_leave_every_key_to_one_revoke() {
    const COUNT: usize = 200;
    let (_etcd, mut client, backend) = etcd_alone().await;
    let mut campaigns = leading_on_one_lease(&backend, "together", COUNT).await;
    assert_eq!(lease_count(&mut client).await, 1);
    // Each term's work holds it until every shutdown was asked: no campaign can leave before
    // the last ask, as none could in a process whose campaigns are all told at once.
    let mut guards = Vec::new();
    for campaign in &mut campaigns {
        guards.push(elected(campaign, PATIENCE).await.hold());
    }
    let mut deletes = Deletes::watch(&mut client, &backend).await;

    let stopping: Vec<_> = campaigns
        .into_iter()
        .map(|campaign| tokio::spawn(campaign.shutdown()))
        .collect();
    drop(guards);
    all_shut_down(stopping).await;

    // No leaver deleted its key (with its request slots free, the first ones used to): the
    // revoke after the last one left deleted them all, at one revision.
    let revisions = deletes.by_revision(COUNT).await;
    assert_eq!(
        revisions.len(),
        1,
        "the keys went at several revisions: {revisions:?}"
    );
    assert_all_gone(&mut client, &backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_started_while_every_other_on_its_lease_is_asked_to_stop_takes_a_new_lease() {
    const TTL: Duration = Duration::from_secs(4);
    let (_etcd, mut client, backend) = etcd_alone().await;
    let mut stopping = leading_on_one_lease(&backend, "old", 5).await;
    let mut guards = Vec::new();
    for campaign in &mut stopping {
        guards.push(elected(campaign, PATIENCE).await.hold());
    }
    // All asked, none gone yet (their work holds them): the lease is sure to be revoked.
    let asked = Instant::now();
    let stopped: Vec<_> = stopping
        .into_iter()
        .map(|campaign| tokio::spawn(campaign.shutdown()))
        .collect();
    let mut fresh = election(&backend, "new", "host-a", TTL).campaign();
    elected(&mut fresh, PATIENCE).await;
    assert_eq!(
        lease_count(&mut client).await,
        2,
        "the new campaign has a lease of its own"
    );

    drop(guards);
    all_shut_down(stopped).await;
    // The old lease went with its revoke, at once (had the new campaign joined it, the
    // leavers would have waited out their patience, half the ttl, and deleted their keys).
    assert!(
        asked.elapsed() < TTL / 2,
        "the shutdowns took {:?}",
        asked.elapsed()
    );
    assert_eq!(
        lease_count(&mut client).await,
        1,
        "the old lease is revoked"
    );
    assert!(
        fresh.status().borrow().is_leader(),
        "the new campaign still leads"
    );
    let left = keys_left(&mut client, &backend).await;
    assert!(
        left.len() == 1 && left[0].starts_with("incumbent/new@"),
        "only the new campaign's key is left: {left:?}"
    );
    fresh.shutdown().await.expect("shutdown");
    assert_all_gone(&mut client, &backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaver_waits_for_the_revoke_at_most_half_the_ttl_while_another_winds_down() {
    const TTL: Duration = Duration::from_secs(2);
    let (_etcd, mut client, backend) = etcd_alone().await;
    // On one lease: `slow`, whose worker takes its time to stop (a guard held, a long grace),
    // and `quick`.
    let mut slow = Election::builder(backend.clone(), "slow")
        .candidate("host-a")
        .ttl(TTL)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(PATIENCE)
        .build()
        .expect("valid election")
        .campaign();
    let term = elected(&mut slow, PATIENCE).await;
    let guard = term.hold();
    let mut quick = election(&backend, "quick", "host-a", TTL).campaign();
    elected(&mut quick, PATIENCE).await;
    assert_eq!(lease_count(&mut client).await, 1, "one lease for both");
    let mut deletes = Deletes::watch(&mut client, &backend).await;

    let asked = Instant::now();
    let slow_stopping = tokio::spawn(slow.shutdown());
    let quick_stopping = tokio::spawn(quick.shutdown());
    // Both were asked, so the revoke is sure to come: quick sends no delete of its own, and
    // waits for it, but no longer than half the ttl, while slow winds down.
    let revisions = deletes.by_revision(1).await;
    let waited = asked.elapsed();
    let left = keys_left(&mut client, &backend).await;
    assert!(
        left.len() == 1 && left[0].starts_with("incumbent/slow@"),
        "quick's key went, slow's stays while its worker stops: {left:?} ({revisions:?})"
    );
    assert!(
        waited >= TTL / 2 - Duration::from_millis(100),
        "quick deleted its key after {waited:?}, without waiting for the revoke"
    );
    timeout(PATIENCE, quick_stopping)
        .await
        .expect("quick shuts down")
        .expect("its task")
        .expect("a clean shutdown");

    drop(guard);
    timeout(PATIENCE, slow_stopping)
        .await
        .expect("slow shuts down")
        .expect("its task")
        .expect("a clean shutdown");
    assert_all_gone(&mut client, &backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_of_all_but_one_election_on_a_lease_keeps_the_lease_and_its_key() {
    const COUNT: usize = 100;
    let (_etcd, proxy, mut client, backend) = etcd_behind_a_proxy().await;
    let mut campaigns = leading_on_one_lease(&backend, "most", COUNT + 1).await;
    let staying = campaigns.pop().expect("one more");
    let mut deletes = Deletes::watch(&mut client, &backend).await;

    shut_down_all_at_once(&proxy, campaigns).await;
    let revisions = deletes.by_revision(COUNT).await;

    assert!(
        staying.status().borrow().is_leader(),
        "the election that did not shut down still leads"
    );
    let leases = client.leases().await.expect("lease list");
    assert_eq!(leases.leases().len(), 1, "its lease lives on");
    assert_eq!(
        keys_left(&mut client, &backend).await,
        [format!(
            "incumbent/most/{COUNT}@{:x}",
            leases.leases()[0].id()
        )],
        "only its key is left ({revisions:?})"
    );
    staying.shutdown().await.expect("shutdown");
    assert_eq!(lease_count(&mut client).await, 0);
}

/// A member of the sharded election `jobs` (`shards` shards) on `backend`, whose workers
/// run until their term ends.
fn shard_member(backend: &EtcdBackend, id: &str, shards: u32) -> incumbent::ShardedRunner {
    incumbent::ShardedElection::builder(backend.clone(), "jobs", shards)
        .candidate(id)
        .ttl(Duration::from_secs(4))
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100))
        .build()
        .expect("valid settings")
        .start(|_, term| async move { term.cancelled().await })
}

/// Waits until `member` owns `count` shards.
async fn owning(member: &incumbent::ShardedRunner, count: usize) {
    let until = Instant::now() + PATIENCE;
    while member.status().borrow().owned().len() != count {
        assert!(
            Instant::now() < until,
            "owns {} shards, not {count}",
            member.status().borrow().owned().len()
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_member_that_shuts_down_ends_its_lease_once_and_the_other_takes_over() {
    // Enough that, of a's, more than a batch of deletes is still queued when the revoke
    // starts: every request slot (64) holds a delete of its own by then.
    const SHARDS: u32 = 512;
    // Two processes, as far as etcd can tell: a through the proxy, b directly, each its own
    // connection and lease.
    let (etcd, proxy, mut client, a_backend) = etcd_behind_a_proxy().await;
    let b_backend = connect(&etcd.endpoints()).await;
    let a = shard_member(&a_backend, "a", SHARDS);
    owning(&a, SHARDS as usize).await;
    let b = shard_member(&b_backend, "b", SHARDS);
    owning(&b, SHARDS as usize / 2).await;
    owning(&a, SHARDS as usize / 2).await;
    let mut deletes = Deletes::watch(&mut client, &a_backend).await;

    // a shuts down while nothing of it passes: its shards reach their releases, the first
    // deletes take every request slot, the rest queue, and the lease is revoked once.
    proxy.blackhole(true);
    let stopping = tokio::spawn(a.shutdown());
    sleep(Duration::from_millis(500)).await;
    proxy.blackhole(false);
    timeout(PATIENCE, stopping)
        .await
        .expect("a shuts down")
        .expect("its task")
        .expect("a clean shutdown");

    // Its shard keys and its member slot.
    let revisions = deletes.by_revision(SHARDS as usize / 2 + 1).await;
    assert_revoked_at_once(&revisions);
    owning(&b, SHARDS as usize).await;
    assert_eq!(lease_count(&mut client).await, 1, "b's lease alone is left");
    b.shutdown().await.expect("shutdown");
}

/// etcd's own count of watch streams and watchers, from its `/metrics`.
#[derive(Debug, PartialEq)]
struct Watches {
    streams: u64,
    watchers: u64,
}

/// The `/metrics` page of the etcd member at `addr`.
async fn metrics_of(addr: std::net::SocketAddr) -> String {
    crate::support::http::get(addr, "/metrics")
        .await
        .expect("etcd's /metrics")
        .body
}

/// The value of the unlabelled gauge `name` on a `/metrics` page.
fn gauge(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("etcd's /metrics has no {name}")) as u64
}

async fn watches(etcd: &EtcdServer) -> Watches {
    let metrics = metrics_of(etcd.client_addr()).await;
    Watches {
        streams: gauge(&metrics, "etcd_debugging_mvcc_watch_stream_total"),
        watchers: gauge(&metrics, "etcd_debugging_mvcc_watcher_total"),
    }
}

/// Waits until etcd counts `expected` watch streams and watchers.
async fn wait_for_watches(etcd: &EtcdServer, expected: Watches, why: &str) {
    let until = Instant::now() + PATIENCE;
    loop {
        let seen = watches(etcd).await;
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < until,
            "{why}: etcd counts {seen:?}, expected {expected:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// `count` elections `<name>/<i>`, each led by "l" on `leaders` and followed by "f" on
/// `followers`.
async fn leaders_and_followers(
    leaders: &EtcdBackend,
    followers: &EtcdBackend,
    name: &str,
    count: usize,
) -> (Vec<Campaign>, Vec<Campaign>) {
    let mut leading = Vec::new();
    for i in 0..count {
        let mut campaign = election(leaders, &format!("{name}/{i}"), "l", TTL).campaign();
        elected(&mut campaign, PATIENCE).await;
        leading.push(campaign);
    }
    let mut following = Vec::new();
    for i in 0..count {
        let campaign = election(followers, &format!("{name}/{i}"), "f", TTL).campaign();
        follows(&campaign).await;
        following.push(campaign);
    }
    (leading, following)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_holds_one_watch_whatever_its_elections_and_none_without_any() {
    const ELECTIONS: usize = 10;
    let etcd = EtcdServer::single().await;
    let leaders = connect(&etcd.endpoints()).await;
    let followers = connect(&etcd.endpoints()).await;
    let none = Watches {
        streams: 0,
        watchers: 0,
    };
    wait_for_watches(&etcd, none, "a backend without elections holds no watch").await;
    let (mut leading, following) =
        leaders_and_followers(&leaders, &followers, "many", ELECTIONS).await;
    // Leaders follow their range and the election's request lock, followers their
    // predecessor and (to report leader changes) the range: all on their backend's one watch.
    wait_for_watches(
        &etcd,
        Watches {
            streams: 2,
            watchers: 2,
        },
        "one watch per backend, not per election",
    )
    .await;

    for campaign in following {
        campaign.shutdown().await.expect("shutdown");
    }
    wait_for_watches(
        &etcd,
        Watches {
            streams: 1,
            watchers: 1,
        },
        "a backend whose elections all stopped pauses its watch",
    )
    .await;

    // A campaign on the paused backend resumes its watch, and hears of the leader's release
    // through it: it leads next.
    let mut next = election(&followers, "many/0", "f", TTL).campaign();
    follows(&next).await;
    wait_for_watches(
        &etcd,
        Watches {
            streams: 2,
            watchers: 2,
        },
        "a campaign resumes its backend's watch",
    )
    .await;
    leading.remove(0).shutdown().await.expect("shutdown");
    elected(&mut next, PATIENCE).await;
    next.shutdown().await.expect("shutdown");

    drop(followers);
    wait_for_watches(
        &etcd,
        Watches {
            streams: 1,
            watchers: 1,
        },
        "a dropped backend closes its watch",
    )
    .await;
    for campaign in &leading {
        assert!(campaign.status().borrow().is_leader());
    }
}

/// How many reads (`Range` requests) etcd has answered, from its `/metrics`.
async fn reads(etcd: &EtcdServer) -> u64 {
    metrics_of(etcd.client_addr())
        .await
        .lines()
        .filter(|line| {
            line.starts_with("grpc_server_handled_total{") && line.contains("grpc_method=\"Range\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaigns_learn_their_leader_and_request_lock_from_their_acquisition_not_a_read() {
    const ELECTIONS: usize = 20;
    let etcd = EtcdServer::single().await;
    let leaders = connect(&etcd.endpoints()).await;
    let followers = connect(&etcd.endpoints()).await;
    let before = reads(&etcd).await;
    let (mut leading, mut following) =
        leaders_and_followers(&leaders, &followers, "learn", ELECTIONS).await;
    for campaign in &following {
        let mut status = campaign.status();
        let leader = timeout(PATIENCE, status.wait_for(|s| s.leader.is_some()))
            .await
            .expect("the follower reports its leader")
            .expect("campaign running")
            .leader
            .clone();
        assert_eq!(leader.map(|l| l.candidate.id), Some("l".to_owned()));
    }
    sleep(Duration::from_millis(500)).await;
    let read = reads(&etcd).await - before;
    assert_eq!(
        read, 0,
        "{ELECTIONS} elections' leaders and followers read {read} times: the acquisition's own \
         read names the leader and the request lock's holder, and the backend's watch keeps \
         them current"
    );

    // A hand-off: the holder's key goes, so who leads next is read once more (by the new
    // leader's campaign's observer, or learnt from the watch).
    let first = leading.remove(0);
    let mut successor = following.remove(0);
    first.resign().await.expect("resign");
    elected(&mut successor, PATIENCE).await;
    let mut status = first.status();
    timeout(
        PATIENCE,
        status.wait_for(|s| s.leader.as_ref().is_some_and(|l| l.candidate.id == "f")),
    )
    .await
    .expect("the old leader, now following, reports the new one")
    .expect("campaign running");
}

/// The follower `b`, on a connection through `proxy`, misses its predecessor's delete while
/// the proxy holds every byte back; then its connections are reset. With `compact`, an
/// operator also compacts the history past the delete meanwhile. `b` must lead on the key it
/// queued with: learning of the delete from its backend's watch (resumed, or read again after
/// the compaction), not from a new session after the outage (a new key, another token).
async fn hand_off_across_a_broken_watch(compact: bool) {
    let etcd = EtcdServer::single().await;
    let mut client = operator(&etcd.endpoints()).await;
    let proxy = Proxy::start(etcd.client_addr());
    let direct = connect(&etcd.endpoints()).await;
    let through_proxy = connect(&[format!("http://{}", proxy.addr())]).await;
    let mut a = election(&direct, "broken-watch", "a", Duration::from_secs(5)).campaign();
    let a_term = elected(&mut a, PATIENCE).await;
    let mut b = election(&through_proxy, "broken-watch", "b", Duration::from_secs(5)).campaign();
    follows(&b).await;
    let queued = candidates(&mut client, &direct, "broken-watch").await;
    let b_key = token(queued.last().expect("b's key"));

    proxy.blackhole(true);
    a.shutdown().await.expect("a stops");
    if compact {
        compact_past_now(&mut client).await;
    }
    sleep(Duration::from_millis(300)).await;
    // The withheld bytes, the delete's event among them, are lost with the connections: reset
    // while no byte passes, so that none gets through before the reset.
    proxy.reset_all();
    sleep(Duration::from_millis(100)).await;
    proxy.blackhole(false);
    let b_term = elected(&mut b, PATIENCE).await;
    assert!(b_term.fencing_token() > a_term.fencing_token());
    assert_eq!(
        b_term.fencing_token(),
        b_key,
        "b leads on the key it queued with, woken by its watch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_watch_resumes_where_it_left_off_and_the_follower_leads() {
    hand_off_across_a_broken_watch(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_cannot_resume_past_a_compaction_has_the_follower_read_again() {
    hand_off_across_a_broken_watch(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_elections_than_request_slots_all_lead_and_stop() {
    let elections = 3 * incumbent::etcd::MAX_REQUESTS_IN_FLIGHT;
    let (_etcd, mut client, backend) = etcd_alone().await;
    let mut campaigns: Vec<Campaign> = (0..elections)
        .map(|i| election(&backend, &format!("burst/{i}"), "host-a", TTL).campaign())
        .collect();
    for campaign in &mut campaigns {
        elected(campaign, PATIENCE).await;
    }
    let options = GetOptions::new().with_prefix().with_count_only();
    let keys = client
        .get("incumbent/burst/", Some(options))
        .await
        .expect("count");
    assert_eq!(keys.count(), elections as i64, "one key per election");
    Campaign::shutdown_all(campaigns).await.expect("shutdown");
    let options = GetOptions::new().with_prefix().with_count_only();
    let keys = client
        .get("incumbent/burst/", Some(options))
        .await
        .expect("count");
    assert_eq!(keys.count(), 0, "every key released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_campaigns_for_one_election_on_one_backend_get_a_key_each() {
    let (_etcd, mut client, backend) = etcd_alone().await;
    let twin = election(&backend, "twins", "host-a", TTL);
    let mut first = twin.campaign();
    elected(&mut first, PATIENCE).await;
    let second = twin.campaign();
    follows(&second).await;
    let keys = candidates(&mut client, &backend, "twins").await;
    assert_eq!(keys.len(), 2, "a key each");
    assert_eq!(keys[0].lease(), keys[1].lease(), "on one shared lease");
    assert!(first.status().borrow().is_leader());
    assert!(!second.status().borrow().is_leader());
}

/// A contender dropped while its key is still in etcd (its release failed, say) leaves the
/// key's name to the next contender of the lease: that one must not adopt the key, which led
/// once, and lead again with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_left_behind_by_a_dropped_contender_never_leads_again_with_its_token() {
    let (_etcd, mut client, backend) = etcd_alone().await;
    let session = backend
        .open_session(&session_options("left"))
        .await
        .expect("session");
    let mut first = session
        .contend("left", &candidate("a"))
        .await
        .expect("contend");
    let Attempt::Won { fencing_token: old } = first.acquire().await.expect("acquire") else {
        panic!("alone, the first contender wins");
    };
    drop(first); // no release: the key stays, bound to the live lease
    let mut second = session
        .contend("left", &candidate("a"))
        .await
        .expect("contend");
    let Attempt::Won { fencing_token: new } = second.acquire().await.expect("acquire") else {
        panic!("alone again, the second contender wins");
    };
    assert!(new > old, "a new term with token {new} after {old}");
    let keys = candidates(&mut client, &backend, "left").await;
    assert_eq!(keys.len(), 1, "the key left behind was replaced");
    assert_eq!(token(&keys[0]), new);
    second.release().await.expect("release");
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoked_by_an_operator_demotes_with_session_expired() {
    let (_etcd, mut client, backend) = etcd_alone().await;
    let mut campaign = election(&backend, "revoked", "a", TTL).campaign();
    elected(&mut campaign, PATIENCE).await;
    let lease = candidates(&mut client, &backend, "revoked").await[0].lease();
    client.lease_revoke(lease).await.expect("revoke");
    assert_eq!(
        demoted(&mut campaign, PATIENCE).await,
        DemotionReason::SessionExpired
    );
    // A new session wins again.
    elected(&mut campaign, PATIENCE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_deleted_by_an_operator_demotes_with_key_deleted() {
    let (_etcd, mut client, backend) = etcd_alone().await;
    let mut campaign = election(&backend, "deleted", "a", TTL).campaign();
    let first = elected(&mut campaign, PATIENCE).await;
    let key = candidates(&mut client, &backend, "deleted").await[0]
        .key()
        .to_vec();
    client.delete(key, None).await.expect("delete");
    assert_eq!(
        demoted(&mut campaign, PATIENCE).await,
        DemotionReason::KeyDeleted
    );
    let second = elected(&mut campaign, PATIENCE).await;
    assert!(second.fencing_token() > first.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_leader_fences_itself_before_another_leads() {
    let etcd = EtcdServer::single().await;
    let proxy = Proxy::start(etcd.client_addr());
    let cut_off = connect(&[format!("http://{}", proxy.addr())]).await;
    let direct = connect(&etcd.endpoints()).await;
    let mut a = election(&cut_off, "black-hole", "a", TTL).campaign();
    elected(&mut a, PATIENCE).await;
    let mut b = election(&direct, "black-hole", "b", TTL).campaign();
    follows(&b).await;

    proxy.blackhole(true);
    let cut = Instant::now();
    let (reason, b_term) = tokio::join!(
        async {
            let reason = demoted(&mut a, PATIENCE).await;
            (reason, Instant::now())
        },
        async {
            let term = elected(&mut b, PATIENCE).await;
            (term, Instant::now())
        }
    );
    let ((reason, a_fenced), (_, b_elected)) = (reason, b_term);
    assert_eq!(reason, DemotionReason::RenewDeadlineExceeded);
    assert!(
        a_fenced < b_elected,
        "a fenced itself {:?} after the cut, b led {:?} after it",
        a_fenced - cut,
        b_elected - cut
    );
    assert!(
        b_elected - cut >= TTL - TTL / 3,
        "b led {:?} after the cut, before a's lease could expire",
        b_elected - cut
    );
    proxy.blackhole(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_survives_a_server_pause_shorter_than_the_ttl() {
    let mut etcd = EtcdServer::single().await;
    let backend = connect(&etcd.endpoints()).await;
    let mut campaign = election(&backend, "paused", "a", Duration::from_secs(5)).campaign();
    elected(&mut campaign, PATIENCE).await;
    etcd.process().pause();
    sleep(Duration::from_secs(1)).await;
    etcd.process().resume();
    let resumed = Instant::now();
    stays_leader(&mut campaign, Duration::from_secs(3)).await;
    let last = campaign
        .status()
        .borrow()
        .last_renewal()
        .expect("a renewal");
    assert!(last >= resumed, "no renewal confirmed after the pause");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_recovers_after_a_server_restart() {
    let mut etcd = EtcdServer::single().await;
    let backend = connect(&etcd.endpoints()).await;
    let mut campaign = election(&backend, "restarted", "a", Duration::from_secs(5)).campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    let started = Instant::now();
    etcd.process().restart().await;
    let restarted = Instant::now();
    eprintln!("etcd restarted in {:?}", restarted - started);
    let mut renewals = campaign.status().borrow().renewals().expect("a session");
    timeout(
        PATIENCE,
        renewals.wait_for(|h| h.confirmed_sent_at >= restarted),
    )
    .await
    .expect("renewals resume after the restart")
    .expect("campaign running");
    assert!(
        !term.is_cancelled(),
        "the lease survives a restart, and so does the term"
    );
    stays_leader(&mut campaign, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_survives_losing_one_member_of_three() {
    let mut cluster = EtcdCluster::three().await;
    let backend = connect(&cluster.endpoints()).await;
    let mut campaign = election(&backend, "cluster", "a", Duration::from_secs(5)).campaign();
    elected(&mut campaign, PATIENCE).await;
    cluster.member(0).kill9();
    let killed = Instant::now();
    let mut renewals = campaign.status().borrow().renewals().expect("a session");
    timeout(
        PATIENCE,
        renewals.wait_for(|h| h.confirmed_sent_at >= killed),
    )
    .await
    .expect("renewals go on with two members")
    .expect("campaign running");
    stays_leader(&mut campaign, Duration::from_secs(2)).await;
}

/// The index of the member that is the cluster's Raft leader.
async fn raft_leader(cluster: &EtcdCluster) -> usize {
    for index in 0..3 {
        let Ok(mut client) =
            Client::connect([format!("http://{}", cluster.client_addr(index))], None).await
        else {
            continue;
        };
        if let Ok(status) = client.status().await
            && status
                .header()
                .is_some_and(|h| h.member_id() == status.leader())
        {
            return index;
        }
    }
    panic!("no member says it is the Raft leader");
}

#[tokio::test]
async fn leader_survives_the_clusters_raft_leader_being_killed() {
    let mut cluster = EtcdCluster::three().await;
    let backend = connect(&cluster.endpoints()).await;
    let mut campaign = election(&backend, "cluster", "a", Duration::from_secs(5)).campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    // Every write, renewals included, is committed through the Raft leader: losing it means
    // an election inside etcd (500 ms here), well within the renew deadline (3.3 s).
    let index = raft_leader(&cluster).await;
    cluster.member(index).kill9();
    let killed = Instant::now();
    let mut renewals = campaign.status().borrow().renewals().expect("a session");
    timeout(
        PATIENCE,
        renewals.wait_for(|h| h.confirmed_sent_at >= killed),
    )
    .await
    .expect("renewals go on once the two members elect a new Raft leader")
    .expect("campaign running");
    stays_leader(&mut campaign, Duration::from_secs(2)).await;
    assert!(!term.is_cancelled());
    // And the election still works: a resign hands off to a follower on the survivors.
    let survivors: Vec<String> = (0..3)
        .filter(|i| *i != index)
        .map(|i| format!("http://{}", cluster.client_addr(i)))
        .collect();
    let mut follower = election(
        &connect(&survivors).await,
        "cluster",
        "b",
        Duration::from_secs(5),
    )
    .campaign();
    follows(&follower).await;
    campaign.resign().await.expect("resign");
    let next = elected(&mut follower, PATIENCE).await;
    assert!(next.fencing_token() > term.fencing_token());
}

/// How many watch streams the etcd member at `addr` holds, from its `/metrics`.
async fn watch_streams_on(addr: std::net::SocketAddr) -> u64 {
    gauge(
        &metrics_of(addr).await,
        "etcd_debugging_mvcc_watch_stream_total",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_watch_member_dies_still_takes_over() {
    let mut cluster = EtcdCluster::three().await;
    // The leader talks to member 0 only, the follower to members 1 and 2: its one watch is on
    // one of those, found from their metrics, and that member is killed.
    let leader_backend = connect(&[format!("http://{}", cluster.client_addr(0))]).await;
    let mut leader =
        election(&leader_backend, "member-dies", "a", Duration::from_secs(5)).campaign();
    let term = elected(&mut leader, PATIENCE).await;
    let follower_backend = connect(&[
        format!("http://{}", cluster.client_addr(1)),
        format!("http://{}", cluster.client_addr(2)),
    ])
    .await;
    let mut follower = election(
        &follower_backend,
        "member-dies",
        "b",
        Duration::from_secs(5),
    )
    .campaign();
    follows(&follower).await;
    let mut watched = None;
    for member in [1, 2] {
        if watch_streams_on(cluster.client_addr(member)).await > 0 {
            watched = Some(member);
        }
    }
    let watched = watched.expect("the follower's watch is on member 1 or 2");
    cluster.member(watched).kill9();
    // The follower's session fails over too; give it a moment before the hand-off.
    sleep(Duration::from_millis(500)).await;
    leader.resign().await.expect("resign");
    let next = elected(&mut follower, PATIENCE).await;
    assert!(next.fencing_token() > term.fencing_token());
}

#[tokio::test]
async fn malformed_endpoints_are_invalid_config() {
    for endpoints in [
        vec!["http//127.0.0.1:2379"],
        vec!["127.0.0.1"],
        vec!["http://127.0.0.1:2379", "http://127.0.0.1:notaport"],
        vec!["unix:///run/etcd.sock"],
        vec![],
    ] {
        match EtcdBackend::connect(endpoints.clone()).await {
            Err(Error::InvalidConfig { reason, .. }) => {
                assert!(reason.contains("http://"), "{endpoints:?}: {reason}")
            }
            other => panic!("{endpoints:?}: expected InvalidConfig, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn unreachable_endpoint_is_unavailable() {
    let (addr, _refusing) = crate::support::net::refused_addr();
    let connected = EtcdBackend::builder([format!("http://{addr}")])
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await;
    match connected {
        Err(error @ Error::Unavailable { .. }) => assert!(error.is_transient()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// Starts etcd with authentication on: user `root` (password `secret`) is the only user.
async fn etcd_with_auth() -> EtcdServer {
    let etcd = EtcdServer::single().await;
    let mut client = operator(&etcd.endpoints()).await;
    client
        .user_add("root", "secret", None)
        .await
        .expect("add root");
    client
        .user_grant_role("root", "root")
        .await
        .expect("grant root");
    client.auth_enable().await.expect("enable auth");
    etcd
}

#[tokio::test]
async fn wrong_password_is_unauthorized() {
    let etcd = etcd_with_auth().await;
    EtcdBackend::builder(etcd.endpoints())
        .user("root", "secret")
        .connect()
        .await
        .expect("the right password connects");
    let wrong = EtcdBackend::builder(etcd.endpoints())
        .user("root", "wrong")
        .connect()
        .await;
    match wrong {
        Err(error @ Error::Unauthorized { .. }) => {
            assert!(!error.is_transient());
            assert!(
                !error.to_string().contains("wrong"),
                "the password leaked: {error}"
            );
        }
        other => panic!("expected Unauthorized, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_user_campaigns() {
    let etcd = etcd_with_auth().await;
    let backend = EtcdBackend::builder(etcd.endpoints())
        .user("root", "secret")
        .connect()
        .await
        .expect("connect");
    let mut campaign = election(&backend, "authenticated", "a", TTL).campaign();
    elected(&mut campaign, PATIENCE).await;
    stays_leader(&mut campaign, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn missing_credentials_on_an_auth_cluster_are_unauthorized() {
    let etcd = etcd_with_auth().await;
    match EtcdBackend::connect(etcd.endpoints()).await {
        Err(Error::Unauthorized { .. }) => {}
        other => panic!("expected Unauthorized, got {other:?}"),
    }
}

#[tokio::test]
async fn debug_output_hides_the_password() {
    let etcd = etcd_with_auth().await;
    let backend = EtcdBackend::builder(etcd.endpoints())
        .user("root", "secret")
        .connect()
        .await
        .expect("connect");
    let shown = format!("{backend:?}");
    assert!(shown.contains("root"), "{shown}");
    assert!(!shown.contains("secret"), "the password leaked: {shown}");
}

/// With the `etcd-tls` feature: a CA and a client certificate reach an etcd that requires
/// them. Without it: asking for TLS names the feature to enable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    // Without the feature, asking for TLS is refused before anything is sent.
    let probe = EtcdBackend::builder(["https://127.0.0.1:9"])
        .ca_certificate("-----BEGIN CERTIFICATE-----\n")
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await;
    if let Err(Error::InvalidConfig { reason, .. }) = &probe
        && reason.contains("etcd-tls")
    {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    crate::support::tls::make_certificates(dir.path());
    let read = |name: &str| std::fs::read(dir.path().join(name)).expect("read PEM");
    let with_tls = |endpoint: &str| {
        EtcdBackend::builder([endpoint.to_owned()])
            .ca_certificate(read("ca.pem"))
            .client_identity(read("client.pem"), read("client.key"))
            .connect_timeout(Duration::from_secs(2))
    };

    let (_etcd, endpoint) = crate::support::tls::etcd_with_tls(dir.path()).await;
    let backend = with_tls(&endpoint)
        .connect()
        .await
        .expect("connect over TLS");
    assert!(!format!("{backend:?}").contains("PRIVATE KEY"));
    let mut campaign = election(&backend, "tls", "a", TTL).campaign();
    elected(&mut campaign, PATIENCE).await;

    let insecure = EtcdBackend::connect([endpoint.replace("https://", "http://")]).await;
    assert!(
        matches!(
            insecure,
            Err(Error::Unavailable { .. }) | Err(Error::Store { .. })
        ),
        "{insecure:?}"
    );
    let anonymous = EtcdBackend::builder([endpoint.clone()])
        .ca_certificate(read("ca.pem"))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(
        anonymous.is_err(),
        "etcd requires a client certificate: {anonymous:?}"
    );
    eprintln!("without a client certificate: {anonymous:?}");
    let untrusted = EtcdBackend::builder([endpoint.clone()])
        .ca_certificate(read("other-ca.pem"))
        .client_identity(read("client.pem"), read("client.key"))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    match untrusted {
        Err(Error::InvalidConfig { reason, .. }) => assert!(reason.contains("TLS"), "{reason}"),
        other => panic!("an untrusted server certificate is a configuration error: {other:?}"),
    }
    let mixed = with_tls(&endpoint.replace("https://", "http://"))
        .connect()
        .await;
    assert!(
        matches!(mixed, Err(Error::InvalidConfig { .. })),
        "{mixed:?}"
    );
}

/// Issue 10, point 5: a leader that fenced itself during an etcd outage leads again as soon as
/// etcd is back, not a ttl later. (etcd extends every lease when it restarts, so the old lease,
/// whose revoke failed during the outage, would otherwise keep the old key, ahead of the new
/// candidacy, for another ttl.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_fenced_by_an_outage_leads_again_at_once_when_etcd_is_back() {
    let ttl = Duration::from_secs(6);
    let mut etcd = EtcdServer::single().await;
    let backend = connect(&etcd.endpoints()).await;
    let mut campaign = election(&backend, "outage", "a", ttl).campaign();
    let first = elected(&mut campaign, PATIENCE).await;
    etcd.process().kill9();
    assert_eq!(
        demoted(&mut campaign, PATIENCE).await,
        DemotionReason::RenewDeadlineExceeded
    );
    // Down a little longer: the revoke of the old lease and the first grants of a new one fail.
    sleep(Duration::from_secs(1)).await;
    etcd.process().restart().await;
    let healthy = Instant::now();
    let second = elected(&mut campaign, PATIENCE).await;
    let took = healthy.elapsed();
    eprintln!("led again {took:?} after etcd was healthy (ttl {ttl:?})");
    assert!(
        took < ttl / 2,
        "led again {took:?} after etcd was healthy: queued behind its own old key?"
    );
    assert!(second.fencing_token() > first.fencing_token());
    let mut client = operator(&etcd.endpoints()).await;
    let keys = candidates(&mut client, &backend, "outage").await;
    assert_eq!(keys.len(), 1, "only the new key is left");
    assert_eq!(token(&keys[0]), second.fencing_token());
}

/// Issue 10, point 5: a contender does not queue behind a key of a lease that its own backend
/// granted and closed, whatever the key's value says, and only behind such keys: a key of
/// someone else's lease is waited for, even when it names the same candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_does_not_queue_behind_a_key_of_a_lease_its_backend_closed() {
    let (_etcd, mut client, backend) = etcd_alone().await;
    let election = "leftover";
    let old = backend
        .open_session(&session_options(election))
        .await
        .expect("session");
    let old_lease = old.lease_id();
    old.close().await.expect("close");
    // What a revoke that never got through leaves behind: the old lease alive, with a key of
    // it ahead of the next candidacy. (etcd grants a lease with the id a client asks for.)
    let value = Leader {
        candidate: candidate("a"),
        fencing_token: None,
        since_unix_ms: None,
    }
    .to_bytes();
    client
        .lease_grant(
            60,
            Some(etcd_client::LeaseGrantOptions::new().with_id(old_lease)),
        )
        .await
        .expect("grant the old lease again");
    let stale = format!("{}{old_lease:x}", backend.election_range(election));
    client
        .put(
            stale.clone(),
            value.clone(),
            Some(etcd_client::PutOptions::new().with_lease(old_lease)),
        )
        .await
        .expect("put the stale key");

    let session = backend
        .open_session(&session_options(election))
        .await
        .expect("session");
    let mut contender = session
        .contend(election, &candidate("a"))
        .await
        .expect("contend");
    let attempt = timeout(Duration::from_secs(2), contender.acquire())
        .await
        .expect("acquire answers at once")
        .expect("acquire");
    assert!(
        matches!(attempt, Attempt::Won { .. }),
        "waits behind its own stale key: {attempt:?}"
    );
    let keys = candidates(&mut client, &backend, election).await;
    assert_eq!(keys.len(), 1, "the stale key is gone");
    assert_eq!(keys[0].lease(), session.lease_id());
    contender.release().await.expect("release");

    // A key of a lease this backend never granted stays, and is queued behind, even though
    // its value names the same candidate.
    let foreign = client.lease_grant(60, None).await.expect("grant").id();
    let theirs = format!("{}{foreign:x}", backend.election_range(election));
    client
        .put(
            theirs.clone(),
            value,
            Some(etcd_client::PutOptions::new().with_lease(foreign)),
        )
        .await
        .expect("put a foreign key");
    let attempt = contender.acquire().await.expect("acquire");
    assert!(
        matches!(attempt, Attempt::Held { .. }),
        "a foreign key must be waited for: {attempt:?}"
    );
    let keys = candidates(&mut client, &backend, election).await;
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0].key(),
        theirs.as_bytes(),
        "the foreign key stays first"
    );
    contender.release().await.expect("release");
    session.close().await.expect("close");
}

/// Issue 10, point 5: "requested lease not found" when a follower writes its key again is a
/// lost session: the campaign is back in the queue with a new lease at once, not after the
/// next renewal (a renew interval later) and a growing back-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_lease_is_revoked_is_back_in_the_queue_at_once() {
    let ttl = Duration::from_secs(9); // renewals 3 s apart
    let etcd = EtcdServer::single().await;
    let mut client = operator(&etcd.endpoints()).await;
    let leader_backend = connect(&etcd.endpoints()).await;
    let follower_backend = connect(&etcd.endpoints()).await;
    let mut a = election(&leader_backend, "revoked-follower", "a", ttl).campaign();
    elected(&mut a, PATIENCE).await;
    let b = election(&follower_backend, "revoked-follower", "b", ttl).campaign();
    follows(&b).await;
    let old = follower_backend.lease_ids()[0];

    // Revoke just after a renewal of b's lease (its remaining ttl goes up), so that the next
    // renewal, which would hear that the lease is gone, is a renew interval away.
    let remaining = async |client: &mut Client| {
        client
            .lease_time_to_live(old, None)
            .await
            .expect("time to live")
            .ttl()
    };
    let mut last = remaining(&mut client).await;
    timeout(PATIENCE, async {
        loop {
            sleep(Duration::from_millis(20)).await;
            let now = remaining(&mut client).await;
            if now > last {
                break;
            }
            last = now;
        }
    })
    .await
    .expect("a renewal");
    client.lease_revoke(old).await.expect("revoke");
    let revoked = Instant::now();

    let requeued = timeout(PATIENCE, async {
        loop {
            let keys = candidates(&mut client, &leader_backend, "revoked-follower").await;
            if keys
                .iter()
                .any(|kv| kv.lease() != old && Leader::from_bytes(kv.value()).candidate.id == "b")
            {
                return Instant::now();
            }
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("b is back in the queue");
    let took = requeued - revoked;
    eprintln!("back in the queue {took:?} after the revoke");
    assert!(
        took < Duration::from_secs(1),
        "back in the queue only {took:?} after the revoke"
    );
    assert!(a.status().borrow().is_leader());
    follows(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_an_etcd_that_is_down_fails_at_once_and_says_it_did_not_retry() {
    // Nothing listens there: connect tries once. Its message must not claim a retry that
    // does not happen (a pod would crash-loop believing the library retries).
    let (nobody, _refusing) = crate::support::net::refused_addr();
    let started = Instant::now();
    let error = EtcdBackend::builder([format!("http://{nobody}")])
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect_err("nothing listens there");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("does not retry"), "{message}");
    assert!(!message.contains("retrying"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "one attempt, not a retry loop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participants_lists_the_queue_leader_first_without_campaigning() {
    let etcd = EtcdServer::single().await;
    let backend = connect(&etcd.endpoints()).await;
    let bystander = election(&backend, "queue", "bystander", TTL);
    assert_eq!(
        bystander.participants().await.expect("read"),
        Some(Vec::new())
    );
    assert_eq!(bystander.leader().await.expect("read"), None);
    let mut a = election(&backend, "queue", "a", TTL).campaign();
    let term = elected(&mut a, PATIENCE).await;
    let mut waiting = Vec::new();
    for id in ["b", "c"] {
        let campaign = election(&connect(&etcd.endpoints()).await, "queue", id, TTL).campaign();
        follows(&campaign).await;
        waiting.push(campaign);
    }
    let queue = bystander
        .participants()
        .await
        .expect("read")
        .expect("etcd keeps a queue");
    let ids: Vec<&str> = queue.iter().map(|l| l.candidate.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"], "in the order the lock is handed on");
    assert_eq!(queue[0].fencing_token, Some(term.fencing_token()));
    let leader = bystander.leader().await.expect("read").expect("a leader");
    assert_eq!(leader.candidate.id, "a");
    for campaign in waiting {
        campaign.shutdown().await.expect("shutdown");
    }
    a.shutdown().await.expect("shutdown");
}

/// An [`ElectionSet`] of `candidate` on `backend`, with this file's settings.
fn set_of(backend: &EtcdBackend, candidate: &str) -> ElectionSet {
    election(backend, "sets", candidate, TTL).set()
}

async fn count_keys(client: &mut Client, prefix: &str) -> i64 {
    let options = GetOptions::new().with_prefix().with_count_only();
    client
        .get(prefix, Some(options))
        .await
        .expect("count")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_set_leads_more_elections_than_it_starts_at_once_on_one_lease() {
    let (_etcd, mut client, backend) = etcd_alone().await;
    let count = 600; // more than a set makes first claims at once (512)
    let set = set_of(&backend, "host-a");
    for i in 0..count {
        set.join(&format!("set/{i}")).expect("a valid name");
    }
    timeout(PATIENCE, async {
        while set.leading() < count {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every member leads");
    assert_eq!(
        count_keys(&mut client, "incumbent/set/").await,
        count as i64,
        "a key each"
    );
    assert_eq!(backend.lease_ids().len(), 1, "one lease for every member");
    let keys = client
        .get("incumbent/set/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("read");
    let lease = backend.lease_ids()[0];
    assert!(keys.kvs().iter().all(|kv| kv.lease() == lease));
    // No member reads or watches the request lock: a set takes no hand-over requests.
    assert!(set.term("set/7").is_some_and(|t| t.fencing_token() > 0));
    set.shutdown().await.expect("shuts down");
    assert_eq!(
        count_keys(&mut client, "incumbent/set/").await,
        0,
        "every key released"
    );
    assert!(backend.lease_ids().is_empty(), "the lease revoked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_set_takes_over_what_the_leader_set_leaves_loses_or_shuts_down() {
    let etcd = EtcdServer::single().await;
    let mut client = operator(&etcd.endpoints()).await;
    let (a_backend, b_backend) = (
        connect(&etcd.endpoints()).await,
        connect(&etcd.endpoints()).await,
    );
    let (a, b) = (set_of(&a_backend, "host-a"), set_of(&b_backend, "host-b"));
    let (mut a_events, mut b_events) = (a.events(), b.events());
    let names = ["handoff/0", "handoff/1", "handoff/2"];
    let mut a_terms = Vec::new();
    for name in names {
        a.join(name).expect("valid");
        a_terms.push(elected(&mut member(&mut a_events, name), PATIENCE).await);
    }
    for name in names {
        b.join(name).expect("valid");
    }
    timeout(PATIENCE, async {
        while names
            .iter()
            .any(|n| b.leader(n).is_none_or(|l| l.candidate.id != "host-a"))
        {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("b sees a lead every election");
    assert_eq!(b.leading(), 0);

    // A leave: a's term ends at the call, b's begins after the release.
    let leaving = a.leave(names[0]);
    assert!(a_terms[0].is_cancelled());
    leaving.await.expect("left");
    let b0 = elected(&mut member(&mut b_events, names[0]), PATIENCE).await;
    assert!(b0.fencing_token() > a_terms[0].fencing_token());

    // An operator deletes a's key: only that member's term ends, and b takes over.
    let key = candidates(&mut client, &a_backend, names[1]).await[0]
        .key()
        .to_vec();
    client.delete(key, None).await.expect("delete");
    assert_eq!(
        demoted(&mut member(&mut a_events, names[1]), PATIENCE).await,
        DemotionReason::KeyDeleted
    );
    assert!(a_terms[1].is_cancelled());
    assert!(
        !a_terms[2].is_cancelled(),
        "the other member's term goes on"
    );
    let b1 = elected(&mut member(&mut b_events, names[1]), PATIENCE).await;
    assert!(b1.fencing_token() > a_terms[1].fencing_token());
    assert!(!a.is_leader(names[1]));

    // A shutdown hands the rest over.
    a.shutdown().await.expect("shuts down");
    assert!(a_terms[2].is_cancelled());
    let b2 = elected(&mut member(&mut b_events, names[2]), PATIENCE).await;
    assert!(b2.fencing_token() > a_terms[2].fencing_token());
    assert_eq!(b.leading(), 3);
    b.shutdown().await.expect("shuts down");
    assert_eq!(count_keys(&mut client, "incumbent/handoff/").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_ends_every_members_term_and_the_set_leads_again_on_a_new_one() {
    let (_etcd, mut client, backend) = etcd_alone().await;
    let set = set_of(&backend, "host-a");
    let mut events = set.events();
    let names = ["revoked/0", "revoked/1"];
    let mut terms = Vec::new();
    for name in names {
        set.join(name).expect("valid");
        terms.push(elected(&mut member(&mut events, name), PATIENCE).await);
    }
    let lease = backend.lease_ids()[0];
    client.lease_revoke(lease).await.expect("revoke");
    // Every member's term ends, and each leads again, in whatever order the set reports.
    let (mut demoted, mut again) = (
        std::collections::HashMap::new(),
        std::collections::HashMap::new(),
    );
    timeout(PATIENCE, async {
        while again.len() < names.len() {
            let SetEvent { election, event } = events.recv().await.expect("the set runs");
            match event {
                LeadershipEvent::Demoted { reason, .. } => {
                    demoted.insert(election, reason);
                }
                LeadershipEvent::Elected(term) if demoted.contains_key(&election) => {
                    again.insert(election, term);
                }
                _ => {}
            }
        }
    })
    .await
    .expect("every member demoted and elected again");
    for (name, term) in names.iter().zip(&terms) {
        let reason = demoted[*name];
        assert!(
            matches!(
                reason,
                DemotionReason::SessionExpired | DemotionReason::KeyDeleted
            ),
            "{name}: {reason:?}"
        );
        assert!(term.is_cancelled());
        assert!(
            term.stop_by().is_some(),
            "an involuntary loss says when the work must stop"
        );
        assert!(again[*name].fencing_token() > term.fencing_token());
    }
    assert!(!backend.lease_ids().contains(&lease), "a new lease");
    set.shutdown().await.expect("shuts down");
}
