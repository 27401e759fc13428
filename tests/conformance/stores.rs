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

    /// A connection that the test can cut off from the store.
    async fn connect_partitionable(&self) -> (Self::Backend, Partition) {
        unimplemented!("this store has no network to partition")
    }

    /// Invalidates every session of `backend`'s connection, as an operator or the store would.
    async fn expire_sessions(&self, _backend: &Self::Backend) {
        unimplemented!("this store has no sessions to expire")
    }

    /// Restarts the store, keeping its data.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    async fn restart(_server: &mut Self::Server) {
        unimplemented!("this store cannot be restarted")
    }
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
/// failover body allows. (tests/consul.rs covers lock-delays.)
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

    /// Restarts the server on the same ports and data directory: keys and leases survive.
    async fn restart(server: &mut crate::support::EtcdServer) {
        server.process().restart().await;
    }
}
