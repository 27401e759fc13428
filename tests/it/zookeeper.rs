//! The ZooKeeper backend against a real ZooKeeper server: what is particular to ZooKeeper
//! (predecessor watches that wake one candidate, czxids as fencing tokens, sessions that
//! expire or survive a reconnect, digest ACLs and chroots, the negotiated timeout, a member
//! of an ensemble lost or cut off, credentials kept out of output). The behaviour every
//! backend shares is in the conformance suite.

use std::time::Duration;

use crate::support::events::{demoted, elected};
use crate::support::zookeeper::ZookeeperEnsemble;
use crate::support::{Proxy, ZookeeperServer};
use incumbent::backend::{
    Attempt, Backend, Candidate, Contender, Observer, Session, SessionOptions,
};
use incumbent::zookeeper::{SessionHandle, ZookeeperBackend};
use incumbent::{DemotionReason, Election, Error};
use tokio::time::{sleep, timeout};
use zookeeper_client as zk;

/// The session timeout of most tests.
const TTL: Duration = Duration::from_secs(2);
/// How long any expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);

async fn connect(connect_string: &str) -> ZookeeperBackend {
    ZookeeperBackend::builder(connect_string)
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to zookeeper")
}

fn options(ttl: Duration) -> SessionOptions {
    SessionOptions {
        ttl,
        renew_interval: ttl / 3,
        lock_delay: None,
        name: "test".to_owned(),
    }
}

fn candidate(id: &str) -> Candidate {
    Candidate {
        id: id.to_owned(),
        metadata: Default::default(),
    }
}

fn election(backend: &ZookeeperBackend, name: &str, id: &str) -> Election<ZookeeperBackend> {
    Election::builder(backend.clone(), name)
        .candidate(id)
        .ttl(TTL)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100))
        .build()
        .expect("valid election")
}

/// A plain client, as an operator (or zkCli.sh) would use it.
async fn operator(server: &ZookeeperServer) -> zk::Client {
    zk::Client::connect(&server.connect_string())
        .await
        .expect("operator client")
}

/// Attaches to a session with its id and password on a connection of its own and closes it,
/// as an operator's client can: ZooKeeper's frames written out here, so that neither this
/// crate's client nor the one `operator` uses is involved.
async fn close_session(server: &str, handle: &SessionHandle) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn frame(stream: &mut tokio::net::TcpStream, body: &[u8]) -> Vec<u8> {
        let length = i32::try_from(body.len()).expect("short");
        stream
            .write_all(&length.to_be_bytes())
            .await
            .expect("write");
        stream.write_all(body).await.expect("write");
        let mut length = [0; 4];
        stream.read_exact(&mut length).await.expect("an answer");
        let mut answer = vec![0; usize::try_from(i32::from_be_bytes(length)).expect("length")];
        stream.read_exact(&mut answer).await.expect("an answer");
        answer
    }

    let mut stream = tokio::net::TcpStream::connect(server)
        .await
        .expect("connect");
    // ConnectRequest: protocol version, last zxid seen, timeout (ms), session id, password,
    // read-only.
    let mut connect = Vec::new();
    connect.extend(0i32.to_be_bytes());
    connect.extend(0i64.to_be_bytes());
    connect.extend(30_000i32.to_be_bytes());
    connect.extend(handle.id().to_be_bytes());
    connect.extend(
        i32::try_from(handle.password().len())
            .expect("short")
            .to_be_bytes(),
    );
    connect.extend(handle.password());
    connect.push(0);
    let accepted = frame(&mut stream, &connect).await;
    let timeout_ms = i32::from_be_bytes(accepted[4..8].try_into().expect("4 bytes"));
    let id = i64::from_be_bytes(accepted[8..16].try_into().expect("8 bytes"));
    assert!(
        timeout_ms > 0 && id == handle.id(),
        "attached to the session"
    );
    // closeSession: xid 1, type -11; the answer's header: xid, zxid, err.
    let mut close = Vec::new();
    close.extend(1i32.to_be_bytes());
    close.extend((-11i32).to_be_bytes());
    let answer = frame(&mut stream, &close).await;
    let xid = i32::from_be_bytes(answer[..4].try_into().expect("4 bytes"));
    let err = i32::from_be_bytes(answer[12..16].try_into().expect("4 bytes"));
    assert_eq!((xid, err), (1, 0), "the close is answered");
}

/// The children of `path`, sorted.
async fn children(client: &zk::Client, path: &str) -> Vec<String> {
    let mut children = client.list_children(path).await.unwrap_or_default();
    children.sort();
    children
}

async fn token(contender: &mut impl Contender) -> u64 {
    match contender.acquire().await.expect("acquire") {
        Attempt::Won { fencing_token } => fencing_token,
        other => panic!("expected to win, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_wakes_only_the_successor() {
    let server = ZookeeperServer::single().await;
    let mut contenders = Vec::new();
    let mut sessions = Vec::new();
    for id in ["a", "b", "c"] {
        let backend = connect(&server.connect_string()).await;
        let session = backend.open_session(&options(TTL)).await.expect("session");
        contenders.push(
            session
                .contend("handoff", &candidate(id))
                .await
                .expect("contend"),
        );
        sessions.push(session);
    }
    let mut c = contenders.pop().expect("c");
    let mut b = contenders.pop().expect("b");
    let mut a = contenders.pop().expect("a");
    let a_token = token(&mut a).await;
    for follower in [&mut b, &mut c] {
        match follower.acquire().await.expect("acquire") {
            Attempt::Held {
                holder: Some(holder),
            } => {
                assert_eq!(holder.candidate.id, "a");
                assert_eq!(holder.fencing_token, Some(a_token));
            }
            other => panic!("expected a to hold, got {other:?}"),
        }
    }
    let b_wait = tokio::spawn(async move {
        b.wait().await.expect("b waits");
        b
    });
    let c_wait = tokio::spawn(async move {
        c.wait().await.expect("c waits");
        c
    });
    sleep(Duration::from_millis(200)).await;
    assert!(
        !b_wait.is_finished() && !c_wait.is_finished(),
        "nobody wakes before the hand-off"
    );
    a.release().await.expect("release");
    let mut b = timeout(PATIENCE, b_wait)
        .await
        .expect("the successor wakes")
        .expect("join");
    sleep(Duration::from_millis(500)).await;
    assert!(
        !c_wait.is_finished(),
        "the hand-off woke the candidate behind the successor"
    );
    let b_token = token(&mut b).await;
    assert!(b_token > a_token, "tokens grow: {a_token} then {b_token}");
    c_wait.abort();
}

/// A follower whose connection broke while its predecessor left is woken when it reconnects:
/// the server forgot the connection's watches with it, and the client sets them again
/// (`SetWatches`, from the last transaction it saw), so the delete it missed fires at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_away_while_the_leader_left_is_woken_when_it_reconnects() {
    let server = ZookeeperServer::single().await;
    let proxy = Proxy::start(server.client_addr());
    let a_backend = connect(&server.connect_string()).await;
    let b_backend = connect(&proxy.addr().to_string()).await;
    let a_session = a_backend
        .open_session(&options(TTL))
        .await
        .expect("a's session");
    let b_session = b_backend
        .open_session(&options(TTL))
        .await
        .expect("b's session");
    let mut a = a_session
        .contend("away", &candidate("a"))
        .await
        .expect("contend");
    let mut b = b_session
        .contend("away", &candidate("b"))
        .await
        .expect("contend");
    let a_token = token(&mut a).await;
    assert!(matches!(
        b.acquire().await.expect("acquire"),
        Attempt::Held { .. }
    ));
    let b_wait = tokio::spawn(async move {
        b.wait().await.expect("b waits");
        b
    });
    sleep(Duration::from_millis(100)).await;
    // b's connection is cut (the server drops its watches with it), and b cannot reach the
    // server again until a has left.
    proxy.blackhole(true);
    proxy.reset_all();
    a.release().await.expect("a leaves");
    sleep(Duration::from_millis(100)).await;
    assert!(!b_wait.is_finished(), "b cannot have heard of it yet");
    proxy.blackhole(false);
    let mut b = timeout(PATIENCE, b_wait)
        .await
        .expect("b is woken once it reconnects")
        .expect("b's task");
    let b_token = token(&mut b).await;
    assert!(b_token > a_token, "tokens grow: {a_token} then {b_token}");
    drop(a_session);
}

/// An observer's first read finds no election node, and its watch for the node's creation
/// reaches the server only after the node was created (a slow link, 600 ms each way): that
/// watch will never fire for a candidate (a node's data watch does not fire for its
/// children), so the observer lists the election again, with a child watch, and sees the
/// first candidate when it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_whose_election_is_created_behind_its_back_sees_the_first_candidate() {
    let server = ZookeeperServer::single().await;
    let proxy = Proxy::start(server.client_addr());
    let slow = connect(&proxy.addr().to_string()).await;
    let fast = connect(&server.connect_string()).await;
    let admin = operator(&server).await;
    let path = slow.election_path("late");
    let mut observer = slow.observe("late").await.expect("observe");
    proxy.set_latency(Duration::from_millis(600));
    let first = tokio::spawn(async move {
        let first = observer.next().await.expect("the first read");
        (observer, first)
    });
    // The list (sent at once) reaches the server at 600 ms and finds no node; the watch on
    // the node's creation is sent when that answer is back, at 1,200 ms, and arrives at
    // 1,800 ms. The node is created between the two.
    sleep(Duration::from_millis(1_500)).await;
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mut made = String::new();
    for part in path.trim_start_matches('/').split('/') {
        made = format!("{made}/{part}");
        match admin.create(&made, b"", &open).await {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => panic!("create {made}: {e}"),
        }
    }
    let (mut observer, first) = timeout(PATIENCE, first)
        .await
        .expect("the first read ends")
        .expect("the observer's task");
    assert_eq!(first, None, "nobody leads yet");
    proxy.set_latency(Duration::ZERO);
    let session = fast.open_session(&options(TTL)).await.expect("session");
    let mut a = session
        .contend("late", &candidate("a"))
        .await
        .expect("contend");
    let a_token = token(&mut a).await;
    let seen = timeout(PATIENCE, observer.next())
        .await
        .expect("the observer sees the first candidate")
        .expect("read")
        .expect("a leads");
    assert_eq!(seen.candidate.id, "a");
    assert_eq!(seen.fencing_token, Some(a_token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_closed_by_another_client_demotes_with_session_expired() {
    let server = ZookeeperServer::single().await;
    let proxy = Proxy::start(server.client_addr());
    let backend = connect(&proxy.addr().to_string()).await;
    let mut campaign = election(&backend, "expiry", "a").campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    let [handle] = backend.session_handles().try_into().expect("one session");
    // Attach to the leader's session with its id and password, and close it, as an
    // operator can: the server deletes its nodes, and the leader's client hears that the
    // session expired when it reconnects. Its own connection is held for the moment, far
    // shorter than the renew deadline, so that it does not attach to the session again in
    // between.
    proxy.blackhole(true);
    timeout(
        PATIENCE,
        close_session(&server.client_addr().to_string(), &handle),
    )
    .await
    .expect("the session is closed in time");
    proxy.blackhole(false);
    assert_eq!(
        demoted(&mut campaign, PATIENCE).await,
        DemotionReason::SessionExpired
    );
    assert!(term.is_cancelled());
    // A new session, a new node, a greater token.
    let next = elected(&mut campaign, PATIENCE).await;
    assert!(next.fencing_token() > term.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_deleting_the_leaders_node_demotes_with_key_deleted() {
    let server = ZookeeperServer::single().await;
    let backend = connect(&server.connect_string()).await;
    let mut campaign = election(&backend, "deleted", "a").campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    let admin = operator(&server).await;
    let path = backend.election_path("deleted");
    let nodes = children(&admin, &path).await;
    assert_eq!(nodes.len(), 1, "one candidate node: {nodes:?}");
    admin
        .delete(&format!("{path}/{}", nodes[0]), None)
        .await
        .expect("delete the leader's node");
    assert_eq!(
        demoted(&mut campaign, PATIENCE).await,
        DemotionReason::KeyDeleted
    );
    let next = elected(&mut campaign, PATIENCE).await;
    assert!(next.fencing_token() > term.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_within_the_session_timeout_keeps_one_node() {
    let server = ZookeeperServer::single().await;
    let proxy = Proxy::start(server.client_addr());
    let backend = connect(&proxy.addr().to_string()).await;
    let session = backend.open_session(&options(TTL)).await.expect("session");
    let mut contender = session
        .contend("reconnect", &candidate("a"))
        .await
        .expect("contend");
    let first = token(&mut contender).await;
    let id = session.session_id();
    // The connection breaks; the client reconnects with the same session.
    proxy.reset_all();
    sleep(Duration::from_millis(300)).await;
    assert_eq!(token(&mut contender).await, first, "the same node leads on");
    assert_eq!(session.session_id(), id);
    let admin = operator(&server).await;
    let nodes = children(&admin, &backend.election_path("reconnect")).await;
    assert_eq!(nodes.len(), 1, "one node for one candidate: {nodes:?}");
    assert!(session.health().borrow().lost.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observer_follows_many_changes() {
    let server = ZookeeperServer::single().await;
    let backend = connect(&server.connect_string()).await;
    let mut observer = backend.observe("many").await.expect("observe");
    assert_eq!(observer.next().await.expect("first read"), None);
    let session = backend.open_session(&options(TTL)).await.expect("session");
    let mut last = 0;
    for i in 0..20 {
        let id = format!("c{i}");
        let mut contender = session
            .contend("many", &candidate(&id))
            .await
            .expect("contend");
        let token = token(&mut contender).await;
        assert!(token > last, "tokens grow");
        last = token;
        let seen = timeout(PATIENCE, async {
            loop {
                let holder = observer.next().await.expect("next");
                if let Some(holder) = holder
                    && holder.candidate.id == id
                {
                    return holder;
                }
            }
        })
        .await
        .expect("the observer sees each leader");
        assert_eq!(seen.fencing_token, Some(token));
        contender.release().await.expect("release");
    }
    let gone = timeout(PATIENCE, observer.next()).await.expect("in time");
    assert_eq!(gone.expect("next"), None, "nobody leads at the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_and_chroot_protect_the_nodes() {
    let server = ZookeeperServer::single().await;
    let connect_string = format!("{}/app", server.connect_string());
    let backend = ZookeeperBackend::builder(connect_string.clone())
        .digest_auth("indexer", "s3cret")
        .connect()
        .await
        .expect("connect with digest auth");
    assert!(!format!("{backend:?}").contains("s3cret"));
    let mut campaign = election(&backend, "secure", "a").campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    // The nodes live under the chroot, readable only with the credentials.
    let admin = zk::Client::connector()
        .with_auth("digest", b"indexer:s3cret")
        .connect(&server.connect_string())
        .await
        .expect("operator client with the credentials");
    let path = format!("/app{}", backend.election_path("secure"));
    let nodes = children(&admin, &path).await;
    assert_eq!(nodes.len(), 1, "one node under the chroot: {nodes:?}");
    let anonymous = operator(&server).await;
    let read = anonymous.list_children(&path).await;
    assert_eq!(read.err(), Some(zk::Error::NoAuth));
    let stranger = ZookeeperBackend::builder(connect_string)
        .digest_auth("indexer", "wrong")
        .connect()
        .await
        .expect("connect: digest auth is only checked against ACLs");
    let mut observer = stranger.observe("secure").await.expect("observe");
    match observer.next().await {
        Err(Error::Unauthorized { reason, .. }) => assert!(!reason.contains("wrong")),
        other => panic!("expected Unauthorized, got {other:?}"),
    }
    let mut allowed = backend.observe("secure").await.expect("observe");
    let holder = allowed.next().await.expect("read").expect("a holder");
    assert_eq!(holder.fencing_token, Some(term.fencing_token()));
    drop(campaign);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_negotiated_timeout_is_reported_and_a_shorter_one_refused() {
    let server = ZookeeperServer::single().await;
    let backend = connect(&server.connect_string()).await;
    let session = backend.open_session(&options(TTL)).await.expect("session");
    assert_eq!(session.negotiated_timeout(), TTL);
    session.close().await.expect("close");
    // Beyond the server's maxSessionTimeout (60 s in the test server).
    let long = Duration::from_secs(120);
    match backend.open_session(&options(long)).await {
        Err(Error::InvalidTiming { reason }) => assert!(reason.contains("maxSessionTimeout")),
        other => panic!("expected InvalidTiming, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_fences_the_leader_and_the_term_ends_before_the_session() {
    let mut server = ZookeeperServer::single().await;
    let backend = connect(&server.connect_string()).await;
    let mut campaign = election(&backend, "paused", "a").campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    server.process().pause();
    let paused = tokio::time::Instant::now();
    let cancelled = timeout(TTL, term.cancelled()).await;
    server.process().resume();
    assert!(
        cancelled.is_ok(),
        "the term outlived the session timeout ({:?})",
        paused.elapsed()
    );
    // The leader comes back once the server answers again.
    let event = elected(&mut campaign, PATIENCE).await;
    assert!(event.fencing_token() >= term.fencing_token());
}

/// The member that leads `ensemble` (asked every 100 ms, for at most 5 s).
async fn quorum_leader(ensemble: &ZookeeperEnsemble) -> usize {
    for _ in 0..50 {
        if let Some(leader) = ensemble.leader().await {
            return leader;
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("no member says it leads the ensemble");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_member_of_three_keeps_the_leader() {
    let mut ensemble = ZookeeperEnsemble::three().await;
    // The member to lose: the one every client tries first (so the clients reconnect), and
    // not the ensemble's own leader. Losing that one pauses the ensemble for an election of
    // its own, which a leader outlasts only when it is shorter than its renewals' slack (a
    // sixth of the ttl at worst, see `zookeeper` in the crate's docs): a matter of timing,
    // not of a minority gone.
    let gone = (quorum_leader(&ensemble).await + 1) % 3;
    let connect_string = ensemble.connect_string_of(&[gone, (gone + 1) % 3, (gone + 2) % 3]);
    // A session timeout long enough for the ensemble to elect a new quorum leader, should
    // the member that goes be the quorum's leader.
    let ttl = Duration::from_secs(6);
    let leader_backend = connect(&connect_string).await;
    let mut leader = Election::builder(leader_backend, "ensemble")
        .candidate("a")
        .ttl(ttl)
        .build()
        .expect("valid election")
        .campaign();
    let term = elected(&mut leader, PATIENCE).await;
    let follower_backend = connect(&connect_string).await;
    let follower = Election::builder(follower_backend, "ensemble")
        .candidate("b")
        .ttl(ttl)
        .build()
        .expect("valid election")
        .campaign();
    sleep(Duration::from_millis(500)).await;
    ensemble.member(gone).kill9();
    sleep(ttl * 2).await;
    assert!(
        !term.is_cancelled(),
        "the leader lost its term with one member of three gone: {:?}",
        leader.status().borrow()
    );
    assert!(leader.status().borrow().is_leader());
    assert!(!follower.status().borrow().is_leader());
    let observer_backend = connect(&connect_string).await;
    let mut observer = observer_backend.observe("ensemble").await.expect("observe");
    let holder = observer.next().await.expect("read").expect("a holder");
    assert_eq!(holder.candidate.id, "a");
    assert_eq!(holder.fencing_token, Some(term.fencing_token()));
}

/// How long a follower of the proxied ensemble takes to notice it no longer hears from its
/// leader, in ticks (`syncLimit`): 2 s, as long as the session timeout, so that a follower
/// cut off goes on answering reads until after the quorum expired a session it holds.
const SYNC_LIMIT_TICKS: u32 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_behind_a_cut_off_follower_ends_its_term_before_another_is_elected() {
    let ensemble = ZookeeperEnsemble::three_with_peer_proxies(SYNC_LIMIT_TICKS).await;
    let quorum_leader = quorum_leader(&ensemble).await;
    let follower = (0..3).find(|&i| i != quorum_leader).expect("a follower");
    let others: Vec<usize> = (0..3).filter(|&i| i != follower).collect();
    // Candidate a talks only to the follower, b only to the other two members.
    let a_backend = connect(&ensemble.connect_string_of(&[follower])).await;
    let mut a = election(&a_backend, "partition", "a").campaign();
    let a_term = elected(&mut a, PATIENCE).await;
    let b_backend = connect(&ensemble.connect_string_of(&others)).await;
    let b = election(&b_backend, "partition", "b").campaign();
    sleep(Duration::from_millis(500)).await;
    assert!(!b.status().borrow().is_leader(), "b queues behind a");
    let a_token = a_term.cancellation_token();
    let a_ended = tokio::spawn(async move {
        a_token.cancelled().await;
        tokio::time::Instant::now()
    });
    let mut b = b;
    // The worst moment to cut: just after a renewal was confirmed, before the follower can
    // report the session's activity to the ensemble's leader (its next ping answer), which
    // then counts the session's time from the activity before the renewal: the case that
    // `DeadlineRule::PreviousActivity` keeps a margin for. (With this ensemble's 200 ms
    // ticks, a's term ends 1.0 s after the cut, and b is elected 1.4 to 1.7 s after it.)
    let mut renewals = a
        .status()
        .borrow()
        .renewals()
        .expect("a leader has a session");
    renewals.borrow_and_update();
    timeout(TTL, renewals.changed())
        .await
        .expect("a renewal is confirmed within the ttl")
        .expect("the session is kept");
    // The follower loses the rest of the ensemble; its client port stays open.
    ensemble.isolate(follower, true);
    let cut = tokio::time::Instant::now();
    let b_term = elected(&mut b, PATIENCE).await;
    let b_elected = b_term.started();
    let a_ended = timeout(PATIENCE, a_ended)
        .await
        .expect("a's term ends")
        .expect("join");
    eprintln!(
        "after the cut: a's term ended at {:?}, b was elected at {:?}",
        a_ended - cut,
        b_elected - cut
    );
    assert!(
        a_ended < b_elected,
        "a's term ended {:?} after the cut, after b was elected ({:?} after the cut): two \
         terms overlapped for {:?}",
        a_ended - cut,
        b_elected - cut,
        a_ended - b_elected
    );
    assert!(
        b_term.fencing_token() > a_term.fencing_token(),
        "tokens grow: {:?} then {:?}",
        a_term.fencing_token(),
        b_term.fencing_token()
    );
    drop(a);
    drop(b);
}

#[tokio::test]
async fn credentials_in_the_connect_string_are_in_no_error_or_debug_output() {
    let mut leaks = Vec::new();
    for connect_string in [
        "zk://indexer:s3cret@127.0.0.1:2181/app",
        "indexer:s3cret@127.0.0.1:2181,,127.0.0.1:2182",
        "127.0.0.1:2181,,127.0.0.1:2182/app?password=s3cret",
        "127.0.0.1:2181/app?password=s3cret",
        // Well-formed as far as this crate can tell: the client library gets it.
        "127.0.0.1:1?password=s3cret",
    ] {
        let builder = ZookeeperBackend::builder(connect_string)
            .digest_auth("indexer", "s3cret")
            .connect_timeout(Duration::from_millis(200));
        let mut shown = vec![format!("{builder:?}")];
        match builder.connect().await {
            Ok(backend) => panic!("connected with {connect_string}: {backend:?}"),
            Err(error) => shown.extend([error.to_string(), format!("{error:?}")]),
        }
        leaks.extend(shown.into_iter().filter(|text| text.contains("s3cret")));
    }
    assert!(leaks.is_empty(), "secrets shown: {leaks:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participants_lists_the_queue_leader_first_without_campaigning() {
    let server = ZookeeperServer::single().await;
    let backend = connect(&server.connect_string()).await;
    let bystander = election(&backend, "queue", "bystander");
    assert_eq!(
        bystander.participants().await.expect("read"),
        Some(Vec::new())
    );
    let mut a = election(&backend, "queue", "a").campaign();
    let term = elected(&mut a, PATIENCE).await;
    let mut waiting = Vec::new();
    for id in ["b", "c"] {
        let campaign = election(&connect(&server.connect_string()).await, "queue", id).campaign();
        let mut status = campaign.status();
        tokio::time::timeout(
            PATIENCE,
            status.wait_for(|s| s.role == incumbent::Role::Follower),
        )
        .await
        .expect("follows")
        .expect("runs");
        waiting.push(campaign);
    }
    let queue = bystander
        .participants()
        .await
        .expect("read")
        .expect("ZooKeeper keeps a queue");
    let ids: Vec<&str> = queue.iter().map(|l| l.candidate.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"], "in the order the lock is handed on");
    assert_eq!(queue[0].fencing_token, Some(term.fencing_token()));
    for campaign in waiting {
        campaign.shutdown().await.expect("shutdown");
    }
    a.shutdown().await.expect("shutdown");
}

/// Connections the server has open, from its AdminServer.
async fn connections(server: &ZookeeperServer) -> Option<usize> {
    let body = crate::support::http::get(server.admin_addr(), "/commands/cons")
        .await
        .ok()?
        .body;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    json["connections"].as_array().map(Vec::len)
}

/// A process that campaigns holds one connection to the ensemble, as kazoo does: its
/// observers and reads go through its campaign session, and the session `connect` opened to
/// check the ensemble is let go. With no campaign left, an observer opens one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaigning_process_holds_one_connection() {
    let server = ZookeeperServer::single().await;
    let backend = connect(&server.connect_string()).await;
    assert_eq!(connections(&server).await, Some(1), "connect's own session");
    let mut a = election(&backend, "one-connection", "a").campaign();
    elected(&mut a, PATIENCE).await;
    let mut observer = backend.observe("one-connection").await.expect("observe");
    let holder = observer.next().await.expect("read").expect("a leader");
    assert_eq!(holder.candidate.id, "a");
    let line = backend
        .participants("one-connection")
        .await
        .expect("list")
        .expect("a line");
    assert_eq!(line.len(), 1);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while connections(&server).await != Some(1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?} connections while campaigning",
            connections(&server).await
        );
        sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(backend.session_ids().len(), 1);

    // Without a campaign the observer still reads, through a session of its own.
    a.shutdown().await.expect("shutdown");
    let mut observer = backend.observe("one-connection").await.expect("observe");
    assert_eq!(observer.next().await.expect("read"), None);
}
