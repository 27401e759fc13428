//! Sessions: one Consul session, renewed once, shared by the elections with equal options.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;
use tokio::time::Instant;

use super::client::SessionCreate;
use super::contender::ConsulContender;
use super::shared::Shared;
use super::{CONSUL_DEFAULT_LOCK_DELAY, ConsulBackend, MAX_LOCK_DELAY, NAME, error};
use crate::Result;
use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::pool::{self, Poolable};
use crate::backend::{Candidate, Session, SessionHealth, SessionOptions};

impl Poolable for Shared {
    /// A dropped session is destroyed at once rather than left to expire.
    const DESTROY_ON_DROP: bool = true;

    fn health(&self) -> watch::Receiver<SessionHealth> {
        Shared::health(self)
    }

    /// Stops the keep-alive and destroys the session; one that is already gone is fine.
    async fn destroy(&self) -> Result<()> {
        self.keepalive.stop();
        self.backend
            .client()
            .session_destroy(&self.id)
            .await
            .map_err(error::from_client)
    }
}

/// A session in Consul: a handle on a Consul session that may be shared with other elections
/// of the same [`ConsulBackend`]. Closing (or dropping) the last handle destroys the Consul
/// session, which releases any lock it still holds (subject to its lock-delay: the campaign
/// releases its lock first, so a graceful hand-off has none).
pub struct ConsulSession {
    shared: pool::Shared<Shared>,
    /// This handle's (one campaign's) number: after one of its contenders released a key,
    /// its contenders leave it to the others for a while.
    handle: u64,
}

/// The number of the next session handle.
static NEXT_HANDLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl std::fmt::Debug for ConsulSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulSession")
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

/// Opens a session: joins a live one with equal options, or creates a new one.
pub(super) async fn open(
    backend: &ConsulBackend,
    options: &SessionOptions,
) -> Result<ConsulSession> {
    let shared = backend
        .inner
        .sessions
        .join(options, || create(backend, options))
        .await?;
    Ok(ConsulSession {
        shared,
        handle: NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    })
}

/// Creates a Consul session with the options and starts renewing it.
async fn create(backend: &ConsulBackend, options: &SessionOptions) -> Result<Shared> {
    let lock_delay = backend.effective_lock_delay(options);
    let params = SessionCreate {
        name: options.name.clone(),
        ttl: Some(options.ttl),
        lock_delay,
        // Only the ttl decides: no `serfHealth`, which a starting agent may not have yet.
        node_checks: Some(Vec::new()),
    };
    let sent = Instant::now();
    let id = backend
        .client()
        .session_create(&params)
        .await
        .map_err(error::from_client)?;
    tracing::debug!(session = %id, ttl = ?options.ttl, ?lock_delay, "consul session created");
    let client = backend.client().clone();
    let renewed = id.clone();
    let keepalive = KeepAlive::spawn(NAME, &id, options, sent, move || {
        let client = client.clone();
        let id = renewed.clone();
        async move {
            match client.session_renew(&id).await {
                Ok(Some(_)) => Ok(Renewal::Alive),
                Ok(None) => Ok(Renewal::Gone),
                Err(e) => Err(error::from_client(e)),
            }
        }
    });
    Ok(Shared {
        backend: backend.clone(),
        id,
        lock_delay: lock_delay
            .unwrap_or(CONSUL_DEFAULT_LOCK_DELAY)
            .min(MAX_LOCK_DELAY),
        keepalive,
        claims: Mutex::new(HashMap::new()),
        unclaimed: watch::Sender::new(0),
    })
}

impl Session for ConsulSession {
    type Contender = ConsulContender;

    fn id(&self) -> String {
        self.shared.id.clone()
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.shared.health()
    }

    async fn contend(&self, election: &str, candidate: &Candidate) -> Result<ConsulContender> {
        Ok(ConsulContender::new(
            self.shared.backend.clone(),
            self.shared.session(),
            self.handle,
            self.shared.backend.key(election),
            candidate.clone(),
        ))
    }

    async fn close(self) -> Result<()> {
        self.shared.close().await
    }
}
