//! The Consul backend against a real `consul agent -dev`, one behaviour per test.
//!
//! Needs the `consul` binary (`scripts/install-test-deps`); a missing binary fails the tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::events::{demoted, elected};
use crate::support::{ConsulDev, ServerProcess};
use incumbent::consul::client::{ConsulClient, PutOptions, QueryOptions, SessionCreate};
use incumbent::consul::{ConsulBackend, ConsulConfig};
use incumbent::{Campaign, DemotionReason, Election, Error, Role};
use tokio::time::{Instant, sleep, timeout};

/// Consul's smallest session ttl.
const TTL: Duration = Duration::from_secs(10);

fn backend(url: &str, lock_delay: Option<Duration>) -> ConsulBackend {
    let mut builder = ConsulBackend::builder(ConsulConfig::new(url));
    if let Some(delay) = lock_delay {
        builder = builder.lock_delay(delay);
    }
    builder.build().expect("valid backend settings")
}

fn election(backend: ConsulBackend, name: &str, id: &str) -> Election<ConsulBackend> {
    Election::builder(backend, name)
        .candidate(id)
        .ttl(TTL)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_secs(2))
        .build()
        .expect("valid election settings")
}

/// A campaign of candidate `id` for `name`, on a backend of its own.
fn candidate(url: &str, name: &str, id: &str, lock_delay: Option<Duration>) -> Campaign {
    election(backend(url, lock_delay), name, id).campaign()
}

fn admin(url: &str) -> ConsulClient {
    ConsulClient::new(ConsulConfig::new(url)).expect("admin client")
}

/// An agent that closes connections beyond `limits.http_max_conns_per_client` (here 2, held
/// by two idle TCP connections) does so without an answer: the error says which limit to
/// raise, since each waiting election holds a connection.
#[tokio::test]
async fn a_connection_refused_by_the_agents_limit_names_the_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = "-hcl=limits { http_max_conns_per_client = 2 }".to_owned();
    let (_agent, http) =
        crate::support::consul::spawn_dev("consul-limit", dir.path(), &[limits]).await;
    // spawn_dev's own readiness checks have closed their connections; take the two slots.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tokio::net::TcpStream::connect(http).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let error = admin(&format!("http://{http}"))
        .kv_get("any", &Default::default())
        .await
        .expect_err("the agent refuses a third connection");
    let message = error.to_string();
    assert!(error.is_transient(), "{message}");
    assert!(
        message.contains("limits.http_max_conns_per_client"),
        "{message}"
    );
}

/// Waits until `campaign`'s role satisfies `pred`.
async fn role_becomes(campaign: &Campaign, limit: Duration, pred: impl Fn(&Role) -> bool) {
    let mut status = campaign.status();
    timeout(limit, status.wait_for(|s| pred(&s.role)))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "role still {:?} after {limit:?}",
                campaign.status().borrow().role
            )
        })
        .expect("campaign running");
}

/// The key's entry, read consistently.
async fn entry(client: &ConsulClient, key: &str) -> Option<incumbent::consul::client::KvEntry> {
    let consistent = QueryOptions {
        consistent: true,
        ..QueryOptions::default()
    };
    client.kv_get(key, &consistent).await.expect("kv get").entry
}

/// `(id, name)` of every session the agent knows.
async fn sessions(addr: SocketAddr) -> Vec<(String, String)> {
    let response = crate::support::http::get(addr, "/v1/session/list")
        .await
        .expect("session list");
    let list: Vec<serde_json::Value> = serde_json::from_str(&response.body).expect("JSON");
    list.iter()
        .map(|s| {
            (
                s["ID"].as_str().unwrap_or_default().to_owned(),
                s["Name"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The id of the session named for candidate `id`.
async fn session_of(addr: SocketAddr, id: &str) -> String {
    let name = format!("incumbent:{id}");
    sessions(addr)
        .await
        .into_iter()
        .find(|(_, n)| *n == name)
        .map(|(id, _)| id)
        .unwrap_or_else(|| panic!("no session named {name}"))
}

/// A dev agent this file starts itself, for its log (dev agents log every HTTP request at
/// debug level) or extra settings.
struct LoggedAgent {
    _process: ServerProcess,
    http: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoggedAgent {
    async fn start(name: &str, extra: &[&str]) -> LoggedAgent {
        let dir = tempfile::Builder::new()
            .prefix("incumbent-consul-")
            .tempdir()
            .expect("temp dir");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (process, http) = crate::support::consul::spawn_dev(name, dir.path(), &extra).await;
        LoggedAgent {
            _process: process,
            http,
            log: dir.path().join(format!("{name}.log")),
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// How many finished HTTP requests the agent has logged whose URL starts with `path`.
    fn requests(&self, path: &str) -> usize {
        count_requests(&self.log, path)
    }
}

fn count_requests(log: &Path, path: &str) -> usize {
    let needle = format!("url={path}");
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("Request finished") && l.contains(&needle))
        .count()
}

#[tokio::test]
async fn one_leader_among_three() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let candidates: Vec<Campaign> = (0..3)
        .map(|i| candidate(&url, "three", &format!("c{i}"), None))
        .collect();
    let leaders = || {
        candidates
            .iter()
            .filter(|c| c.status().borrow().is_leader())
            .count()
    };
    let deadline = Instant::now() + TTL;
    while leaders() == 0 {
        assert!(Instant::now() < deadline, "no leader within {TTL:?}");
        sleep(Duration::from_millis(10)).await;
    }
    // Stable, and every candidate names the same leader.
    for _ in 0..20 {
        assert_eq!(leaders(), 1);
        sleep(Duration::from_millis(100)).await;
    }
    let statuses: Vec<_> = candidates
        .iter()
        .map(|c| c.status().borrow().clone())
        .collect();
    let leader = statuses.iter().find(|s| s.is_leader()).expect("a leader");
    for s in &statuses {
        assert_eq!(
            s.leader.as_ref().map(|l| &l.candidate.id),
            Some(&leader.candidate.id),
            "{s:?}"
        );
    }
}

#[tokio::test]
async fn the_fencing_token_is_the_modify_index_and_grows_on_hand_off() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let admin = admin(&url);
    let key = "incumbent/tokens";
    let mut a = candidate(&url, "tokens", "a", None);
    let first = elected(&mut a, TTL).await;
    let held = entry(&admin, key).await.expect("the key");
    assert_eq!(first.fencing_token(), held.modify_index);
    assert_ne!(first.fencing_token(), held.lock_index, "not the lock index");
    let mut b = candidate(&url, "tokens", "b", None);
    role_becomes(&b, TTL, |r| *r == Role::Follower).await;
    a.shutdown().await.expect("shutdown");
    let second = elected(&mut b, TTL).await;
    let held = entry(&admin, key).await.expect("the key");
    assert_eq!(second.fencing_token(), held.modify_index);
    assert!(
        second.fencing_token() > first.fencing_token(),
        "{} then {}",
        first.fencing_token(),
        second.fencing_token()
    );
    // Observers read the token with the leader.
    assert_eq!(
        b.status()
            .borrow()
            .leader
            .as_ref()
            .and_then(|l| l.fencing_token),
        Some(second.fencing_token())
    );
}

#[tokio::test]
async fn a_release_wakes_the_blocked_follower_at_once() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let mut a = candidate(&url, "handoff", "a", None);
    let first = elected(&mut a, TTL).await;
    let mut b = candidate(&url, "handoff", "b", None);
    role_becomes(&b, TTL, |r| *r == Role::Follower).await;
    sleep(Duration::from_millis(500)).await; // b sits in its blocking query
    a.resign().await.expect("resign");
    let released = Instant::now();
    assert!(first.is_cancelled());
    let second = elected(&mut b, TTL).await;
    let took = released.elapsed();
    println!("follower elected {took:?} after the release");
    assert!(
        took < Duration::from_millis(300),
        "took {took:?}: a poll, not a wake-up"
    );
    assert!(second.fencing_token() > first.fencing_token());
}

#[tokio::test]
async fn lock_delay_zero_hands_off_at_once_after_the_session_is_invalidated() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let admin = admin(&url);
    let mut a = candidate(&url, "nodelay", "a", Some(Duration::ZERO));
    elected(&mut a, TTL).await;
    let mut b = candidate(&url, "nodelay", "b", Some(Duration::ZERO));
    role_becomes(&b, TTL, |r| *r == Role::Follower).await;
    let session = session_of(consul.http_addr(), "a").await;
    admin.session_destroy(&session).await.expect("destroy");
    let destroyed = Instant::now();
    elected(&mut b, Duration::from_secs(1)).await;
    println!("elected {:?} after the invalidation", destroyed.elapsed());
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::SessionExpired);
}

#[tokio::test]
async fn lock_delay_is_waited_out_by_waking_when_it_ends() {
    let agent = LoggedAgent::start("lock-delay", &[]).await;
    let url = agent.url();
    let admin = admin(&url);
    let delay = Duration::from_secs(3);
    let mut a = candidate(&url, "delayed", "a", Some(delay));
    let first = elected(&mut a, TTL).await;
    let mut followers = vec![
        candidate(&url, "delayed", "b", Some(delay)),
        candidate(&url, "delayed", "c", Some(delay)),
    ];
    for f in &followers {
        role_becomes(f, TTL, |r| *r == Role::Follower).await;
    }
    let session = session_of(agent.http, "a").await;
    let invalidated = Instant::now();
    admin.session_destroy(&session).await.expect("destroy");

    // The leader's term ends at once: its blocking read sees the lock go.
    timeout(Duration::from_secs(1), first.cancelled())
        .await
        .expect("term cancelled at once");
    println!("term cancelled after {:?}", invalidated.elapsed());
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::SessionExpired);

    // Everyone sleeps until the delay ends, as the status says, without polling.
    sleep(Duration::from_millis(1200)).await;
    for f in &followers {
        match f.status().borrow().role {
            Role::CoolingDown { until } => {
                let wakes = until - invalidated;
                assert!(
                    wakes >= delay && wakes <= delay + Duration::from_millis(500),
                    "wakes {wakes:?} after the invalidation"
                );
            }
            other => panic!("{other:?} during the lock-delay"),
        }
    }
    let kv = "/v1/kv/incumbent/delayed";
    let before = agent.requests(kv);
    sleep(delay - Duration::from_millis(1200) - Duration::from_millis(200)).await;
    assert_eq!(
        agent.requests(kv),
        before,
        "no request for the key during the delay"
    );

    // The next leader comes when the delay ends, not on a later poll.
    let mut all: Vec<&mut Campaign> = followers.iter_mut().collect();
    all.push(&mut a);
    let (term, _) = timeout(
        delay + Duration::from_secs(1),
        futures_util::future::select_all(all.into_iter().map(|c| Box::pin(elected(c, TTL)))),
    )
    .await
    .map(|(term, i, _)| (term, i))
    .expect("a leader within the delay plus a second");
    let after = invalidated.elapsed();
    println!("next leader elected {after:?} after the invalidation");
    assert!(
        after >= delay,
        "elected {after:?} after, inside the lock-delay"
    );
    assert!(term.fencing_token() > first.fencing_token());
}

/// Two contenders of one session for one election (two campaigns of one `Election` share
/// the pooled session, each through a handle of its own): Consul would grant the second
/// `?acquire=` too, so the second waits behind the first, and is woken when the first gives
/// the lock up: released, or dropped while holding it (nothing changes in Consul then).
#[tokio::test]
async fn a_second_contender_of_one_session_waits_behind_the_first_and_is_woken_at_once() {
    use incumbent::backend::{Attempt, Backend, Candidate, Contender, Session, SessionOptions};
    let consul = ConsulDev::start().await;
    let backend = backend(&consul.http_url(), Some(Duration::ZERO));
    let options = SessionOptions {
        ttl: TTL,
        renew_interval: TTL / 3,
        lock_delay: Some(Duration::ZERO),
        name: "twins".into(),
    };
    let session = backend.open_session(&options).await.expect("session");
    let who = Candidate {
        id: "a".into(),
        metadata: Default::default(),
    };
    let mut last = 0;
    for released in [true, false] {
        // Two campaigns' handles (a handle that released a key leaves it to the others for a
        // while: each round has handles of its own).
        let ours = backend.open_session(&options).await.expect("session");
        let twin = backend.open_session(&options).await.expect("session");
        assert_eq!(
            ours.id(),
            session.id(),
            "equal options share one Consul session"
        );
        assert_eq!(
            twin.id(),
            session.id(),
            "equal options share one Consul session"
        );
        let mut first = twin.contend("twins", &who).await.expect("contend");
        let Attempt::Won { fencing_token } = first.acquire().await.expect("acquire") else {
            panic!("the first contender is alone");
        };
        assert!(fencing_token > last);
        let mut second = ours.contend("twins", &who).await.expect("contend");
        let attempt = second.acquire().await.expect("acquire");
        assert!(
            matches!(attempt, Attempt::Held { .. }),
            "the second contender of the session must not win too: {attempt:?}"
        );
        let waiting = tokio::spawn(async move {
            second.wait().await.expect("wait");
            second
        });
        sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "the second contender waits");
        if released {
            first.release().await.expect("release");
        }
        drop(first);
        let given_up = Instant::now();
        let mut second = timeout(Duration::from_secs(2), waiting)
            .await
            .unwrap_or_else(|_| panic!("still waiting (released: {released})"))
            .expect("join");
        println!("woken {:?} after the first gave up", given_up.elapsed());
        let Attempt::Won { fencing_token } = second.acquire().await.expect("acquire") else {
            panic!("the second contender wins once the first gave up");
        };
        assert!(fencing_token > last);
        last = fencing_token;
        second.release().await.expect("release");
        twin.close().await.expect("close");
        ours.close().await.expect("close");
    }
    session.close().await.expect("close");
}

#[tokio::test]
async fn an_operator_destroying_the_session_demotes_with_session_expired() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let mut a = candidate(&url, "destroyed", "a", None);
    let term = elected(&mut a, TTL).await;
    let session = session_of(consul.http_addr(), "a").await;
    admin(&url)
        .session_destroy(&session)
        .await
        .expect("destroy");
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::SessionExpired);
    assert!(term.is_cancelled());
}

#[tokio::test]
async fn deleting_the_key_demotes_with_key_deleted() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let mut a = candidate(&url, "deleted", "a", None);
    let first = elected(&mut a, TTL).await;
    assert!(
        admin(&url)
            .kv_delete("incumbent/deleted", None)
            .await
            .expect("delete")
    );
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::KeyDeleted);
    // Alone, it takes the lock again, with a greater token.
    let second = elected(&mut a, TTL).await;
    assert!(second.fencing_token() > first.fencing_token());
}

#[tokio::test]
async fn another_session_taking_the_lock_demotes_with_lock_taken() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let admin = admin(&url);
    let key = "incumbent/taken";
    let mut a = candidate(&url, "taken", "a", None);
    elected(&mut a, TTL).await;
    let ours = session_of(consul.http_addr(), "a").await;
    let theirs = admin
        .session_create(&SessionCreate {
            name: "operator".into(),
            ttl: Some(Duration::from_secs(60)),
            lock_delay: Some(Duration::ZERO),
            node_checks: Some(Vec::new()),
        })
        .await
        .expect("operator session");
    let release = PutOptions {
        release: Some(ours),
        ..PutOptions::default()
    };
    assert!(
        admin
            .kv_put(key, b"operator", &release)
            .await
            .expect("release")
    );
    let acquire = PutOptions {
        acquire: Some(theirs.clone()),
        ..PutOptions::default()
    };
    assert!(
        admin
            .kv_put(key, b"operator", &acquire)
            .await
            .expect("acquire")
    );
    assert_eq!(demoted(&mut a, TTL).await, DemotionReason::LockTaken);
    // The candidate follows the new holder instead of fighting it.
    role_becomes(&a, TTL, |r| *r == Role::Follower).await;
    assert_eq!(
        entry(&admin, key).await.and_then(|e| e.session),
        Some(theirs)
    );
}

#[tokio::test]
async fn an_agent_restart_leads_to_a_re_election() {
    let mut consul = ConsulDev::start().await;
    let url = consul.http_url();
    let mut campaigns = [
        candidate(&url, "restart", "a", None),
        candidate(&url, "restart", "b", None),
    ];
    let first = timeout(
        TTL,
        futures_util::future::select_all(campaigns.iter_mut().map(|c| Box::pin(elected(c, TTL)))),
    )
    .await
    .expect("a first leader")
    .1;
    // A restarted dev agent starts empty: every session and key is gone.
    consul.process().restart().await;
    let restarted = Instant::now();
    let reason = demoted(&mut campaigns[first], TTL).await;
    assert!(
        matches!(
            reason,
            DemotionReason::SessionExpired | DemotionReason::KeyDeleted
        ),
        "{reason:?}"
    );
    let deadline = restarted + TTL * 2;
    loop {
        let leaders = campaigns
            .iter()
            .filter(|c| c.status().borrow().is_leader())
            .count();
        assert!(leaders <= 1);
        if leaders == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no leader after the restart");
        sleep(Duration::from_millis(20)).await;
    }
    println!("re-elected {:?} after the restart", restarted.elapsed());
}

#[tokio::test]
async fn a_token_without_permission_is_unauthorized_and_retried_slowly() {
    let acl = r#"acl { enabled = true default_policy = "deny" tokens { master = "root-secret" } }"#;
    let agent = LoggedAgent::start("acl", &["-hcl", acl]).await;
    // A token with no policy at all, made with the master token (once ACLs have settled).
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let token = loop {
        let response = http
            .put(format!("{}/v1/acl/token", agent.url()))
            .header("X-Consul-Token", "root-secret")
            .body(r#"{"Description":"no permissions"}"#)
            .send()
            .await;
        match response {
            Ok(r) if r.status().is_success() => {
                let body: serde_json::Value = r.json().await.expect("JSON");
                break body["SecretID"].as_str().expect("SecretID").to_owned();
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "cannot create a token: {other:?}"
                );
                sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let backend =
        ConsulBackend::new(ConsulConfig::new(agent.url()).token(&token)).expect("backend");
    assert!(!format!("{backend:?}").contains(&token));
    let campaign = Election::builder(backend, "acl")
        .candidate("a")
        .ttl(TTL)
        .backoff(Duration::from_millis(10), Duration::from_secs(1))
        .build()
        .expect("valid")
        .campaign();
    let mut status = campaign.status();
    let problem = timeout(
        Duration::from_secs(5),
        status.wait_for(|s| s.problem.is_some()),
    )
    .await
    .expect("a problem reported")
    .expect("running")
    .problem
    .clone()
    .expect("a problem");
    assert!(
        problem.message.contains("refused the credentials"),
        "{}",
        problem.message
    );
    assert!(problem.message.contains("ACL token"), "{}", problem.message);
    assert!(!problem.message.contains(&token));
    // Retried at the longest back-off (1 s here), not in a storm.
    let create = "/v1/session/create";
    let before = agent.requests(create);
    sleep(Duration::from_secs(3)).await;
    let attempts = agent.requests(create) - before;
    println!("{attempts} session creations in 3 s");
    assert!((1..=4).contains(&attempts), "{attempts} attempts in 3 s");
    assert!(!campaign.status().borrow().is_leader());
}

#[tokio::test]
async fn one_session_serves_many_elections() {
    let consul = ConsulDev::start().await;
    let url = consul.http_url();
    let backend = backend(&url, None);
    let mut campaigns: Vec<Campaign> = (0..4)
        .map(|i| election(backend.clone(), &format!("many/{i}"), "x").campaign())
        .collect();
    for c in &mut campaigns {
        elected(c, TTL).await;
    }
    let open = sessions(consul.http_addr()).await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].1, "incumbent:x");
    assert_eq!(backend.session_ids(), vec![open[0].0.clone()]);
    // Closing all but one keeps the session; closing the last destroys it.
    let last = campaigns.pop().expect("a campaign");
    for c in campaigns {
        c.shutdown().await.expect("shutdown");
    }
    assert_eq!(sessions(consul.http_addr()).await.len(), 1);
    assert!(last.status().borrow().is_leader());
    last.shutdown().await.expect("shutdown");
    assert!(sessions(consul.http_addr()).await.is_empty());
    assert!(backend.session_ids().is_empty());
}

#[test]
fn ttls_outside_consuls_limits_are_typed_errors() {
    let backend = ConsulBackend::connect("http://127.0.0.1:8500").expect("valid");
    for ttl in [Duration::from_secs(5), Duration::from_secs(86_401)] {
        let err = Election::builder(backend.clone(), "e")
            .ttl(ttl)
            .build()
            .expect_err("outside Consul's limits");
        assert!(matches!(err, Error::InvalidTiming { .. }), "{err}");
        assert!(err.to_string().contains("consul"), "{err}");
    }
}

#[tokio::test]
async fn an_agent_paused_for_less_than_the_renew_deadline_keeps_the_leader() {
    let mut consul = ConsulDev::start().await;
    let url = consul.http_url();
    let mut a = candidate(&url, "paused", "a", None);
    let term = elected(&mut a, TTL).await;
    consul.process().pause();
    sleep(Duration::from_secs(2)).await;
    consul.process().resume();
    // Whatever was in flight is answered late, not lost: the term goes on.
    let demotion = timeout(Duration::from_secs(5), demoted(&mut a, TTL)).await;
    assert!(demotion.is_err(), "demoted: {demotion:?}");
    assert!(!term.is_cancelled());
    assert!(a.status().borrow().is_leader());
}

#[tokio::test]
async fn an_unreachable_agent_is_reported_as_unavailable_and_retried() {
    let (nobody, _refusing) = crate::support::net::refused_addr();
    let nobody = format!("http://{nobody}");
    let campaign = candidate(&nobody, "unreachable", "a", None);
    let mut status = campaign.status();
    let problem = timeout(
        Duration::from_secs(5),
        status.wait_for(|s| s.problem.is_some()),
    )
    .await
    .expect("a problem reported")
    .expect("running")
    .problem
    .clone()
    .expect("a problem");
    assert!(
        problem.message.contains("consul is unavailable"),
        "{}",
        problem.message
    );
    assert!(
        matches!(
            campaign.status().borrow().role,
            Role::Connecting | Role::CoolingDown { .. }
        ),
        "{:?}",
        campaign.status().borrow().role
    );
}

/// A campaign over HTTPS, with a CA and a client certificate made by `openssl`, is elected; a
/// CA that did not sign the agent's certificate is a configuration error that the campaign
/// reports (and no session is ever made), not an agent that seems down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_over_https_is_elected_and_a_wrong_ca_is_reported_as_configuration() {
    use incumbent::backend::Backend as _;
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    crate::support::tls::make_certificates(d);
    let (_consul, https) = crate::support::tls::consul_with_tls(d).await;
    let read = |name: &str| std::fs::read(d.join(name)).expect("read PEM");
    let config = |ca: &str| {
        ConsulConfig::new(format!("https://{https}"))
            .ca_pem(read(ca))
            .client_identity_pem(read("client.pem"), read("client.key"))
    };
    let trusted = ConsulBackend::new(config("ca.pem")).expect("valid settings");
    assert!(!format!("{trusted:?}").contains("PRIVATE KEY"));
    let mut campaign = election(trusted, "tls", "a").campaign();
    elected(&mut campaign, Duration::from_secs(20)).await;

    let untrusted = ConsulBackend::new(config("other-ca.pem")).expect("valid settings");
    let session = untrusted
        .open_session(&incumbent::backend::SessionOptions {
            ttl: TTL,
            renew_interval: TTL / 2,
            lock_delay: Some(Duration::ZERO),
            name: "tls".into(),
        })
        .await;
    match session {
        Err(Error::InvalidConfig { reason, .. }) => {
            assert!(reason.contains("ca_pem"), "{reason}")
        }
        other => panic!("an untrusted agent certificate is a configuration error: {other:?}"),
    }
    let refused = election(untrusted, "tls", "b").campaign();
    let mut status = refused.status();
    let problem = timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.problem.is_some()),
    )
    .await
    .expect("the campaign reports the problem")
    .expect("status")
    .problem
    .clone()
    .expect("a problem");
    assert!(problem.message.contains("TLS"), "{}", problem.message);
}

/// A sharded group on one agent: 3 members balance 64 shards, then each join of a 4th
/// balances again, the newcomer leading its part, round after round (separate backends in one
/// process, as separate processes would be: the agent's per-client connection limit is
/// raised, as the README says to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_group_balances_at_every_join() {
    use incumbent::{ShardedElection, ShardedRunner};
    use std::collections::BTreeMap;
    let consul = ConsulDev::start_with(&[crate::support::consul::many_connections()]).await;
    let url = consul.http_url();
    let start = |group: &str, id: &str| -> ShardedRunner {
        ShardedElection::builder(backend(&url, None), group, 64)
            .candidate(id)
            .ttl(TTL)
            .grace(Duration::from_secs(1))
            .max_members(8)
            .build()
            .expect("valid settings")
            .start(|_, term| async move { term.cancelled().await })
    };
    /// Waits until every shard has one owner and the owners are balanced; says why not.
    async fn balanced(members: &[&ShardedRunner], limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let mut owners: BTreeMap<u32, usize> = BTreeMap::new();
            let mut counts = Vec::new();
            for m in members {
                let owned = m.status().borrow().owned();
                counts.push(owned.len());
                for k in owned {
                    *owners.entry(k).or_default() += 1;
                }
            }
            let per = 64 / members.len();
            let single = owners.values().all(|&n| n == 1);
            if owners.len() == 64 && single && counts.iter().all(|&c| c == per || c == per + 1) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let states: Vec<String> = members
                    .iter()
                    .map(|m| {
                        let s = m.status().borrow().clone();
                        format!(
                            "registered {}, problem {:?}, assigned {}, owned {}",
                            s.registered,
                            s.problem,
                            s.assigned.len(),
                            s.owned().len()
                        )
                    })
                    .collect();
                return Err(states.join("; "));
            }
            sleep(Duration::from_millis(20)).await;
        }
    }
    for round in 0..3 {
        let group = format!("sharded{round}");
        let (a, b, c) = (
            start(&group, "m1"),
            start(&group, "m2"),
            start(&group, "m3"),
        );
        balanced(&[&a, &b, &c], Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("round {round}: three members: {e}"));
        let d = start(&group, "m4");
        balanced(&[&a, &b, &c, &d], Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("round {round}: after a join: {e}"));
        for m in [a, b, c, d] {
            m.shutdown().await.expect("shutdown");
        }
    }
}
