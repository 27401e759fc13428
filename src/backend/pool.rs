//! Sharing one store session among many elections.
//!
//! A [`SessionPool`] hands out [`Shared`] handles on one live session per distinct
//! [`SessionOptions`]: the first election to ask opens it, later ones join it, and the
//! session is destroyed when the last handle is closed (or, for sessions that ask for it with
//! [`Poolable::DESTROY_ON_DROP`], dropped). A lost session is never handed out again: the
//! next election to ask opens a fresh one. So one keep-alive serves every election of a
//! backend, whatever their number.
//!
//! The users of a session are its handles, counted by a reference count of their own: a
//! contender may keep the session itself ([`Shared::session`]) without keeping it open.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::{SessionHealth, SessionOptions};
use crate::Result;

/// A store session that a [`SessionPool`] can share.
pub trait Poolable: Send + Sync + 'static {
    /// Whether dropping the last handle without [`close`](Shared::close) destroys the
    /// session too, in a task spawned on the current tokio runtime (if any; errors are only
    /// logged). `false`: the session is left to expire in the store.
    const DESTROY_ON_DROP: bool = false;

    /// The session's health; a lost session is not shared any more.
    fn health(&self) -> tokio::sync::watch::Receiver<SessionHealth>;
    /// Counts one more handle on the session, if it may still be joined beyond its health
    /// (`false`: it is being ended for its handles; lost sessions are never joined either).
    /// Called for every handle the pool hands out, a fresh session's first included.
    fn try_join(&self) -> bool {
        true
    }
    /// Ends the session in the store. Called once, when its last handle leaves.
    fn destroy(&self) -> impl Future<Output = Result<()>> + Send;
}

/// Live sessions by options. Cheap to share behind the backend's `Arc`.
#[derive(Debug)]
pub struct SessionPool<T> {
    /// Held while a session is opened, so that concurrent elections with equal options share
    /// one session instead of opening two.
    opening: tokio::sync::Mutex<()>,
    live: Mutex<HashMap<SessionOptions, Entry<T>>>,
}

/// A pooled session, and the count of its users (one strong reference per handle).
#[derive(Debug)]
struct Entry<T> {
    session: Weak<T>,
    users: Weak<()>,
}

impl<T> Default for SessionPool<T> {
    fn default() -> Self {
        SessionPool {
            opening: tokio::sync::Mutex::new(()),
            live: Mutex::new(HashMap::new()),
        }
    }
}

/// One election's handle on a pooled session.
#[derive(Debug)]
pub struct Shared<T: Poolable> {
    session: Arc<T>,
    /// `None` once closed.
    user: Option<Arc<()>>,
}

impl<T: Poolable> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.session
    }
}

impl<T: Poolable> SessionPool<T> {
    /// Joins the live session opened with `options`, or opens one with `open`.
    pub async fn join<F, Fut>(&self, options: &SessionOptions, open: F) -> Result<Shared<T>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let _opening = self.opening.lock().await;
        {
            let mut live = self.live();
            live.retain(|_, entry| entry.users.strong_count() > 0);
            // The health is checked before joining: a handle taken and given back here could
            // be the last one, and would leave the session undestroyed.
            if let Some(entry) = live.get(options)
                && let Some(session) = entry.session.upgrade()
                && session.health().borrow().lost.is_none()
                && let Some(user) = entry.users.upgrade()
                && session.try_join()
            {
                return Ok(Shared {
                    session,
                    user: Some(user),
                });
            }
        }
        let session = Arc::new(open().await?);
        // A fresh session is always joinable: counted like the others.
        let _ = session.try_join();
        let user = Arc::new(());
        // Replaces a lost session, if any: its users keep their handle and close it themselves.
        self.live().insert(
            options.clone(),
            Entry {
                session: Arc::downgrade(&session),
                users: Arc::downgrade(&user),
            },
        );
        Ok(Shared {
            session,
            user: Some(user),
        })
    }

    /// The sessions that have users now, one per options, lost ones included until they are
    /// replaced or their users leave.
    pub fn sessions(&self) -> Vec<Arc<T>> {
        self.live()
            .values()
            .filter(|entry| entry.users.strong_count() > 0)
            .filter_map(|entry| entry.session.upgrade())
            .collect()
    }

    fn live(&self) -> MutexGuard<'_, HashMap<SessionOptions, Entry<T>>> {
        // Every critical section leaves the map consistent: a poisoned lock is still good.
        super::lock(&self.live)
    }
}

impl<T: Poolable> Shared<T> {
    /// Leaves the session; the last handle to leave destroys it in the store.
    pub async fn close(mut self) -> Result<()> {
        self.close_in_place().await
    }

    /// [`close`](Self::close), for an owner that cannot give the handle away (it has a
    /// `Drop` of its own): the handle is closed after, and its drop does nothing more.
    pub async fn close_in_place(&mut self) -> Result<()> {
        match self.user.take().and_then(Arc::into_inner) {
            Some(()) => self.session.destroy().await,
            None => Ok(()),
        }
    }

    /// The session itself, for a contender: it is not a user, and does not keep the session
    /// from being destroyed when the last handle leaves.
    pub fn session(&self) -> Arc<T> {
        self.session.clone()
    }
}

impl<T: Poolable> Drop for Shared<T> {
    fn drop(&mut self) {
        let last = self.user.take().and_then(Arc::into_inner).is_some();
        if !(last && T::DESTROY_ON_DROP) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let session = self.session.clone();
            runtime.spawn(async move {
                if let Err(error) = session.destroy().await {
                    tracing::debug!(%error, "destroying the session of a dropped handle failed; the store expires it");
                }
            });
        }
    }
}
