//! Why a Consul request failed, and how an HTTP answer maps to that.

use reqwest::StatusCode;

/// How much of an error body is kept in a [`ConsulError`].
const MAX_ERROR_BODY: usize = 512;

/// Why a Consul request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsulError {
    /// The agent could not be reached or did not answer in time (connection
    /// refused or reset, DNS or TLS handshake failure, timeout). Transient.
    #[error(
        "Consul agent at {address} is unreachable during {operation}: {reason}{hint}",
        hint = unreachable_hint(.reason)
    )]
    Unreachable {
        /// What the client was doing, e.g. `"session renew"`.
        operation: &'static str,
        /// The agent's address (scheme, host and port).
        address: String,
        /// The transport error and its causes, e.g. `"error sending request:
        /// client error (Connect): tcp connect error: Connection refused"`.
        reason: String,
    },

    /// The TLS handshake failed: the agent's certificate is not trusted
    /// (wrong or missing `ca_pem`, wrong host name) or the agent refused the
    /// client certificate. Not transient: fix the TLS configuration.
    #[error(
        "TLS with the Consul agent at {address} failed during {operation}: {reason}; check \
         ca_pem (the CA that signed the agent's certificate), the address's host name and \
         client_identity_pem (required when the agent sets verify_incoming)"
    )]
    Tls {
        /// What the client was doing.
        operation: &'static str,
        /// The agent's address (scheme, host and port).
        address: String,
        /// The TLS error and its causes.
        reason: String,
    },

    /// Consul does not know the ACL token (HTTP 403 "ACL not found"). Not
    /// transient: retrying with the same token cannot succeed.
    #[error(
        "Consul rejected the ACL token during {operation} ({message}): check the ACL token \
         configured for incumbent; it is missing, mistyped, expired or deleted"
    )]
    Unauthorized {
        /// What the client was doing.
        operation: &'static str,
        /// Consul's message.
        message: String,
    },

    /// The ACL token lacks a permission (HTTP 403 "Permission denied"). Not
    /// transient.
    #[error(
        "Consul denied permission for {operation} ({message}): check the ACL token's policy; \
         leader election needs `session:write` on the agent's node and `key:write` on the \
         election key"
    )]
    PermissionDenied {
        /// What the client was doing.
        operation: &'static str,
        /// Consul's message.
        message: String,
    },

    /// The server failed (HTTP 5xx, e.g. "No cluster leader" during an
    /// election, or 429 when rate limited). Transient.
    #[error("Consul server error during {operation} (HTTP {status}): {body}{hint}", hint = hint(.body))]
    ServerError {
        /// What the client was doing.
        operation: &'static str,
        /// The HTTP status code.
        status: u16,
        /// The start of the response body.
        body: String,
    },

    /// Consul refused the request as invalid (HTTP 4xx, or one of the 500s
    /// that Consul 1.8 uses for invalid input such as a session TTL outside
    /// `[10s, 24h]`). Not transient: fix the configuration.
    #[error("Consul rejected {operation} as invalid (HTTP {status}): {body}{hint}", hint = hint(.body))]
    BadRequest {
        /// What the client was doing.
        operation: &'static str,
        /// The HTTP status code.
        status: u16,
        /// The start of the response body.
        body: String,
    },

    /// A lock operation named a session that does not exist (it expired or
    /// was destroyed). Not transient for that session: create a new one.
    #[error("Consul session {session} is invalid or gone during {operation}: create a new session")]
    InvalidSession {
        /// What the client was doing.
        operation: &'static str,
        /// The session id.
        session: String,
    },

    /// The response could not be decoded (malformed JSON, missing
    /// `X-Consul-Index`, bad base64). Not transient.
    #[error("undecodable Consul response to {operation}: {reason}")]
    InvalidResponse {
        /// What the client was doing.
        operation: &'static str,
        /// What was wrong.
        reason: String,
    },

    /// The client configuration is invalid (bad address, bad TLS PEM, bad
    /// token characters, bad key). Not transient.
    #[error("invalid Consul client configuration: {0}")]
    InvalidConfig(String),
}

impl ConsulError {
    /// Whether retrying the same request later may succeed: true for
    /// [`Unreachable`](Self::Unreachable) and
    /// [`ServerError`](Self::ServerError), false for everything that needs a
    /// change (of token, configuration or session) first.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable { .. } | Self::ServerError { .. })
    }
}

/// Advice for Consul error messages whose fix is not obvious.
fn hint(body: &str) -> &'static str {
    if body.contains("Invalid Session TTL") {
        "; the session TTL must be between 10s and 24h (Consul's session_ttl_min may raise the minimum)"
    } else if body.contains("Missing check") {
        "; the check is not (yet) registered on the agent: right after an agent starts this \
         resolves itself, otherwise fix the session's check ids"
    } else if body.contains("No cluster leader") {
        "; the Consul servers are electing a leader or have lost quorum"
    } else if body.contains("Namespaces are a Consul Enterprise feature") {
        "; do not set a namespace when talking to open-source Consul"
    } else if body.contains("UUID must be 36 characters") {
        "; session ids are 36-character UUIDs as returned by session create"
    } else {
        ""
    }
}

/// Advice for a connection the agent closed without an answer: what an agent does (Consul
/// before 1.9 without even a 429) to the connections of a client address beyond
/// `limits.http_max_conns_per_client`, and every follower holds one for its blocking query.
fn unreachable_hint(reason: &str) -> &'static str {
    let closed = [
        "connection closed before message completed",
        "Connection reset by peer",
    ];
    if closed.iter().any(|m| reason.contains(m)) {
        "; if this process runs many elections: the agent closes a client's connections \
         beyond limits.http_max_conns_per_client (200 by default) without an answer, and \
         each election waiting for its leader holds one (its blocking query), so raise that \
         limit in the agent's configuration"
    } else {
        ""
    }
}

/// Maps a non-success, non-404 status to an error.
pub(super) fn classify_failure(
    operation: &'static str,
    status: StatusCode,
    body: &[u8],
) -> ConsulError {
    let body = error_body(body);
    let acl_not_found = body.contains("ACL not found");
    let permission_denied = body.contains("Permission denied");
    if status == StatusCode::FORBIDDEN || acl_not_found || permission_denied {
        return if acl_not_found {
            ConsulError::Unauthorized {
                operation,
                message: body,
            }
        } else {
            ConsulError::PermissionDenied {
                operation,
                message: body,
            }
        };
    }
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        // Consul 1.8 answers some invalid input with a 500. ("Missing check"
        // is not among them: a freshly started agent says it about its own
        // `serfHealth` until the check is registered.)
        let invalid_input = ["Invalid Session TTL", "UUID must be 36 characters"];
        if status == StatusCode::INTERNAL_SERVER_ERROR
            && invalid_input.iter().any(|m| body.contains(m))
        {
            return ConsulError::BadRequest {
                operation,
                status: status.as_u16(),
                body,
            };
        }
        return ConsulError::ServerError {
            operation,
            status: status.as_u16(),
            body,
        };
    }
    ConsulError::BadRequest {
        operation,
        status: status.as_u16(),
        body,
    }
}

/// The start of a body, as trimmed text, for error messages.
pub(super) fn error_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.len() <= MAX_ERROR_BODY {
        return text.to_owned();
    }
    let mut end = MAX_ERROR_BODY;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_failures() {
        let e = classify_failure("x", StatusCode::FORBIDDEN, b"ACL not found");
        assert!(matches!(e, ConsulError::Unauthorized { .. }));
        assert!(!e.is_transient());
        assert!(e.to_string().contains("check the ACL token"));
        let e = classify_failure("x", StatusCode::FORBIDDEN, b"Permission denied");
        assert!(matches!(e, ConsulError::PermissionDenied { .. }));
        assert!(e.to_string().contains("check the ACL token"));
        let e = classify_failure("x", StatusCode::INTERNAL_SERVER_ERROR, b"No cluster leader");
        assert!(matches!(e, ConsulError::ServerError { status: 500, .. }));
        assert!(e.is_transient());
        let e = classify_failure(
            "x",
            StatusCode::INTERNAL_SERVER_ERROR,
            b"Invalid Session TTL '1000000000', must be between [10s=24h0m0s]",
        );
        assert!(matches!(e, ConsulError::BadRequest { status: 500, .. }));
        assert!(!e.is_transient());
        assert!(e.to_string().contains("between 10s and 24h"), "{e}");
        let e = classify_failure("x", StatusCode::BAD_REQUEST, b"Invalid wait time");
        assert!(matches!(e, ConsulError::BadRequest { status: 400, .. }));
        let e = classify_failure(
            "x",
            StatusCode::INTERNAL_SERVER_ERROR,
            b"Missing check 'serfHealth' registration",
        );
        assert!(e.is_transient());
        assert!(e.to_string().contains("not (yet) registered"), "{e}");
        let e = classify_failure("x", StatusCode::TOO_MANY_REQUESTS, b"");
        assert!(e.is_transient());
    }
}
