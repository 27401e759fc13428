//! Sessions: one etcd lease, kept alive once, shared by the elections with equal options.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::time::Instant;

use super::contender::EtcdContender;
use super::{EtcdBackend, NAME, SEPARATOR, error};
use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::lock;
use crate::backend::pool::{Poolable, Shared};
use crate::backend::{Candidate, Session, SessionHealth, SessionOptions};
use crate::{Error, Result};

/// A granted lease and its keep-alive, shared through the backend's pool by every
/// [`EtcdSession`] with its options.
pub(super) struct Lease {
    backend: EtcdBackend,
    pub id: i64,
    keepalive: KeepAlive,
    /// The candidate keys claimed by contenders of this lease, so that two campaigns for the
    /// same election sharing the lease still get a key each.
    keys: Mutex<HashSet<String>>,
}

impl Lease {
    pub fn health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }
}

impl Poolable for Lease {
    /// A dropped session's lease is revoked at once rather than left to expire.
    const DESTROY_ON_DROP: bool = true;

    fn health(&self) -> watch::Receiver<SessionHealth> {
        Lease::health(self)
    }

    /// Stops the keep-alive and revokes the lease; a lease that is already gone is fine.
    async fn destroy(&self) -> Result<()> {
        self.keepalive.stop();
        let backend = &self.backend;
        let id = self.id;
        backend
            .request("revoking the lease (it expires by itself)", || async {
                match backend.lease_client().revoke(id).await {
                    Err(e) if error::is_lease_not_found(&e) => Ok(()),
                    other => other.map(drop),
                }
            })
            .await
    }
}

/// A session in etcd: a handle on a lease that may be shared with other elections of the
/// same [`EtcdBackend`]. Closing (or dropping) the last handle revokes the lease, which
/// deletes every key bound to it.
pub struct EtcdSession {
    lease: Shared<Lease>,
}

impl std::fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSession")
            .field("lease", &format_args!("{:x}", self.lease.id))
            .finish_non_exhaustive()
    }
}

/// Opens a session: joins a live lease with equal options, or grants a new one.
pub(super) async fn open(backend: &EtcdBackend, options: &SessionOptions) -> Result<EtcdSession> {
    let lease = backend
        .inner
        .leases
        .join(options, || grant(backend, options))
        .await?;
    Ok(EtcdSession { lease })
}

/// Grants a lease with the options' ttl and starts keeping it alive.
async fn grant(backend: &EtcdBackend, options: &SessionOptions) -> Result<Lease> {
    let ttl = whole_seconds(options.ttl);
    let sent = Instant::now();
    let granted = backend
        .request("granting a lease", || async {
            backend.lease_client().grant(ttl, None).await
        })
        .await
        .map_err(|e| match e {
            Error::Store { reason, .. } if reason.contains("lease TTL") => Error::InvalidTiming {
                reason: format!("etcd refused a lease of {ttl} s: {reason}; choose another .ttl()"),
            },
            other => other,
        })?;
    let id = granted.id();
    tracing::debug!(lease = %format_args!("{id:x}"), ttl, granted = granted.ttl(), "lease granted");
    let keepalive = KeepAlive::spawn(NAME, options, sent, renewer(backend.lease_client(), id));
    Ok(Lease {
        backend: backend.clone(),
        id,
        keepalive,
        keys: Mutex::new(HashSet::new()),
    })
}

/// A ttl in whole seconds, rounded up: etcd leases count in seconds, and a shorter lease than
/// asked for would expire before the campaign's renew deadline assumes.
fn whole_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

type KeepAliveChannel = (LeaseKeeper, LeaseKeepAliveStream);

/// The renewal call for [`KeepAlive`]: one keep-alive message on the lease's stream, and its
/// answer. The stream is opened on first use and reopened after any failure, because
/// `etcd-client`'s stream neither reconnects after a server restart nor errors while the
/// server is paused; [`KeepAlive`] bounds each call by the renew interval, and a call cut
/// short leaves the stream closed, so the next one starts on a fresh stream.
fn renewer(
    client: LeaseClient,
    id: i64,
) -> impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = Result<Renewal>> + Send>> + Send + 'static
{
    let channel: Arc<Mutex<Option<KeepAliveChannel>>> = Arc::default();
    move || {
        let channel = channel.clone();
        let mut client = client.clone();
        Box::pin(async move {
            let open = lock(&channel).take();
            let Some((mut keeper, mut responses)) = open else {
                // Opening the stream sends a first keep-alive and waits for its answer.
                return match client.keep_alive(id).await {
                    Ok(opened) => {
                        *lock(&channel) = Some(opened);
                        Ok(Renewal::Alive)
                    }
                    Err(e) if error::is_lease_not_found(&e) => Ok(Renewal::Gone),
                    Err(e) => Err(error::from_client(e)),
                };
            };
            keeper.keep_alive().await.map_err(error::from_client)?;
            match responses.message().await {
                Ok(Some(response)) if response.ttl() > 0 => {
                    *lock(&channel) = Some((keeper, responses));
                    Ok(Renewal::Alive)
                }
                Ok(Some(_)) => Ok(Renewal::Gone),
                Ok(None) => Err(error::unavailable(
                    "the server closed the lease keep-alive stream",
                )),
                Err(e) if error::is_lease_not_found(&e) => Ok(Renewal::Gone),
                Err(e) => Err(error::from_client(e)),
            }
        })
    }
}

impl EtcdSession {
    /// The id of the lease behind this session (candidate keys and `etcdctl lease list`
    /// show it in hex).
    pub fn lease_id(&self) -> i64 {
        self.lease.id
    }
}

impl Session for EtcdSession {
    type Contender = EtcdContender;

    fn id(&self) -> String {
        format!("{:x}", self.lease.id)
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.lease.health()
    }

    async fn contend(&self, election: &str, candidate: &Candidate) -> Result<EtcdContender> {
        let base = format!(
            "{}{SEPARATOR}{:x}",
            self.lease
                .backend
                .election_range(election)
                .trim_end_matches(SEPARATOR),
            self.lease.id
        );
        let key = {
            let mut keys = lock(&self.lease.keys);
            let mut key = base.clone();
            let mut n = 0;
            while keys.contains(&key) {
                n += 1;
                key = format!("{base}.{n}");
            }
            keys.insert(key.clone());
            key
        };
        Ok(EtcdContender::new(
            self.lease.backend.clone(),
            self.lease.session(),
            election,
            key,
            candidate.clone(),
        ))
    }

    async fn close(self) -> Result<()> {
        self.lease.close().await
    }
}

/// Gives a contender's key back to its lease when the contender is dropped.
pub(super) fn free_key(lease: &Lease, key: &str) {
    lock(&lease.keys).remove(key);
}
