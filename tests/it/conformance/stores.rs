//! One fixture per backend: how to start the store, connect a candidate, and inject faults.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use incumbent::backend::Backend;
use incumbent::memory::{MemoryBackend, Reachability};

/// Cuts one candidate's connection off from the store, and heals it.
pub struct Partition {
    switch: Box<dyn Fn(bool) + Send + Sync>,
    _keep: Box<dyn Any + Send + Sync>,
}

impl Partition {
    pub fn new(
        switch: impl Fn(bool) + Send + Sync + 'static,
        keep: impl Any + Send + Sync,
    ) -> Self {
        Partition {
            switch: Box::new(switch),
            _keep: Box::new(keep),
        }
    }

    /// Black-holes the candidate's traffic.
    pub fn cut(&self) {
        (self.switch)(true);
    }

    /// Lets it through again.
    pub fn heal(&self) {
        (self.switch)(false);
    }
}

/// A store under test. Clones are cheap and share the store.
pub trait Store: Clone + Send + Sync + 'static {
    type Backend: Backend;
    /// Keeps the store running (a server process) until dropped.
    type Server: Send;

    async fn start() -> (Self, Self::Server);

    /// A new connection to the store, for one candidate.
    async fn connect(&self) -> Self::Backend;

    /// The session ttl the tests use.
    fn ttl(&self) -> Duration;

    /// Whether a campaign that released the lock is held back from it for a while (the
    /// courtesy of the stores that do not queue their candidates: the polled ones and
    /// Consul), so that followers in other processes get it first. etcd and ZooKeeper queue
    /// a resigning candidate behind the others; the memory and file backends wake their
    /// waiting followers at the release (in this process, or in the kernel), well before the
    /// releaser's back-off ends.
    const HOLDS_BACK_THE_RELEASER: bool = false;

    /// A connection that the test can cut off from the store.
    async fn connect_partitionable(&self) -> (Self::Backend, Partition) {
        unimplemented!("this store has no network to partition")
    }

    /// Invalidates every session of `backend`'s connection, as an operator or the store would.
    async fn expire_sessions(&self, _backend: &Self::Backend) {
        unimplemented!("this store has no sessions to expire")
    }

    /// A connection whose requests the test can hold back (the partition's `cut`), while
    /// what the store sends (answers already on their way, watch events) still arrives.
    #[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
    async fn connect_deaf_store(&self) -> (Self::Backend, Partition) {
        unimplemented!("this store has no network to cut")
    }

    /// Takes the lock away from `backend`'s leader behind its back, in a way that the leader
    /// can only tell apart from others by asking the store; returns the reason its `Demoted`
    /// event must give once the store answers.
    #[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
    async fn take_the_lock_away(&self, _backend: &Self::Backend) -> incumbent::DemotionReason {
        unimplemented!("this store cannot take a lock away")
    }

    /// Restarts the store, keeping its data.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    async fn restart(_server: &mut Self::Server) {
        unimplemented!("this store cannot be restarted")
    }
}

/// A TCP proxy to `upstream` on a fresh loopback port whose client-to-store direction can be
/// held back (`cut`: bytes withheld, not lost), while the store-to-client direction always
/// flows: the store's events reach the client, its requests do not reach the store.
#[cfg(any(feature = "etcd", feature = "consul", feature = "zookeeper"))]
async fn deaf_proxy(upstream: std::net::SocketAddr) -> (std::net::SocketAddr, Partition) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind the proxy");
    let addr = listener.local_addr().expect("the proxy's address");
    let (held, _) = tokio::sync::watch::channel(false);
    let held = Arc::new(held);
    let stop = tokio_util::sync::CancellationToken::new();
    let (accepting, stopping) = (held.clone(), stop.clone());
    tokio::spawn(stopping.run_until_cancelled_owned(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                continue;
            };
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let mut open = accepting.subscribe();
            tokio::spawn(async move {
                let mut buffer = vec![0; 16 * 1024];
                loop {
                    let read = match client_read.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => read,
                    };
                    if open.wait_for(|held| !held).await.is_err()
                        || server_write.write_all(&buffer[..read]).await.is_err()
                    {
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
        }
    }));
    let partition = Partition::new(
        move |cut| {
            held.send_replace(cut);
        },
        stop.drop_guard(),
    );
    (addr, partition)
}

/// The in-process memory backend.
#[derive(Clone)]
pub struct Memory(MemoryBackend);

impl Store for Memory {
    type Backend = MemoryBackend;
    type Server = ();

    async fn start() -> (Self, ()) {
        (Memory(MemoryBackend::new()), ())
    }

    async fn connect(&self) -> MemoryBackend {
        self.0.client()
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn connect_partitionable(&self) -> (MemoryBackend, Partition) {
        let client = self.0.client();
        let switch = client.clone();
        let partition = Partition::new(
            move |cut| {
                switch.set_reachability(match cut {
                    true => Reachability::Hanging,
                    false => Reachability::Reachable,
                })
            },
            (),
        );
        (client, partition)
    }

    async fn expire_sessions(&self, backend: &MemoryBackend) {
        backend.expire_sessions();
    }
}

/// The file backend, in a temp dir.
#[derive(Clone)]
pub struct File {
    dir: Arc<tempfile::TempDir>,
}

impl Store for File {
    type Backend = incumbent::file::FileBackend;
    type Server = ();

    async fn start() -> (Self, ()) {
        let dir = tempfile::tempdir().expect("a temp dir");
        (File { dir: Arc::new(dir) }, ())
    }

    async fn connect(&self) -> incumbent::file::FileBackend {
        incumbent::file::FileBackend::in_dir(self.dir.path())
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// Consul: a `consul agent -dev` per test on loopback, with Consul's smallest ttl (10 s).
///
/// The backends use lock-delay 0: a crashed leader's session is invalidated up to 2 × ttl
/// after its last renewal, and Consul's default 15 s lock-delay on top would exceed what the
/// failover body allows. (tests/it/consul.rs covers lock-delays.)
#[cfg(feature = "consul")]
#[derive(Clone)]
pub struct Consul {
    http: std::net::SocketAddr,
}

#[cfg(feature = "consul")]
impl Consul {
    fn backend(address: String) -> incumbent::consul::ConsulBackend {
        incumbent::consul::ConsulBackend::builder(incumbent::consul::ConsulConfig::new(address))
            .lock_delay(Duration::ZERO)
            .build()
            .expect("valid consul settings")
    }
}

#[cfg(feature = "consul")]
impl Store for Consul {
    type Backend = incumbent::consul::ConsulBackend;
    const HOLDS_BACK_THE_RELEASER: bool = true;
    type Server = crate::support::ConsulDev;

    async fn start() -> (Self, crate::support::ConsulDev) {
        let server = crate::support::ConsulDev::start().await;
        (
            Consul {
                http: server.http_addr(),
            },
            server,
        )
    }

    async fn connect(&self) -> incumbent::consul::ConsulBackend {
        Self::backend(format!("http://{}", self.http))
    }

    fn ttl(&self) -> Duration {
        incumbent::consul::MIN_TTL
    }

    /// A backend that reaches the agent through a proxy, which the partition black-holes.
    async fn connect_partitionable(&self) -> (incumbent::consul::ConsulBackend, Partition) {
        let proxy = Arc::new(crate::support::Proxy::start(self.http));
        let backend = Self::backend(format!("http://{}", proxy.addr()));
        let switch = proxy.clone();
        (
            backend,
            Partition::new(move |cut| switch.blackhole(cut), proxy),
        )
    }

    /// Destroys every session the backend keeps alive, as an operator would.
    async fn expire_sessions(&self, backend: &incumbent::consul::ConsulBackend) {
        let admin = incumbent::consul::client::ConsulClient::new(
            incumbent::consul::ConsulConfig::new(format!("http://{}", self.http)),
        )
        .expect("admin client");
        for id in backend.session_ids() {
            admin.session_destroy(&id).await.expect("destroy a session");
        }
    }

    async fn connect_deaf_store(&self) -> (incumbent::consul::ConsulBackend, Partition) {
        let (addr, partition) = deaf_proxy(self.http).await;
        (Self::backend(format!("http://{addr}")), partition)
    }

    /// Releases the leader's lock with its own session id, as an operator can: the key loses
    /// its session as when the session is invalidated, but the session lives on.
    async fn take_the_lock_away(
        &self,
        backend: &incumbent::consul::ConsulBackend,
    ) -> incumbent::DemotionReason {
        let admin = incumbent::consul::client::ConsulClient::new(
            incumbent::consul::ConsulConfig::new(format!("http://{}", self.http)),
        )
        .expect("admin client");
        let [session] = backend.session_ids().try_into().expect("one session");
        let options = incumbent::consul::client::PutOptions {
            release: Some(session),
            ..Default::default()
        };
        let key = backend.key(super::bodies::ELECTION);
        let released = admin.kv_put(&key, b"released by an operator", &options);
        assert!(released.await.expect("release"), "the lock was released");
        incumbent::DemotionReason::LockTaken
    }

    /// Restarts the agent on the same ports. A dev agent keeps no data: it comes back empty,
    /// without sessions or keys.
    async fn restart(server: &mut crate::support::ConsulDev) {
        server.process().restart().await;
    }
}

/// etcd: a single real server per test on loopback, with etcd's smallest ttl (2 s).
#[cfg(feature = "etcd")]
#[derive(Clone)]
pub struct Etcd {
    client: std::net::SocketAddr,
}

#[cfg(feature = "etcd")]
impl Store for Etcd {
    type Backend = incumbent::etcd::EtcdBackend;
    type Server = crate::support::EtcdServer;

    async fn start() -> (Self, crate::support::EtcdServer) {
        let server = crate::support::EtcdServer::single().await;
        (
            Etcd {
                client: server.client_addr(),
            },
            server,
        )
    }

    async fn connect(&self) -> incumbent::etcd::EtcdBackend {
        incumbent::etcd::EtcdBackend::connect([format!("http://{}", self.client)])
            .await
            .expect("connect to etcd")
    }

    fn ttl(&self) -> Duration {
        incumbent::etcd::MIN_TTL
    }

    /// A backend that reaches etcd through a proxy, which the partition black-holes.
    async fn connect_partitionable(&self) -> (incumbent::etcd::EtcdBackend, Partition) {
        let proxy = Arc::new(crate::support::Proxy::start(self.client));
        let backend = incumbent::etcd::EtcdBackend::connect([format!("http://{}", proxy.addr())])
            .await
            .expect("connect to etcd through the proxy");
        let switch = proxy.clone();
        (
            backend,
            Partition::new(move |cut| switch.blackhole(cut), proxy),
        )
    }

    /// Revokes every lease the backend keeps alive, as an operator would.
    async fn expire_sessions(&self, backend: &incumbent::etcd::EtcdBackend) {
        let mut admin = etcd_client::Client::connect([format!("http://{}", self.client)], None)
            .await
            .expect("admin client");
        for id in backend.lease_ids() {
            admin.lease_revoke(id).await.expect("revoke a lease");
        }
    }

    async fn connect_deaf_store(&self) -> (incumbent::etcd::EtcdBackend, Partition) {
        let (addr, partition) = deaf_proxy(self.client).await;
        let backend = incumbent::etcd::EtcdBackend::connect([format!("http://{addr}")])
            .await
            .expect("connect to etcd through the proxy");
        (backend, partition)
    }

    /// Revokes the leader's lease: its key is deleted, as by an operator's delete, but the
    /// lease is gone.
    async fn take_the_lock_away(
        &self,
        backend: &incumbent::etcd::EtcdBackend,
    ) -> incumbent::DemotionReason {
        self.expire_sessions(backend).await;
        incumbent::DemotionReason::SessionExpired
    }

    /// Restarts the server on the same ports and data directory: keys and leases survive.
    async fn restart(server: &mut crate::support::EtcdServer) {
        server.process().restart().await;
    }
}

/// ZooKeeper: a standalone server per test on loopback (tick 200 ms), with a 2 s session
/// timeout.
///
/// Every connection goes through a proxy of its own, so that `expire_sessions` can make the
/// server expire one connection's sessions the way it does in production: it hears nothing
/// from them for longer than their timeout.
#[cfg(feature = "zookeeper")]
#[derive(Clone)]
pub struct Zookeeper {
    client: std::net::SocketAddr,
    /// The proxy of each connection made by `connect`, by the backend's server address.
    proxies: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<crate::support::Proxy>>>>,
}

#[cfg(feature = "zookeeper")]
impl Zookeeper {
    async fn backend(address: std::net::SocketAddr) -> incumbent::zookeeper::ZookeeperBackend {
        incumbent::zookeeper::ZookeeperBackend::builder(address.to_string())
            .connect_timeout(Duration::from_secs(2))
            .request_timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect("connect to zookeeper")
    }
}

#[cfg(feature = "zookeeper")]
impl Store for Zookeeper {
    type Backend = incumbent::zookeeper::ZookeeperBackend;
    type Server = crate::support::ZookeeperServer;

    async fn start() -> (Self, crate::support::ZookeeperServer) {
        let server = crate::support::ZookeeperServer::single().await;
        (
            Zookeeper {
                client: server.client_addr(),
                proxies: Arc::default(),
            },
            server,
        )
    }

    async fn connect(&self) -> incumbent::zookeeper::ZookeeperBackend {
        let proxy = Arc::new(crate::support::Proxy::start(self.client));
        let backend = Self::backend(proxy.addr()).await;
        self.proxies
            .lock()
            .unwrap()
            .insert(backend.servers().to_owned(), proxy);
        backend
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// A backend that reaches the server through a proxy, which the partition black-holes.
    async fn connect_partitionable(&self) -> (incumbent::zookeeper::ZookeeperBackend, Partition) {
        let proxy = Arc::new(crate::support::Proxy::start(self.client));
        let backend = Self::backend(proxy.addr()).await;
        let switch = proxy.clone();
        (
            backend,
            Partition::new(move |cut| switch.blackhole(cut), proxy),
        )
    }

    /// Cuts the backend's connection off until the server has expired its sessions (the
    /// session timeout and two ticks), then lets it reconnect, to hear that they expired.
    async fn expire_sessions(&self, backend: &incumbent::zookeeper::ZookeeperBackend) {
        let proxy = self
            .proxies
            .lock()
            .unwrap()
            .get(backend.servers())
            .cloned()
            .expect("a backend made by connect");
        proxy.blackhole(true);
        tokio::time::sleep(self.ttl() + Duration::from_millis(600)).await;
        proxy.blackhole(false);
    }

    async fn connect_deaf_store(&self) -> (incumbent::zookeeper::ZookeeperBackend, Partition) {
        let (addr, partition) = deaf_proxy(self.client).await;
        (Self::backend(addr).await, partition)
    }

    /// Deletes the leader's node as an operator can: the session lives on, so the server
    /// answers the leader's question with "alive", and the reason is the delete.
    async fn take_the_lock_away(
        &self,
        backend: &incumbent::zookeeper::ZookeeperBackend,
    ) -> incumbent::DemotionReason {
        let admin = zookeeper_client::Client::connect(&self.client.to_string())
            .await
            .expect("admin client");
        let path = backend.election_path(super::bodies::ELECTION);
        let mut nodes = admin
            .list_children(&path)
            .await
            .expect("list the candidates");
        nodes.sort_by_key(|name| name.rsplit('-').next().unwrap_or_default().to_owned());
        let leader = nodes.first().expect("a leader's node");
        admin
            .delete(&format!("{path}/{leader}"), None)
            .await
            .expect("delete the leader's node");
        incumbent::DemotionReason::KeyDeleted
    }

    /// Restarts the server on the same port and data directory: nodes and sessions survive
    /// (sessions are in the transaction log), as in any ensemble.
    async fn restart(server: &mut crate::support::ZookeeperServer) {
        server.process().restart().await;
    }
}

/// Redis: a `redis-server` per test on loopback, without persistence. `Redis<true>` has
/// keyspace notifications on (followers wake on them); `Redis<false>` has them off, and its
/// followers poll every 100 ms.
#[cfg(feature = "redis")]
#[derive(Clone)]
pub struct Redis<const NOTIFICATIONS: bool> {
    addr: std::net::SocketAddr,
}

/// Redis whose followers wake on keyspace notifications.
#[cfg(feature = "redis")]
pub type RedisNotified = Redis<true>;
/// Redis whose followers poll.
#[cfg(feature = "redis")]
pub type RedisPolled = Redis<false>;

#[cfg(feature = "redis")]
impl<const NOTIFICATIONS: bool> Redis<NOTIFICATIONS> {
    async fn backend(addr: std::net::SocketAddr) -> incumbent::redis::RedisBackend {
        let backend = incumbent::redis::RedisBackend::builder(incumbent::redis::RedisConfig::new(
            addr.to_string(),
        ))
        .notifications(incumbent::redis::Notifications::IfEnabled)
        .poll_interval(Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to redis");
        assert_eq!(backend.notifications_active(), NOTIFICATIONS);
        backend
    }
}

#[cfg(feature = "redis")]
impl<const NOTIFICATIONS: bool> Store for Redis<NOTIFICATIONS> {
    type Backend = incumbent::redis::RedisBackend;
    const HOLDS_BACK_THE_RELEASER: bool = true;
    type Server = crate::support::RedisServer;

    async fn start() -> (Self, crate::support::RedisServer) {
        let server = match NOTIFICATIONS {
            true => crate::support::RedisServer::with_notifications().await,
            false => crate::support::RedisServer::start().await,
        };
        let addr = server.addr();
        (Redis { addr }, server)
    }

    async fn connect(&self) -> incumbent::redis::RedisBackend {
        Self::backend(self.addr).await
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// A backend that reaches Redis through a proxy, which the partition black-holes.
    async fn connect_partitionable(&self) -> (incumbent::redis::RedisBackend, Partition) {
        let proxy = Arc::new(crate::support::Proxy::start(self.addr));
        let backend = Self::backend(proxy.addr()).await;
        let switch = proxy.clone();
        (
            backend,
            Partition::new(move |cut| switch.blackhole(cut), proxy),
        )
    }

    /// Restarts the server on the same port. It keeps no data: it comes back empty.
    async fn restart(server: &mut crate::support::RedisServer) {
        server.process().restart().await;
    }
}

/// memcached: a server per test on loopback, polled every 100 ms.
#[cfg(feature = "memcached")]
#[derive(Clone)]
pub struct Memcached {
    addr: std::net::SocketAddr,
}

#[cfg(feature = "memcached")]
impl Memcached {
    async fn backend(addr: std::net::SocketAddr) -> incumbent::memcached::MemcachedBackend {
        incumbent::memcached::MemcachedBackend::builder(addr.to_string())
            .poll_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("connect to memcached")
    }
}

#[cfg(feature = "memcached")]
impl Store for Memcached {
    type Backend = incumbent::memcached::MemcachedBackend;
    const HOLDS_BACK_THE_RELEASER: bool = true;
    type Server = crate::support::MemcachedServer;

    async fn start() -> (Self, crate::support::MemcachedServer) {
        let server = crate::support::MemcachedServer::start().await;
        let addr = server.addr();
        (Memcached { addr }, server)
    }

    async fn connect(&self) -> incumbent::memcached::MemcachedBackend {
        Self::backend(self.addr).await
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// A backend that reaches memcached through a proxy, which the partition black-holes.
    async fn connect_partitionable(&self) -> (incumbent::memcached::MemcachedBackend, Partition) {
        let proxy = Arc::new(crate::support::Proxy::start(self.addr));
        let backend = Self::backend(proxy.addr()).await;
        let switch = proxy.clone();
        (
            backend,
            Partition::new(move |cut| switch.blackhole(cut), proxy),
        )
    }

    /// Restarts the server on the same port: it comes back empty.
    async fn restart(server: &mut crate::support::MemcachedServer) {
        server.process().restart().await;
    }
}

/// PostgreSQL: a server per test on loopback (`initdb` in a temp dir). `Postgres<true>`'s
/// followers `LISTEN`; `Postgres<false>`'s poll every 100 ms, as behind a transaction
/// pooler.
#[cfg(feature = "postgres")]
#[derive(Clone)]
pub struct Postgres<const LISTEN: bool> {
    addr: std::net::SocketAddr,
}

/// PostgreSQL whose followers wake on `NOTIFY`.
#[cfg(feature = "postgres")]
pub type PostgresListening = Postgres<true>;
/// PostgreSQL whose followers poll.
#[cfg(feature = "postgres")]
pub type PostgresPolled = Postgres<false>;

#[cfg(feature = "postgres")]
impl<const LISTEN: bool> Postgres<LISTEN> {
    async fn backend(addr: std::net::SocketAddr) -> incumbent::postgres::PostgresBackend {
        let backend = crate::support::postgres::backend(addr)
            .listen(LISTEN)
            .poll_interval(Duration::from_millis(100))
            .connect()
            .await
            .expect("connect to postgres");
        assert_eq!(backend.listening(), LISTEN);
        backend
    }
}

#[cfg(feature = "postgres")]
impl<const LISTEN: bool> Store for Postgres<LISTEN> {
    type Backend = incumbent::postgres::PostgresBackend;
    const HOLDS_BACK_THE_RELEASER: bool = true;
    type Server = crate::support::PostgresServer;

    async fn start() -> (Self, crate::support::PostgresServer) {
        let server = crate::support::PostgresServer::start().await;
        let addr = server.addr();
        (Postgres { addr }, server)
    }

    async fn connect(&self) -> incumbent::postgres::PostgresBackend {
        Self::backend(self.addr).await
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// A backend that reaches PostgreSQL through a proxy, which the partition black-holes.
    async fn connect_partitionable(&self) -> (incumbent::postgres::PostgresBackend, Partition) {
        let proxy = Arc::new(crate::support::Proxy::start(self.addr));
        let backend = Self::backend(proxy.addr()).await;
        let switch = proxy.clone();
        (
            backend,
            Partition::new(move |cut| switch.blackhole(cut), proxy),
        )
    }

    /// Restarts the server on the same port and data directory: the lease rows survive.
    async fn restart(server: &mut crate::support::PostgresServer) {
        server.process().restart().await;
    }
}

/// Kubernetes: a real `kube-apiserver` (and its etcd) per test on loopback; each candidate a
/// client of its own, woken by its backend's watch.
#[cfg(feature = "kubernetes")]
#[derive(Clone)]
pub struct Kubernetes {
    config: incumbent::kubernetes::kube::Config,
}

#[cfg(feature = "kubernetes")]
impl Kubernetes {
    async fn backend(
        config: incumbent::kubernetes::kube::Config,
    ) -> incumbent::kubernetes::KubernetesBackend {
        incumbent::kubernetes::KubernetesBackend::builder()
            .config(config)
            .connect()
            .await
            .expect("connect to the API server")
    }
}

#[cfg(feature = "kubernetes")]
impl Store for Kubernetes {
    type Backend = incumbent::kubernetes::KubernetesBackend;
    const HOLDS_BACK_THE_RELEASER: bool = true;
    type Server = crate::support::kube::KubeServer;

    async fn start() -> (Self, crate::support::kube::KubeServer) {
        let server = crate::support::kube::KubeServer::start().await;
        let config = server.config().await;
        (Kubernetes { config }, server)
    }

    async fn connect(&self) -> incumbent::kubernetes::KubernetesBackend {
        Self::backend(self.config.clone()).await
    }

    /// Three seconds, not two: eight API servers starting at once on two cores (the suite's
    /// threads) leave less headroom than the other stores' servers do.
    fn ttl(&self) -> Duration {
        Duration::from_secs(3)
    }

    /// A backend that reaches the API server through a proxy, which the partition
    /// black-holes (TLS passes through it untouched: the certificate names 127.0.0.1).
    async fn connect_partitionable(&self) -> (incumbent::kubernetes::KubernetesBackend, Partition) {
        let target = self
            .config
            .cluster_url
            .authority()
            .expect("an address")
            .as_str()
            .parse()
            .expect("host:port");
        let proxy = Arc::new(crate::support::Proxy::start(target));
        let mut config = self.config.clone();
        config.cluster_url = format!("https://{}", proxy.addr()).parse().expect("a URL");
        let backend = Self::backend(config).await;
        let switch = proxy.clone();
        (
            backend,
            Partition::new(move |cut| switch.blackhole(cut), proxy),
        )
    }

    /// Restarts the API server on the same port; etcd keeps the Leases.
    async fn restart(server: &mut crate::support::kube::KubeServer) {
        server.process().restart().await;
        server.wait_serving().await;
    }
}
