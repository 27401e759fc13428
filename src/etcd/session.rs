//! Sessions: one etcd lease, kept alive once, shared by the elections with equal options.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::time::Instant;

use super::contender::EtcdContender;
use super::lease::{Lease, Revoke, key_hash, revoke};
use super::{EtcdBackend, NAME, error};
use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::lock;
use crate::backend::pool::{Poolable, Shared};
use crate::backend::{Candidate, Session, SessionHealth, SessionOptions, ShutdownNotice};
use crate::{Error, Result};

/// Copies the keep-alive's health into the sessions' channel as it changes, keeping a loss
/// that [`Lease::gone`] set first. Ends when the keep-alive does.
fn forward_health(mut from: watch::Receiver<SessionHealth>, to: Arc<watch::Sender<SessionHealth>>) {
    tokio::spawn(async move {
        loop {
            let latest = from.borrow_and_update().clone();
            to.send_if_modified(|h| {
                let lost = h.lost.or(latest.lost);
                let changed = h.confirmed_sent_at != latest.confirmed_sent_at
                    || h.last_error != latest.last_error
                    || h.lost != lost;
                h.confirmed_sent_at = latest.confirmed_sent_at;
                h.last_error = latest.last_error;
                h.lost = lost;
                changed
            });
            if latest.lost.is_some() || from.changed().await.is_err() {
                // Once lost, the keep-alive changes nothing more: a last look, and done.
                let last = from.borrow().lost;
                to.send_if_modified(|h| match (h.lost, last) {
                    (None, Some(loss)) => {
                        h.lost = Some(loss);
                        true
                    }
                    _ => false,
                });
                break;
            }
        }
    });
}

/// The first pause before retrying a revoke that failed, and the longest (or a quarter of the
/// ttl, if shorter).
const REVOKE_RETRY_FIRST: Duration = Duration::from_millis(100);
const REVOKE_RETRY_MAX: Duration = Duration::from_secs(1);
/// A failed revoke is retried for this many ttls after the close, and at least
/// [`REVOKE_PATIENCE_MIN`]: long enough to outlast an etcd restart or a leader election,
/// after which etcd extends every lease by its ttl.
const REVOKE_PATIENCE_TTLS: u32 = 10;
const REVOKE_PATIENCE_MIN: Duration = Duration::from_secs(60);

/// Retries a revoke that failed because etcd could not be reached, in a background task:
/// with jittered back-off, until etcd revokes the lease or says it is gone, an error other
/// than unavailability, or the patience runs out. etcd extends every lease by its ttl when it
/// restarts or elects a new leader, so a lease whose revoke failed during an outage would
/// otherwise live on for a ttl after etcd is back, and its keys with it.
fn revoke_in_background(backend: EtcdBackend, id: i64, ttl: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let backoff = crate::backoff::Backoff {
        initial: REVOKE_RETRY_FIRST,
        max: REVOKE_RETRY_MAX.min(ttl / 4).max(REVOKE_RETRY_FIRST),
    };
    let patience = ttl
        .saturating_mul(REVOKE_PATIENCE_TTLS)
        .max(REVOKE_PATIENCE_MIN);
    runtime.spawn(async move {
        let until = Instant::now() + patience;
        let lease = format!("{id:x}");
        for attempt in 0u32.. {
            let pause = backoff.delay(attempt);
            if Instant::now() + pause >= until {
                tracing::debug!(%lease, ?patience, "giving up revoking the lease; etcd expires it");
                return;
            }
            tokio::time::sleep(pause).await;
            match revoke(&backend, id).await {
                Ok(()) => {
                    tracing::debug!(%lease, retries = attempt + 1, "lease revoked on a retry");
                    return;
                }
                Err(error) if error.is_transient() => {}
                Err(error) => {
                    tracing::debug!(%lease, %error, "cannot revoke the lease; etcd expires it");
                    return;
                }
            }
        }
    });
}

impl Poolable for Lease {
    /// A dropped session's lease is revoked at once rather than left to expire.
    const DESTROY_ON_DROP: bool = true;

    fn health(&self) -> watch::Receiver<SessionHealth> {
        Lease::health(self)
    }

    fn try_join(&self) -> bool {
        Lease::try_join(self)
    }

    /// Stops the keep-alive and revokes the lease; a lease that is already gone is fine. The
    /// lease is remembered as abandoned first, so that no contender of this backend queues
    /// behind a key of it (see [`EtcdContender`]). A revoke that fails because etcd cannot
    /// be reached is retried in the background (see [`revoke_in_background`]) and reported.
    async fn destroy(&self) -> Result<()> {
        self.keepalive.stop();
        self.backend.abandon(self.id);
        // Revoked already for its leavers, or being revoked: its outcome decides (the
        // campaigns of a mass shutdown close their handles while it is on its way).
        let revoked = self
            .revoke
            .subscribe()
            .wait_for(|r| *r != Revoke::Started)
            .await
            .is_ok_and(|r| *r == Revoke::Done);
        if revoked {
            return Ok(());
        }
        match revoke(&self.backend, self.id).await {
            Err(error) if error.is_transient() => {
                revoke_in_background(self.backend.clone(), self.id, self.ttl);
                Err(error)
            }
            other => other,
        }
    }
}

/// A session in etcd: a handle on a lease that may be shared with other elections of the
/// same [`EtcdBackend`]. Closing (or dropping) the last handle revokes the lease, which
/// deletes every key bound to it.
pub struct EtcdSession {
    lease: Shared<Lease>,
    /// This handle's id in the lease's leavers (from 1; 0 once it parted).
    id: u64,
}

impl EtcdSession {
    /// Gives this handle's count in the lease's leavers back, once.
    fn part(&mut self) {
        if self.id != 0 {
            self.lease.session().parted(std::mem::take(&mut self.id));
        }
    }
}

impl Drop for EtcdSession {
    fn drop(&mut self) {
        self.part();
    }
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
    let id = lease.handle_id();
    Ok(EtcdSession { lease, id })
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
    let keepalive = KeepAlive::spawn(
        NAME,
        &format!("{id:x}"),
        options,
        sent,
        renewer(backend.lease_client(), id),
    );
    let from = keepalive.health();
    let (health_tx, health) = watch::channel(from.borrow().clone());
    let health_tx = Arc::new(health_tx);
    forward_health(from, health_tx.clone());
    Ok(Lease {
        backend: backend.clone(),
        id,
        ttl: options.ttl,
        keepalive,
        health,
        health_tx,
        keys: Mutex::new(HashSet::new()),
        leavers: Mutex::default(),
        retired: Default::default(),
        revoke: watch::Sender::new(Revoke::No),
        candidate: Mutex::default(),
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
/// server is paused. [`KeepAlive`] lets each call run until it answers or the session has
/// surely expired, and may have several in flight (it sends another when one is not answered
/// within its retry period): a call holds the stream while it waits, so a call made meanwhile
/// finds none and opens a fresh one. A call that fails or is given up leaves the stream with
/// it, so the next call starts on a fresh stream too.
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
        // `<prefix><election>@<lease>`, then `.1`, `.2`… for further campaigns of the
        // election on this lease.
        let range = self.lease.backend.election_range(election);
        let base = format!("{range}{:x}", self.lease.id);
        let key = {
            let mut keys = lock(&self.lease.keys);
            let mut key = base.clone();
            let mut n = 0;
            while !keys.insert(key_hash(&key)) {
                n += 1;
                key = format!("{base}.{n}");
            }
            key
        };
        Ok(EtcdContender::new(
            self.lease.backend.clone(),
            self.lease.session(),
            range.len(),
            key,
            self.lease.shared_candidate(candidate),
            self.id,
        ))
    }

    fn leaving(&self) {
        if self.id != 0 {
            self.lease.session().leaving(self.id);
        }
    }

    /// Counts this handle as asked to shut down: once every handle of the lease is, its
    /// leavers leave their keys to the lease's revoke (see the [module](super) docs). Holds
    /// the lease weakly: a notice kept longer than the handle never keeps the lease from its
    /// revoke.
    fn shutdown_notice(&self) -> Option<ShutdownNotice> {
        if self.id == 0 {
            return None;
        }
        let (lease, id) = (Arc::downgrade(&self.lease.session()), self.id);
        Some(ShutdownNotice::new(move || {
            if let Some(lease) = lease.upgrade() {
                lease.asked(id);
            }
        }))
    }

    async fn close(mut self) -> Result<()> {
        self.part();
        self.lease.close_in_place().await
    }
}
