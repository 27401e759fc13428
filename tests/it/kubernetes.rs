//! The Kubernetes backend against a real `kube-apiserver`: what is particular to Leases
//! (client-go on the same Lease, a Lease deleted while held, hostile annotations, RBAC).
//! The behaviour every backend shares is in the conformance suite; skewed clocks are in
//! `cli_failover`.

use std::process::Stdio;
use std::time::Duration;

use crate::support::events::{demoted, elected};
use crate::support::kube::KubeServer;
use incumbent::kubernetes::k8s_openapi::api::coordination::v1::Lease;
use incumbent::kubernetes::kube::Api;
use incumbent::kubernetes::kube::api::{DeleteParams, Patch, PatchParams};
use incumbent::kubernetes::{HOLDER_ANNOTATION, KubernetesBackend, TOKEN_ANNOTATION};
use incumbent::{Election, Error, Role};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::{Instant, sleep, timeout};

/// The ttl of the tests (whole seconds, as a Lease's duration).
const TTL: Duration = Duration::from_secs(2);
/// How long any expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(15);

async fn connect(server: &KubeServer) -> KubernetesBackend {
    KubernetesBackend::builder()
        .config(server.config().await)
        .connect()
        .await
        .expect("connect to the API server")
}

fn election(
    backend: &KubernetesBackend,
    name: &str,
    candidate: &str,
) -> Election<KubernetesBackend> {
    election_with_ttl(backend, name, candidate, TTL)
}

fn election_with_ttl(
    backend: &KubernetesBackend,
    name: &str,
    candidate: &str,
    ttl: Duration,
) -> Election<KubernetesBackend> {
    Election::builder(backend.clone(), name)
        .candidate(candidate)
        .ttl(ttl)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100))
        .build()
        .expect("valid election")
}

async fn leases(server: &KubeServer) -> Api<Lease> {
    let client =
        incumbent::kubernetes::kube::Client::try_from(server.config().await).expect("a client");
    Api::namespaced(client, "default")
}

/// Waits until `campaign`'s status names `id` as the leader.
async fn sees_leader(campaign: &incumbent::Campaign, id: &str) {
    let mut status = campaign.status();
    timeout(PATIENCE, async {
        while status
            .borrow()
            .leader
            .as_ref()
            .map(|l| l.candidate.id.as_str())
            != Some(id)
        {
            status.changed().await.expect("status");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the status does not name {id} as the leader"));
}

/// A client-go `leaderelection` candidate (`incumbent-k8s-peer`), killed on drop; its
/// stdout lines (`elected <id>`, `new-leader <id>`, `stopped <id>`) arrive on `lines`.
struct GoPeer {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl GoPeer {
    fn start(server: &KubeServer, lease: &str, id: &str) -> GoPeer {
        let binary = crate::support::bin::find_binary("incumbent-k8s-peer");
        let mut child = tokio::process::Command::new(binary)
            .args(["--kubeconfig", &server.kubeconfig().display().to_string()])
            .args(["--namespace", "default", "--name", lease, "--id", id])
            .args(["--lease-duration", "2s", "--renew-deadline", "1500ms"])
            .args(["--retry-period", "200ms"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the client-go peer");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let _ = tx.send(line);
            }
        });
        GoPeer { child, lines }
    }

    /// Waits for the line `line`; the lines before it.
    async fn saw(&mut self, line: &str) -> Vec<String> {
        let mut before = Vec::new();
        let found = timeout(PATIENCE, async {
            while let Some(next) = self.lines.recv().await {
                if next == line {
                    return true;
                }
                before.push(next);
            }
            false
        })
        .await;
        assert!(
            matches!(found, Ok(true)),
            "the client-go peer did not print {line:?}; it printed {before:?}"
        );
        before
    }

    /// SIGTERM: client-go's ReleaseOnCancel releases the Lease; waits for the exit, and
    /// returns the lines printed since those read.
    async fn terminate(mut self) -> Vec<String> {
        let pid = self.child.id().expect("running") as i32;
        // SAFETY: kill(2) on a child of this test.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = timeout(PATIENCE, self.child.wait())
            .await
            .expect("the peer exits after SIGTERM")
            .expect("wait");
        assert!(status.success(), "the peer exited with {status}");
        // Its last lines may still be in the pipe, or in the reader task, when the exit is
        // seen: read until the reader reaches the pipe's end (it then drops its sender).
        let mut rest = Vec::new();
        while let Ok(Some(line)) = timeout(PATIENCE, self.lines.recv()).await {
            rest.push(line);
        }
        rest
    }
}

/// A client-go candidate and incumbent's take turns on one Lease: each sees the other as
/// the holder, never both lead (each starts only after the other has stopped), and each
/// release hands over at once (ReleaseOnCancel on either side), not after a lease duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_and_incumbent_take_turns_on_one_lease() {
    let server = KubeServer::start().await;
    let backend = connect(&server).await;

    // client-go leads first; incumbent sees it as the holder and waits.
    let mut go = GoPeer::start(&server, "shared", "go-a");
    go.saw("elected go-a").await;
    let mut rust = election(&backend, "shared", "rust").campaign();
    sees_leader(&rust, "go-a").await;
    sleep(TTL * 2).await;
    assert_eq!(rust.status().borrow().role, Role::Follower, "both lead");

    // client-go stops (and releases): incumbent leads at once.
    let released = Instant::now();
    let after = go.terminate().await;
    assert!(after.contains(&"stopped go-a".to_owned()), "{after:?}");
    let term = elected(&mut rust, PATIENCE).await;
    let handed = released.elapsed();
    assert!(
        handed < TTL,
        "incumbent led {handed:?} after client-go released, not at once"
    );

    // A second client-go candidate sees incumbent as the holder and waits.
    let mut go = GoPeer::start(&server, "shared", "go-b");
    go.saw("new-leader rust").await;
    sleep(TTL * 2).await;
    assert!(
        !term.is_cancelled(),
        "incumbent's term ended while it held the Lease"
    );
    while let Ok(line) = go.lines.try_recv() {
        assert_ne!(
            line, "elected go-b",
            "client-go led while incumbent held the Lease"
        );
    }

    // incumbent shuts down (and releases): client-go leads within its retry period.
    let released = Instant::now();
    rust.shutdown().await.expect("shutdown");
    assert!(term.is_cancelled());
    go.saw("elected go-b").await;
    let handed = released.elapsed();
    assert!(
        handed < TTL,
        "client-go led {handed:?} after incumbent released, not at once"
    );

    // The Lease as client-go left it: its holder, and one transition per change of holder.
    let lease = leases(&server)
        .await
        .get("shared")
        .await
        .expect("the Lease");
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("go-b"));
    assert!(spec.lease_transitions.unwrap_or(0) >= 2, "{spec:?}");
    drop(go);
}

/// An operator deletes a held Lease: the leader's next renewal finds it gone and its term
/// ends; a candidate creates it again, and its token is still above every earlier one
/// (the clock seeds it: the deleted Lease's annotation is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_while_held_ends_the_term_and_tokens_still_grow() {
    let server = KubeServer::start().await;
    let backend = connect(&server).await;
    let mut a = election(&backend, "deleted", "a").campaign();
    let first = elected(&mut a, PATIENCE).await;
    leases(&server)
        .await
        .delete("deleted", &DeleteParams::default())
        .await
        .expect("delete the Lease");
    demoted(&mut a, PATIENCE).await;
    assert!(first.is_cancelled());
    let second = elected(&mut a, PATIENCE).await;
    assert!(
        second.fencing_token() > first.fencing_token(),
        "{} after {}",
        second.fencing_token(),
        first.fencing_token()
    );
    a.shutdown().await.expect("shutdown");
}

/// Hostile annotations: a fencing token beyond the largest one is refused with a typed error
/// (never wrapped or trusted as a floor), and a holder annotation that does not match the
/// Lease's holder and transitions (left behind, or forged) is not taken for ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_annotations_are_refused_not_trusted() {
    let server = KubeServer::start().await;
    let api = leases(&server).await;
    let backend = connect(&server).await;
    let mut a = election(&backend, "hostile", "a").campaign();
    elected(&mut a, PATIENCE).await;
    a.shutdown().await.expect("shutdown");

    // A token past 2^53 - 1.
    let patch = serde_json::json!({
        "metadata": { "annotations": { TOKEN_ANNOTATION: "18446744073709551615" } }
    });
    api.patch("hostile", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
    let b = election(&backend, "hostile", "b").campaign();
    let problem = crate::support::events::problem(&b.status(), PATIENCE).await;
    assert!(
        problem.contains("outside") && problem.contains(TOKEN_ANNOTATION),
        "{problem}"
    );
    assert!(!b.status().borrow().is_leader(), "led on a hostile token");
    b.shutdown().await.expect("shutdown");

    // A forged holder annotation for a Lease held by someone else (client-go, say): the
    // observer reports that holder, never the forged value.
    let forged = r#"0 {"fencing_token":1,"id":"mallory","owner":"x"}"#;
    let patch = serde_json::json!({
        "metadata": { "annotations": { TOKEN_ANNOTATION: "5", HOLDER_ANNOTATION: forged } },
        "spec": {
            "holderIdentity": "go-peer",
            "leaseDurationSeconds": 30,
            "leaseTransitions": 7,
            "renewTime": "2020-01-01T00:00:00.000000Z"
        }
    });
    api.patch("hostile", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
    let mut observer = incumbent::backend::Backend::observe(&backend, "hostile")
        .await
        .expect("observe");
    let seen = timeout(PATIENCE, async {
        loop {
            if let Some(leader) = incumbent::backend::Observer::next(&mut observer)
                .await
                .expect("read")
            {
                return leader;
            }
        }
    })
    .await
    .expect("the observer sees the holder");
    assert_eq!(seen.candidate.id, "go-peer");
    assert_eq!(seen.fencing_token, None);
    // Its renewTime is years old, but the Lease was seen changing just now: it is held
    // for its whole duration from here, by this process's clock.
    let c = election(&backend, "hostile", "c").campaign();
    sleep(TTL * 2).await;
    assert_eq!(
        c.status().borrow().role,
        Role::Follower,
        "took a live Lease"
    );
    c.shutdown().await.expect("shutdown");
}

/// With RBAC on, a user without rights on Leases gets [`Error::Unauthorized`], whose message
/// names the verbs and resource the Role must grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_user_is_told_which_role_it_needs() {
    let server = KubeServer::start_with_rbac().await;
    let kubeconfig = server.kubeconfig_for("incumbent-user-token");
    let config = crate::support::kube::config_from(&kubeconfig).await;
    let error = KubernetesBackend::builder()
        .config(config)
        .connect()
        .await
        .expect_err("forbidden");
    assert!(matches!(error, Error::Unauthorized { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("leases.coordination.k8s.io") && message.contains("403"),
        "{message}"
    );
    assert!(!message.contains("incumbent-user-token"), "{message}");
}

/// Twelve candidates, each with a client of its own, race for one Lease at once (409
/// Conflicts for all but one write per version): exactly one leads, and when it leaves,
/// exactly one other takes over, with a greater token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_storm_gives_one_leader() {
    // Longer than the other tests' 2 s, whose renew deadline (1.3 s) twelve clients of one
    // API server missed on a machine running two suites at once: the leader fenced itself,
    // as it must, and none led for a moment. The renew deadline is 4 s here.
    const STORM_TTL: Duration = Duration::from_secs(6);
    let server = KubeServer::start().await;
    let mut campaigns = Vec::new();
    for i in 0..12 {
        let backend = connect(&server).await;
        campaigns
            .push(election_with_ttl(&backend, "storm", &format!("c{i}"), STORM_TTL).campaign());
    }
    let leading = |campaigns: &Vec<incumbent::Campaign>| {
        campaigns
            .iter()
            .filter(|c| c.status().borrow().is_leader())
            .count()
    };
    let deadline = Instant::now() + PATIENCE;
    while leading(&campaigns) == 0 && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    // Sampled every 20 ms for 4 s: never more than one.
    for _ in 0..(TTL * 2).as_millis() / 20 {
        assert_eq!(leading(&campaigns), 1, "not exactly one leader");
        sleep(Duration::from_millis(20)).await;
    }
    let first = campaigns
        .iter()
        .position(|c| c.status().borrow().is_leader())
        .expect("a leader");
    let token = campaigns[first]
        .status()
        .borrow()
        .leader
        .as_ref()
        .and_then(|l| l.fencing_token)
        .expect("a token");
    let leaver = campaigns.remove(first);
    leaver.shutdown().await.expect("shutdown");
    let deadline = Instant::now() + PATIENCE;
    while leading(&campaigns) == 0 && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..(TTL * 2).as_millis() / 20 {
        assert_eq!(
            leading(&campaigns),
            1,
            "not exactly one leader after the hand-off"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let next = campaigns
        .iter()
        .find_map(|c| {
            c.status()
                .borrow()
                .leader
                .as_ref()
                .and_then(|l| l.fencing_token)
        })
        .expect("a token");
    assert!(next > token, "{next} after {token}");
    for campaign in campaigns {
        campaign.shutdown().await.expect("shutdown");
    }
}

/// A follower's watch drops (its connections reset) while it misses the leader's release:
/// it watches again from the last version it saw, gets the release it missed, and leads at
/// once, not at its safety-net read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_watch_misses_nothing() {
    let server = KubeServer::start().await;
    let leader_backend = connect(&server).await;
    let mut a = election(&leader_backend, "dropped", "a").campaign();
    elected(&mut a, PATIENCE).await;
    let proxy = crate::support::Proxy::start(server.addr());
    let mut config = server.config().await;
    config.cluster_url = format!("https://{}", proxy.addr()).parse().expect("a URL");
    let follower_backend = KubernetesBackend::builder()
        .config(config)
        .connect()
        .await
        .expect("connect through the proxy");
    let mut b = election(&follower_backend, "dropped", "b").campaign();
    sees_leader(&b, "a").await;
    // b hears nothing while a leaves; then its connections break.
    proxy.blackhole(true);
    a.shutdown().await.expect("a leaves");
    sleep(Duration::from_millis(300)).await;
    proxy.reset_all();
    proxy.blackhole(false);
    let healed = Instant::now();
    elected(&mut b, PATIENCE).await;
    let took = healed.elapsed();
    assert!(
        took < incumbent::kubernetes::SAFETY_NET_POLL / 2,
        "b led {took:?} after its link healed: the watch missed the release"
    );
    b.shutdown().await.expect("shutdown");
}

/// A namespace that does not exist is a problem the status names, not a silent wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_is_named() {
    let server = KubeServer::start().await;
    let backend = KubernetesBackend::builder()
        .config(server.config().await)
        .namespace("nowhere")
        .connect()
        .await
        .expect("connect");
    assert_eq!(backend.namespace(), "nowhere");
    let campaign = election(&backend, "jobs", "a").campaign();
    let problem = crate::support::events::problem(&campaign.status(), PATIENCE).await;
    assert!(problem.contains("\"nowhere\" does not exist"), "{problem}");
    campaign.shutdown().await.expect("shutdown");
}
