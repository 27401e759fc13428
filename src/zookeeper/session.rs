//! Sessions: one ZooKeeper session, kept alive once, shared by the elections with equal
//! options.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client as zk;
use tokio::sync::watch;
use tokio::time::Instant;

use super::contender::ZookeeperContender;
use super::shared::{ClientSlot, Zk};
use super::{MARK, NAME, ZookeeperBackend, from_client};
use crate::backend::keepalive::{KeepAlive, Renewal};
use crate::backend::lock;
use crate::backend::pool::{Poolable, Shared};
use crate::backend::{Candidate, Session, SessionHealth, SessionOptions};
use crate::{Error, Result};

impl Poolable for Zk {
    /// A dropped session is closed at once rather than left to expire.
    const DESTROY_ON_DROP: bool = true;

    fn health(&self) -> watch::Receiver<SessionHealth> {
        Zk::health(self)
    }

    /// Stops the keep-alive and closes the session (which deletes its ephemeral nodes), waiting
    /// for the server to confirm, within the request timeout.
    async fn destroy(&self) -> Result<()> {
        self.keepalive.stop();
        let Some(client) = lock(&self.client).take() else {
            return Ok(());
        };
        let mut state = client.state_watcher();
        // The last clone leaving sends the close request; the renewal in flight, if any,
        // holds one only until it ends.
        drop(client);
        let closed = async {
            loop {
                if state.changed().await.is_terminated() {
                    return;
                }
            }
        };
        let limit = self.backend.inner.settings.request_timeout;
        if tokio::time::timeout(limit, closed).await.is_err() {
            tracing::debug!(session = %format_args!("{:#x}", self.id), "the session close was not confirmed in time; the server expires it");
        }
        Ok(())
    }
}

/// A session in ZooKeeper: a handle on a ZooKeeper session that may be shared with other
/// elections of the same [`ZookeeperBackend`]. Closing (or dropping) the last handle closes
/// the session, which deletes every node it created.
pub struct ZookeeperSession {
    zk: Shared<Zk>,
}

impl std::fmt::Debug for ZookeeperSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperSession")
            .field("id", &format_args!("{:#x}", self.zk.id))
            .field("negotiated_timeout", &self.zk.negotiated)
            .finish_non_exhaustive()
    }
}

/// Opens a session: joins a live one with equal options, or connects a new one.
pub(super) async fn open(
    backend: &ZookeeperBackend,
    options: &SessionOptions,
) -> Result<ZookeeperSession> {
    let zk = backend
        .inner
        .sessions
        .join(options, || connect(backend, options))
        .await?;
    Ok(ZookeeperSession { zk })
}

/// Connects a client whose session timeout is the options' ttl and starts keeping it alive.
async fn connect(backend: &ZookeeperBackend, options: &SessionOptions) -> Result<Zk> {
    let sent = Instant::now();
    let client = backend.client(options.ttl).await?;
    let negotiated = client.session_timeout();
    let id = client.session_id();
    let info = client.session().clone();
    if negotiated < options.ttl {
        return Err(Error::InvalidTiming {
            reason: format!(
                "ZooKeeper granted a session timeout of {negotiated:?} for a ttl of {:?} (its \
                 maxSessionTimeout is lower); choose a ttl of at most {negotiated:?}",
                options.ttl
            ),
        });
    }
    if negotiated > options.ttl {
        tracing::info!(
            session = %format_args!("{id:#x}"),
            ttl = ?options.ttl,
            negotiated = ?negotiated,
            "ZooKeeper granted a longer session timeout than the ttl (its minSessionTimeout is higher): failover takes that long"
        );
    }
    tracing::debug!(session = %format_args!("{id:#x}"), ?negotiated, "session opened");
    let slot: ClientSlot = Arc::new(Mutex::new(Some(client)));
    let keepalive = KeepAlive::spawn(
        NAME,
        &format!("{id:#x}"),
        options,
        sent,
        renewer(slot.clone()),
    );
    Ok(Zk {
        backend: backend.clone(),
        id,
        info,
        client: slot,
        negotiated,
        keepalive,
        slots: Mutex::new(HashSet::new()),
    })
}

/// The renewal call for [`KeepAlive`]: a `sync` of the (chroot's) root, whose answer proves
/// that the ensemble's leader, not only the server the client is connected to, had not
/// closed the session when the renewal reached it (see "Why renewals sync" in the
/// [module docs](super)).
///
/// The request goes out when the returned future is first polled, which [`KeepAlive`] does
/// right after the call: the instant it records for the renewal (the call) is therefore no
/// later than when the request left.
fn renewer(
    slot: ClientSlot,
) -> impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = Result<Renewal>> + Send>> + Send + 'static
{
    move || {
        let client = lock(&slot).clone();
        Box::pin(async move {
            let Some(client) = client else {
                return Ok(Renewal::Gone);
            };
            match client.sync("/").await {
                Ok(()) => Ok(Renewal::Alive),
                Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => Ok(Renewal::Gone),
                Err(e) => Err(from_client(e, "renewing the session")),
            }
        })
    }
}

impl ZookeeperSession {
    /// The ZooKeeper session id (`0x…` in ZooKeeper's tools).
    pub fn session_id(&self) -> i64 {
        self.zk.id
    }

    /// The session timeout the server granted: the ttl asked for, or longer when the
    /// server's `minSessionTimeout` is higher.
    pub fn negotiated_timeout(&self) -> Duration {
        self.zk.negotiated
    }
}

impl Session for ZookeeperSession {
    type Contender = ZookeeperContender;

    fn id(&self) -> String {
        format!("{:#x}", self.zk.id)
    }

    fn health(&self) -> watch::Receiver<SessionHealth> {
        self.zk.health()
    }

    async fn contend(&self, election: &str, candidate: &Candidate) -> Result<ZookeeperContender> {
        let n = {
            let mut slots = lock(&self.zk.slots);
            let mut n = 0;
            while slots.contains(&(election.to_owned(), n)) {
                n += 1;
            }
            slots.insert((election.to_owned(), n));
            n
        };
        let name = format!("{MARK}{:x}-{n}-", self.zk.id);
        Ok(ZookeeperContender::new(
            self.zk.session(),
            election,
            n,
            name,
            candidate.clone(),
        ))
    }

    async fn close(self) -> Result<()> {
        self.zk.close().await
    }
}
