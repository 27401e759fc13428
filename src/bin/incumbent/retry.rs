//! One rule for every backend: a permanent error (a lock directory that cannot be made,
//! credentials the store refuses, an invalid configuration) ends the program at once, with
//! its exit code; a store that cannot be reached (`Error::Unavailable`, a timeout) is tried
//! again with back-off, until `--fail-after` (or `--timeout`) gives up with exit code 1.

use std::future::Future;
use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, sleep};

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

/// A store error without the library's "retrying with back-off", which this program says
/// (or does not) itself; [`tidy`]'d.
pub fn describe(error: &incumbent::Error) -> String {
    tidy(&match error {
        incumbent::Error::Unavailable { backend, reason } => {
            format!("{backend} is unavailable: {reason}")
        }
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
