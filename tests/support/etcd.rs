//! etcd on loopback: a single member or a static three-member cluster.
//!
//! Data directories are in a temp dir on the system's temp file system (on disk, so each
//! write waits for a real fsync of etcd's WAL, as in production), except for
//! [`EtcdServer::single_on_tmpfs`], whose data is in memory.

use std::net::SocketAddr;
use std::path::Path;

use tempfile::TempDir;

use super::bin::find_binary;
use super::net::free_addr;
use super::process::{Probe, ServerProcess, start_with_retries};

/// Raft heartbeat in milliseconds, low so that tests fail over fast.
pub const HEARTBEAT_MS: u32 = 50;

/// Raft election timeout in milliseconds (ten heartbeats).
pub const ELECTION_TIMEOUT_MS: u32 = 500;

/// Where [`EtcdServer::single_on_tmpfs`] keeps its data: Linux's shared-memory tmpfs, where an
/// fsync returns at once.
pub const TMPFS: &str = "/dev/shm";

/// A one-member etcd, killed on drop.
pub struct EtcdServer {
    cluster: EtcdCluster,
}

impl EtcdServer {
    /// Starts a one-member etcd, its data directory in the system's temp dir (on disk), and
    /// waits until `/health` reports healthy. Each write waits for its WAL entry to be
    /// fsynced, as in production.
    pub async fn single() -> Self {
        EtcdServer {
            cluster: EtcdCluster::start(1, &std::env::temp_dir()).await,
        }
    }

    /// Like [`single`](EtcdServer::single), with the data directory on tmpfs ([`TMPFS`]): the
    /// WAL's fsync costs next to nothing, so a write costs only etcd's own work. For
    /// benchmarks that tell the disk's share from the rest; nothing survives a reboot, so
    /// never for tests of durability. Panics where [`TMPFS`] does not exist (it is Linux's).
    pub async fn single_on_tmpfs() -> Self {
        EtcdServer {
            cluster: EtcdCluster::start(1, Path::new(TMPFS)).await,
        }
    }

    /// The client URL, as a one-element list: `["http://127.0.0.1:PORT"]`.
    pub fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints()
    }

    /// The client address, e.g. to put a `Proxy` in front of it.
    pub fn client_addr(&self) -> SocketAddr {
        self.cluster.client_addr(0)
    }

    /// The URL of etcd's Prometheus `/metrics`.
    pub fn metrics_url(&self) -> String {
        self.cluster.metrics_url(0)
    }

    /// The process, to kill, pause, resume or restart it.
    pub fn process(&mut self) -> &mut ServerProcess {
        self.cluster.member(0)
    }
}

/// An etcd cluster whose members are all on loopback, each with its own
/// client port, peer port and data directory; killed on drop.
pub struct EtcdCluster {
    members: Vec<ServerProcess>,
    client_addrs: Vec<SocketAddr>,
    // Declared last so it is removed after the processes are killed.
    _dir: TempDir,
}

impl EtcdCluster {
    /// Starts a three-member cluster and waits until every member is healthy.
    pub async fn three() -> Self {
        Self::start(3, &std::env::temp_dir()).await
    }

    /// The client URLs of all members, `http://127.0.0.1:PORT`, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.client_addrs
            .iter()
            .map(|addr| format!("http://{addr}"))
            .collect()
    }

    /// The client address of member `index`.
    pub fn client_addr(&self, index: usize) -> SocketAddr {
        self.client_addrs[index]
    }

    /// The URL of member `index`'s Prometheus `/metrics`.
    pub fn metrics_url(&self, index: usize) -> String {
        format!("http://{}/metrics", self.client_addrs[index])
    }

    /// Member `index`'s process, to kill, pause, resume or restart it.
    pub fn member(&mut self, index: usize) -> &mut ServerProcess {
        &mut self.members[index]
    }

    /// Starts `size` members, their data directories in a new temp dir under `parent`, again
    /// on new ports when one exits during startup ([`start_with_retries`]).
    async fn start(size: usize, parent: &Path) -> Self {
        start_with_retries("etcd", || Self::try_start(size, parent)).await
    }

    async fn try_start(size: usize, parent: &Path) -> Result<Self, String> {
        let etcd = find_binary("etcd");
        let dir = tempfile::Builder::new()
            .prefix("incumbent-etcd-")
            .tempdir_in(parent)
            .unwrap_or_else(|e| panic!("create an etcd temp dir in {}: {e}", parent.display()));
        let names: Vec<String> = (0..size).map(|i| format!("etcd{i}")).collect();
        let client_addrs: Vec<SocketAddr> = (0..size).map(|_| free_addr()).collect();
        let peer_addrs: Vec<SocketAddr> = (0..size).map(|_| free_addr()).collect();
        let initial_cluster = names
            .iter()
            .zip(&peer_addrs)
            .map(|(name, peer)| format!("{name}=http://{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        // Any string shared by all members and unique to this cluster.
        let token = format!("incumbent-{}", peer_addrs[0].port());
        let shared_args = cluster_args(&initial_cluster, &token);
        let mut members: Vec<ServerProcess> = (0..size)
            .map(|i| {
                let data_dir = dir.path().join(&names[i]);
                let mut args = member_args(&names[i], &data_dir, client_addrs[i], peer_addrs[i]);
                args.extend_from_slice(&shared_args);
                let probe = health_probe(client_addrs[i]);
                ServerProcess::spawn(&names[i], etcd.clone(), args, dir.path(), probe)
            })
            .collect();
        // Members become healthy only once a quorum has started, so all are
        // spawned before waiting on any.
        for member in &mut members {
            member.try_wait_ready().await?;
        }
        Ok(EtcdCluster {
            members,
            client_addrs,
            _dir: dir,
        })
    }
}

/// The flags that differ between members.
fn member_args(name: &str, data_dir: &Path, client: SocketAddr, peer: SocketAddr) -> Vec<String> {
    vec![
        format!("--name={name}"),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls=http://{client}"),
        format!("--advertise-client-urls=http://{client}"),
        format!("--listen-peer-urls=http://{peer}"),
        format!("--initial-advertise-peer-urls=http://{peer}"),
    ]
}

/// The flags that every member of a cluster shares.
fn cluster_args(initial_cluster: &str, token: &str) -> Vec<String> {
    vec![
        format!("--initial-cluster={initial_cluster}"),
        "--initial-cluster-state=new".to_owned(),
        format!("--initial-cluster-token={token}"),
        format!("--heartbeat-interval={HEARTBEAT_MS}"),
        format!("--election-timeout={ELECTION_TIMEOUT_MS}"),
        "--logger=zap".to_owned(),
        "--log-outputs=stderr".to_owned(),
    ]
}

fn health_probe(addr: SocketAddr) -> Probe {
    Probe::Http {
        addr,
        path: "/health",
        check: is_healthy,
    }
}

/// Whether an etcd `/health` body says healthy: `{"health":"true"}` (etcd
/// 3.4 sends a string, later versions may send a boolean).
pub fn is_healthy(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body).is_ok_and(|json| {
        matches!(&json["health"], serde_json::Value::Bool(true))
            || json["health"].as_str() == Some("true")
    })
}
