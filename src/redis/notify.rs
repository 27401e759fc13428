//! Keyspace notifications: one pub/sub connection per backend, waking the followers of a key
//! when it is deleted, expires or is set.

use std::sync::Arc;
use std::time::Duration;

use ::redis::Client;
use ::redis::aio::ConnectionManager;
use futures_core::Stream;
use tokio_util::sync::CancellationToken;

pub(super) use crate::backend::polled::Notifier;
use crate::backend::polled::{RECONNECT, Wakes};

/// The flags this backend needs in `notify-keyspace-events`: keyspace events (`K`) for
/// generic commands (`g`: `del`), string commands (`$`: `set`) and expiries (`x`).
const FLAGS: &str = "Kg$x";

/// Whether `flags` (the value of `notify-keyspace-events`) publish what followers need: every
/// one of [`FLAGS`], where `A` stands for `g$lshzxetd` (all but `K`, `E`, `m` and `n`). Without
/// `$`, a `SET` of the key (a new leader) wakes nobody, and observers lag by a poll.
fn sufficient(flags: &str) -> bool {
    let all = flags.contains('A');
    FLAGS
        .chars()
        .all(|flag| flags.contains(flag) || (all && flag != 'K'))
}

/// `flags` with [`FLAGS`] added.
fn merged(flags: &str) -> String {
    let mut out = flags.to_owned();
    for flag in FLAGS.chars() {
        if !out.contains(flag) {
            out.push(flag);
        }
    }
    out
}

/// A glob pattern matching exactly the keys that start with `prefix`.
fn pattern(db: i64, prefix: &str) -> String {
    let mut escaped = String::new();
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    format!("__keyspace@{db}__:{escaped}*")
}

/// Checks (and with `configure`, turns on) the server's keyspace notifications, and starts
/// listening. `None`: followers poll; the reason is logged.
pub(super) async fn start(
    client: &Client,
    conn: &mut ConnectionManager,
    db: i64,
    prefix: &str,
    configure: bool,
    timeout: Duration,
) -> Option<Notifier> {
    let current: Result<(String, String), _> = ::redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(conn)
        .await;
    let flags = match current {
        Ok((_, flags)) => flags,
        Err(error) => {
            tracing::info!(%error, "redis: cannot read notify-keyspace-events; followers poll");
            return None;
        }
    };
    if !sufficient(&flags) {
        if !configure {
            tracing::info!(
                %flags,
                "redis: keyspace notifications are not enabled (notify-keyspace-events lacks \
                 {FLAGS}); followers poll"
            );
            return None;
        }
        let wanted = merged(&flags);
        let set: Result<(), _> = ::redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(&wanted)
            .query_async(conn)
            .await;
        match set {
            Ok(()) => tracing::info!(
                from = %flags,
                to = %wanted,
                "redis: turned keyspace notifications on with CONFIG SET"
            ),
            Err(error) => {
                tracing::info!(
                    %error,
                    "redis: keyspace notifications are off and CONFIG SET was refused; \
                     followers poll"
                );
                return None;
            }
        }
    }
    let pattern = pattern(db, prefix);
    let channel_prefix = format!("__keyspace@{db}__:");
    // The first subscription is made here, so that a server that refuses it (an ACL without
    // pub/sub) is known before followers rely on it.
    let pubsub = match subscribe(client, &pattern, timeout).await {
        Ok(pubsub) => pubsub,
        Err(error) => {
            tracing::info!(%error, "redis: cannot subscribe to keyspace notifications; followers poll");
            return None;
        }
    };
    let keys = Arc::new(Wakes::default());
    let stop = CancellationToken::new();
    let listening = keys.clone();
    let client = client.clone();
    tokio::spawn(stop.clone().run_until_cancelled_owned(listen(
        client,
        pubsub,
        pattern,
        channel_prefix,
        timeout,
        listening,
    )));
    Some(Notifier::new(keys, stop))
}

async fn subscribe(
    client: &Client,
    pattern: &str,
    timeout: Duration,
) -> Result<::redis::aio::PubSub, String> {
    let connect = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.psubscribe(pattern).await?;
        Ok::<_, ::redis::RedisError>(pubsub)
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(pubsub)) => Ok(pubsub),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// Wakes the followers of each key an event names; reconnects when the connection drops,
/// waking every follower then (events may have been missed meanwhile).
async fn listen(
    client: Client,
    mut pubsub: ::redis::aio::PubSub,
    pattern: String,
    channel_prefix: String,
    timeout: Duration,
    keys: Arc<Wakes>,
) {
    loop {
        {
            let mut messages = std::pin::pin!(pubsub.on_message());
            while let Some(message) =
                std::future::poll_fn(|cx| messages.as_mut().poll_next(cx)).await
            {
                let event = message.get_payload_bytes();
                // `expire` is a renewal (PEXPIRE): the holder stays, nobody needs waking.
                if event == b"expire" {
                    continue;
                }
                if let Some(key) = message.get_channel_name().strip_prefix(&channel_prefix) {
                    keys.bump(key);
                }
            }
        }
        tracing::debug!("redis: the keyspace notification connection dropped; reconnecting");
        let mut attempt = 0;
        pubsub = loop {
            tokio::time::sleep(RECONNECT.delay(attempt)).await;
            match subscribe(&client, &pattern, timeout).await {
                Ok(pubsub) => break pubsub,
                Err(error) => {
                    tracing::debug!(%error, "redis: resubscribing failed");
                    attempt = attempt.saturating_add(1);
                }
            }
        };
        keys.bump_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked_and_merged() {
        assert!(sufficient("KA"));
        assert!(sufficient("xgK$"));
        assert!(
            !sufficient("Kgx"),
            "without `$` a new leader's SET wakes nobody"
        );
        assert!(!sufficient("A"), "`A` does not include `K`");
        assert!(!sufficient(""));
        assert!(!sufficient("EA"));
        assert!(!sufficient("Kg"));
        assert_eq!(merged(""), "Kg$x");
        assert_eq!(merged("Ex"), "ExKg$");
    }

    #[test]
    fn patterns_escape_glob_characters() {
        assert_eq!(pattern(3, "a/b/"), "__keyspace@3__:a/b/*");
        assert_eq!(pattern(0, "a*"), "__keyspace@0__:a\\**");
    }
}
