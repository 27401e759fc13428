//! The fault loop: starts a store, N `incumbent run` candidates (each through its own TCP
//! proxy) whose command is the worker, injects seeded faults one at a time, waits after each
//! for exactly one running leader within the promised bound, and records everything it did
//! next to the workers' ledgers. The checker ([`super::check`]) judges the history afterwards.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::time::sleep;

use super::check::{self, Death, FaultRecord, History, Verdict};
use super::worker::mono_ns;
use crate::support::bin::find_binary;
use crate::support::net::{free_addr, free_port};
use crate::support::redis::TextProbe;
use crate::support::zookeeper::{TICK_MS, ZookeeperEnsemble};
use crate::support::{
    EtcdCluster, EtcdServer, MemcachedServer, PgBouncer, PostgresServer, Probe, Proxy,
    ServerProcess, ZookeeperServer,
};

/// The election every candidate runs for.
pub const ELECTION: &str = "chaos/worker";

/// How long the first leader may take, servers started.
const FIRST_LEADER: Duration = Duration::from_secs(60);

/// A leader is running when its last beat is at most this old.
pub const FRESH_BEAT: Duration = Duration::from_millis(200);

/// One leader must run alone this long to count as the leader again.
pub const STABLE: Duration = Duration::from_millis(300);

/// After a fault whose bound passed without one leader: how much longer the loop waits for
/// one (the fault is a violation either way; with a leader the run goes on, without one it
/// ends).
pub const LATE_LIMIT: Duration = Duration::from_secs(60);

/// How long a SIGTERMed supervisor may take to exit.
const EXIT_LIMIT: Duration = Duration::from_secs(10);

/// The bound after a voluntary hand-off (SIGTERM, resign): the old leader stops its worker
/// (which exits at once) and releases, and a follower takes over.
pub const HANDOFF_BOUND: Duration = Duration::from_secs(2);

/// The ZooKeeper ensemble's `syncLimit` in ticks ([`TICK_MS`] each, 2 s in all): how long a
/// member that hears nothing from its peers takes to stop serving (a follower that loses its
/// leader, a leader that loses its quorum), and the other two to notice a lost leader.
const ZK_SYNC_LIMIT: u32 = 10;

/// What a ZooKeeper leader election among the two members left may take, once they noticed
/// their leader is gone (`finalizeWait`, the vote, the new leader syncing its follower).
const ZK_ELECTION: Duration = Duration::from_secs(2);

/// The member of the ensemble candidate `index` connects to.
fn ensemble_member(index: usize) -> usize {
    index % 3
}

/// Where per-fault details go that the checker does not need (which member was cut off,
/// whether it was ZooKeeper's leader; how long the Redis replica lagged), one JSON line each.
const DETAILS_FILE: &str = "fault-details.jsonl";

/// Where the elections live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Backend {
    /// Campaigns in this process on one shared memory backend ([`super::inproc`]).
    Memory,
    File,
    Etcd,
    /// A three-member etcd cluster, every candidate connected to all three members.
    EtcdCluster,
    Consul,
    /// One ZooKeeper server (standalone), its data on disk.
    Zookeeper,
    /// One Redis server with `appendonly yes` and `appendfsync always`: a restart keeps the
    /// lock key and the fencing counter.
    Redis,
    /// One Redis server without persistence (`--save ''`, no AOF): a restart loses the lock
    /// key and the fencing counter, and tokens must still grow (seeded from its clock).
    RedisVolatile,
    /// One memcached: a restart loses the lock and the fencing counter (best effort).
    Memcached,
    /// A three-member ZooKeeper ensemble whose peer links run through proxies, so that one
    /// member can be cut off from the other two while its client port stays open; each
    /// candidate connects to one member (candidate `i` to member `i % 3`).
    ZookeeperEnsemble,
    /// A Redis primary and a replica, both without persistence, behind a relay whose
    /// upstream is switched to the replica when it is promoted (`promote-replica`): a
    /// failover loses what the replica had not received.
    RedisFailover,
    /// One PostgreSQL server (`initdb` in a temp dir), followers woken by `LISTEN`: a
    /// restart keeps the lease rows.
    Postgres,
    /// The same server behind PgBouncer in transaction mode (4 server connections for all
    /// candidates), followers polling (`INCUMBENT_PG_LISTEN=off`); the store's faults hit
    /// the server behind it.
    PostgresPooled,
    /// A real `kube-apiserver` on its own etcd, each candidate a client of its own through
    /// its proxy: `sigstop-store` freezes the etcd behind the API server, and
    /// `kill9-restart-store` restarts the API server.
    Kubernetes,
}

impl Backend {
    pub const ALL: [Backend; 14] = [
        Backend::Memory,
        Backend::File,
        Backend::Etcd,
        Backend::EtcdCluster,
        Backend::Consul,
        Backend::Zookeeper,
        Backend::Redis,
        Backend::RedisVolatile,
        Backend::Memcached,
        Backend::ZookeeperEnsemble,
        Backend::RedisFailover,
        Backend::Postgres,
        Backend::PostgresPooled,
        Backend::Kubernetes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::File => "file",
            Backend::Etcd => "etcd",
            Backend::EtcdCluster => "etcd-cluster",
            Backend::Consul => "consul",
            Backend::Zookeeper => "zookeeper",
            Backend::Redis => "redis",
            Backend::RedisVolatile => "redis-volatile",
            Backend::Memcached => "memcached",
            Backend::ZookeeperEnsemble => "zookeeper-ensemble",
            Backend::RedisFailover => "redis-failover",
            Backend::Postgres => "postgres",
            Backend::PostgresPooled => "postgres-pooled",
            Backend::Kubernetes => "kubernetes",
        }
    }

    /// Whether a restart of the store loses the lock and the fencing counter (memcached,
    /// Redis without persistence): then two terms may overlap for up to a renewal interval,
    /// and tokens must still grow (the checker counts both, and stale writes accepted).
    pub fn restart_loses_data(self) -> bool {
        matches!(
            self,
            Backend::Memcached | Backend::RedisVolatile | Backend::RedisFailover
        )
    }

    /// The candidates' `--ttl`. Consul's smallest session ttl is 10 s.
    pub fn ttl(self) -> Duration {
        match self {
            Backend::Memory | Backend::File => Duration::from_secs(1),
            Backend::Etcd
            | Backend::EtcdCluster
            | Backend::Zookeeper
            | Backend::Redis
            | Backend::RedisVolatile
            | Backend::Memcached
            | Backend::ZookeeperEnsemble
            | Backend::RedisFailover
            | Backend::Postgres
            | Backend::PostgresPooled
            | Backend::Kubernetes => Duration::from_secs(2),
            Backend::Consul => Duration::from_secs(10),
        }
    }

    /// The promised time from a leader's death (or its cut-off from the store) to a new
    /// leader's command: the kernel frees a dead process's `flock` at once; etcd revokes an
    /// expired lease within about half a second of its ttl; Consul invalidates a session
    /// between ttl and 2 × ttl (lock-delay 0); ZooKeeper expires a session within a tick
    /// (200 ms here) of its timeout (the ttl); a Redis or memcached key expires at its ttl,
    /// and followers poll every 500 ms; a memcached candidate that finds the counter went
    /// back (a restart) leads only a ttl after it took the lock; the memory backend frees
    /// an expired session's lock when its ttl is up, and wakes its waiters at once.
    pub fn failover_bound(self) -> Duration {
        match self {
            Backend::Memory => self.ttl() + Duration::from_secs(1),
            Backend::File => Duration::from_secs(1),
            Backend::Etcd
            | Backend::EtcdCluster
            | Backend::Zookeeper
            | Backend::ZookeeperEnsemble
            | Backend::Redis
            | Backend::Postgres
            | Backend::PostgresPooled
            | Backend::Kubernetes => self.ttl() + Duration::from_secs(2),
            Backend::Memcached | Backend::RedisVolatile | Backend::RedisFailover => {
                self.ttl() * 2 + Duration::from_secs(2)
            }
            Backend::Consul => self.ttl() * 2 + Duration::from_secs(5),
        }
    }

    /// The faults that apply to this backend; in library mode, the supervisor is the
    /// worker's own process, and it does not resign on SIGUSR1.
    pub fn faults(self, library: bool) -> Vec<Fault> {
        let mut faults = match self {
            Backend::Memory => vec![
                Fault::AbortTask,
                Fault::DropRuntime,
                Fault::Shutdown,
                Fault::FreezeRuntime,
                Fault::Unreachable,
                Fault::Failing,
                Fault::Latency,
                Fault::IgnoreCancel,
            ],
            Backend::File => vec![
                Fault::Kill9,
                Fault::Sigterm,
                Fault::FreezeGroup,
                Fault::FreezeSupervisor,
                Fault::StderrStall,
            ],
            Backend::Etcd
            | Backend::Consul
            | Backend::Zookeeper
            | Backend::Redis
            | Backend::RedisVolatile
            | Backend::Memcached
            | Backend::Postgres
            | Backend::PostgresPooled
            | Backend::Kubernetes => {
                let mut faults = Fault::ALL[..9].to_vec();
                faults.push(Fault::SwitchoverDuringFault);
                faults
            }
            Backend::EtcdCluster => vec![
                Fault::Kill9,
                Fault::Sigterm,
                Fault::FreezeGroup,
                Fault::FreezeSupervisor,
                Fault::StderrStall,
                Fault::MemberLoss,
            ],
            // No store process to pause or restart: the faults of the ensemble's members are
            // partitions.
            Backend::ZookeeperEnsemble => vec![
                Fault::Kill9,
                Fault::Sigterm,
                Fault::FreezeGroup,
                Fault::FreezeSupervisor,
                Fault::Blackhole,
                Fault::Latency,
                Fault::StderrStall,
                Fault::PartitionMember,
            ],
            // The store process is the primary.
            Backend::RedisFailover => {
                let mut faults = Fault::ALL[..9].to_vec();
                faults.push(Fault::PromoteReplica);
                faults.push(Fault::SwitchoverDuringFault);
                faults
            }
        };
        if library {
            faults.retain(|f| !matches!(f, Fault::FreezeSupervisor | Fault::StderrStall));
        }
        faults
    }
}

/// A fault, done to the current leader (or its store, or its link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the leader's supervisor (`incumbent run`); restart it.
    Kill9,
    /// SIGTERM the leader's supervisor; restart it once it has exited.
    Sigterm,
    /// SIGSTOP the supervisor and the worker's process group for longer than the ttl (a VM
    /// pause), then SIGCONT.
    FreezeGroup,
    /// SIGSTOP only the supervisor for longer than the ttl, then SIGCONT: its command runs on.
    FreezeSupervisor,
    /// SIGSTOP the store for longer than the ttl, then SIGCONT.
    StorePause,
    /// SIGKILL the store, then start it again on the same data.
    StoreRestart,
    /// Black-hole the leader's link to the store for longer than the ttl.
    Blackhole,
    /// Delay every chunk on the leader's link by ttl/20 to ttl/5 for about a ttl.
    Latency,
    /// Stop reading the leader's stderr, fill the pipe, make it resign (SIGUSR1), read again.
    StderrStall,
    /// SIGKILL the etcd cluster's raft leader member for longer than the ttl, then restart it.
    MemberLoss,
    /// In process: abort the leader's election task (a crash); start a new candidate.
    AbortTask,
    /// In process: drop the leader's runtime, every task on it; start a new candidate.
    DropRuntime,
    /// In process: shut the leader down (graceful hand-off); start a new candidate.
    Shutdown,
    /// In process: block the leader's runtime thread for longer than the ttl (a pause).
    FreezeRuntime,
    /// In process: the store hangs for the leader's client for longer than the ttl.
    Unreachable,
    /// In process: the store fails every call of the leader's client for longer than the ttl.
    Failing,
    /// In process: the store hangs for the leader's client while its worker ignores
    /// cancellation: the runner must stop the worker hard before the lock can pass on.
    IgnoreCancel,
    /// (ZooKeeper ensemble) Cut the member the leader's candidate is connected to off from the
    /// other two for longer than the ttl (its client port stays open), then heal.
    PartitionMember,
    /// (Redis failover) Maybe pause the replica so that it misses the last writes, SIGKILL
    /// the primary, promote the replica (`REPLICAOF NO ONE`), switch the candidates' relay
    /// to it, and start a fresh replica of it for the next failover. Loses data.
    PromoteReplica,
    /// Black-hole or slow down the leader's link to the store and, while it lasts, run
    /// `incumbent switchover` to another live candidate (an operator moving leadership in the
    /// middle of trouble); then heal, and wait for the switchover to end.
    SwitchoverDuringFault,
}

impl Fault {
    pub const ALL: [Fault; 20] = [
        Fault::Kill9,
        Fault::Sigterm,
        Fault::FreezeGroup,
        Fault::FreezeSupervisor,
        Fault::StorePause,
        Fault::StoreRestart,
        Fault::Blackhole,
        Fault::Latency,
        Fault::StderrStall,
        Fault::MemberLoss,
        Fault::AbortTask,
        Fault::DropRuntime,
        Fault::Shutdown,
        Fault::FreezeRuntime,
        Fault::Unreachable,
        Fault::Failing,
        Fault::IgnoreCancel,
        Fault::PartitionMember,
        Fault::PromoteReplica,
        Fault::SwitchoverDuringFault,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill9 => "kill9-leader",
            Fault::Sigterm => "sigterm-leader",
            Fault::FreezeGroup => "sigstop-group",
            Fault::FreezeSupervisor => "sigstop-supervisor",
            Fault::StorePause => "sigstop-store",
            Fault::StoreRestart => "kill9-restart-store",
            Fault::Blackhole => "blackhole-link",
            Fault::Latency => "latency-link",
            Fault::StderrStall => "stalled-stderr-resign",
            Fault::MemberLoss => "kill9-etcd-leader-member",
            Fault::AbortTask => "abort-leader-task",
            Fault::DropRuntime => "drop-leader-runtime",
            Fault::Shutdown => "shutdown-leader",
            Fault::FreezeRuntime => "freeze-leader-runtime",
            Fault::Unreachable => "store-hangs-for-leader",
            Fault::Failing => "store-fails-for-leader",
            Fault::IgnoreCancel => "worker-ignores-cancel",
            Fault::PartitionMember => "partition-member",
            Fault::PromoteReplica => "promote-replica",
            Fault::SwitchoverDuringFault => "switchover-during-fault",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub backend: Backend,
    /// How many candidates.
    pub candidates: usize,
    /// How many faults.
    pub faults: usize,
    /// Seeds every choice: which fault, on whom, for how long.
    pub seed: u64,
    /// No fault is started after this long.
    pub max_time: Duration,
    /// Draw only from these (those that apply to the backend); empty: all that apply.
    pub kinds: Vec<Fault>,
    /// Take `kinds` in turn instead of drawing them.
    pub in_turn: bool,
    /// Candidates are library campaigns (`THIS candidate …`) instead of `incumbent run`.
    pub library: bool,
    /// The `incumbent` binary.
    pub incumbent: PathBuf,
    /// The program that runs `THIS worker LEDGER FENCE` and `THIS candidate URL ID TTL_MS
    /// LEDGER FENCE`: the checker itself.
    pub this: PathBuf,
    /// Keep the history here instead of in a temp dir that is removed.
    pub keep: Option<PathBuf>,
    /// A bug to plant in the workers ([`super::worker::PLANT`]), to see the checker fail.
    pub plant: Option<String>,
}

impl Config {
    /// The backend's name, and the mode in library mode: `etcd`, `etcd library`.
    pub fn label(&self) -> String {
        if self.backend == Backend::Memory {
            "memory in-process".to_owned()
        } else if self.library {
            format!("{} library", self.backend.name())
        } else {
            self.backend.name().to_owned()
        }
    }
}

/// The outcome of one backend's run.
pub struct Outcome {
    pub verdict: Verdict,
    /// How many faults were injected.
    pub injected: usize,
    pub elapsed: Duration,
}

/// Where one run writes its history: under `--keep` if given, else in a temporary directory
/// that lives as long as the returned guard.
pub(crate) fn history_dir(config: &Config) -> (tempfile::TempDir, PathBuf) {
    let temp = tempfile::Builder::new()
        .prefix("incumbent-chaos-")
        .tempdir()
        .expect("create a temp dir");
    let dir = match &config.keep {
        Some(dir) => {
            let dir = dir.join(config.label().replace(' ', "-"));
            std::fs::create_dir_all(&dir).expect("create the history dir");
            dir
        }
        None => temp.path().to_path_buf(),
    };
    (temp, dir)
}

/// Checks the history a run left in `dir`, with the errors its fault loop met.
pub(crate) fn outcome(
    dir: &Path,
    errors: Vec<String>,
    injected: usize,
    started: Instant,
) -> Outcome {
    let mut history = History::read(dir).expect("read the history");
    history.errors = errors;
    Outcome {
        verdict: check::check(&history),
        injected,
        elapsed: started.elapsed(),
    }
}

/// Runs the fault loop for one backend and checks its history.
pub async fn run(config: &Config) -> Outcome {
    if config.backend == Backend::Memory {
        return super::inproc::run(config).await;
    }
    let started = Instant::now();
    let (_temp, dir) = history_dir(config);
    let mut errors = Vec::new();
    let mut world = World::start(config, &dir).await;
    let applicable = config.backend.faults(config.library);
    let injected = fault_loop(&mut world, config, applicable, &mut errors).await;
    world.shut_down(&mut errors).await;
    drop(world);
    outcome(&dir, errors, injected, started)
}

/// The store the candidates elect through.
enum Store {
    File,
    Etcd(EtcdServer),
    Cluster(EtcdCluster),
    Consul(ConsulServer),
    Zookeeper(ZookeeperServer),
    Redis(RedisServer),
    Memcached(MemcachedServer),
    ZookeeperEnsemble(ZookeeperEnsemble),
    RedisFailover(Box<RedisFailover>),
    Postgres(PostgresServer),
    PostgresPooled(Box<(PostgresServer, PgBouncer)>),
    Kubernetes(Box<crate::support::kube::KubeServer>),
}

impl Store {
    async fn start(backend: Backend) -> Store {
        match backend {
            Backend::Memory => unreachable!("the memory backend runs in process"),
            Backend::File => Store::File,
            Backend::Etcd => Store::Etcd(EtcdServer::single().await),
            Backend::EtcdCluster => Store::Cluster(EtcdCluster::three().await),
            Backend::Consul => Store::Consul(ConsulServer::start().await),
            Backend::Zookeeper => Store::Zookeeper(ZookeeperServer::single().await),
            Backend::Redis => Store::Redis(RedisServer::start(true).await),
            Backend::RedisVolatile => Store::Redis(RedisServer::start(false).await),
            Backend::Memcached => Store::Memcached(MemcachedServer::start().await),
            Backend::ZookeeperEnsemble => Store::ZookeeperEnsemble(
                ZookeeperEnsemble::three_with_peer_proxies(ZK_SYNC_LIMIT).await,
            ),
            Backend::RedisFailover => Store::RedisFailover(Box::new(RedisFailover::start().await)),
            Backend::Postgres => Store::Postgres(PostgresServer::start().await),
            Backend::PostgresPooled => {
                let server = PostgresServer::start().await;
                let bouncer = PgBouncer::transaction_mode(server.addr(), 4).await;
                Store::PostgresPooled(Box::new((server, bouncer)))
            }
            Backend::Kubernetes => {
                Store::Kubernetes(Box::new(crate::support::kube::KubeServer::start().await))
            }
        }
    }

    /// Where candidate `index` connects (through a proxy of its own).
    fn client_addr(&self, index: usize) -> Option<std::net::SocketAddr> {
        match self {
            // Candidates reach the cluster's three members directly.
            Store::File | Store::Cluster(_) => None,
            Store::ZookeeperEnsemble(ensemble) => Some(
                ensemble
                    .connect_string_of(&[ensemble_member(index)])
                    .parse()
                    .expect("a member's client address"),
            ),
            Store::RedisFailover(pair) => Some(pair.relay.addr()),
            Store::Etcd(etcd) => Some(etcd.client_addr()),
            Store::Consul(consul) => Some(consul.http),
            Store::Zookeeper(zookeeper) => Some(zookeeper.client_addr()),
            Store::Redis(redis) => Some(redis.addr),
            Store::Memcached(memcached) => Some(memcached.addr()),
            Store::Postgres(postgres) => Some(postgres.addr()),
            Store::PostgresPooled(pair) => Some(pair.1.addr()),
            Store::Kubernetes(server) => Some(server.addr()),
        }
    }

    fn process(&mut self) -> Option<&mut ServerProcess> {
        match self {
            Store::File | Store::Cluster(_) => None,
            Store::Etcd(etcd) => Some(etcd.process()),
            Store::Consul(consul) => Some(&mut consul.process),
            Store::Zookeeper(zookeeper) => Some(zookeeper.process()),
            Store::Redis(redis) => Some(&mut redis.process),
            Store::Memcached(memcached) => Some(memcached.process()),
            Store::ZookeeperEnsemble(_) => None,
            Store::RedisFailover(pair) => Some(&mut pair.primary.process),
            Store::Postgres(postgres) => Some(postgres.process()),
            Store::PostgresPooled(pair) => Some(pair.0.process()),
            Store::Kubernetes(server) => Some(server.process()),
        }
    }

    /// The process a `sigstop-store` freezes: the store's, or for Kubernetes the etcd
    /// behind the API server (the API server then answers nothing that needs storage).
    fn paused_process(&mut self) -> Option<&mut ServerProcess> {
        match self {
            Store::Kubernetes(server) => Some(server.etcd().process()),
            other => other.process(),
        }
    }
}

/// A one-server Consul that keeps its data on disk (not `-dev`, which forgets everything
/// on a restart: its indexes, and so the fencing tokens, would start again from 1).
struct ConsulServer {
    process: ServerProcess,
    http: std::net::SocketAddr,
    _dir: TempDir,
}

impl ConsulServer {
    async fn start() -> ConsulServer {
        let consul = find_binary("consul");
        let dir = tempfile::Builder::new()
            .prefix("incumbent-chaos-consul-")
            .tempdir()
            .expect("create a consul temp dir");
        let http = free_addr();
        let mut args: Vec<String> = vec![
            "agent".into(),
            "-server".into(),
            "-bootstrap-expect=1".into(),
            "-node=chaos".into(),
            "-bind=127.0.0.1".into(),
            "-client=127.0.0.1".into(),
            "-log-level=warn".into(),
            "-hcl=performance { raft_multiplier = 1 }".into(),
            format!("-http-port={}", http.port()),
            format!("-data-dir={}", dir.path().join("data").display()),
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
        let probe = Probe::Http {
            addr: http,
            path: "/v1/status/leader",
            check: |body| serde_json::from_str::<String>(body).is_ok_and(|l| !l.is_empty()),
        };
        let mut process = ServerProcess::spawn("consul", consul, args, dir.path(), probe);
        process.wait_ready().await;
        ConsulServer {
            process,
            http,
            _dir: dir,
        }
    }
}

/// A Redis that keeps its data in an append-only file synced before every reply
/// (`appendfsync always`), so that a kill -9 loses no acknowledged write: the harness's
/// `RedisServer` keeps nothing, and would lose the lock and the fencing counter on a
/// restart, as memcached does.
struct RedisServer {
    process: ServerProcess,
    addr: std::net::SocketAddr,
    _probe: TextProbe,
    _dir: TempDir,
}

impl RedisServer {
    /// A server on a free loopback port; `persistent`: an append-only file synced at every
    /// write, else no persistence at all (a restart forgets everything).
    async fn start(persistent: bool) -> RedisServer {
        Self::start_with(persistent, &[]).await
    }

    /// The same, with more arguments.
    async fn start_with(persistent: bool, more: &[&str]) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("incumbent-chaos-redis-")
            .tempdir()
            .expect("create a redis temp dir");
        let addr = free_addr();
        let appendonly = if persistent { "yes" } else { "no" };
        let args: Vec<String> = vec![
            "--port".into(),
            addr.port().to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            appendonly.into(),
            "--appendfsync".into(),
            "always".into(),
            "--dir".into(),
            dir.path().display().to_string(),
        ]
        .into_iter()
        .chain(more.iter().map(|a| (*a).to_owned()))
        .collect();
        let probe = TextProbe::start(addr, b"PING\r\n");
        let mut process = ServerProcess::spawn(
            "redis",
            find_binary("redis-server"),
            args,
            dir.path(),
            Probe::Http {
                addr: probe.addr,
                path: "/",
                check: |body| body.starts_with("+PONG"),
            },
        );
        process.wait_ready().await;
        RedisServer {
            process,
            addr,
            _probe: probe,
            _dir: dir,
        }
    }
}

/// A Redis primary and a replica, neither persistent, and the relay the candidates reach the
/// primary through. The replica replicates through a proxy of its own, which can withhold
/// the primary's last writes from it; after a failover a fresh replica of the new primary is
/// started for the next one.
struct RedisFailover {
    primary: RedisServer,
    replica: RedisServer,
    /// The replica's link to the primary.
    link: Proxy,
    /// The candidates' proxies connect here; it is switched to the promoted replica.
    relay: Proxy,
    /// How many failovers were made.
    promotions: u32,
}

/// Replicas sync without writing an RDB file first, and at once.
const REPLICATION_ARGS: [&str; 4] = [
    "--repl-diskless-sync",
    "yes",
    "--repl-diskless-sync-delay",
    "0",
];

/// How long a fresh replica may take to be in sync with its primary.
const REPLICA_SYNC_LIMIT: Duration = Duration::from_secs(30);

impl RedisFailover {
    async fn start() -> RedisFailover {
        let primary = RedisServer::start_with(false, &REPLICATION_ARGS).await;
        let (replica, link) = Self::replica_of(primary.addr).await;
        let relay = Proxy::start(primary.addr);
        let pair = RedisFailover {
            primary,
            replica,
            link,
            relay,
            promotions: 0,
        };
        if let Err(e) = pair.synced().await {
            panic!("the first Redis replica: {e}");
        }
        pair
    }

    /// A fresh server, made a replica of `primary` through a proxy.
    async fn replica_of(primary: std::net::SocketAddr) -> (RedisServer, Proxy) {
        let replica = RedisServer::start_with(false, &REPLICATION_ARGS).await;
        let link = Proxy::start(primary);
        let port = link.addr().port().to_string();
        if let Err(e) = redis_call(replica.addr, &["REPLICAOF", "127.0.0.1", &port]).await {
            panic!("REPLICAOF on a fresh Redis replica: {e}");
        }
        (replica, link)
    }

    /// Waits (bounded) until the replica's link to the primary is up and it has loaded the
    /// primary's data.
    async fn synced(&self) -> Result<(), String> {
        let deadline = Instant::now() + REPLICA_SYNC_LIMIT;
        let mut last = String::new();
        while Instant::now() < deadline {
            match redis_call(self.replica.addr, &["INFO", "replication"]).await {
                Ok(info)
                    if info.contains("master_link_status:up")
                        && info.contains("master_sync_in_progress:0") =>
                {
                    return Ok(());
                }
                Ok(info) => last = info,
                Err(e) => last = e,
            }
            sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "not in sync within {REPLICA_SYNC_LIMIT:?}: {}",
            last.trim()
        ))
    }

    /// The failover: withholds the last `lag` of the primary's writes from the replica (none
    /// when zero), SIGKILLs the primary, drops what was withheld, promotes the replica and
    /// switches the relay to it. Returns when the relay was switched.
    async fn fail_over(&mut self, lag: Duration, errors: &mut Vec<String>) -> u64 {
        if !lag.is_zero() {
            self.link.blackhole(true);
            sleep(lag).await;
        }
        self.primary.process.kill9();
        // The bytes the link withheld are lost with its connections: reset them while
        // still withheld, then let the relay tasks see it before opening the link again.
        self.link.reset_all();
        if !lag.is_zero() {
            sleep(Duration::from_millis(100)).await;
        }
        self.link.blackhole(false);
        if let Err(e) = redis_call(self.replica.addr, &["REPLICAOF", "NO", "ONE"]).await {
            errors.push(format!("REPLICAOF NO ONE on the replica: {e}"));
        }
        self.relay.switch(self.replica.addr);
        let switched = mono_ns();
        self.promotions += 1;
        // The next failover's replica; it syncs while the candidates fail over.
        let (fresh, link) = Self::replica_of(self.replica.addr).await;
        let promoted = std::mem::replace(&mut self.replica, fresh);
        // The old primary is dead; dropping it removes its files.
        drop(std::mem::replace(&mut self.primary, promoted));
        self.link = link;
        switched
    }
}

/// Sends one command to the Redis server at `addr` and returns its reply (a status line, an
/// error, an integer or a bulk string), with a bounded wait.
async fn redis_call(addr: std::net::SocketAddr, args: &[&str]) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write to {addr}: {e}"))?;
        let mut reply = Vec::new();
        let mut buffer = [0; 4096];
        loop {
            let n = stream
                .read(&mut buffer)
                .await
                .map_err(|e| format!("read from {addr}: {e}"))?;
            if n == 0 {
                return Err(format!("{addr} closed the connection"));
            }
            reply.extend_from_slice(&buffer[..n]);
            let Some(end) = reply.windows(2).position(|w| w == b"\r\n") else {
                continue;
            };
            let line = String::from_utf8_lossy(&reply[..end]).into_owned();
            match line.as_bytes().first() {
                Some(b'-') => return Err(format!("{addr}: {line}")),
                Some(b'$') => {
                    let len: usize = line[1..].parse().map_err(|_| format!("{addr}: {line}"))?;
                    if reply.len() >= end + 2 + len + 2 {
                        return Ok(
                            String::from_utf8_lossy(&reply[end + 2..end + 2 + len]).into_owned()
                        );
                    }
                }
                _ => return Ok(line),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .unwrap_or_else(|_| Err(format!("{addr} did not answer within 5 s")))
}

/// One `incumbent run` process, its stderr read by a thread that can be told to stall.
struct Candidate {
    child: Child,
    stalled: Arc<AtomicBool>,
    /// A write end of its stderr pipe, to fill it.
    stderr: std::io::PipeWriter,
}

impl Candidate {
    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits i32")
    }
}

/// A worker, from the first line of its ledger.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub pid: i32,
    pub supervisor: i32,
    pub token: u64,
    pub path: PathBuf,
    /// It has ended (its ledger says `stop`) or died.
    pub gone: bool,
}

/// Reads the first line of the ledgers in `ledger` not seen yet, then marks the workers that
/// are `gone`.
pub(crate) fn scan_ledgers(ledger: &Path, seen: &mut Vec<Seen>, gone: impl Fn(&Seen) -> bool) {
    if let Ok(entries) = std::fs::read_dir(ledger) {
        for entry in entries.flatten() {
            let path = entry.path();
            if seen.iter().any(|s| s.path == path) {
                continue;
            }
            let first = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(worker) = check::parse_worker(&first) {
                seen.push(Seen {
                    pid: worker.pid,
                    supervisor: worker.supervisor,
                    token: worker.token,
                    path,
                    gone: false,
                });
            }
        }
    }
    for s in seen.iter_mut().filter(|s| !s.gone) {
        s.gone = gone(s);
    }
}

/// Everything a run starts; killed on drop.
struct World {
    backend: Backend,
    dir: PathBuf,
    ledger: PathBuf,
    fence: PathBuf,
    store: Store,
    proxies: Vec<Option<Proxy>>,
    candidates: Vec<Option<Candidate>>,
    generations: Vec<u32>,
    seen: Vec<Seen>,
    config: Config,
    faults_log: File,
    deaths_log: File,
}

impl World {
    async fn start(config: &Config, dir: &Path) -> World {
        let ledger = dir.join("ledger");
        let fence = dir.join("fence");
        std::fs::create_dir_all(&ledger).expect("create the ledger dir");
        std::fs::create_dir_all(&fence).expect("create the fence dir");
        let store = Store::start(config.backend).await;
        let proxies = (0..config.candidates)
            .map(|index| store.client_addr(index).map(Proxy::start))
            .collect();
        let open = |name: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(name))
                .expect("open a history file")
        };
        let mut world = World {
            backend: config.backend,
            dir: dir.to_path_buf(),
            ledger,
            fence,
            store,
            proxies,
            candidates: (0..config.candidates).map(|_| None).collect(),
            generations: vec![0; config.candidates],
            seen: Vec::new(),
            config: config.clone(),
            faults_log: open(check::FAULTS_FILE),
            deaths_log: open(check::DEATHS_FILE),
        };
        for index in 0..config.candidates {
            world.spawn(index);
        }
        world
    }

    fn url(&self, index: usize) -> String {
        match (&self.store, &self.proxies[index]) {
            (Store::File, _) => format!("file://{}", self.dir.join("locks").display()),
            (Store::Cluster(cluster), _) => {
                let members: Vec<String> =
                    (0..3).map(|i| cluster.client_addr(i).to_string()).collect();
                format!("etcd://{}", members.join(","))
            }
            (Store::Etcd(_), Some(proxy)) => format!("etcd://{}", proxy.addr()),
            (Store::Consul(_), Some(proxy)) => format!("consul://{}", proxy.addr()),
            (Store::Zookeeper(_), Some(proxy)) => format!("zk://{}", proxy.addr()),
            (Store::Redis(_), Some(proxy)) => format!("redis://{}", proxy.addr()),
            (Store::Memcached(_), Some(proxy)) => format!("memcached://{}", proxy.addr()),
            (Store::ZookeeperEnsemble(_), Some(proxy)) => format!("zk://{}", proxy.addr()),
            (Store::RedisFailover(_), Some(proxy)) => format!("redis://{}", proxy.addr()),
            (Store::Postgres(_) | Store::PostgresPooled(..), Some(proxy)) => {
                format!("postgres://{}/postgres", proxy.addr())
            }
            // The kubeconfig (KUBECONFIG, see `spawn`) points at the candidate's proxy.
            (Store::Kubernetes(_), Some(_)) => "k8s://default".to_owned(),
            (_, None) => unreachable!("store backends have a proxy per candidate"),
        }
    }

    fn spawn(&mut self, index: usize) {
        self.generations[index] += 1;
        let generation = self.generations[index];
        let (mut reader, writer) = std::io::pipe().expect("a pipe for stderr");
        let ttl_ms = self.backend.ttl().as_millis().to_string();
        let id = format!("c{index}-{generation}");
        let mut command;
        if self.config.library {
            command = Command::new(&self.config.this);
            command.args(["candidate", &self.url(index), &id, &ttl_ms]);
        } else {
            command = Command::new(&self.config.incumbent);
            command
                .args(["run", "--backend", &self.url(index), "--election", ELECTION])
                .args([
                    "--id",
                    &id,
                    "--ttl",
                    &format!("{ttl_ms}ms"),
                    "--grace",
                    "1s",
                ]);
            if self.backend == Backend::Consul {
                command.args(["--lock-delay", "0s"]);
            }
            command.arg("--").arg(&self.config.this).arg("worker");
        }
        command
            .arg(&self.ledger)
            .arg(&self.fence)
            .env_remove("RUST_LOG")
            .env_remove("INCUMBENT_BACKEND")
            .env_remove(super::worker::PLANT)
            // The harness's PostgreSQL trusts user `postgres` on loopback.
            .env("PGUSER", crate::support::postgres::USER)
            // Behind a transaction pooler, LISTEN hears nothing: followers poll.
            .env(
                "INCUMBENT_PG_LISTEN",
                if self.backend == Backend::PostgresPooled {
                    "off"
                } else {
                    "on"
                },
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(writer.try_clone().expect("dup the stderr pipe"));
        if let Some(plant) = &self.config.plant {
            command.env(super::worker::PLANT, plant);
        }
        if let (Store::Kubernetes(server), Some(proxy)) = (&self.store, &self.proxies[index]) {
            command.env("KUBECONFIG", server.kubeconfig_via(proxy.addr()));
        }
        // SAFETY: the hook only calls prctl(2), which is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", command.get_program().display()));
        let stalled = Arc::new(AtomicBool::new(false));
        let log_path = self.dir.join(format!("candidate-{index}.log"));
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .expect("open a candidate log");
        let _ = writeln!(log, "--- c{index}-{generation} pid {}", child.id());
        let stall = stalled.clone();
        std::thread::spawn(move || {
            let mut buffer = vec![0; 16 * 1024];
            loop {
                while stall.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                match reader.read(&mut buffer) {
                    Ok(0) | Err(_) => return,
                    // The stall's filler is dots without a newline: not worth keeping.
                    Ok(n) if buffer[..n].iter().all(|&b| b == b'.') => {}
                    Ok(n) => {
                        let _ = log.write_all(&buffer[..n]);
                    }
                }
            }
        });
        self.candidates[index] = Some(Candidate {
            child,
            stalled,
            stderr: writer,
        });
    }

    /// Reads the first line of new ledgers and marks dead workers.
    fn scan(&mut self) {
        scan_ledgers(&self.ledger, &mut self.seen, |s| {
            !alive(s.pid) || ended(&s.path)
        });
    }

    fn candidate_by_pid(&self, pid: i32) -> Option<usize> {
        self.candidates
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.pid() == pid))
    }

    /// The one running leader, if exactly one worker lives, is not frozen, beats, and its
    /// supervisor runs.
    fn running_leader(&mut self) -> Option<Seen> {
        self.scan();
        let alive: Vec<&Seen> = self.seen.iter().filter(|s| !s.gone).collect();
        let [leader] = alive[..] else {
            return None;
        };
        let leader = leader.clone();
        let index = self.candidate_by_pid(leader.supervisor)?;
        let supervisor = self.candidates[index].as_ref()?.pid();
        if proc_state(leader.pid) == Some('T') || proc_state(supervisor) == Some('T') {
            return None;
        }
        let fresh = last_beat_ns(&leader.path)
            .is_some_and(|at| mono_ns().saturating_sub(at) < FRESH_BEAT.as_nanos() as u64);
        fresh.then_some(leader)
    }

    /// Waits until one leader has run, alone, for [`STABLE`]; when that began within
    /// `limit`, the leader and the instant it began.
    fn record_death(&mut self, pid: i32, at_ns: u64) {
        let line = serde_json::to_string(&Death { pid, at_ns }).expect("serialize");
        let _ = writeln!(self.deaths_log, "{line}");
    }

    /// SIGKILLs candidate `index` and reaps it.
    fn kill9(&mut self, index: usize) {
        if let Some(mut candidate) = self.candidates[index].take() {
            let pid = candidate.pid();
            let at = mono_ns();
            signal(pid, libc::SIGKILL);
            let _ = candidate.child.wait();
            self.record_death(pid, at);
        }
    }

    /// SIGTERMs candidate `index` and waits for it to exit; SIGKILLs it if it does not.
    async fn terminate(&mut self, index: usize, errors: &mut Vec<String>) {
        let Some(candidate) = self.candidates[index].as_mut() else {
            return;
        };
        let pid = candidate.pid();
        signal(pid, libc::SIGCONT);
        signal(pid, libc::SIGTERM);
        let deadline = Instant::now() + EXIT_LIMIT;
        loop {
            if let Ok(Some(_)) = candidate.child.try_wait() {
                self.candidates[index] = None;
                self.record_death(pid, mono_ns());
                return;
            }
            if Instant::now() >= deadline {
                errors.push(format!(
                    "candidate {index} (pid {pid}) did not exit within {EXIT_LIMIT:?} of SIGTERM"
                ));
                self.kill9(index);
                return;
            }
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// Injects `fault` on candidate `index`, the leader; returns when it began, when it was
    /// lifted, and the bound from its beginning to one leader again.
    async fn inject_fault(
        &mut self,
        fault: Fault,
        index: usize,
        leader: &Seen,
        rng: &mut fastrand::Rng,
        errors: &mut Vec<String>,
    ) -> (u64, u64, Duration) {
        let ttl = self.backend.ttl();
        // Longer than the ttl: 1.5 to 2.5 ttl.
        let hold = ttl * 3 / 2 + Duration::from_millis(rng.u64(..ttl.as_millis() as u64));
        let supervisor = leader.supervisor;
        // Before the fault starts: whether the member to cut off leads the ensemble; that the
        // Redis replica is in sync (a fresh one was started after the last failover).
        let mut details = serde_json::Map::new();
        match (fault, &self.store) {
            (Fault::PartitionMember, Store::ZookeeperEnsemble(ensemble)) => {
                let member = ensemble_member(index);
                let zk_leader = ensemble.leader().await;
                details.insert("member".into(), member.into());
                details.insert("zk_leader".into(), (zk_leader == Some(member)).into());
            }
            (Fault::PromoteReplica, Store::RedisFailover(pair)) => {
                if let Err(e) = pair.synced().await {
                    errors.push(format!(
                        "before failover {}: the replica is {e}",
                        pair.promotions
                    ));
                }
            }
            _ => {}
        }
        let inject = mono_ns();
        // When the fault ended, where that is not when this match ends.
        let mut healed = None;
        match fault {
            Fault::Kill9 => {
                self.kill9(index);
                self.spawn(index);
            }
            Fault::Sigterm => {
                self.terminate(index, errors).await;
                self.spawn(index);
            }
            Fault::FreezeGroup => {
                // In library mode the worker is a task of the supervisor's process.
                let separate = leader.pid != supervisor;
                signal(supervisor, libc::SIGSTOP);
                if separate {
                    signal(-leader.pid, libc::SIGSTOP);
                }
                sleep(hold).await;
                if separate {
                    signal(-leader.pid, libc::SIGCONT);
                }
                signal(supervisor, libc::SIGCONT);
            }
            Fault::FreezeSupervisor => {
                signal(supervisor, libc::SIGSTOP);
                sleep(hold).await;
                signal(supervisor, libc::SIGCONT);
            }
            Fault::StorePause => {
                let store = self.store.paused_process().expect("a store process");
                store.pause();
                sleep(hold).await;
                store.resume();
            }
            Fault::StoreRestart => {
                let down = Duration::from_millis(rng.u64(..ttl.as_millis() as u64 / 2));
                let store = self.store.process().expect("a store process");
                store.kill9();
                sleep(down).await;
                store.restart().await;
            }
            Fault::Blackhole => {
                let proxy = self.proxies[index].as_ref().expect("a proxy");
                proxy.blackhole(true);
                sleep(hold).await;
                proxy.blackhole(false);
            }
            Fault::MemberLoss => {
                let Store::Cluster(cluster) = &mut self.store else {
                    unreachable!("member loss is for the cluster only");
                };
                let member = raft_leader(cluster).await.unwrap_or_else(|| rng.usize(..3));
                cluster.member(member).kill9();
                sleep(hold).await;
                cluster.member(member).restart().await;
            }
            Fault::Latency => {
                let ms = ttl.as_millis() as u64;
                let delay = Duration::from_millis(ms / 20 + rng.u64(..ms * 3 / 20));
                let proxy = self.proxies[index].as_ref().expect("a proxy");
                proxy.set_latency(delay);
                sleep(ttl).await;
                proxy.set_latency(Duration::ZERO);
            }
            Fault::StderrStall => {
                let candidate = self.candidates[index].as_ref().expect("the leader");
                candidate.stalled.store(true, Ordering::SeqCst);
                fill(&candidate.stderr);
                signal(supervisor, libc::SIGUSR1);
                sleep(Duration::from_millis(500 + rng.u64(..1000))).await;
                candidate.stalled.store(false, Ordering::SeqCst);
            }
            Fault::PartitionMember => {
                let Store::ZookeeperEnsemble(ensemble) = &self.store else {
                    unreachable!("partition-member is for the ZooKeeper ensemble only");
                };
                let member = ensemble_member(index);
                ensemble.isolate(member, true);
                sleep(hold).await;
                ensemble.isolate(member, false);
            }
            Fault::PromoteReplica => {
                let Store::RedisFailover(pair) = &mut self.store else {
                    unreachable!("promote-replica is for redis-failover only");
                };
                // Half of the failovers lose the last 0 to 1.5 ttl of writes.
                let lag = if rng.bool() {
                    Duration::from_millis(rng.u64(..ttl.as_millis() as u64 * 3 / 2))
                } else {
                    Duration::ZERO
                };
                details.insert("lag_ms".into(), (lag.as_millis() as u64).into());
                healed = Some(pair.fail_over(lag, errors).await);
            }
            Fault::SwitchoverDuringFault => {
                let others: Vec<usize> = (0..self.candidates.len())
                    .filter(|&t| t != index && self.candidates[t].is_some())
                    .collect();
                let proxy = self.proxies[index].as_ref().expect("a proxy");
                let blackhole = rng.bool();
                match blackhole {
                    true => proxy.blackhole(true),
                    false => {
                        let ms = ttl.as_millis() as u64;
                        proxy.set_latency(Duration::from_millis(ms / 20 + rng.u64(..ms * 3 / 20)));
                    }
                }
                details.insert("blackhole".into(), blackhole.into());
                let switchover = match others.as_slice() {
                    [] => None,
                    others => {
                        let target = others[rng.usize(..others.len())];
                        let to = format!("c{target}-{}", self.generations[target]);
                        details.insert("to".into(), to.clone().into());
                        let limit = hold + ttl * 4;
                        Command::new(&self.config.incumbent)
                            .args(["switchover", "--backend", &self.url(target)])
                            .args(["--election", ELECTION, "--to", &to])
                            .args(["--timeout", &format!("{}ms", limit.as_millis())])
                            .env_remove("RUST_LOG")
                            .env_remove("INCUMBENT_BACKEND")
                            .env("PGUSER", crate::support::postgres::USER)
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .spawn()
                            .ok()
                            .map(|child| (child, Instant::now() + limit + ttl))
                    }
                };
                sleep(hold / 2 + Duration::from_millis(rng.u64(..hold.as_millis() as u64 / 2)))
                    .await;
                let proxy = self.proxies[index].as_ref().expect("a proxy");
                proxy.blackhole(false);
                proxy.set_latency(Duration::ZERO);
                healed = Some(mono_ns());
                if let Some((mut child, deadline)) = switchover {
                    let code = loop {
                        match child.try_wait() {
                            Ok(Some(status)) => break status.code(),
                            _ if Instant::now() >= deadline => {
                                let _ = child.kill();
                                let _ = child.wait();
                                errors.push(format!(
                                    "incumbent switchover did not exit within {:?}",
                                    hold + ttl * 5
                                ));
                                break None;
                            }
                            _ => sleep(Duration::from_millis(20)).await,
                        }
                    };
                    details.insert("exit_code".into(), code.into());
                }
            }
            Fault::AbortTask
            | Fault::DropRuntime
            | Fault::Shutdown
            | Fault::FreezeRuntime
            | Fault::Unreachable
            | Fault::Failing
            | Fault::IgnoreCancel => {
                unreachable!("{} is an in-process fault", fault.name())
            }
        }
        let heal = healed.unwrap_or_else(mono_ns);
        let held = Duration::from_nanos(heal - inject);
        let bound = match fault {
            Fault::Sigterm | Fault::StderrStall => HANDOFF_BOUND + held,
            // A hand-over keeps the next term for its target for a window (the ttl), and a
            // target cut off meanwhile lets it lapse into an open election.
            Fault::SwitchoverDuringFault => held + ttl + self.backend.failover_bound(),
            // The leader's candidate loses its session, as after a kill, once the two other
            // members expire it: at once if one of them leads the ensemble; else once they
            // noticed their leader is gone (syncLimit ticks) and elected another (which gives
            // every session a full timeout again). That election may come only after the
            // partition heals: ZooKeeper's leader election backs its notifications off while
            // a peer is unreachable, and was seen not to finish during a 4.8 s partition of a
            // freshly started ensemble (RELIABILITY.md). A liveness bound of the store's own
            // recovery; the safety checks are unchanged.
            Fault::PartitionMember => {
                let detection = Duration::from_millis(u64::from(ZK_SYNC_LIMIT * TICK_MS));
                held.max(detection) + ZK_ELECTION + self.backend.failover_bound()
            }
            _ => held + self.backend.failover_bound(),
        };
        if !details.is_empty() {
            details.insert("kind".into(), fault.name().into());
            details.insert("inject_ns".into(), inject.into());
            let line = serde_json::Value::Object(details).to_string();
            let _ = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(DETAILS_FILE))
                .and_then(|mut file| writeln!(file, "{line}"));
        }
        (inject, heal, bound)
    }

    /// Stops every candidate with SIGTERM, records workers that outlive them all.
    async fn shut_down(&mut self, errors: &mut Vec<String>) {
        for index in 0..self.candidates.len() {
            self.terminate(index, errors).await;
        }
        // A worker killed with its supervisor may take a moment to be reaped.
        sleep(Duration::from_millis(check::ORPHAN_GRACE_MS)).await;
        self.scan();
        let leftover: Vec<String> = self
            .seen
            .iter()
            .filter(|s| !s.gone)
            .map(|s| s.pid.to_string())
            .collect();
        let _ = std::fs::write(self.dir.join(check::LEFTOVER_FILE), leftover.join("\n"));
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for index in 0..self.candidates.len() {
            self.kill9(index);
        }
        self.scan();
        for seen in self.seen.iter().filter(|s| !s.gone) {
            // Its process group: the worker, frozen or not.
            signal(-seen.pid, libc::SIGKILL);
        }
        if let Some(store) = self.store.process()
            && store.pid().is_some()
        {
            store.resume();
        }
    }
}

/// Fills the pipe behind `writer` from a thread: the write completes once the pipe is read
/// again (or fails when it is closed).
fn fill(writer: &std::io::PipeWriter) {
    let Ok(mut writer) = writer.try_clone() else {
        return;
    };
    // SAFETY: fcntl on a descriptor we own.
    let capacity = unsafe { libc::fcntl(writer.as_raw_fd(), libc::F_GETPIPE_SZ) };
    let capacity = usize::try_from(capacity).unwrap_or(65_536);
    std::thread::spawn(move || {
        let _ = writer.write_all(&vec![b'.'; capacity]);
    });
}

/// Sends `signal` to `pid` (a process group when negative). Only ever our own children and
/// their workers.
fn signal(pid: i32, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid, signal) };
}

/// A process's state letter from `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`…), if it exists.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: i32) -> bool {
    !matches!(proc_state(pid), None | Some('Z' | 'X'))
}

/// The last bytes of a ledger.
fn tail(path: &Path) -> Option<String> {
    let mut file = File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(256))).ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    Some(String::from_utf8_lossy(&tail).into_owned())
}

/// Whether a ledger's term has ended (its `stop` line is written).
pub fn ended(path: &Path) -> bool {
    tail(path).is_some_and(|t| t.contains("\nstop ") || t.starts_with("stop "))
}

/// The time of the last complete `beat` line of a ledger.
pub fn last_beat_ns(path: &Path) -> Option<u64> {
    tail(path)?
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| l.strip_prefix("beat "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .next_back()
}

/// The index of the cluster's raft leader, from each member's `etcd_server_is_leader` metric.
async fn raft_leader(cluster: &EtcdCluster) -> Option<usize> {
    for index in 0..3 {
        let addr = cluster.client_addr(index);
        if let Ok(response) = crate::support::http::get(addr, "/metrics").await
            && response
                .body
                .lines()
                .any(|l| l.trim() == "etcd_server_is_leader 1")
        {
            return Some(index);
        }
    }
    None
}

impl Faulty for World {
    const FIRST_LEADER: Duration = FIRST_LEADER;

    fn running_leader(&mut self) -> Option<Seen> {
        World::running_leader(self)
    }

    fn locate(&self, leader: &Seen) -> Result<usize, String> {
        self.candidate_by_pid(leader.supervisor)
            .ok_or_else(|| format!("the leader's supervisor {} is unknown", leader.supervisor))
    }

    async fn inject(
        &mut self,
        fault: Fault,
        index: usize,
        leader: &Seen,
        rng: &mut fastrand::Rng,
        errors: &mut Vec<String>,
    ) -> (u64, u64, Duration) {
        self.inject_fault(fault, index, leader, rng, errors).await
    }

    fn record(&self, fault: Fault, leader: &Seen) -> FaultRecord {
        /// Beyond the renewal interval, what an overlap after a store lost its data may last:
        /// the renewal's round trip and the supervisor's kill.
        const LOST_DATA_OVERLAP_MARGIN_MS: u64 = 250;
        FaultRecord {
            freezes_supervisor: matches!(fault, Fault::FreezeGroup | Fault::FreezeSupervisor),
            // A failover to an asynchronous replica may lose the last writes, whether or not
            // the replica was made to lag.
            store_lost_data: (fault == Fault::StoreRestart && self.backend.restart_loses_data())
                || fault == Fault::PromoteReplica,
            // The candidates renew every ttl / 3; the answer and the kill take a moment more.
            lost_data_overlap_ms: u64::try_from((self.backend.ttl() / 3).as_millis())
                .unwrap_or(u64::MAX)
                + LOST_DATA_OVERLAP_MARGIN_MS,
            ..FaultRecord::new(fault, leader.supervisor, leader.pid, leader.token)
        }
    }

    fn faults_log(&mut self) -> &mut File {
        &mut self.faults_log
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn unexpected_exits(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        for index in 0..self.candidates.len() {
            let Some(candidate) = self.candidates[index].as_mut() else {
                continue;
            };
            let Ok(Some(status)) = candidate.child.try_wait() else {
                continue;
            };
            let pid = candidate.pid();
            self.candidates[index] = None;
            self.record_death(pid, mono_ns());
            let log = std::fs::read_to_string(self.dir.join(format!("candidate-{index}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
            errors.push(format!(
                "candidate {index} (pid {pid}) exited by itself ({status}); its log ends: {tail}"
            ));
            self.spawn(index);
        }
        errors
    }
}

/// What the fault loop needs of a world, whatever runs its candidates: processes (this
/// module's `World`) or runtimes of this process (`inproc`). The loop, [`fault_loop`], and
/// the wait for one leader, [`await_leader`], are written once, here.
pub(crate) trait Faulty {
    /// How long the first leader may take.
    const FIRST_LEADER: Duration;
    /// The one running leader, if there is exactly one.
    fn running_leader(&mut self) -> Option<Seen>;
    /// Housekeeping between two looks for the leader.
    fn between_looks(&mut self) {}
    /// The index of the leader's candidate, or why it is unknown.
    fn locate(&self, leader: &Seen) -> Result<usize, String>;
    /// Injects `fault` on candidate `index`, the leader; returns when it began, when it was
    /// lifted, and the bound from its beginning to one leader again.
    async fn inject(
        &mut self,
        fault: Fault,
        index: usize,
        leader: &Seen,
        rng: &mut fastrand::Rng,
        errors: &mut Vec<String>,
    ) -> (u64, u64, Duration);
    /// The record of `fault` on `leader`, its times not yet set.
    fn record(&self, fault: Fault, leader: &Seen) -> FaultRecord;
    /// Where fault records go, one JSON line each.
    fn faults_log(&mut self) -> &mut File;
    /// The history's directory, for messages.
    fn dir(&self) -> &Path;
    /// Candidates that ended by themselves (not by a fault): one error each, and each is
    /// started again. A run in which candidates quietly vanish tests fewer than it says.
    fn unexpected_exits(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// The one running leader once it has run for [`STABLE`], and when it was first seen; `None`
/// if none settles within `limit`.
pub(crate) async fn await_leader<W: Faulty>(world: &mut W, limit: Duration) -> Option<(Seen, u64)> {
    let deadline = Instant::now() + limit;
    let mut current: Option<(Seen, u64, Instant)> = None;
    loop {
        match (world.running_leader(), &current) {
            (Some(leader), Some((seen, _, _))) if leader.pid == seen.pid => {}
            (Some(leader), _) => current = Some((leader, mono_ns(), Instant::now())),
            (None, _) => current = None,
        }
        if let Some((leader, at, since)) = &current {
            if *since > deadline {
                return None;
            }
            if since.elapsed() >= STABLE {
                return Some((leader.clone(), *at));
            }
        } else if Instant::now() >= deadline {
            return None;
        }
        world.between_looks();
        sleep(Duration::from_millis(10)).await;
    }
}

/// Runs the faults (drawn from `applicable`, narrowed to `config.kinds`); returns how many
/// were injected.
pub(crate) async fn fault_loop<W: Faulty>(
    world: &mut W,
    config: &Config,
    applicable: Vec<Fault>,
    errors: &mut Vec<String>,
) -> usize {
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let kinds: Vec<Fault> = if config.kinds.is_empty() {
        applicable
    } else {
        config
            .kinds
            .iter()
            .copied()
            .filter(|k| applicable.contains(k))
            .collect()
    };
    let started = Instant::now();
    let first = await_leader(world, W::FIRST_LEADER).await;
    errors.extend(world.unexpected_exits());
    let Some((mut leader, _)) = first else {
        errors.push(format!(
            "no leader within {:?} of the start",
            W::FIRST_LEADER
        ));
        return 0;
    };
    let mut injected = 0;
    for n in 0..config.faults {
        if kinds.is_empty() || started.elapsed() >= config.max_time {
            break;
        }
        let fault = if config.in_turn {
            kinds[n % kinds.len()]
        } else {
            kinds[rng.usize(..kinds.len())]
        };
        let index = match world.locate(&leader) {
            Ok(index) => index,
            Err(why) => {
                errors.push(why);
                break;
            }
        };
        let (inject_ns, heal_ns, bound) =
            world.inject(fault, index, &leader, &mut rng, errors).await;
        injected += 1;
        let since = Duration::from_nanos(mono_ns().saturating_sub(inject_ns));
        let settled = await_leader(world, bound.saturating_sub(since)).await;
        // Late: wait on, to tell a late leader (a violation, e.g. on a loaded host) from
        // none at all (which ends the run).
        let late = match settled {
            Some(_) => None,
            None => await_leader(world, LATE_LIMIT).await,
        };
        let record = FaultRecord {
            inject_ns,
            heal_ns,
            settled_ns: settled.as_ref().map(|(_, at)| *at),
            late_settled_ns: Some(late.as_ref().map(|(_, at)| *at)),
            bound_ms: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
            ..world.record(fault, &leader)
        };
        let line = serde_json::to_string(&record).expect("serialize");
        let _ = writeln!(world.faults_log(), "{line}");
        errors.extend(world.unexpected_exits());
        match settled.or(late) {
            Some((next, _)) => leader = next,
            None => {
                errors.push(format!(
                    "fault {n} ({}): no single running leader within {bound:?} and {LATE_LIMIT:?} \
                     more; history in {}",
                    fault.name(),
                    world.dir().display()
                ));
                break;
            }
        }
        sleep(Duration::from_millis(200 + rng.u64(..300))).await;
    }
    injected
}
