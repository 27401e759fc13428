//! Sessions: process-local (a random id), alive as long as one renewal per renew interval
//! rewrites every key their elections hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{KeyState, PolledBackend, PolledContender, Renewing, Store};
use crate::Result;
use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::pool::{self, Poolable};
use crate::backend::{Candidate, LockLoss, Session, SessionHealth, SessionOptions, lock};

/// Numbers the session handles of this process.
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0);

/// A key held by one contender of the session.
pub(super) struct Held {
    /// Our value of the key, compared by every renewal.
    pub value: Vec<u8>,
    /// The value a proclaim is writing, or wrote without an answer: the store may hold it
    /// now or later (a request that timed out can still execute), so a renewal accepts it
    /// too, and makes it [`value`](Self::value) once it finds it.
    pub pending: Option<Vec<u8>>,
    /// Told why, when a renewal finds the key gone or another's.
    pub loss: watch::Sender<Option<LockLoss>>,
}

/// The keys held by a session's contenders, and when a renewal last took their list.
#[derive(Default)]
pub(super) struct HeldState {
    /// By key.
    pub keys: HashMap<String, Held>,
    /// When the last renewal took the list of keys to renew: a key taken by a request sent
    /// before that instant but registered after it was left out of that renewal, whose
    /// confirmation then says nothing of the key (see `PolledContender::take`).
    pub listed_at: Option<Instant>,
}

/// The keys held by a session's contenders.
pub(super) type HeldKeys = Arc<Mutex<HeldState>>;

/// A session and its keep-alive, shared through the backend's pool by every
/// [`PolledSession`] with its options.
pub(super) struct Shared<S> {
    pub backend: PolledBackend<S>,
    /// A random id, process-local (the store knows no sessions): for logs and owner ids.
    pub id: String,
    pub options: SessionOptions,
    pub held: HeldKeys,
    keepalive: KeepAlive,
}

impl<S> Shared<S> {
    /// The session's health, as the keep-alive reports it.
    pub fn keepalive_health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }
}

impl<S: Store> Poolable for Shared<S> {
    /// A dropped session releases its keys at once rather than leaving them to expire.
    const DESTROY_ON_DROP: bool = true;

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.keepalive.health()
    }

    /// Stops the renewals and deletes every key still held (where still ours).
    async fn destroy(&self) -> Result<()> {
        self.keepalive.stop();
        let held: Vec<(String, Held)> = lock(&self.held).keys.drain().collect();
        for (key, held) in held {
            for value in std::iter::once(held.value).chain(held.pending) {
                self.backend.store().release(&key, &value).await?;
            }
        }
        Ok(())
    }
}

/// A session on a store whose followers poll: a handle on a process-local session that may
/// be shared with other elections of the same backend. Its liveness is the renewal of its
/// keys: one renewal rewrites them all every renew interval. Closing (or dropping) the last
/// handle deletes the keys it still holds.
///
/// Each handle is one campaign's: after a contender of this handle released a key, this
/// handle's contenders leave it to others for a while (see
/// [`COURTESY_POLLS`](super::COURTESY_POLLS) and [`PUSH_COURTESY`](super::PUSH_COURTESY)).
pub struct PolledSession<S: Store> {
    shared: pool::Shared<Shared<S>>,
    handle: u64,
}

impl<S: Store> std::fmt::Debug for PolledSession<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolledSession")
            .field("store", &S::NAME)
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

/// Opens a session: joins a live one with equal options, or starts a new one.
pub(super) async fn open<S: Store>(
    backend: &PolledBackend<S>,
    options: &SessionOptions,
) -> Result<PolledSession<S>> {
    let shared = backend
        .inner
        .sessions
        .join(options, || create(backend, options))
        .await?;
    Ok(PolledSession {
        shared,
        handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
    })
}

/// Checks that the store answers, and starts the renewals.
async fn create<S: Store>(
    backend: &PolledBackend<S>,
    options: &SessionOptions,
) -> Result<Shared<S>> {
    let sent = Instant::now();
    backend.store().ping().await?;
    let id = format!("{:016x}", fastrand::u64(..));
    let held: HeldKeys = Arc::default();
    let (renewing, renewed, ttl) = (backend.clone(), held.clone(), options.ttl);
    let keepalive = KeepAlive::spawn(S::NAME, &id, options, sent, move || {
        renew(renewing.clone(), renewed.clone(), ttl)
    });
    tracing::debug!(store = S::NAME, session = %id, ttl = ?options.ttl, "session started");
    Ok(Shared {
        backend: backend.clone(),
        id,
        options: options.clone(),
        held,
        keepalive,
    })
}

/// One renewal of every held key. A key that is no longer ours ends its contender's term;
/// the others are confirmed. With no key held, a ping.
async fn renew<S: Store>(
    backend: PolledBackend<S>,
    held: HeldKeys,
    ttl: Duration,
) -> Result<Renewal> {
    let snapshot: Vec<Renewing> = {
        let mut held = lock(&held);
        held.listed_at = Some(Instant::now());
        held.keys
            .iter()
            .map(|(key, held)| Renewing {
                key: key.clone(),
                value: held.value.clone(),
                pending: held.pending.clone(),
            })
            .collect()
    };
    if snapshot.is_empty() {
        backend.store().ping().await?;
        return Ok(Renewal::Alive);
    }
    let states = backend.store().renew(&snapshot, ttl).await?;
    for (renewed, state) in snapshot.iter().zip(states) {
        let mut held = lock(&held);
        // Unless the key changed hands in this process meanwhile (released, proclaimed).
        let Some(ours) = held
            .keys
            .get_mut(&renewed.key)
            .filter(|h| h.value == renewed.value && h.pending == renewed.pending)
        else {
            continue;
        };
        let loss = match state {
            KeyState::Renewed => continue,
            KeyState::RenewedPending => {
                // A proclaim whose answer was lost did execute: its value is ours now.
                if let Some(pending) = ours.pending.take() {
                    ours.value = pending;
                }
                continue;
            }
            KeyState::Gone => LockLoss::Deleted,
            KeyState::Other => LockLoss::Taken,
        };
        if let Some(lost) = held.keys.remove(&renewed.key) {
            drop(held);
            // The term ends first: the contender is told before anything is logged.
            lost.loss.send_replace(Some(loss));
            let key = &renewed.key;
            tracing::warn!(store = S::NAME, %key, ?loss, "a renewal found the lock no longer ours");
        }
    }
    Ok(Renewal::Alive)
}

impl<S: Store> Session for PolledSession<S> {
    type Contender = PolledContender<S>;

    fn id(&self) -> String {
        self.shared.id.clone()
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.shared.keepalive_health()
    }

    async fn contend(&self, election: &str, candidate: &Candidate) -> Result<PolledContender<S>> {
        Ok(PolledContender::new(
            self.shared.session(),
            election,
            candidate.clone(),
            self.handle,
        ))
    }

    async fn close(self) -> Result<()> {
        self.shared.close().await
    }
}
