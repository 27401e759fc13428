//! The crate's error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong in `incumbent`, with a variant per cause a caller can act on.
///
/// Builder errors ([`InvalidElectionName`](Error::InvalidElectionName),
/// [`InvalidTiming`](Error::InvalidTiming), ...) are returned by
/// [`ElectionBuilder::build`](crate::ElectionBuilder::build) and never change with retries.
/// Store errors say whether a retry can help: see [`Error::is_transient`]. The campaign retries
/// transient errors by itself, with back-off, and reports them in its
/// [`Status`](crate::Status); it backs off to the maximum delay on
/// [`Unauthorized`](Error::Unauthorized) so wrong credentials never cause a retry storm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The election name is empty, too long, or has a character the stores cannot hold.
    #[error(
        "invalid election name {name:?}: {reason}; use 1 to 128 characters from [A-Za-z0-9._-/], not starting or ending with '/'"
    )]
    InvalidElectionName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The candidate identity or its metadata is unusable.
    #[error("invalid candidate: {reason}")]
    InvalidCandidate {
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The durations of an election do not fit together or do not fit the store.
    #[error("invalid timing: {reason}")]
    InvalidTiming {
        /// Which setting is wrong, its value, and the allowed range.
        reason: String,
    },
    /// A sharded election's settings are out of range, or its group has no member slot left.
    #[error("invalid sharded election: {reason}")]
    InvalidSharding {
        /// What is wrong, and what to do.
        reason: String,
    },
    /// A backend's configuration (endpoint, URL, TLS material, directory) is unusable.
    #[error("invalid {backend} configuration: {reason}")]
    InvalidConfig {
        /// The backend, e.g. `"etcd"`.
        backend: &'static str,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// The store could not be reached or did not answer in time. Transient: a running
    /// campaign retries with back-off (its status says so); a backend's `connect` tries once
    /// and says so in `reason`.
    #[error("{backend} is unavailable: {reason}")]
    Unavailable {
        /// The backend, e.g. `"etcd"`.
        backend: &'static str,
        /// What failed.
        reason: String,
    },
    /// The store refused our credentials or their permissions. Not transient: fix the credentials.
    #[error(
        "{backend} refused the credentials: {reason}; check the user, password or token and its permissions on the election's keys"
    )]
    Unauthorized {
        /// The backend, e.g. `"consul"`.
        backend: &'static str,
        /// What the store said.
        reason: String,
    },
    /// The store answered something this crate does not understand, or rejected a request.
    #[error("{backend} error: {reason}")]
    Store {
        /// The backend, e.g. `"etcd"`.
        backend: &'static str,
        /// What happened.
        reason: String,
    },
    /// A local file operation of the file backend failed.
    #[error("file backend: {action} {path}: {source}")]
    Io {
        /// What was being done, e.g. `"cannot create the lock directory"`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The store accepts no writes on this connection: a PostgreSQL standby (in recovery),
    /// or a server or transaction that is read-only. Refused before any campaign writes.
    /// Transient: the campaign retries (a failover can make the server writable, and the next
    /// connection can reach another of the hosts given).
    #[error(
        "{backend}: the server accepts no writes here: {reason}; connect to the primary \
         (list every host in the URL: incumbent connects to the one that takes writes)"
    )]
    ReadOnly {
        /// The backend, e.g. `"postgres"`.
        backend: &'static str,
        /// What the server said.
        reason: String,
    },
    /// The campaign has shut down; start a new one with [`Election::campaign`](crate::Election::campaign).
    #[error("the campaign has shut down; call Election::campaign() to start a new one")]
    Stopped,
    /// Only the leader can do this, and this candidate does not lead (or its term ended while
    /// the request was under way).
    #[error(
        "this candidate does not lead the election; only the leader can proclaim (set the metadata of later campaigns with ElectionBuilder::metadata)"
    )]
    NotLeader,
    /// A hand-over ([`CampaignHandle::hand_over`](crate::CampaignHandle::hand_over)) was
    /// refused, or did not complete; the variant says why.
    #[error("hand-over: {0}")]
    HandOver(#[from] crate::switchover::HandOverError),
    /// A worker run by [`Election::run`](crate::Election::run) failed and the policy was to stop.
    #[error("the worker failed: {0}")]
    Worker(String),
    /// A wait did not finish within its limit.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The campaign's task panicked. It is a bug (in this crate, or in code it calls such as
    /// a `tracing` subscriber): the campaign ended the term, reports this in its status, and
    /// campaigns again after a back-off.
    #[error("the campaign's task panicked ({message}); campaigning again after a back-off")]
    CampaignPanicked {
        /// The panic's message.
        message: String,
    },
}

impl Error {
    /// An error of a backend's `connect`, which tries once: an unavailable store's message
    /// says that nothing retried, and what will.
    #[cfg_attr(
        not(any(
            feature = "etcd",
            feature = "zookeeper",
            feature = "redis",
            feature = "memcached",
            feature = "postgres"
        )),
        allow(dead_code)
    )]
    pub(crate) fn not_retried(self) -> Error {
        match self {
            Error::Unavailable { backend, reason } => Error::Unavailable {
                backend,
                reason: format!(
                    "{reason} (connect tried once and does not retry: call it again, or \
                     retry it with back-off; once connected, a campaign retries by itself)"
                ),
            },
            other => other,
        }
    }

    /// Whether retrying the same request later can succeed (the store was down or slow).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::ReadOnly { .. } | Error::Timeout(_)
        )
    }

    pub(crate) fn timing(reason: impl Into<String>) -> Self {
        Error::InvalidTiming {
            reason: reason.into(),
        }
    }
}

/// An error and its sources as one line, skipping a source whose text the line already holds
/// (client libraries often repeat their cause in their own message).
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

/// Shorthand for `Result<T, incumbent::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layer(message: &'static str, source: Option<Layer>) -> Layer {
        Layer {
            message,
            source: source.map(Box::new),
        }
    }

    #[test]
    fn a_chain_says_each_cause_once() {
        let inner = layer("connection refused", None);
        let middle = layer("tcp connect error: connection refused", Some(inner));
        let outer = layer("transport error", Some(middle));
        assert_eq!(
            chain(&outer),
            "transport error: tcp connect error: connection refused"
        );
    }
}
