//! The health router over real HTTP: `/healthz`, `/readyz`, `/leader` and a `/metrics` scrape,
//! on the memory backend, in real time. One behaviour per test, named for it.

use crate::support::events::elected;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use incumbent::http::Health;
use incumbent::memory::{MemoryBackend, Reachability};
use incumbent::{Campaign, Election, Role};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

const NAME: &str = "jobs/index";
/// Short enough that faults show within a second, long enough for a loaded test machine.
const TTL: Duration = Duration::from_millis(900);
/// How long any wait in these tests may take before the test fails.
const LIMIT: Duration = Duration::from_secs(10);

fn election(backend: &MemoryBackend, name: &str, id: &str) -> Election<MemoryBackend> {
    Election::builder(backend.clone(), name)
        .candidate(id)
        .metadata("addr", format!("{id}.example:8080"))
        .ttl(TTL)
        .backoff(Duration::from_millis(50), Duration::from_millis(300))
        .grace(Duration::from_millis(200))
        .build()
        .expect("valid settings")
}

/// Waits until the campaign's role is `role`.
async fn role(campaign: &Campaign, role: Role) {
    let mut status = campaign.status();
    timeout(LIMIT, status.wait_for(|s| s.role == role))
        .await
        .expect("role reached in time")
        .expect("campaign running");
}

/// A server on a free loopback port, stopped on drop.
struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
    client: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Reply {
    status: u16,
    json: Value,
}

impl Server {
    async fn start(app: axum::Router) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("http client");
        Server { addr, task, client }
    }

    async fn text(&self, path: &str) -> (u16, String) {
        let response = self
            .client
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .expect("request answered");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    async fn get(&self, path: &str) -> Reply {
        let (status, body) = self.text(path).await;
        let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        Reply { status, json }
    }

    /// Polls `path` until it answers `status`; returns that reply.
    async fn until(&self, path: &str, status: u16) -> Reply {
        let deadline = Instant::now() + LIMIT;
        loop {
            let reply = self.get(path).await;
            if reply.status == status {
                return reply;
            }
            assert!(
                Instant::now() < deadline,
                "{path} still answers {} instead of {status}: {}",
                reply.status,
                reply.json
            );
            sleep(Duration::from_millis(25)).await;
        }
    }
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[tokio::test]
async fn readyz_answers_200_on_the_leader_and_503_on_a_follower() {
    let store = MemoryBackend::new();
    let mut a = election(&store, NAME, "a").campaign();
    elected(&mut a, LIMIT).await;
    let b = election(&store.client(), NAME, "b").campaign();
    role(&b, Role::Follower).await;
    let leader = Server::start(Health::new().election(a.status()).router()).await;
    let follower = Server::start(incumbent::http::router([b.status()])).await;

    let ready = leader.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.json);
    assert_eq!(ready.json["ready"], true);
    assert_eq!(ready.json["elections"][0]["role"], "leader");
    let not_ready = follower.get("/readyz").await;
    assert_eq!(not_ready.status, 503, "{}", not_ready.json);
    assert_eq!(not_ready.json["ready"], false);
    assert_eq!(not_ready.json["elections"][0]["role"], "follower");

    // Both are healthy: following is a follower's job.
    assert_eq!(leader.get("/healthz").await.status, 200);
    assert_eq!(follower.get("/healthz").await.status, 200);

    // Leadership moves, and readiness with it.
    a.resign().await.expect("resign");
    follower.until("/readyz", 200).await;
    leader.until("/readyz", 503).await;
}

#[tokio::test]
async fn one_router_serves_several_elections_selected_by_name() {
    let store = MemoryBackend::new();
    let mut index = election(&store, "jobs/index", "a").campaign();
    elected(&mut index, LIMIT).await;
    let mut other = election(&store.client(), "jobs/mail", "b").campaign();
    elected(&mut other, LIMIT).await;
    let mail = election(&store, "jobs/mail", "a").campaign();
    role(&mail, Role::Follower).await;
    let server = Server::start(
        Health::new()
            .election(index.status())
            .election(mail.status())
            .router(),
    )
    .await;

    assert_eq!(
        server.get("/readyz?election=jobs%2Findex").await.status,
        200
    );
    assert_eq!(server.get("/readyz?election=jobs/index").await.status, 200);
    assert_eq!(server.get("/readyz?election=jobs/mail").await.status, 503);
    let all = server.get("/readyz").await;
    assert_eq!(all.status, 503, "not the leader of every election");
    assert_eq!(all.json["elections"].as_array().map(Vec::len), Some(2));

    let both = server.get("/leader").await;
    assert_eq!(both.status, 200);
    assert_eq!(both.json["elections"][0]["election"], "jobs/index");
    assert_eq!(both.json["elections"][1]["election"], "jobs/mail");
    assert_eq!(both.json["elections"][1]["leader"]["id"], "b");
    let one = server.get("/leader?election=jobs/mail").await;
    assert_eq!(one.json["elections"].as_array().map(Vec::len), Some(1));

    let unknown = server.get("/healthz?election=jobs/nope").await;
    assert_eq!(unknown.status, 404);
    let message = unknown.json["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("jobs/nope") && message.contains("jobs/mail"),
        "{message}"
    );
    assert_eq!(server.get("/readyz?election=%zz").await.status, 400);
}

#[tokio::test]
async fn healthz_stays_200_on_every_replica_while_the_store_is_down() {
    let store = MemoryBackend::new();
    let a_client = store.client();
    let mut a = election(&a_client, NAME, "a").campaign();
    elected(&mut a, LIMIT).await;
    let b_client = store.client();
    let b = election(&b_client, NAME, "b").campaign();
    role(&b, Role::Follower).await;
    let server = Server::start(
        Health::new()
            .election(a.status())
            .election(b.status())
            .router(),
    )
    .await;
    assert_eq!(server.get("/healthz").await.status, 200);

    // The store goes away for both: the leader fences itself, the follower cannot reach it.
    // Restarting either would not help, so neither is unhealthy; /readyz says why.
    a_client.set_reachability(Reachability::Hanging);
    b_client.set_reachability(Reachability::Failing);
    let fenced = server.until("/readyz", 503).await;
    let deadline = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < deadline {
        let health = server.get("/healthz").await;
        assert_eq!(health.status, 200, "{}", health.json);
        sleep(Duration::from_millis(50)).await;
    }
    let ready = server.get("/readyz").await;
    assert!(
        ready.json["elections"][1]["problem"].is_string(),
        "the store trouble is reported in /readyz: {} (after fencing: {})",
        ready.json,
        fenced.json
    );
    let leader = server.get("/leader").await;
    assert_eq!(
        leader.json["elections"][0]["last_demotion"],
        "renew_deadline_exceeded"
    );
    assert_eq!(leader.json["elections"][0]["is_leader"], false);

    a_client.set_reachability(Reachability::Reachable);
    b_client.set_reachability(Reachability::Reachable);
    let deadline = Instant::now() + LIMIT;
    loop {
        let leader = server.get("/leader").await;
        let elections = leader.json["elections"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if elections.iter().any(|e| e["is_leader"] == true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "nobody leads again: {}",
            leader.json
        );
        sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(server.get("/healthz").await.status, 200);
}

#[tokio::test]
async fn readyz_answers_503_the_instant_the_term_ends_while_the_worker_winds_down() {
    let store = MemoryBackend::new();
    let mut a = election(&store, NAME, "a").campaign();
    let term = elected(&mut a, LIMIT).await;
    let guard = term.hold(); // the hand-off waits for this worker
    let server = Server::start(incumbent::http::router([a.status()])).await;
    assert_eq!(server.get("/readyz").await.status, 200);
    let resigning = tokio::spawn({
        let handle = a.handle();
        async move { handle.resign().await }
    });
    term.cancelled().await;
    let ready = server.get("/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.json);
    assert_eq!(ready.json["elections"][0]["role"], "stepping_down");
    let leader = server.get("/leader").await;
    assert_eq!(leader.json["elections"][0]["is_leader"], false);
    assert_eq!(leader.json["elections"][0]["role"], "stepping_down");
    assert!(leader.json["elections"][0]["term"].is_null());
    assert!(!resigning.is_finished(), "still winding down");
    drop(guard);
    resigning.await.expect("join").expect("resign");
}

#[tokio::test]
async fn healthz_answers_503_when_the_campaign_has_stopped() {
    let store = MemoryBackend::new();
    let mut a = election(&store, NAME, "a").campaign();
    elected(&mut a, LIMIT).await;
    let server = Server::start(incumbent::http::router([a.status()])).await;
    assert_eq!(server.get("/healthz").await.status, 200);
    a.shutdown().await.expect("shutdown");
    let stopped = server.get("/healthz").await;
    assert_eq!(stopped.status, 503);
    assert_eq!(stopped.json["elections"][0]["role"], "stopped");
    assert_eq!(
        stopped.json["elections"][0]["reason"],
        "the campaign has stopped"
    );
}

#[tokio::test]
async fn leader_json_describes_the_leader_its_term_and_its_lease() {
    let store = MemoryBackend::new();
    let mut a = election(&store, NAME, "a").campaign();
    let term = elected(&mut a, LIMIT).await;
    let b = election(&store.client(), NAME, "b").campaign();
    role(&b, Role::Follower).await;
    let leader = Server::start(incumbent::http::router([a.status()])).await;
    let follower = Server::start(incumbent::http::router([b.status()])).await;
    let now = unix_ms_now();
    let near = |v: &Value, slack_ms: u64| {
        v.as_u64()
            .is_some_and(|ms| ms + slack_ms >= now && ms <= now + slack_ms)
    };

    let reply = leader.get("/leader").await;
    assert_eq!(reply.status, 200);
    let e = &reply.json["elections"][0];
    assert_eq!(e["election"], NAME);
    assert_eq!(e["candidate"]["id"], "a");
    assert_eq!(e["candidate"]["metadata"]["addr"], "a.example:8080");
    assert_eq!(e["role"], "leader");
    assert_eq!(e["is_leader"], true);
    assert_eq!(e["healthy"], true);
    assert_eq!(e["leader"]["id"], "a");
    assert_eq!(e["leader"]["metadata"]["addr"], "a.example:8080");
    assert_eq!(e["leader"]["fencing_token"], term.fencing_token());
    assert_eq!(e["term"]["fencing_token"], term.fencing_token());
    assert!(near(&e["term"]["started_at_unix_ms"], 60_000), "{e}");
    assert!(near(&e["leader"]["since_unix_ms"], 60_000), "{e}");
    let since = e["leader"]["since"].as_str().unwrap_or_default();
    assert!(
        since.len() == 24 && since.ends_with('Z') && since.as_bytes()[10] == b'T',
        "RFC 3339 with milliseconds: {since}"
    );
    assert!(near(&e["last_renewal_unix_ms"], 5_000), "{e}");
    assert!(
        e["renew_deadline_at_unix_ms"].as_u64() > e["last_renewal_unix_ms"].as_u64(),
        "{e}"
    );
    assert!(e["problem"].is_null());
    assert!(e["last_demotion"].is_null());
    assert_eq!(
        e["wakeup"], "push",
        "the memory backend wakes followers at once"
    );

    let seen = follower.get("/leader").await;
    let e = &seen.json["elections"][0];
    assert_eq!(e["candidate"]["id"], "b");
    assert_eq!(e["role"], "follower");
    assert_eq!(e["is_leader"], false);
    assert_eq!(e["leader"]["id"], "a");
    assert_eq!(e["leader"]["fencing_token"], term.fencing_token());
    assert!(e["term"].is_null());
}

/// The process-wide Prometheus recorder; only one can be installed per process.
fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("no other recorder in this test binary")
    })
}

#[tokio::test]
async fn metrics_are_scraped_over_http_after_an_election() {
    let handle = prometheus().clone();
    let store = MemoryBackend::new();
    let mut a = election(&store, "jobs/metrics", "metrics-a").campaign();
    elected(&mut a, LIMIT).await;
    let app = Health::new().election(a.status()).router().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(handle.render())),
    );
    let server = Server::start(app).await;

    let (status, body) = server.text("/metrics").await;
    assert_eq!(status, 200);
    let line = |name: &str| {
        body.lines()
            .find(|l| l.starts_with(name) && l.contains("election=\"jobs/metrics\""))
            .map(str::to_owned)
    };
    let is_leader = line("incumbent_is_leader{").unwrap_or_else(|| panic!("{body}"));
    assert!(is_leader.ends_with(" 1"), "{is_leader}");
    let won = line("incumbent_elections_won_total{").unwrap_or_else(|| panic!("{body}"));
    assert!(won.contains("election=\"jobs/metrics\""), "{won}");
    assert!(won.ends_with(" 1"), "{won}");
    assert_eq!(server.get("/readyz").await.status, 200);
}

impl Server {
    /// `POST path`, with `Authorization: Bearer token` when given.
    async fn post(&self, path: &str, token: Option<&str>) -> Reply {
        let mut request = self.client.post(format!("http://{}{path}", self.addr));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("request answered");
        let status = response.status().as_u16();
        let body = response.text().await.expect("body");
        // A route that is not there answers with no body.
        let json = match body.is_empty() {
            true => Value::Null,
            false => serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")),
        };
        Reply { status, json }
    }
}

#[tokio::test]
async fn switchover_is_guarded_refuses_a_candidate_that_is_not_live_and_hands_over() {
    let backend = MemoryBackend::new();
    let mut a = election(&backend, NAME, "a").campaign();
    elected(&mut a, LIMIT).await;
    let mut b = election(&backend, NAME, "b").campaign();
    role(&b, Role::Follower).await;
    // Served by the follower: its request goes to the leader through the store.
    let server = Server::start(Health::new().switchover(b.handle(), "s3cret").router()).await;
    let plain = Server::start(Health::new().election(a.status()).router()).await;
    // Opt-in: a router without it has no such route.
    assert_eq!(
        plain.post("/switchover?to=b", Some("s3cret")).await.status,
        404
    );
    for token in [None, Some("wrong"), Some("s3cre"), Some("s3cret2")] {
        let reply = server.post("/switchover?to=b", token).await;
        assert_eq!(reply.status, 401, "{token:?}: {}", reply.json);
    }
    assert!(
        a.status().borrow().is_leader(),
        "an unauthorized request moved leadership"
    );
    assert_eq!(server.post("/switchover", Some("s3cret")).await.status, 400);
    let refused = server.post("/switchover?to=nobody", Some("s3cret")).await;
    assert_eq!(refused.status, 409, "{}", refused.json);
    assert_eq!(refused.json["reason"], "not_a_candidate");
    assert!(a.status().borrow().is_leader());
    let done = server.post("/switchover?to=b", Some("s3cret")).await;
    assert_eq!(done.status, 200, "{}", done.json);
    assert_eq!(done.json["to"], "b");
    let term = elected(&mut b, LIMIT).await;
    assert_eq!(done.json["fencing_token"], term.fencing_token());
    assert!(!a.status().borrow().is_leader());
    assert!(!format!("{:?}", Health::new().switchover(b.handle(), "s3cret")).contains("s3cret"));
}

/// `GET /shards` lists the shards this process owns and the members it sees, and stops
/// listing a shard the instant its term ends; the shard gauges are scraped too.
#[tokio::test]
async fn shards_lists_the_shards_owned_and_the_metrics_count_them() {
    let handle = prometheus().clone();
    let store = MemoryBackend::new();
    let group = incumbent::ShardedElection::builder(store.clone(), "jobs/http-shards", 4)
        .candidate("s-a")
        .ttl(Duration::from_secs(2))
        .build()
        .expect("valid");
    let runner = group.start(|_, term| async move { term.cancelled().await });
    let mut status = runner.status();
    timeout(LIMIT, status.wait_for(|s| s.owned().len() == 4))
        .await
        .expect("all four shards")
        .expect("running");
    let app = Health::new().sharded(runner.status()).router().route(
        "/metrics",
        axum::routing::get(move || std::future::ready(handle.render())),
    );
    let server = Server::start(app).await;
    let reply = server.get("/shards").await;
    assert_eq!(reply.status, 200);
    let g = &reply.json["groups"][0];
    assert_eq!(g["group"], "jobs/http-shards");
    assert_eq!(
        g["owned"],
        serde_json::json!([0, 1, 2, 3]),
        "{}",
        reply.json
    );
    assert_eq!(g["members"][0]["id"], "s-a");
    assert_eq!(g["registered"], true);

    let (_, body) = server.text("/metrics").await;
    let owned = body
        .lines()
        .find(|l| l.starts_with("incumbent_shards_owned{") && l.contains("jobs/http-shards"))
        .unwrap_or_else(|| panic!("{body}"));
    assert!(owned.ends_with(" 4"), "{owned}");

    // A cut-off store: each shard's term ends by its renew deadline, and /shards says so.
    store.set_reachability(Reachability::Hanging);
    let deadline = Instant::now() + LIMIT;
    loop {
        let reply = server.get("/shards").await;
        if reply.json["groups"][0]["owned"] == serde_json::json!([]) {
            assert!(status.borrow().owned().is_empty());
            break;
        }
        assert!(Instant::now() < deadline, "{}", reply.json);
        sleep(Duration::from_millis(25)).await;
    }
    store.set_reachability(Reachability::Reachable);
    runner.shutdown().await.expect("shutdown");
}
