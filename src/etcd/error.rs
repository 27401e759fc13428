//! How `etcd-client` errors map to [`Error`].

use std::future::Future;
use std::time::Duration;

use tokio::time::timeout;

use super::NAME;
use crate::Error;
use crate::error::chain;

/// gRPC status codes (stable across gRPC implementations), named where we act on them.
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const ABORTED: i32 = 10;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// Messages etcd sends with a code that does not say "auth" (e.g. `InvalidArgument`).
const AUTH_MESSAGES: &[&str] = &[
    "authentication failed",
    "invalid auth token",
    "user name is empty",
    "user name not found",
    "permission denied",
];

/// Messages of errors that a retry can cure, whatever their code.
const TRANSIENT_MESSAGES: &[&str] = &[
    "no leader",
    "leader changed",
    "request timed out",
    "too many requests",
    "transport",
    "connection",
    "broken pipe",
    "h2 protocol error",
];

/// Messages of TLS failures: the configuration is wrong, a retry cannot help.
const TLS_MESSAGES: &[&str] = &[
    "invalid peer certificate",
    "certificate verify",
    "handshake",
    "fatal alert",
];

/// Maps an `etcd-client` error to the crate's error type: transport trouble is
/// [`Error::Unavailable`] (transient), refused credentials [`Error::Unauthorized`], anything
/// else [`Error::Store`].
pub(super) fn from_client(error: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    match error {
        E::GRpcStatus(status) => {
            let code = status.code() as i32;
            let mut message = status.message().to_owned();
            if let Some(source) = std::error::Error::source(&status) {
                let detail = chain(source);
                if !message.contains(&detail) {
                    message = format!("{message}: {detail}");
                }
            }
            let lower = message.to_ascii_lowercase();
            if matches!(code, code::UNAUTHENTICATED | code::PERMISSION_DENIED)
                || AUTH_MESSAGES.iter().any(|m| lower.contains(m))
            {
                Error::Unauthorized {
                    backend: NAME,
                    reason: status.message().to_owned(),
                }
            } else if TLS_MESSAGES.iter().any(|m| lower.contains(m)) {
                tls_failure(&message)
            } else if matches!(
                code,
                code::UNAVAILABLE
                    | code::DEADLINE_EXCEEDED
                    | code::CANCELLED
                    | code::ABORTED
                    | code::RESOURCE_EXHAUSTED
            ) || (code == code::UNKNOWN
                && TRANSIENT_MESSAGES.iter().any(|m| lower.contains(m)))
            {
                unavailable(message)
            } else {
                store(message)
            }
        }
        E::TransportError(e) => {
            let message = chain(&e);
            if TLS_MESSAGES
                .iter()
                .any(|m| message.to_ascii_lowercase().contains(m))
            {
                tls_failure(&message)
            } else {
                unavailable(message)
            }
        }
        E::IoError(e) => unavailable(format!("I/O error: {e}")),
        E::WatchError(e) => unavailable(format!("watch stream failed: {e}")),
        E::LeaseKeepAliveError(e) => unavailable(format!("lease keep-alive stream failed: {e}")),
        E::InvalidArgs(e) => Error::InvalidConfig {
            backend: NAME,
            reason: e,
        },
        E::InvalidUri(e) => Error::InvalidConfig {
            backend: NAME,
            reason: format!("invalid endpoint URL: {e}; use http://host:port or https://host:port"),
        },
        other => store(other.to_string()),
    }
}

/// A TLS handshake that failed on the certificates: the configuration is wrong, so a retry
/// cannot help.
fn tls_failure(detail: &str) -> Error {
    Error::InvalidConfig {
        backend: NAME,
        reason: format!(
            "TLS handshake failed: {detail}; check that the CA certificate signed the servers' \
             certificates, that their names match the endpoints (or set .tls_domain_name()), \
             and, if etcd requires client certificates, that .client_identity() gives one its \
             CA signed"
        ),
    }
}

/// Whether the store said that a lease does not exist (expired or revoked).
pub(super) fn is_lease_not_found(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() as i32 == code::NOT_FOUND && status.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("lease not found"),
        _ => false,
    }
}

pub(super) fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: NAME,
        reason: reason.into(),
    }
}

pub(super) fn store(reason: impl Into<String>) -> Error {
    Error::Store {
        backend: NAME,
        reason: reason.into(),
    }
}

/// Runs one request with a time limit: a store that does not answer is unavailable.
///
/// The request's future (a few kilobytes for a gRPC call) is boxed before anything awaits it,
/// so that it takes memory only while the request runs: otherwise it would be inlined in
/// every future that awaits this one, and so in every campaign's task for as long as the
/// campaign runs.
pub(super) fn within<'a, T: 'a>(
    limit: Duration,
    what: &'a str,
    request: impl Future<Output = Result<T, etcd_client::Error>> + 'a,
) -> impl Future<Output = crate::Result<T>> + 'a {
    let request = Box::pin(request);
    async move {
        match timeout(limit, request).await {
            Ok(result) => result.map_err(from_client),
            Err(_) => Err(unavailable(format!("{what}: no answer within {limit:?}"))),
        }
    }
}
