//! Sharing one store session among many elections.
//!
//! A [`SessionPool`] hands out [`Shared`] handles on one live session per distinct
//! [`SessionOptions`]: the first election to ask opens it, later ones join it, and the
//! session is closed when the last handle is closed. A lost session is never handed out
//! again: the next election to ask opens a fresh one. So one keep-alive serves every
//! election of a backend, whatever their number.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Weak};

use tokio::sync::Mutex;

use super::{SessionHealth, SessionOptions};
use crate::Result;

/// A store session that a [`SessionPool`] can share.
pub trait Poolable: Send + Sync + 'static {
    /// The session's health; a lost session is not shared any more.
    fn health(&self) -> tokio::sync::watch::Receiver<SessionHealth>;
    /// Ends the session in the store. Called once, by the last handle's close.
    fn destroy(&self) -> impl Future<Output = Result<()>> + Send;
}

/// Live sessions by options. Cheap to share behind the backend's `Arc`.
#[derive(Debug)]
pub struct SessionPool<T> {
    live: Mutex<HashMap<SessionOptions, Weak<T>>>,
}

impl<T> Default for SessionPool<T> {
    fn default() -> Self {
        SessionPool {
            live: Mutex::new(HashMap::new()),
        }
    }
}

/// One election's handle on a pooled session.
#[derive(Debug)]
pub struct Shared<T: Poolable> {
    session: Arc<T>,
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
        let mut live = self.live.lock().await;
        live.retain(|_, weak| weak.strong_count() > 0);
        if let Some(session) = live.get(options).and_then(Weak::upgrade)
            && session.health().borrow().lost.is_none()
        {
            return Ok(Shared { session });
        }
        let session = Arc::new(open().await?);
        live.insert(options.clone(), Arc::downgrade(&session));
        Ok(Shared { session })
    }
}

impl<T: Poolable> Shared<T> {
    /// Leaves the session; the last handle to leave destroys it in the store.
    pub async fn close(self) -> Result<()> {
        match Arc::into_inner(self.session) {
            Some(last) => last.destroy().await,
            None => Ok(()),
        }
    }
}
