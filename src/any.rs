//! [`AnyBackend`]: the store chosen at run time, from a URL in the service's configuration.
//!
//! Every API that takes a backend takes an `AnyBackend`, so a service need not be generic
//! over its store:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use incumbent::{AnyBackend, Election};
//!
//! // From the service's configuration: "memory:", "file:///run/app", "etcd://host:2379", …
//! let backend = AnyBackend::connect("memory:").await?;
//! let election = Election::builder(backend, "jobs/index").build()?;
//! # let _ = election;
//! # Ok(()) }
//! ```
//!
//! The URL forms, and where credentials come from (the environment, never the URL), are
//! those of [`BackendUrl`]. A store whose cargo feature is not compiled in is refused
//! with [`Error::InvalidConfig`] naming the feature.

use tokio::sync::watch;

use crate::backend::{
    Attempt, Backend, BackendInfo, Candidate, Contender, Leader, LockLoss, Observer, Session,
    SessionHealth, SessionOptions, ShutdownNotice,
};
use crate::url::{BackendUrl, WithBackend};
use crate::{Error, Result};

/// Defines the enums of every compiled-in store and their dispatch.
macro_rules! any_backend {
    ($( $(#[$cfg:meta])* $variant:ident($backend:ty), )*) => {
        /// Any of the stores compiled in, chosen at run time: made by
        /// [`AnyBackend::connect`] from a URL, or with `From` from a backend made by hand.
        /// Cheap to clone. [`url`](crate::url) lists the URL forms.
        #[derive(Clone, Debug)]
        #[non_exhaustive]
        pub enum AnyBackend {
            $(
                $(#[$cfg])*
                #[doc = concat!("A [`", stringify!($backend), "`].")]
                $variant($backend),
            )*
        }

        /// The session of an [`AnyBackend`].
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnySession {
            $(
                $(#[$cfg])*
                #[doc = concat!("A session of a [`", stringify!($backend), "`].")]
                $variant(<$backend as Backend>::Session),
            )*
        }

        /// The contender of an [`AnyBackend`]'s session.
        // As large as the largest store's contender: one per campaign, where boxing it would
        // cost every store an allocation and a pointer instead.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyContender {
            $(
                $(#[$cfg])*
                #[doc = concat!("A contender of a [`", stringify!($backend), "`].")]
                $variant(<<$backend as Backend>::Session as Session>::Contender),
            )*
        }

        /// The observer of an [`AnyBackend`].
        #[derive(Debug)]
        #[non_exhaustive]
        pub enum AnyObserver {
            $(
                $(#[$cfg])*
                #[doc = concat!("An observer of a [`", stringify!($backend), "`].")]
                $variant(<$backend as Backend>::Observer),
            )*
        }

        $(
            $(#[$cfg])*
            impl From<$backend> for AnyBackend {
                fn from(backend: $backend) -> AnyBackend {
                    AnyBackend::$variant(backend)
                }
            }
        )*

        impl AnyBackend {
            /// `backend` as an `AnyBackend`, if it is one of the stores compiled in.
            fn of<B: Backend>(backend: B) -> Result<AnyBackend> {
                let any: Box<dyn std::any::Any> = Box::new(backend);
                $(
                    $(#[$cfg])*
                    let any = match any.downcast::<$backend>() {
                        Ok(backend) => return Ok(AnyBackend::$variant(*backend)),
                        Err(other) => other,
                    };
                )*
                drop(any);
                Err(Error::InvalidConfig {
                    backend: "url",
                    reason: "the URL named a backend that AnyBackend does not know".into(),
                })
            }
        }

        impl Backend for AnyBackend {
            type Session = AnySession;
            type Observer = AnyObserver;

            fn info(&self) -> BackendInfo {
                match self {
                    $( $(#[$cfg])* AnyBackend::$variant(b) => b.info(), )*
                }
            }

            async fn open_session(&self, options: &SessionOptions) -> Result<AnySession> {
                match self {
                    $(
                        $(#[$cfg])*
                        AnyBackend::$variant(b) => {
                            b.open_session(options).await.map(AnySession::$variant)
                        }
                    )*
                }
            }

            async fn observe(&self, election: &str) -> Result<AnyObserver> {
                match self {
                    $(
                        $(#[$cfg])*
                        AnyBackend::$variant(b) => b.observe(election).await.map(AnyObserver::$variant),
                    )*
                }
            }

            async fn observe_for(&self, election: &str, session: &AnySession) -> Result<AnyObserver> {
                #[allow(unreachable_patterns, reason = "one arm per backend built, and one for a session of another")]
                match (self, session) {
                    $(
                        $(#[$cfg])*
                        (AnyBackend::$variant(b), AnySession::$variant(s)) => {
                            b.observe_for(election, s).await.map(AnyObserver::$variant)
                        }
                    )*
                    _ => self.observe(election).await,
                }
            }

            async fn participants(&self, election: &str) -> Result<Option<Vec<Leader>>> {
                match self {
                    $( $(#[$cfg])* AnyBackend::$variant(b) => b.participants(election).await, )*
                }
            }
        }

        impl Session for AnySession {
            type Contender = AnyContender;

            fn id(&self) -> String {
                match self {
                    $( $(#[$cfg])* AnySession::$variant(s) => s.id(), )*
                }
            }

            fn health(&self) -> watch::Receiver<SessionHealth> {
                match self {
                    $( $(#[$cfg])* AnySession::$variant(s) => s.health(), )*
                }
            }

            async fn contend(&self, election: &str, candidate: &Candidate) -> Result<AnyContender> {
                match self {
                    $(
                        $(#[$cfg])*
                        AnySession::$variant(s) => {
                            s.contend(election, candidate).await.map(AnyContender::$variant)
                        }
                    )*
                }
            }

            fn leaving(&self) {
                match self {
                    $( $(#[$cfg])* AnySession::$variant(s) => s.leaving(), )*
                }
            }

            fn shutdown_notice(&self) -> Option<ShutdownNotice> {
                match self {
                    $( $(#[$cfg])* AnySession::$variant(s) => s.shutdown_notice(), )*
                }
            }

            async fn close(self) -> Result<()> {
                match self {
                    $( $(#[$cfg])* AnySession::$variant(s) => s.close().await, )*
                }
            }
        }

        impl Contender for AnyContender {
            async fn acquire(&mut self) -> Result<Attempt> {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.acquire().await, )*
                }
            }

            async fn wait(&mut self) -> Result<()> {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.wait().await, )*
                }
            }

            async fn lost(&mut self) -> LockLoss {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.lost().await, )*
                }
            }

            async fn explain(&mut self, loss: LockLoss) -> LockLoss {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.explain(loss).await, )*
                }
            }

            async fn take_over(&mut self, holder: &Leader) -> Result<Attempt> {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.take_over(holder).await, )*
                }
            }

            async fn proclaim(&mut self, leader: &Leader) -> Result<()> {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.proclaim(leader).await, )*
                }
            }

            async fn release(&mut self) -> Result<()> {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.release().await, )*
                }
            }

            fn ignore_requests(&mut self) {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.ignore_requests(), )*
                }
            }

            async fn leave(&mut self) -> Result<Option<crate::backend::Settling>> {
                match self {
                    $( $(#[$cfg])* AnyContender::$variant(c) => c.leave().await, )*
                }
            }
        }

        impl Observer for AnyObserver {
            async fn next(&mut self) -> Result<Option<Leader>> {
                match self {
                    $( $(#[$cfg])* AnyObserver::$variant(o) => o.next().await, )*
                }
            }
        }
    };
}

any_backend! {
    Memory(crate::memory::MemoryBackend),
    #[cfg(feature = "file")]
    File(crate::file::FileBackend),
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::EtcdBackend),
    #[cfg(feature = "consul")]
    Consul(crate::consul::ConsulBackend),
    #[cfg(feature = "zookeeper")]
    Zookeeper(crate::zookeeper::ZookeeperBackend),
    #[cfg(feature = "redis")]
    Redis(crate::redis::RedisBackend),
    #[cfg(feature = "memcached")]
    Memcached(crate::memcached::MemcachedBackend),
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::PostgresBackend),
    #[cfg(feature = "kubernetes")]
    Kubernetes(crate::kubernetes::KubernetesBackend),
}

/// Turns the backend a URL connected to into an [`AnyBackend`].
struct IntoAny;

impl WithBackend for IntoAny {
    type Output = Result<AnyBackend>;

    async fn call<B: Backend>(self, backend: B) -> Result<AnyBackend> {
        AnyBackend::of(backend)
    }
}

impl AnyBackend {
    /// Connects to the store `url` names (see [`BackendUrl`] for the forms: `memory:`,
    /// `file:///dir`, `etcd://host:2379`, `consul://host:8500`, `zk://host:2181`,
    /// `redis://host:6379`, `memcached://host:11211`, `postgres://host:5432/db`,
    /// `k8s://namespace`); credentials and TLS files come from
    /// the environment. Tries once, like every backend's `connect`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a malformed URL or a store whose cargo feature is not
    /// compiled in (the message says which), and the store's own connection errors.
    pub async fn connect(url: &str) -> Result<AnyBackend> {
        let url: BackendUrl = url.parse()?;
        url.connect(IntoAny).await?
    }
}
