//! Kubernetes: a real `kube-apiserver` on its own etcd (tests/support/kube.rs), and beside
//! it, in the same run, client-go's `leaderelection` (`incumbent-k8s-peer`, two processes)
//! on another Lease of the same server.

use std::process::Stdio;
use std::time::{Duration, Instant};

use incumbent::kubernetes::KubernetesBackend;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::kube::KubeServer;

/// The ttl of every round (a Lease's duration is whole seconds).
const TTL: Duration = Duration::from_secs(2);
/// Hand-off rounds of each side.
const HANDOFF_ROUNDS: usize = 30;
/// Crash rounds: each waits for the Lease to run out.
const CRASH_ROUNDS: usize = 5;
/// client-go's retry period in this comparison: its followers try that often.
const GO_RETRY: &str = "200ms";

async fn connect(server: &KubeServer) -> KubernetesBackend {
    connect_with(server.config().await).await
}

/// A backend on the API server `config` names, for rounds that connect candidates by
/// themselves.
async fn connect_with(config: incumbent::kubernetes::kube::Config) -> KubernetesBackend {
    KubernetesBackend::builder()
        .config(config)
        .connect()
        .await
        .expect("connect to the API server")
}

pub async fn run() {
    println!("\n## kubernetes");
    let server = KubeServer::start().await;
    println!("kube-apiserver on {}, its etcd on tmpfs", server.addr());
    let handoff = crate::polled::handoff(
        [connect(&server).await, connect(&server).await],
        TTL,
        HANDOFF_ROUNDS,
        Duration::from_millis(200),
    )
    .await;
    crate::common::print_latencies_against(
        "hand-off after resign, two backends (as two processes), followers woken by the watch",
        &handoff,
        "median well below client-go's in the same run",
    );
    let go = go_handoffs(&server, HANDOFF_ROUNDS.min(10)).await;
    crate::common::print_latencies(
        &format!(
            "client-go leaderelection, process level: SIGTERM (ReleaseOnCancel) to the other \
             process's `elected` line, retry period {GO_RETRY}"
        ),
        &go,
    );
    {
        let members = vec![
            connect(&server).await,
            connect(&server).await,
            connect(&server).await,
        ];
        let (gaps, calls) =
            crate::switchover::rounds(members, TTL, crate::polled::SWITCHOVER_POLLED_ROUNDS).await;
        let config = server.config().await;
        let window = Duration::from_millis(500);
        let fallback =
            crate::switchover::dead_target(move || connect_with(config.clone()), TTL, window, 3)
                .await;
        crate::switchover::print("kubernetes", &gaps, &calls, &fallback, window);
    }
    let config = server.config().await;
    crate::polled::crash(
        move || connect_with(config.clone()),
        TTL,
        CRASH_ROUNDS,
        "runtime and connection dropped; followers judge the Lease run out a ttl after they saw its last renewal",
        "<= ttl + the renew interval",
    )
    .await;
    let config = server.config().await;
    let client =
        incumbent::kubernetes::kube::Client::try_from(server.config().await).expect("a client");
    // The API server's own requests (its identity Lease, its controllers), to subtract.
    let window = Duration::from_secs(10);
    let before = requests(client.clone()).await;
    tokio::time::sleep(window).await;
    if let (Some(before), Some(after)) = (before, requests(client.clone()).await) {
        println!(
            "idle baseline, no candidate: {:.1} requests/s at the server (its own, and this \
             reading of /metrics)",
            after.saturating_sub(before) as f64 / window.as_secs_f64()
        );
    }
    crate::polled::idle(
        move || connect_with(config.clone()),
        TTL,
        move || requests(client.clone()),
        "from the API server's apiserver_request_total (every verb and resource; the \
         watches are long-running requests, counted once when made)",
    )
    .await;
}

/// The API server's count of requests so far: the sum of `apiserver_request_total`.
async fn requests(client: incumbent::kubernetes::kube::Client) -> Option<u64> {
    let request = http::Request::get("/metrics").body(Vec::new()).ok()?;
    let text = client.request_text(request).await.ok()?;
    let total: f64 = text
        .lines()
        .filter(|line| line.starts_with("apiserver_request_total{"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    Some(total as u64)
}

/// Two client-go peers on one Lease: each round SIGTERMs the leader and times the other's
/// `elected` line, then starts a new peer in the place of the old one.
async fn go_handoffs(server: &KubeServer, rounds: usize) -> Vec<Duration> {
    let binary = crate::support::bin::find_binary("incumbent-k8s-peer");
    let kubeconfig = server.kubeconfig().display().to_string();
    let start = |id: String| {
        let mut child = tokio::process::Command::new(&binary)
            .args(["--kubeconfig", &kubeconfig, "--namespace", "default"])
            .args(["--name", "go-bench", "--id", &id])
            .args(["--lease-duration", "2s", "--renew-deadline", "1500ms"])
            .args(["--retry-period", GO_RETRY])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the client-go peer");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        (child, lines)
    };
    let mut peers = [start("go-0".into()), start("go-1".into())];
    let mut samples = Vec::new();
    let mut next = 2;
    // Who leads first.
    let mut leader = None;
    let first = tokio::time::timeout(TTL * 10, async {
        loop {
            for (i, (_, lines)) in peers.iter_mut().enumerate() {
                if let Ok(Ok(Some(line))) =
                    tokio::time::timeout(Duration::from_millis(50), lines.next_line()).await
                    && line.starts_with("elected ")
                {
                    return i;
                }
            }
        }
    })
    .await;
    if let Ok(i) = first {
        leader = Some(i);
    }
    for _ in 0..rounds {
        let Some(l) = leader else { break };
        let other = 1 - l;
        // Let the follower settle into its retries.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let pid = peers[l].0.id().expect("running") as i32;
        let sent = Instant::now();
        // SAFETY: kill(2) on a child of this program.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let elected = tokio::time::timeout(TTL * 5, async {
            while let Ok(Some(line)) = peers[other].1.next_line().await {
                if line.starts_with("elected ") {
                    return true;
                }
            }
            false
        })
        .await;
        if !matches!(elected, Ok(true)) {
            println!("  a client-go round timed out");
            break;
        }
        samples.push(sent.elapsed());
        let _ = peers[l].0.wait().await;
        peers[l] = start(format!("go-{next}"));
        next += 1;
        leader = Some(other);
    }
    samples
}
