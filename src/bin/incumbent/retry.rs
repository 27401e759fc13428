//! One rule for every backend: a permanent error (a lock directory that cannot be made,
//! credentials the store refuses, an invalid configuration, a certificate that does not
//! check out) ends the program at once, with its exit code; a store that cannot be reached
//! (`Error::Unavailable`, a timeout) is tried again with back-off, until `--fail-after` (or
//! `--timeout`) gives up with exit code 1. A host name that does not resolve is a store that
//! cannot be reached: DNS may be down for a while, or a new service's name not yet published,
//! and the OS reports both alike. Connecting is bounded by the same limit
//! ([`until_connected`]), so a backend whose own connect timeout is longer cannot keep the
//! program past it.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use incumbent::url::BackendUrl;
use serde_json::json;
use tokio::time::{Instant, sleep, sleep_until};

use crate::Failure;
use crate::messages::tidy;
use crate::report::{Reporter, human, millis};

/// The first delay between attempts; it doubles up to [`MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(5);

/// Whether an error of the library is worth retrying: the store could not be reached or did
/// not answer in time. Anything else is permanent.
pub fn is_transient(error: &incumbent::Error) -> bool {
    error.is_transient()
}

/// The store this program talks to, for messages: its URL as shown, and its addresses.
struct Store {
    shown: String,
    addresses: Vec<String>,
}

static STORE: OnceLock<Store> = OnceLock::new();

/// Names the store that "unavailable" messages are about: `url`, whose addresses are looked
/// for in the library's message (when none is there, the URL is added).
pub fn name_store(url: &BackendUrl) {
    let strip = |a: &String| {
        a.trim_start_matches("http://")
            .trim_start_matches("https://")
            .to_owned()
    };
    let addresses = match url {
        BackendUrl::Etcd { endpoints, .. } => endpoints.iter().map(strip).collect(),
        BackendUrl::Consul { address, .. } => vec![strip(address)],
        BackendUrl::Zookeeper { servers, .. } => servers.clone(),
        BackendUrl::Redis { address, .. } | BackendUrl::Memcached { address } => {
            vec![address.clone()]
        }
        _ => Vec::new(),
    };
    let _ = STORE.set(Store {
        shown: url.to_string(),
        addresses: addresses.into_iter().filter(|a| !a.is_empty()).collect(),
    });
}

/// A store error without the library's "retrying with back-off", which this program says
/// (or does not) itself, naming the store's address when the library's message does not;
/// [`tidy`]'d.
pub fn describe(error: &incumbent::Error) -> String {
    tidy(&match error {
        incumbent::Error::Unavailable { backend, reason } => match STORE.get() {
            Some(store)
                if !matches!(*backend, "memory" | "file")
                    && !store.addresses.iter().any(|a| reason.contains(a.as_str())) =>
            {
                format!("{backend} at {} is unavailable: {reason}", store.shown)
            }
            _ => format!("{backend} is unavailable: {reason}"),
        },
        other => other.to_string(),
    })
}

/// How long this program keeps trying a store that cannot be reached.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    /// Give up when the store has failed this long in a row (`None`: never).
    pub fail_after: Option<Duration>,
    /// The name of the option that set it, for messages.
    pub option: &'static str,
}

impl Patience {
    /// Runs `attempt` until it succeeds or fails permanently; transient failures are retried
    /// with back-off until the patience runs out (from `since`), then reported as exit code 1.
    pub async fn run<T, F, Fut>(
        &self,
        since: Instant,
        out: &Reporter,
        mut attempt: F,
    ) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, incumbent::Error>>,
    {
        let mut delay = FIRST_DELAY;
        loop {
            let error = match attempt().await {
                Ok(value) => return Ok(value),
                Err(error) if !is_transient(&error) => return Err(error.into()),
                Err(error) => error,
            };
            let message = describe(&error);
            let failing = since.elapsed();
            let wait = match self.fail_after {
                Some(limit) if failing >= limit => return Err(self.gave_up(failing, &message)),
                // The next attempt would come too late: give up when the time is up.
                Some(limit) if failing + delay >= limit => {
                    sleep(limit - failing).await;
                    return Err(self.gave_up(since.elapsed(), &message));
                }
                Some(_) | None => delay,
            };
            out.warn(
                "retrying",
                &format!("{message}; retrying in {}", human(wait)),
                json!({ "error": message, "retry_in_ms": millis(wait), "failing_ms": millis(failing) }),
            );
            sleep(wait).await;
            delay = (delay * 2).min(MAX_DELAY);
        }
    }

    /// The failure that ends the program when the store has failed for `failing`.
    pub fn gave_up(&self, failing: Duration, message: &str) -> Failure {
        Failure::Runtime(format!(
            "giving up after {} ({} {}): {message}",
            human(failing),
            self.option,
            human(self.fail_after.unwrap_or(failing)),
        ))
    }
}

/// Runs `attempt` (a connection and what follows it) but, while `connected` has not fired,
/// no later than `limit`: a store that neither answers nor fails (a name that takes long to
/// resolve, a connect timeout longer than the patience) cannot keep the program past its
/// `--fail-after`. Once connected, `attempt` runs as long as it takes.
pub async fn until_connected<T, Fut>(
    attempt: Fut,
    connected: tokio::sync::oneshot::Receiver<()>,
    limit: Option<Instant>,
    backend: &'static str,
) -> Result<T, incumbent::Error>
where
    Fut: Future<Output = Result<T, incumbent::Error>>,
{
    let Some(limit) = limit else {
        return attempt.await;
    };
    tokio::pin!(attempt);
    tokio::select! {
        biased;
        done = &mut attempt => return done,
        Ok(()) = connected => {}
        () = sleep_until(limit) => {
            return Err(incumbent::Error::Unavailable {
                backend,
                reason: "no answer while connecting".into(),
            });
        }
    }
    attempt.await
}
