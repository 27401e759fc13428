//! A Consul agent in `-dev` mode (one in-memory server) on loopback.

use std::net::SocketAddr;
use std::path::Path;

use tempfile::TempDir;

use super::bin::find_binary;
use super::net::{free_addr, free_port};
use super::process::{Probe, ServerProcess, start_with_retries};

/// A `consul agent -dev` with every port on a free loopback port, killed on drop.
/// The agent argument that raises its per-client connection limit (200 by default) for
/// tests whose processes all connect from 127.0.0.1: the agent counts them as one client,
/// and each of their elections waiting or holding has a blocking query (a connection) open.
pub fn many_connections() -> String {
    "-hcl=limits { http_max_conns_per_client = 4096 }".to_owned()
}

pub struct ConsulDev {
    process: ServerProcess,
    http: SocketAddr,
    // Declared last so it is removed after the process is killed.
    _dir: TempDir,
}

impl ConsulDev {
    /// Starts the agent and waits until it has elected itself leader.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// [`start`](Self::start), with `extra` arguments for the agent (`-hcl=…`).
    pub async fn start_with(extra: &[String]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("incumbent-consul-")
            .tempdir()
            .expect("create consul temp dir");
        let (process, http) = spawn_dev("consul", dir.path(), extra).await;
        ConsulDev {
            process,
            http,
            _dir: dir,
        }
    }

    /// The HTTP API address, `127.0.0.1:PORT`.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// The HTTP API base URL, `http://127.0.0.1:PORT`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// The process, to kill, pause, resume or restart it. A restarted dev
    /// agent starts empty: dev mode keeps no data.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

/// Whether a `/v1/status/leader` body names a leader (`""` means none yet).
fn has_leader(body: &str) -> bool {
    serde_json::from_str::<String>(body).is_ok_and(|leader| !leader.is_empty())
}

/// Starts `consul agent -dev` named `name` with every port on a free loopback port, its log
/// and data in `dir`, and `extra` arguments (ACL or TLS settings, say); waits until it has
/// elected itself leader. Returns the process (killed on drop) and its HTTP address.
pub async fn spawn_dev(name: &str, dir: &Path, extra: &[String]) -> (ServerProcess, SocketAddr) {
    // Again on new ports when the agent exits during startup ([`start_with_retries`]).
    start_with_retries("consul", || try_spawn_dev(name, dir, extra)).await
}

async fn try_spawn_dev(
    name: &str,
    dir: &Path,
    extra: &[String],
) -> Result<(ServerProcess, SocketAddr), String> {
    let consul = find_binary("consul");
    let http = free_addr();
    let mut args: Vec<String> = vec![
        "agent".into(),
        "-dev".into(),
        format!("-node={name}"),
        "-bind=127.0.0.1".into(),
        "-client=127.0.0.1".into(),
        format!("-http-port={}", http.port()),
        // Dev mode keeps its state in memory; the directory holds the node id.
        format!("-data-dir={}", dir.join("data").display()),
    ];
    for flag in [
        "-dns-port",
        "-serf-lan-port",
        "-serf-wan-port",
        "-server-port",
        "-grpc-port",
    ] {
        args.push(format!("{flag}={}", free_port()));
    }
    args.extend_from_slice(extra);
    let probe = Probe::Http {
        addr: http,
        path: "/v1/status/leader",
        check: has_leader,
    };
    let mut process = ServerProcess::spawn(name, consul, args, dir, probe);
    process.try_wait_ready().await?;
    // A session made before the new leader has registered the agent's node is refused
    // ("Missing node registration", 500), which a loaded machine showed: wait for the node
    // too. (With ACLs on, an anonymous read lists no node; those tests wait for the ACLs to
    // settle before anything else.)
    if !extra.iter().any(|arg| arg.contains("acl")) {
        let registered = Probe::Http {
            addr: http,
            path: "/v1/catalog/nodes",
            check: lists_a_node,
        };
        let deadline = tokio::time::Instant::now() + NODE_REGISTRATION;
        while !registered.is_ready().await {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "{name} registered no node within {NODE_REGISTRATION:?} of electing \
                     itself\n{}",
                    process.log_tail()
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    Ok((process, http))
}

/// How long a dev agent may take to register its node after electing itself leader.
const NODE_REGISTRATION: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether a `/v1/catalog/nodes` body lists a node.
fn lists_a_node(body: &str) -> bool {
    serde_json::from_str::<Vec<serde_json::Value>>(body).is_ok_and(|nodes| !nodes.is_empty())
}
