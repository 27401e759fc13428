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
    #[allow(dead_code)] // used by the server fixtures, not by the embedded ones
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
