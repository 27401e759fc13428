//! The Kubernetes backend: an election is a `coordination.k8s.io/v1` Lease, the object
//! client-go's `leaderelection` uses, taken and renewed by `resourceVersion`-preconditioned
//! updates, with followers woken by a watch.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use incumbent::Election;
//! use incumbent::kubernetes::KubernetesBackend;
//!
//! // In a pod: the service account's token, CA and namespace; elsewhere: the kubeconfig
//! // (KUBECONFIG or ~/.kube/config) and its context's namespace.
//! let backend = KubernetesBackend::builder().connect().await?;
//!
//! let election = Election::builder(backend, "index-builder") // the Lease's name
//!     .candidate(std::env::var("POD_NAME")?)
//!     .ttl(Duration::from_secs(15))
//!     .build()?;
//! election
//!     .run(|term| async move {
//!         // pass term.fencing_token() with every write; stop when term.cancelled() fires
//!         term.cancelled().await;
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Cargo features
//!
//! `kubernetes` brings kube-rs (`kube`, `k8s-openapi`) with rustls. Like every library on
//! kube-rs, this crate leaves k8s-openapi's choice of Kubernetes version to the application:
//! add `k8s-openapi = { version = "0.29", features = ["latest"] }` (or the `v1_*` feature of
//! the oldest API server you run) to your `Cargo.toml`; without it, k8s-openapi's build
//! stops and says so. The Lease API is the same in every version k8s-openapi supports. For
//! a binary that has no other use for k8s-openapi (this crate's CLI), the feature
//! `k8s-latest` picks the newest.
//!
//! # RBAC
//!
//! The service account needs, in its namespace:
//!
//! ```yaml
//! apiVersion: rbac.authorization.k8s.io/v1
//! kind: Role
//! metadata: { name: incumbent }
//! rules:
//!   - apiGroups: ["coordination.k8s.io"]
//!     resources: ["leases"]
//!     verbs: ["get", "list", "watch", "create", "update"]
//! ```
//!
//! bound to it with a RoleBinding. Leases are never deleted by the backend.
//!
//! # How it works
//!
//! - **One Lease per election**, named after the election (prefix `""` by default). A name
//!   that is not a valid object name (`jobs/a`, capitals, `_`) is turned into one:
//!   `jobs-a-` and eight hex digits of a hash of the whole name ([`lease_name`]).
//!   `kubectl get lease -o wide` shows the holder.
//! - **Every write is a `resourceVersion`-preconditioned update** (or a create, for a
//!   Lease that does not exist yet): two candidates racing for one Lease give one winner,
//!   and the other gets `409 Conflict` and reads again. A take changes `holderIdentity`,
//!   `acquireTime`, `renewTime`, `leaseDurationSeconds` and `leaseTransitions` (plus one)
//!   in that one write, as client-go does.
//! - **Expiry is judged as client-go judges it**: a Lease is held while fewer than
//!   `leaseDurationSeconds` have passed, on this process's monotonic clock, since this
//!   process *saw* it change (its `resourceVersion`). The remote `renewTime` is never
//!   compared with the local wall clock, so a node's clock skewed by minutes changes
//!   nothing. A take's precondition is the version it judged: if the holder renewed
//!   meanwhile, the take fails. The holder's term ends on its side before anyone else may
//!   judge the Lease expired, since they count from when they saw its last renewal, which
//!   was sent after the instant the holder counts from.
//! - **The fencing token** is kept in the Lease's annotation
//!   `incumbent.dev/fencing-token`, bumped in the same write as the take: the greatest of
//!   the annotation + 1, this process's clock in milliseconds, and the highest token this
//!   process saw + 1 (a `u64`, at most [`MAX_TOKEN`]; it never wraps). A Lease deleted and
//!   created again (its `uid` changes, `leaseTransitions` starts at 0) still gets tokens
//!   above every earlier one, since the clock went on. `leaseTransitions` (an `int32`) is
//!   bumped too, for client-go, and stays at its maximum rather than wrap.
//! - **client-go on the same Lease.** A client-go `leaderelection` candidate and this
//!   crate's candidates contend for one Lease and never both lead: both take only with the
//!   version they judged expired. Each sees the other as the holder (`holderIdentity` is the
//!   candidate's id; the rest of this crate's leader value is in the annotation
//!   `incumbent.dev/holder`, trusted only while `holderIdentity` and `leaseTransitions` match
//!   it). A release empties `holderIdentity` and sets `leaseDurationSeconds` to 1, as
//!   client-go's `ReleaseOnCancel` does, so either side takes over at once.
//! - **Followers watch**: one watch of the namespace's Leases per backend wakes the
//!   followers of a Lease that changed, and times their next try to the instant the holder's
//!   lease runs out as judged above. No polling (a safety-net read every
//!   [`SAFETY_NET_POLL`]).
//! - **The ttl is whole seconds** (`leaseDurationSeconds`), at least [`MIN_TTL`].

mod store;
pub(crate) mod url;

use std::time::Duration;

pub use self::store::{LeaseStore, lease_name};
use crate::backend::polled::{
    self, PolledBackend, PolledBuilder, PolledContender, PolledObserver, PolledSession,
};
pub use crate::backend::polled::{COURTESY_POLLS, MAX_TOKEN, PUSH_COURTESY};
use crate::backend::{BackendInfo, Wakeup};
use crate::{Error, Result};
pub use k8s_openapi;
pub use kube;

const NAME: &str = "kubernetes";

/// The smallest ttl: `leaseDurationSeconds` counts whole seconds, and renewals every third
/// of the ttl must fit in with a few round trips.
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// The largest ttl: a day.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// How long one request may take unless [`KubernetesBuilder::timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often followers read their Lease in case the watch missed a change.
pub const SAFETY_NET_POLL: Duration = Duration::from_secs(10);
/// The annotation that holds an election's last fencing token.
pub const TOKEN_ANNOTATION: &str = "incumbent.dev/fencing-token";
/// The annotation that holds this crate's leader value (id, metadata, token, owner).
pub const HOLDER_ANNOTATION: &str = "incumbent.dev/holder";

/// Where the client's configuration comes from.
#[derive(Clone)]
pub(crate) enum Source {
    /// `kube::Config::infer`: the kubeconfig, else the pod's service account.
    Infer,
    /// The pod's service account only.
    InCluster,
    /// A configuration given by the caller.
    Config(Box<kube::Config>),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Infer => f.write_str("Infer"),
            Source::InCluster => f.write_str("InCluster"),
            // kube::Config's Debug leaves out its secrets; its URL is enough here.
            Source::Config(config) => f
                .debug_tuple("Config")
                .field(&config.cluster_url.to_string())
                .finish(),
        }
    }
}

/// The Kubernetes part of a [`KubernetesBuilder`]: where the API server is, the namespace,
/// and how long one request may take.
#[derive(Clone, Debug)]
pub struct Settings {
    source: Source,
    namespace: Option<String>,
    timeout: Duration,
}

/// Settings for a [`KubernetesBackend`]: made by [`KubernetesBackend::builder`], finished by
/// [`connect`](KubernetesBuilder::connect).
pub type KubernetesBuilder = PolledBuilder<Settings>;

impl PolledBuilder<Settings> {
    /// The namespace of the Leases (default: the kubeconfig context's namespace, or the
    /// pod's own namespace in a cluster).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.store.namespace = Some(namespace.into());
        self
    }

    /// Uses this client configuration (a kubeconfig loaded by the caller, say) instead of
    /// inferring one.
    pub fn config(mut self, config: kube::Config) -> Self {
        self.store.source = Source::Config(Box::new(config));
        self
    }

    /// Uses the pod's service account only (`KUBERNETES_SERVICE_HOST`, the token and CA
    /// under `/var/run/secrets/kubernetes.io/serviceaccount`), never a kubeconfig.
    pub fn in_cluster(mut self) -> Self {
        self.store.source = Source::InCluster;
        self
    }

    /// How long one request may take (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.store.timeout = timeout;
        self
    }

    /// Loads the configuration, checks that the API server answers and that the Leases of
    /// the namespace can be listed, starts the watch, and builds the backend.
    ///
    /// Errors: [`Error::InvalidConfig`] for no usable configuration, a namespace that is
    /// not a valid name, or a prefix that cannot start an object name;
    /// [`Error::Unauthorized`] when the credentials are refused or RBAC forbids the Leases
    /// (the message names the Role it needs); [`Error::Unavailable`] when the API server
    /// cannot be reached.
    pub async fn connect(self) -> Result<KubernetesBackend> {
        self.dial().await.map_err(Error::not_retried)
    }

    async fn dial(self) -> Result<KubernetesBackend> {
        let invalid = |reason: String| Error::InvalidConfig {
            backend: NAME,
            reason,
        };
        let Settings {
            source,
            namespace,
            timeout,
        } = self.store;
        if timeout.is_zero() {
            return Err(invalid("the timeout must be above zero (e.g. 5s)".into()));
        }
        if !self.prefix.is_empty() && !store::valid_name(&format!("{}x", self.prefix)) {
            return Err(invalid(format!(
                "the prefix {:?} cannot start a Lease's name: lowercase letters, digits, '-' \
                 and '.', starting with a letter or digit (e.g. \"incumbent-\")",
                self.prefix
            )));
        }
        let mut config = match source {
            Source::Config(config) => *config,
            Source::Infer => kube::Config::infer().await.map_err(|e| {
                invalid(format!(
                    "no Kubernetes configuration: {e} (set KUBECONFIG, or run in a pod with a \
                     service account)"
                ))
            })?,
            Source::InCluster => kube::Config::incluster().map_err(|e| {
                invalid(format!(
                    "not in a pod with a service account: {e} (KUBERNETES_SERVICE_HOST and \
                     /var/run/secrets/kubernetes.io/serviceaccount)"
                ))
            })?,
        };
        let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
        if !store::valid_label(&namespace) {
            return Err(invalid(format!(
                "the namespace {namespace:?} is not a valid namespace name (lowercase letters, \
                 digits and '-', at most 63)"
            )));
        }
        config.connect_timeout = Some(timeout);
        // kube's rustls takes the process's default crypto provider, and with more than one
        // compiled in (ring here, aws-lc-rs in another crate) there is none until someone
        // installs one: ring, unless the application installed its own first.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = kube::Client::try_from(config)
            .map_err(|e| invalid(format!("cannot build a client: {e}")))?;
        let store = LeaseStore::connect(client, namespace, timeout).await?;
        let info = BackendInfo {
            min_ttl: MIN_TTL,
            max_ttl: MAX_TTL,
            ..polled::info(NAME, Wakeup::Push)
        };
        Ok(PolledBackend::new(
            store,
            self.prefix,
            SAFETY_NET_POLL,
            info,
        ))
    }
}

/// Kubernetes Leases in one namespace, for any number of elections. Cheap to clone: clones
/// share the client, the watch and the sessions. See the [module docs](self).
pub type KubernetesBackend = PolledBackend<LeaseStore>;

impl PolledBackend<LeaseStore> {
    /// Starts configuring a backend: the configuration is inferred (the kubeconfig, else the
    /// pod's service account) unless [`config`](KubernetesBuilder::config) or
    /// [`in_cluster`](KubernetesBuilder::in_cluster) says otherwise.
    pub fn builder() -> KubernetesBuilder {
        PolledBuilder::new(Settings {
            source: Source::Infer,
            namespace: None,
            timeout: DEFAULT_TIMEOUT,
        })
        .prefix("")
    }

    /// The namespace of this backend's Leases.
    pub fn namespace(&self) -> &str {
        self.store().namespace()
    }
}

/// A session on Kubernetes: process-local, alive as long as one renewal (an update of
/// `renewTime` per Lease, preconditioned on its version) keeps every Lease its elections
/// hold. Closing (or dropping) the last handle releases the Leases it still holds.
pub type KubernetesSession = PolledSession<LeaseStore>;
/// One session's claim on one Lease; see the [module docs](self).
pub type KubernetesContender = PolledContender<LeaseStore>;
/// Follows the holder of one Lease through the backend's watch.
pub type KubernetesObserver = PolledObserver<LeaseStore>;

/// Maps a kube-rs error: refused credentials or RBAC, an API server that cannot be reached
/// or is overloaded, or anything else.
pub(crate) fn from_kube(error: kube::Error, what: &str) -> Error {
    match error {
        kube::Error::Api(status) => {
            let reason = format!(
                "{what}: {} ({} {})",
                status.message, status.code, status.reason
            );
            match status.code {
                401 | 403 => Error::Unauthorized {
                    backend: NAME,
                    reason: format!(
                        "{reason}; the service account needs get, list, watch, create and \
                         update on leases.coordination.k8s.io in its namespace (see the \
                         backend's docs for the Role)"
                    ),
                },
                429 | 500..=599 => Error::Unavailable {
                    backend: NAME,
                    reason,
                },
                _ => Error::Store {
                    backend: NAME,
                    reason,
                },
            }
        }
        other => Error::Unavailable {
            backend: NAME,
            reason: format!("{what}: {}", crate::error::chain(&other)),
        },
    }
}

/// The error of a request unanswered within the timeout.
pub(crate) fn timed_out(what: &str, timeout: Duration) -> Error {
    Error::Unavailable {
        backend: NAME,
        reason: format!("{what}: no answer within {timeout:?}"),
    }
}
