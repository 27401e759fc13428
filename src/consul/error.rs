//! How [`ConsulError`]s map to the crate's [`Error`].

use super::NAME;
use super::client::ConsulError;
use crate::Error;

/// Maps a client error to the crate's error type: an agent that cannot be reached or a
/// server that fails is [`Error::Unavailable`] (transient, retried); a refused ACL token is
/// [`Error::Unauthorized`] (no retry storm); a request Consul refuses as invalid is
/// [`Error::InvalidTiming`] (a session ttl) or [`Error::InvalidConfig`]; anything else is
/// [`Error::Store`]. No message carries the ACL token: the client never puts it in one.
pub(super) fn from_client(error: ConsulError) -> Error {
    let reason = error.to_string();
    match error {
        ConsulError::Unreachable { .. } | ConsulError::ServerError { .. } => Error::Unavailable {
            backend: NAME,
            reason,
        },
        ConsulError::Unauthorized { .. } | ConsulError::PermissionDenied { .. } => {
            Error::Unauthorized {
                backend: NAME,
                reason: format!(
                    "{reason}; the token needs `key:write` on the election keys and \
                     `session:write` on the agent's node"
                ),
            }
        }
        ConsulError::BadRequest { ref body, .. } if body.contains("Invalid Session TTL") => {
            Error::InvalidTiming {
                reason: format!("{reason}; choose a .ttl() that Consul accepts"),
            }
        }
        ConsulError::BadRequest { .. }
        | ConsulError::InvalidConfig(_)
        | ConsulError::Tls { .. } => Error::InvalidConfig {
            backend: NAME,
            reason,
        },
        ConsulError::InvalidSession { .. } | ConsulError::InvalidResponse { .. } => Error::Store {
            backend: NAME,
            reason,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_kind_of_failure() {
        let e = from_client(ConsulError::Unreachable {
            operation: "kv get",
            address: "http://127.0.0.1:1".into(),
            reason: "connection refused".into(),
        });
        assert!(
            matches!(e, Error::Unavailable { .. }) && e.is_transient(),
            "{e}"
        );
        let e = from_client(ConsulError::ServerError {
            operation: "kv put",
            status: 500,
            body: "No cluster leader".into(),
        });
        assert!(
            matches!(e, Error::Unavailable { .. }) && e.is_transient(),
            "{e}"
        );
        let e = from_client(ConsulError::PermissionDenied {
            operation: "session create",
            message: "Permission denied".into(),
        });
        assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("check the ACL token") && text.contains("session:write"),
            "{text}"
        );
        let e = from_client(ConsulError::Unauthorized {
            operation: "session create",
            message: "ACL not found".into(),
        });
        assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
        let e = from_client(ConsulError::BadRequest {
            operation: "session create",
            status: 500,
            body: "Invalid Session TTL '1000000000', must be between [10s=24h0m0s]".into(),
        });
        assert!(matches!(e, Error::InvalidTiming { .. }), "{e}");
        let e = from_client(ConsulError::BadRequest {
            operation: "kv get",
            status: 400,
            body: "Namespaces are a Consul Enterprise feature".into(),
        });
        assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
        let e = from_client(ConsulError::Tls {
            operation: "kv get",
            address: "https://127.0.0.1:8501".into(),
            reason: "invalid peer certificate".into(),
        });
        assert!(
            matches!(e, Error::InvalidConfig { .. }) && !e.is_transient(),
            "{e}"
        );
        let e = from_client(ConsulError::InvalidConfig("bad address".into()));
        assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
        let e = from_client(ConsulError::InvalidSession {
            operation: "kv put",
            session: "x".into(),
        });
        assert!(matches!(e, Error::Store { .. }), "{e}");
    }
}
