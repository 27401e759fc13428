//! A watch that resumes where it left off, and the back-off between attempts to re-establish
//! one.

use std::time::Duration;

use etcd_client::{Event, WatchFilterType, WatchOptions, WatchStream};
use tokio::time::sleep;

use super::{EtcdBackend, error};
use crate::Result;

/// The first pause before re-establishing a broken watch.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// The longest pause between attempts: a store that stays down is tried this often.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// What a [`Follow`] watches.
#[derive(Clone, Debug)]
pub(super) struct Target {
    pub key: Vec<u8>,
    /// Every key under `key`, rather than `key` alone.
    pub prefix: bool,
}

/// Events on some keys from a start revision on, over one watch stream that is opened when
/// first needed. Cancel-safe: dropping a [`next`](Follow::next) future loses no event, and the
/// stream stays open for the next call.
pub(super) struct Follow {
    backend: EtcdBackend,
    targets: Vec<Target>,
    deletes_only: bool,
    /// The first revision whose events have not been returned yet.
    next_revision: i64,
    stream: Option<WatchStream>,
    retry: Retry,
}

impl Follow {
    /// Follows `targets` from `revision` on; only their deletes if `deletes_only`.
    pub fn new(
        backend: &EtcdBackend,
        targets: Vec<Target>,
        deletes_only: bool,
        revision: i64,
    ) -> Follow {
        Follow {
            backend: backend.clone(),
            targets,
            deletes_only,
            next_revision: revision,
            stream: None,
            retry: Retry::default(),
        }
    }

    /// The next events, in revision order. `Err` when the watch cannot be opened, breaks, or
    /// is cancelled by the server (e.g. its start revision was compacted): re-establish it
    /// from a fresh read, after [`pause`](Follow::pause).
    pub async fn next(&mut self) -> Result<Vec<Event>> {
        if self.stream.is_none() {
            self.stream = Some(self.open().await?);
        }
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return Err(error::unavailable("the watch stream is closed"));
            };
            let message = stream.message().await;
            match message {
                Ok(Some(response)) if response.canceled() => {
                    self.stream = None;
                    let reason = match response.compact_revision() {
                        0 => format!("the watch was cancelled: {}", response.cancel_reason()),
                        compacted => format!(
                            "the watch was cancelled: revision {} is compacted (up to {compacted})",
                            self.next_revision
                        ),
                    };
                    return Err(error::unavailable(reason));
                }
                Ok(Some(response)) => {
                    if response.created() {
                        self.retry.reset();
                    }
                    let events = response.events();
                    if let Some(last) = events
                        .iter()
                        .filter_map(|e| e.kv())
                        .map(|kv| kv.mod_revision())
                        .max()
                    {
                        self.next_revision = self.next_revision.max(last + 1);
                    }
                    if !events.is_empty() {
                        return Ok(events.to_vec());
                    }
                }
                Ok(None) => {
                    self.stream = None;
                    return Err(error::unavailable("the server closed the watch stream"));
                }
                Err(e) => {
                    self.stream = None;
                    return Err(error::from_client(e));
                }
            }
        }
    }

    /// Sleeps before the next attempt to re-establish the watch, longer after each failure.
    pub async fn pause(&mut self) {
        self.retry.pause().await;
    }

    /// Restarts the watch from `revision` (the revision of a fresh read, plus one).
    pub fn restart_at(&mut self, revision: i64) {
        self.stream = None;
        self.next_revision = revision;
    }

    async fn open(&self) -> Result<WatchStream> {
        let mut options = WatchOptions::new().with_start_revision(self.next_revision);
        if self.deletes_only {
            options = options.with_filters([WatchFilterType::NoPut]);
        }
        let target_options = |target: &Target| match target.prefix {
            true => options.clone().with_prefix(),
            false => options.clone(),
        };
        let Some((first, others)) = self.targets.split_first() else {
            return Err(error::store("nothing to watch"));
        };
        let mut watch = self.backend.inner.client.watch_client();
        let limit = self.backend.request_timeout();
        let mut stream = error::within(limit, "opening a watch", async {
            watch
                .watch(first.key.clone(), Some(target_options(first)))
                .await
        })
        .await?;
        for target in others {
            error::within(limit, "adding a watch", async {
                stream
                    .watch(target.key.clone(), Some(target_options(target)))
                    .await
            })
            .await?;
        }
        Ok(stream)
    }
}

/// Jittered exponential back-off from [`RETRY_INITIAL`] to [`RETRY_MAX`].
#[derive(Debug)]
pub(super) struct Retry {
    ceiling: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            ceiling: RETRY_INITIAL,
        }
    }
}

impl Retry {
    /// Sleeps for a random time in `[ceiling/2, ceiling]`, then doubles the ceiling.
    pub async fn pause(&mut self) {
        let half = self.ceiling / 2;
        let spread = u64::try_from((self.ceiling - half).as_micros()).unwrap_or(0);
        let delay = half + Duration::from_micros(fastrand::u64(0..=spread));
        self.ceiling = (self.ceiling * 2).min(RETRY_MAX);
        sleep(delay).await;
    }

    /// Starts over from the shortest pause.
    pub fn reset(&mut self) {
        self.ceiling = RETRY_INITIAL;
    }
}
