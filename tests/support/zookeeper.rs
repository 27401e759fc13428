//! ZooKeeper on loopback: a standalone server ([`ZookeeperServer`], `ZooKeeperServerMain`)
//! or a three-member ensemble ([`ZookeeperEnsemble`], `QuorumPeerMain`) from Debian's
//! `zookeeper` package, run straight from its jar, in a temp dir, killed on drop.
//!
//! The tick is short ([`TICK_MS`]) so that session timeouts of a second or two are allowed
//! and expiry is detected within a tick. Readiness is probed on the AdminServer's `ruok`
//! command, bound to its own free loopback port: it answers without an error only once the
//! server serves requests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::bin::{INSTALL_HINT, find_binary};
use super::http;
use super::net::free_addr;
use super::process::{Probe, ServerProcess, start_with_retries};
use super::proxy::Proxy;

/// ZooKeeper's tick in milliseconds: sessions are checked for expiry at this pace.
pub const TICK_MS: u32 = 200;

/// The smallest session timeout the server grants, in milliseconds (two ticks).
pub const MIN_SESSION_TIMEOUT_MS: u32 = 2 * TICK_MS;

/// The largest session timeout the server grants, in milliseconds.
pub const MAX_SESSION_TIMEOUT_MS: u32 = 60_000;

/// Where Debian's `libzookeeper-java` puts the server's jar; its manifest names the other
/// jars it needs.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// Jars the manifest leaves out: a logger (else the server logs nothing) and the servlet
/// API (else the AdminServer, our readiness probe, cannot start).
const EXTRA_JARS: [&str; 2] = [
    "/usr/share/java/slf4j-simple.jar",
    "/usr/share/java/servlet-api.jar",
];

/// A standalone ZooKeeper server, killed on drop.
pub struct ZookeeperServer {
    process: ServerProcess,
    client_addr: SocketAddr,
    admin_addr: SocketAddr,
    // Declared last so it is removed after the process is killed.
    _dir: TempDir,
}

impl ZookeeperServer {
    /// Starts a standalone server on a free loopback port, its data in a temp dir, and waits
    /// until it serves requests. Panics, naming the install command, when Java or the
    /// `zookeeper` package is missing.
    pub async fn single() -> Self {
        // A free port can be taken by another process between choosing it and the server
        // binding it (eight tests at a time open many connections): start again on new
        // ports, a few times, before giving up with the server's log.
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::try_single().await {
                Ok(server) => return server,
                Err(why) => failures.push(why),
            }
        }
        panic!(
            "zookeeper did not start in 3 tries:\n{}",
            failures.join("\n---\n")
        );
    }

    async fn try_single() -> Result<Self, String> {
        let java = find_binary("java");
        let classpath = classpath();
        let dir = tempfile::Builder::new()
            .prefix("incumbent-zookeeper-")
            .tempdir()
            .expect("create a zookeeper temp dir");
        let client_addr = free_addr();
        let admin_addr = free_addr();
        let config = dir.path().join("zoo.cfg");
        std::fs::create_dir_all(dir.path().join("data")).expect("create the data dir");
        std::fs::write(&config, config_text(dir.path(), client_addr, admin_addr))
            .expect("write zoo.cfg");
        let args = vec![
            "-Xmx256m".to_owned(),
            "-cp".to_owned(),
            classpath,
            "org.apache.zookeeper.server.ZooKeeperServerMain".to_owned(),
            config.display().to_string(),
        ];
        let probe = Probe::Http {
            addr: admin_addr,
            path: "/commands/ruok",
            check: is_serving,
        };
        let mut process = ServerProcess::spawn("zookeeper", java, args, dir.path(), probe);
        process.try_wait_ready().await?;
        process.verify_listener(client_addr)?;
        Ok(ZookeeperServer {
            process,
            client_addr,
            admin_addr,
            _dir: dir,
        })
    }

    /// The client address, e.g. to put a `Proxy` in front of it.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The AdminServer's HTTP address (`GET /commands/srvr`, `/commands/mntr`, …).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The connect string: `127.0.0.1:PORT`.
    pub fn connect_string(&self) -> String {
        self.client_addr.to_string()
    }

    /// The process, to kill, pause, resume or restart it.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

/// A three-member ZooKeeper ensemble on loopback, each member with its own client, quorum,
/// election and admin ports and data directory; killed on drop.
///
/// Made by [`ZookeeperEnsemble::three_with_peer_proxies`], every member reaches every other
/// member's quorum and election ports through a [`Proxy`] of its own, one per direction, so
/// that a member can be cut off from the others ([`ZookeeperEnsemble::isolate`]) while its
/// client port stays open.
pub struct ZookeeperEnsemble {
    members: Vec<ServerProcess>,
    client_addrs: Vec<SocketAddr>,
    admin_addrs: Vec<SocketAddr>,
    /// `(from, to, proxy)`: member `from` reaches member `to`'s quorum or election port
    /// through `proxy`. Empty unless made with peer proxies.
    links: Vec<(usize, usize, Proxy)>,
    // Declared last so it is removed after the processes are killed.
    _dir: TempDir,
}

/// A member's quorum and election addresses.
#[derive(Clone, Copy)]
struct PeerPorts {
    quorum: SocketAddr,
    election: SocketAddr,
}

impl ZookeeperEnsemble {
    /// Starts three members and waits until each serves requests (which needs a quorum).
    pub async fn three() -> Self {
        Self::start(false, 5).await
    }

    /// Starts three members whose links to each other run through proxies (see
    /// [`ZookeeperEnsemble::isolate`]), with `syncLimit` = `sync_limit` ticks: how long a
    /// follower that hears nothing from its leader takes to notice. Waits until each member
    /// serves requests.
    pub async fn three_with_peer_proxies(sync_limit: u32) -> Self {
        Self::start(true, sync_limit).await
    }

    /// Starts the three members, again on new ports when one exits during startup
    /// ([`start_with_retries`]; ZooKeeper exits with 14 when its quorum port is taken).
    async fn start(proxied: bool, sync_limit: u32) -> Self {
        start_with_retries("the zookeeper ensemble", || {
            Self::try_start(proxied, sync_limit)
        })
        .await
    }

    async fn try_start(proxied: bool, sync_limit: u32) -> Result<Self, String> {
        let java = find_binary("java");
        let classpath = classpath();
        let dir = tempfile::Builder::new()
            .prefix("incumbent-zookeeper-ensemble-")
            .tempdir()
            .expect("create a zookeeper temp dir");
        let client_addrs: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
        let admin_addrs: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
        let real: Vec<PeerPorts> = (0..3)
            .map(|_| PeerPorts {
                quorum: free_addr(),
                election: free_addr(),
            })
            .collect();
        // What member `from` dials to reach member `to`: its ports, or proxies in front.
        let mut links = Vec::new();
        let mut views: Vec<Vec<PeerPorts>> = Vec::new();
        for from in 0..3 {
            let mut view = real.clone();
            if proxied {
                for (to, ports) in view.iter_mut().enumerate() {
                    if to == from {
                        continue;
                    }
                    let quorum = Proxy::start(real[to].quorum);
                    let election = Proxy::start(real[to].election);
                    *ports = PeerPorts {
                        quorum: quorum.addr(),
                        election: election.addr(),
                    };
                    links.push((from, to, quorum));
                    links.push((from, to, election));
                }
            }
            views.push(view);
        }
        let mut members = Vec::new();
        for i in 0..3 {
            let member = dir.path().join(format!("zk{}", i + 1));
            std::fs::create_dir_all(member.join("data")).expect("create the data dir");
            std::fs::write(member.join("data/myid"), format!("{}\n", i + 1)).expect("write myid");
            let config = member.join("zoo.cfg");
            let servers: String = views[i]
                .iter()
                .enumerate()
                .map(|(j, ports)| {
                    format!(
                        "server.{}={}:{}:{}\n",
                        j + 1,
                        ports.quorum.ip(),
                        ports.quorum.port(),
                        ports.election.port()
                    )
                })
                .collect();
            let text = format!(
                "{}initLimit=10\nsyncLimit={sync_limit}\n{servers}",
                config_text(&member, client_addrs[i], admin_addrs[i])
            );
            std::fs::write(&config, text).expect("write zoo.cfg");
            let args = vec![
                "-Xmx256m".to_owned(),
                "-cp".to_owned(),
                classpath.clone(),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain".to_owned(),
                config.display().to_string(),
            ];
            let probe = Probe::Http {
                addr: admin_addrs[i],
                path: "/commands/ruok",
                check: is_serving,
            };
            let name = format!("zookeeper{}", i + 1);
            members.push(ServerProcess::spawn(
                &name,
                java.clone(),
                args,
                dir.path(),
                probe,
            ));
        }
        for (member, &client) in members.iter_mut().zip(&client_addrs) {
            // On failure the members are dropped, which kills those still running.
            member.try_wait_ready().await?;
            member.verify_listener(client)?;
        }
        Ok(ZookeeperEnsemble {
            members,
            client_addrs,
            admin_addrs,
            links,
            _dir: dir,
        })
    }

    /// The connect string of all members: `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn connect_string(&self) -> String {
        self.connect_string_of(&[0, 1, 2])
    }

    /// The connect string of the members `indexes` only.
    pub fn connect_string_of(&self, indexes: &[usize]) -> String {
        indexes
            .iter()
            .map(|&i| self.client_addrs[i].to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `index`'s process, to kill, pause, resume or restart it.
    pub fn member(&mut self, index: usize) -> &mut ServerProcess {
        &mut self.members[index]
    }

    /// The index of the member that is the ensemble's leader now, asked of each member's
    /// AdminServer; `None` if none says it leads.
    pub async fn leader(&self) -> Option<usize> {
        for (i, addr) in self.admin_addrs.iter().enumerate() {
            let Ok(response) = http::get(*addr, "/commands/srvr").await else {
                continue;
            };
            let state = serde_json::from_str::<serde_json::Value>(&response.body)
                .ok()
                .and_then(|json| {
                    json["server_stats"]["server_state"]
                        .as_str()
                        .map(str::to_owned)
                });
            if state.as_deref() == Some("leader") {
                return Some(i);
            }
        }
        None
    }

    /// Cuts member `index` off from the other two (`on`), or joins it again: every byte of
    /// its quorum and election links, both ways, is withheld while the connections stay
    /// open, as in a network partition. Its client port stays open. Panics unless the
    /// ensemble was made with peer proxies.
    pub fn isolate(&self, index: usize, on: bool) {
        assert!(
            !self.links.is_empty(),
            "isolate needs ZookeeperEnsemble::three_with_peer_proxies"
        );
        for (from, to, proxy) in &self.links {
            if *from == index || *to == index {
                proxy.blackhole(on);
            }
        }
    }
}

/// The server's class path; panics with the install hint when the package is missing.
fn classpath() -> String {
    let mut jars = vec![PathBuf::from(ZOOKEEPER_JAR)];
    jars.extend(EXTRA_JARS.iter().map(PathBuf::from));
    for jar in &jars {
        assert!(
            jar.exists(),
            "{} not found: ZooKeeper is not installed; install the test servers with `{INSTALL_HINT}`",
            jar.display()
        );
    }
    jars.iter()
        .map(|jar| jar.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

fn config_text(dir: &Path, client: SocketAddr, admin: SocketAddr) -> String {
    format!(
        "tickTime={TICK_MS}\n\
         dataDir={data}\n\
         clientPortAddress={client_ip}\n\
         clientPort={client_port}\n\
         minSessionTimeout={MIN_SESSION_TIMEOUT_MS}\n\
         maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}\n\
         maxClientCnxns=0\n\
         admin.enableServer=true\n\
         admin.serverAddress={admin_ip}\n\
         admin.serverPort={admin_port}\n\
         4lw.commands.whitelist=ruok,srvr,cons\n",
        data = dir.join("data").display(),
        client_ip = client.ip(),
        client_port = client.port(),
        admin_ip = admin.ip(),
        admin_port = admin.port(),
    )
}

/// Whether the AdminServer's `ruok` answer says the server serves requests: no error.
fn is_serving(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .is_ok_and(|json| json["command"] == "ruok" && json["error"].is_null())
}
