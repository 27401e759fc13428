//! `LISTEN`: one connection per backend, woken by the `NOTIFY` that every acquire, proclaim
//! and release sends in its own statement (delivered when it commits), waking the followers
//! of the election it names.
//!
//! It needs a connection of its own to the server: behind a transaction pooler (PgBouncer's
//! `pool_mode = transaction`) a `LISTEN` lands on whichever server connection is free and
//! hears nothing afterwards. Turn it off there ([`Listen::Off`](super::Listen::Off)):
//! followers then poll.

use std::sync::Arc;

use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::Connector;
pub(super) use crate::backend::polled::Notifier;
use crate::backend::polled::{RECONNECT, Wakes};

/// Starts listening on `channel`. The first `LISTEN` is made here, so that a server that
/// refuses it is known at once: `None` then, and followers poll (the reason is logged).
pub(super) async fn start(connector: Arc<Connector>, channel: String) -> Option<Notifier> {
    let keys = Arc::new(Wakes::default());
    let (ready, listening) = tokio::sync::oneshot::channel();
    let stop = CancellationToken::new();
    tokio::spawn(stop.clone().run_until_cancelled_owned(listen(
        connector,
        channel,
        keys.clone(),
        ready,
    )));
    match listening.await {
        Ok(Ok(())) => Some(Notifier::new(keys, stop)),
        Ok(Err(error)) => {
            tracing::info!(%error, "postgres: cannot LISTEN; followers poll");
            stop.cancel();
            None
        }
        Err(_) => None,
    }
}

/// Listens on `channel`, waking the followers of each election a notification names;
/// connects again when the connection drops, waking every follower then (notifications may
/// have been missed meanwhile). `ready` hears how the first `LISTEN` went.
async fn listen(
    connector: Arc<Connector>,
    channel: String,
    keys: Arc<Wakes>,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) {
    let mut ready = Some(ready);
    let mut attempt = 0;
    loop {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let listened = connector
            .listen(&channel, move |message| {
                if let AsyncMessage::Notification(note) = message {
                    let _ = tx.send(note.payload().to_owned());
                }
            })
            .await;
        match listened {
            Ok(connection) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Ok(()));
                } else {
                    keys.bump_all();
                }
                attempt = 0;
                let mut connection = std::pin::pin!(connection);
                loop {
                    tokio::select! {
                        Some(key) = rx.recv() => keys.bump(&key),
                        () = &mut connection => break,
                    }
                }
                while let Ok(key) = rx.try_recv() {
                    keys.bump(&key);
                }
                tracing::debug!("postgres: the LISTEN connection dropped; connecting again");
            }
            Err(error) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Err(error.to_string()));
                    return;
                }
                tracing::debug!(%error, "postgres: LISTEN again failed");
            }
        }
        tokio::time::sleep(RECONNECT.delay(attempt)).await;
        attempt = attempt.saturating_add(1);
    }
}
