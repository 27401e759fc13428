//! A thin, typed async client for the parts of the Consul HTTP API that leader
//! election needs: sessions, the KV store (with blocking queries, `acquire`,
//! `release` and check-and-set) and the leader status.
//!
//! The client speaks HTTP/1.1 through `reqwest` with rustls, sends the ACL
//! token in the `X-Consul-Token` header and never retries on its own: every
//! failure is a [`ConsulError`] whose [`is_transient`](ConsulError::is_transient)
//! tells the caller whether trying again can help.
//!
//! ```no_run
//! # async fn demo() -> Result<(), incumbent::consul::client::ConsulError> {
//! use std::time::Duration;
//! use incumbent::consul::client::{ConsulClient, ConsulConfig, PutOptions, SessionCreate};
//!
//! let client = ConsulClient::new(ConsulConfig::new("http://127.0.0.1:8500"))?;
//! let session = client
//!     .session_create(&SessionCreate {
//!         name: "my-service".into(),
//!         ttl: Some(Duration::from_secs(10)),
//!         lock_delay: Some(Duration::ZERO),
//!         node_checks: Some(Vec::new()),
//!         ..SessionCreate::default()
//!     })
//!     .await?;
//! let acquired = client
//!     .kv_put("service/my-service/leader", b"me", &PutOptions {
//!         acquire: Some(session.clone()),
//!         ..PutOptions::default()
//!     })
//!     .await?;
//! # let _ = acquired;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use url::Url;

/// The request timeout used when none is configured.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest blocking-query wait Consul honours; longer waits are capped by
/// the server.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// The name of the header carrying the ACL token.
const TOKEN_HEADER: &str = "X-Consul-Token";

/// The name of the header carrying the Raft index of a read.
const INDEX_HEADER: &str = "X-Consul-Index";

/// Texts in a transport error chain that mean a TLS configuration problem.
const TLS_FAILURES: [&str; 4] = [
    "invalid peer certificate",
    "received fatal alert",
    "peer is incompatible",
    "peer misbehaved",
];

/// How much of an error body is kept in a [`ConsulError`].
const MAX_ERROR_BODY: usize = 512;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a Consul request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsulError {
    /// The agent could not be reached or did not answer in time (connection
    /// refused or reset, DNS or TLS handshake failure, timeout). Transient.
    #[error("Consul agent at {address} is unreachable during {operation}: {reason}")]
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

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// How to reach and authenticate to a Consul agent. Build it with
/// [`ConsulConfig::new`] and the builder methods, then pass it to
/// [`ConsulClient::new`].
///
/// `Debug` output redacts the ACL token and the TLS private key.
#[derive(Clone)]
pub struct ConsulConfig {
    address: String,
    token: Option<String>,
    datacenter: Option<String>,
    namespace: Option<String>,
    ca_pem: Option<Vec<u8>>,
    client_identity_pem: Option<Vec<u8>>,
    request_timeout: Duration,
}

impl ConsulConfig {
    /// A configuration for the agent at `address`, e.g.
    /// `"http://127.0.0.1:8500"` or `"https://consul.internal:8501"`. An
    /// address without a scheme (`"127.0.0.1:8500"`) means `http://`. A path
    /// (for a reverse proxy) is kept as the prefix of `/v1/...`.
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            token: None,
            datacenter: None,
            namespace: None,
            ca_pem: None,
            client_identity_pem: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// The ACL token, sent as `X-Consul-Token` with every request.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The datacenter to address (`?dc=`); the agent's own when unset.
    pub fn datacenter(mut self, datacenter: impl Into<String>) -> Self {
        self.datacenter = Some(datacenter.into());
        self
    }

    /// The namespace for session and KV requests (`?ns=`). Consul
    /// Enterprise only: open-source Consul answers any `ns` parameter, even
    /// `default`, with HTTP 400, so leave it unset there.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// PEM-encoded CA certificates to trust for `https://` addresses. When
    /// set, only these roots are trusted (like Consul's `CONSUL_CACERT`);
    /// otherwise the platform's roots are used.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// The client certificate (chain) and its private key, both PEM, for
    /// agents with `verify_incoming` (like Consul's `CONSUL_CLIENT_CERT` and
    /// `CONSUL_CLIENT_KEY`). The key may be PKCS#8, PKCS#1 (RSA) or SEC1 (EC,
    /// as `consul tls cert create` writes).
    pub fn client_identity_pem(
        mut self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Self {
        let (cert, key) = (cert_pem.as_ref(), key_pem.as_ref());
        let mut pem = Vec::with_capacity(cert.len() + key.len() + 1);
        pem.extend_from_slice(cert);
        pem.push(b'\n');
        pem.extend_from_slice(key);
        self.client_identity_pem = Some(pem);
        self
    }

    /// The time limit of one request (connect, send, receive), default
    /// [`DEFAULT_REQUEST_TIMEOUT`]. Blocking queries get their `wait` plus
    /// Consul's jitter on top of it.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The configured agent address, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The configured datacenter.
    pub fn datacenter_name(&self) -> Option<&str> {
        self.datacenter.as_deref()
    }

    /// The configured namespace.
    pub fn namespace_name(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The configured request timeout.
    pub fn timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Whether an ACL token is configured (the token itself is not exposed).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }
}

impl Default for ConsulConfig {
    /// The local agent's default address, `http://127.0.0.1:8500`.
    fn default() -> Self {
        Self::new("http://127.0.0.1:8500")
    }
}

impl fmt::Debug for ConsulConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulConfig")
            .field("address", &crate::url::redact(&self.address))
            .field("token", &self.token.as_ref().map(|_| Redacted))
            .field("datacenter", &self.datacenter)
            .field("namespace", &self.namespace)
            .field(
                "ca_pem",
                &self.ca_pem.as_ref().map(|pem| ByteCount(pem.len())),
            )
            .field(
                "client_identity_pem",
                &self.client_identity_pem.as_ref().map(|_| Redacted),
            )
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// Prints `<redacted>` in place of a secret.
struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Prints `<N bytes>` in place of a blob.
struct ByteCount(usize);

impl fmt::Debug for ByteCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0)
    }
}

// ---------------------------------------------------------------------------
// Request and response types
// ---------------------------------------------------------------------------

/// What Consul does with the locks a session holds when it is invalidated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SessionBehavior {
    /// Release the locks, keeping the keys (Consul's default).
    #[default]
    Release,
    /// Delete the locked keys.
    Delete,
}

impl SessionBehavior {
    fn as_str(self) -> &'static str {
        match self {
            Self::Release => "release",
            Self::Delete => "delete",
        }
    }
}

/// The parameters of [`ConsulClient::session_create`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionCreate {
    /// A human-readable name (may be empty).
    pub name: String,
    /// The session TTL; Consul requires `[10s, 24h]` and invalidates the
    /// session some time after `ttl` without a renewal (up to twice the TTL).
    /// `None`: no TTL, the session lives until its checks fail or it is
    /// destroyed.
    pub ttl: Option<Duration>,
    /// How long Consul refuses to let another session acquire a lock this
    /// session held when it is invalidated. `None` means Consul's default of
    /// 15 s; `Some(Duration::ZERO)` is sent as `"0s"` and disables the delay.
    pub lock_delay: Option<Duration>,
    /// What happens to held locks when the session is invalidated.
    pub behavior: SessionBehavior,
    /// Node health checks tied to the session. `None` means Consul's default
    /// (`["serfHealth"]`); `Some(vec![])` ties the session to no node check,
    /// leaving only the TTL.
    pub node_checks: Option<Vec<String>>,
    /// Ids of service checks tied to the session (Consul 1.7+).
    pub service_checks: Option<Vec<String>>,
}

/// A session as Consul reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// The session id (a UUID).
    pub id: String,
    /// The session name.
    pub name: String,
    /// The node the session belongs to.
    pub node: String,
    /// The lock delay (Consul reports it in nanoseconds).
    pub lock_delay: Duration,
    /// What happens to held locks when the session is invalidated.
    pub behavior: SessionBehavior,
    /// The TTL, `None` when the session has none.
    pub ttl: Option<Duration>,
    /// The node checks tied to the session.
    pub node_checks: Vec<String>,
    /// The ids of the service checks tied to the session.
    pub service_checks: Vec<String>,
    /// The Raft index that created the session.
    pub create_index: u64,
    /// The Raft index that last modified the session.
    pub modify_index: u64,
}

/// Read options for [`ConsulClient::kv_get`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryOptions {
    /// Makes the read a blocking query: Consul answers when the key's index
    /// exceeds this one, or after `wait`. Pass the previous
    /// [`KvResponse::index`]; if an answer's index goes backwards (a snapshot
    /// restore), restart from 0. Do not pass 0 as a blocking index: it does
    /// not block.
    pub index: Option<u64>,
    /// The longest a blocking query waits (Consul's default is 5 min, its
    /// maximum 10 min; Consul adds up to `wait / 16` of jitter). Only
    /// meaningful with `index`.
    pub wait: Option<Duration>,
    /// Use the `consistent` read mode (the leader verifies it still leads
    /// before answering) instead of the default mode.
    pub consistent: bool,
}

/// Write options for [`ConsulClient::kv_put`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// Acquire the key's lock for this session (`?acquire=`): succeeds when
    /// the key is unlocked (and no lock delay applies) or already held by
    /// this session.
    pub acquire: Option<String>,
    /// Release the key's lock held by this session (`?release=`).
    pub release: Option<String>,
    /// Check-and-set: write only if the key's `ModifyIndex` is this (0: only
    /// if the key does not exist).
    pub cas: Option<u64>,
    /// Opaque flags stored with the key.
    pub flags: Option<u64>,
}

/// A KV entry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvEntry {
    /// The full key.
    pub key: String,
    /// The value (Consul's base64 decoded; empty for a null value).
    pub value: Vec<u8>,
    /// The opaque flags.
    pub flags: u64,
    /// The session holding the key's lock, if any.
    pub session: Option<String>,
    /// The Raft index that created the key.
    pub create_index: u64,
    /// The Raft index that last modified the key.
    pub modify_index: u64,
    /// How many times the lock has been acquired.
    pub lock_index: u64,
}

/// The answer to [`ConsulClient::kv_get`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvResponse {
    /// The `X-Consul-Index` of the answer, also when the key does not exist;
    /// pass it as [`QueryOptions::index`] to wait for the next change.
    pub index: u64,
    /// The entry, `None` when the key does not exist.
    pub entry: Option<KvEntry>,
}

// Wire formats.

#[derive(Serialize)]
struct SessionCreateBody<'a> {
    #[serde(rename = "Name")]
    name: &'a str,
    #[serde(rename = "TTL", skip_serializing_if = "Option::is_none")]
    ttl: Option<String>,
    #[serde(rename = "LockDelay", skip_serializing_if = "Option::is_none")]
    lock_delay: Option<String>,
    #[serde(rename = "Behavior")]
    behavior: &'static str,
    #[serde(rename = "NodeChecks", skip_serializing_if = "Option::is_none")]
    node_checks: Option<&'a [String]>,
    #[serde(rename = "ServiceChecks", skip_serializing_if = "Option::is_none")]
    service_checks: Option<Vec<ServiceCheckWire<'a>>>,
}

#[derive(Serialize)]
struct ServiceCheckWire<'a> {
    #[serde(rename = "ID")]
    id: &'a str,
}

#[derive(Deserialize)]
struct SessionCreated {
    #[serde(rename = "ID")]
    id: String,
}

#[derive(Deserialize)]
struct SessionWire {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Node", default)]
    node: String,
    #[serde(rename = "LockDelay", default)]
    lock_delay: Option<serde_json::Value>,
    #[serde(rename = "Behavior", default)]
    behavior: String,
    #[serde(rename = "TTL", default)]
    ttl: Option<String>,
    #[serde(rename = "NodeChecks", default)]
    node_checks: Option<Vec<String>>,
    // Consul before 1.7 reports node checks as `Checks`.
    #[serde(rename = "Checks", default)]
    checks: Option<Vec<String>>,
    #[serde(rename = "ServiceChecks", default)]
    service_checks: Option<Vec<ServiceCheckRead>>,
    #[serde(rename = "CreateIndex", default)]
    create_index: u64,
    #[serde(rename = "ModifyIndex", default)]
    modify_index: u64,
}

#[derive(Deserialize)]
struct ServiceCheckRead {
    #[serde(rename = "ID")]
    id: String,
}

#[derive(Deserialize)]
struct KvWire {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Value", default)]
    value: Option<String>,
    #[serde(rename = "Flags", default)]
    flags: u64,
    #[serde(rename = "Session", default)]
    session: Option<String>,
    #[serde(rename = "CreateIndex", default)]
    create_index: u64,
    #[serde(rename = "ModifyIndex", default)]
    modify_index: u64,
    #[serde(rename = "LockIndex", default)]
    lock_index: u64,
}

impl SessionWire {
    fn into_info(self, operation: &'static str) -> Result<SessionInfo, ConsulError> {
        let invalid = |reason: String| ConsulError::InvalidResponse { operation, reason };
        let lock_delay = match self.lock_delay {
            None | Some(serde_json::Value::Null) => Duration::ZERO,
            // Consul encodes a Go time.Duration: integer nanoseconds.
            Some(serde_json::Value::Number(n)) => n
                .as_u64()
                .map(Duration::from_nanos)
                .ok_or_else(|| invalid(format!("LockDelay {n} is not a non-negative integer")))?,
            Some(serde_json::Value::String(s)) => parse_go_duration(&s)
                .ok_or_else(|| invalid(format!("LockDelay {s:?} is not a duration")))?,
            Some(other) => return Err(invalid(format!("LockDelay {other} is not a duration"))),
        };
        let ttl = match self.ttl.as_deref() {
            None | Some("") => None,
            Some(s) => Some(
                parse_go_duration(s)
                    .ok_or_else(|| invalid(format!("TTL {s:?} is not a duration")))?,
            ),
        };
        let behavior = match self.behavior.as_str() {
            "" | "release" => SessionBehavior::Release,
            "delete" => SessionBehavior::Delete,
            other => return Err(invalid(format!("unknown session Behavior {other:?}"))),
        };
        Ok(SessionInfo {
            id: self.id,
            name: self.name,
            node: self.node,
            lock_delay,
            behavior,
            ttl,
            node_checks: self.node_checks.or(self.checks).unwrap_or_default(),
            service_checks: self
                .service_checks
                .unwrap_or_default()
                .into_iter()
                .map(|check| check.id)
                .collect(),
            create_index: self.create_index,
            modify_index: self.modify_index,
        })
    }
}

impl KvWire {
    fn into_entry(self, operation: &'static str) -> Result<KvEntry, ConsulError> {
        let value = match self.value {
            None => Vec::new(),
            Some(encoded) => {
                base64_decode(&encoded).ok_or_else(|| ConsulError::InvalidResponse {
                    operation,
                    reason: format!("the value of key {:?} is not valid base64", self.key),
                })?
            }
        };
        Ok(KvEntry {
            key: self.key,
            value,
            flags: self.flags,
            session: self.session.filter(|s| !s.is_empty()),
            create_index: self.create_index,
            modify_index: self.modify_index,
            lock_index: self.lock_index,
        })
    }
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// An async Consul HTTP API client. Cloning is cheap (it shares the
/// connection pool). `Debug` output redacts the ACL token.
#[derive(Clone)]
pub struct ConsulClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// The base URL, its path ending in `/`.
    base: Url,
    /// Scheme, host and port, for error messages.
    display_address: String,
    has_token: bool,
    datacenter: Option<String>,
    namespace: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for ConsulClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("ConsulClient")
            .field("address", &inner.display_address)
            .field("token", &inner.has_token.then_some(Redacted))
            .field("datacenter", &inner.datacenter)
            .field("namespace", &inner.namespace)
            .field("request_timeout", &inner.timeout)
            .finish()
    }
}

/// What the query string of a request gets besides its own parameters.
#[derive(Clone, Copy)]
enum Scope {
    /// `dc` only (status endpoints).
    Datacenter,
    /// `dc` and `ns` (session and KV endpoints).
    Namespaced,
}

/// A decoded HTTP answer: status, index header, body.
struct Answer {
    status: StatusCode,
    index: Option<u64>,
    body: Vec<u8>,
}

impl ConsulClient {
    /// Builds a client. Fails with [`ConsulError::InvalidConfig`] for an
    /// unparsable address, an unsupported scheme, credentials in the address,
    /// a token that is not a valid header value, or unusable TLS PEM.
    pub fn new(config: ConsulConfig) -> Result<Self, ConsulError> {
        let base = parse_address(&config.address)?;
        let display_address = match base.port() {
            Some(port) => format!(
                "{}://{}:{port}",
                base.scheme(),
                base.host_str().unwrap_or("")
            ),
            None => format!("{}://{}", base.scheme(), base.host_str().unwrap_or("")),
        };

        let mut headers = HeaderMap::new();
        if let Some(token) = &config.token {
            let mut value = HeaderValue::from_str(token).map_err(|_| {
                ConsulError::InvalidConfig(
                    "the ACL token contains characters not allowed in an HTTP header".into(),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(TOKEN_HEADER, value);
        }

        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("incumbent/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.request_timeout)
            .tcp_nodelay(true)
            .no_proxy();
        if let Some(pem) = &config.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| ConsulError::InvalidConfig(format!("ca_pem is not valid PEM: {e}")))?;
            if certs.is_empty() {
                return Err(ConsulError::InvalidConfig(
                    "ca_pem contains no certificate".into(),
                ));
            }
            builder = builder.tls_certs_only(certs);
        }
        if let Some(pem) = &config.client_identity_pem {
            // The error text of reqwest does not include key material.
            let identity = reqwest::Identity::from_pem(pem).map_err(|e| {
                ConsulError::InvalidConfig(format!(
                    "client_identity_pem must hold a certificate and its private key in PEM: {e}"
                ))
            })?;
            builder = builder.identity(identity);
        }
        let http = builder.build().map_err(|e| {
            ConsulError::InvalidConfig(format!("cannot build the HTTP client: {e}"))
        })?;

        Ok(Self {
            inner: Arc::new(Inner {
                http,
                base,
                display_address,
                has_token: config.token.is_some(),
                datacenter: config.datacenter.filter(|dc| !dc.is_empty()),
                namespace: config.namespace.filter(|ns| !ns.is_empty()),
                timeout: config.request_timeout,
            }),
        })
    }

    /// The agent address in use (scheme, host and port).
    pub fn address(&self) -> &str {
        &self.inner.display_address
    }

    // --- Sessions ----------------------------------------------------------

    /// Creates a session (`PUT /v1/session/create`) and returns its id.
    pub async fn session_create(&self, params: &SessionCreate) -> Result<String, ConsulError> {
        const OP: &str = "session create";
        let body = SessionCreateBody {
            name: &params.name,
            ttl: params.ttl.map(format_go_duration),
            lock_delay: params.lock_delay.map(format_go_duration),
            behavior: params.behavior.as_str(),
            node_checks: params.node_checks.as_deref(),
            service_checks: params
                .service_checks
                .as_ref()
                .map(|ids| ids.iter().map(|id| ServiceCheckWire { id }).collect()),
        };
        let body =
            serde_json::to_vec(&body).map_err(|e| ConsulError::InvalidConfig(e.to_string()))?;
        let url = self.url(&["session", "create"], Scope::Namespaced, &[])?;
        let answer = self
            .send(OP, Method::PUT, url, Some(body), self.inner.timeout)
            .await?;
        let created: SessionCreated = self.decode_ok(OP, answer)?;
        Ok(created.id)
    }

    /// Renews a session's TTL (`PUT /v1/session/renew/:id`). Returns `None`
    /// when Consul no longer knows the session (it expired or was
    /// destroyed): create a new one.
    pub async fn session_renew(&self, id: &str) -> Result<Option<SessionInfo>, ConsulError> {
        const OP: &str = "session renew";
        let url = self.url(&["session", "renew", id], Scope::Namespaced, &[])?;
        let answer = self
            .send(OP, Method::PUT, url, None, self.inner.timeout)
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let sessions: Vec<SessionWire> = self.decode_ok(OP, answer)?;
        sessions
            .into_iter()
            .next()
            .map(|s| s.into_info(OP))
            .transpose()
    }

    /// Destroys a session (`PUT /v1/session/destroy/:id`), releasing or
    /// deleting its locks per its behavior. Destroying an unknown session
    /// succeeds.
    pub async fn session_destroy(&self, id: &str) -> Result<(), ConsulError> {
        const OP: &str = "session destroy";
        let url = self.url(&["session", "destroy", id], Scope::Namespaced, &[])?;
        let answer = self
            .send(OP, Method::PUT, url, None, self.inner.timeout)
            .await?;
        let _: serde_json::Value = self.decode_ok(OP, answer)?;
        Ok(())
    }

    /// Reads a session (`GET /v1/session/info/:id`); `None` when it does not
    /// exist.
    pub async fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, ConsulError> {
        const OP: &str = "session info";
        let url = self.url(&["session", "info", id], Scope::Namespaced, &[])?;
        let answer = self
            .send(OP, Method::GET, url, None, self.inner.timeout)
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let sessions: Option<Vec<SessionWire>> = self.decode_ok(OP, answer)?;
        sessions
            .unwrap_or_default()
            .into_iter()
            .next()
            .map(|s| s.into_info(OP))
            .transpose()
    }

    // --- KV ----------------------------------------------------------------

    /// Reads a key (`GET /v1/kv/:key`), optionally as a blocking query. The
    /// answer carries Consul's index even when the key does not exist, so a
    /// caller can block until it appears.
    pub async fn kv_get(
        &self,
        key: &str,
        options: &QueryOptions,
    ) -> Result<KvResponse, ConsulError> {
        const OP: &str = "kv get";
        let mut query: Vec<(&str, Option<String>)> = Vec::new();
        let mut timeout = self.inner.timeout;
        if let Some(index) = options.index {
            query.push(("index", Some(index.to_string())));
            // Consul waits up to `wait` plus `wait / 16` of jitter, 5 min by
            // default, at most 10 min.
            let wait = options
                .wait
                .unwrap_or(Duration::from_secs(300))
                .min(MAX_WAIT);
            timeout = timeout.saturating_add(wait).saturating_add(wait / 16);
        }
        if let Some(wait) = options.wait {
            query.push(("wait", Some(format_go_duration(wait.min(MAX_WAIT)))));
        }
        if options.consistent {
            query.push(("consistent", None));
        }
        let url = self.kv_url(OP, key, &query)?;
        let answer = self.send(OP, Method::GET, url, None, timeout).await?;
        let index = answer.index.ok_or_else(|| ConsulError::InvalidResponse {
            operation: OP,
            reason: format!("missing or malformed {INDEX_HEADER} header"),
        })?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(KvResponse { index, entry: None });
        }
        let entries: Option<Vec<KvWire>> = self.decode_ok(OP, answer)?;
        let entry = entries
            .unwrap_or_default()
            .into_iter()
            .next()
            .map(|e| e.into_entry(OP))
            .transpose()?;
        Ok(KvResponse { index, entry })
    }

    /// Writes a key (`PUT /v1/kv/:key`). Returns Consul's verdict: `false`
    /// when an `acquire` found the lock held by another session or inside a
    /// lock delay, a `release` named a session not holding the lock, or a
    /// `cas` index did not match. An `acquire` or `release` naming a session
    /// Consul does not know fails with [`ConsulError::InvalidSession`].
    pub async fn kv_put(
        &self,
        key: &str,
        value: &[u8],
        options: &PutOptions,
    ) -> Result<bool, ConsulError> {
        const OP: &str = "kv put";
        let mut query: Vec<(&str, Option<String>)> = Vec::new();
        if let Some(session) = &options.acquire {
            query.push(("acquire", Some(session.clone())));
        }
        if let Some(session) = &options.release {
            query.push(("release", Some(session.clone())));
        }
        if let Some(cas) = options.cas {
            query.push(("cas", Some(cas.to_string())));
        }
        if let Some(flags) = options.flags {
            query.push(("flags", Some(flags.to_string())));
        }
        let url = self.kv_url(OP, key, &query)?;
        let answer = self
            .send(
                OP,
                Method::PUT,
                url,
                Some(value.to_vec()),
                self.inner.timeout,
            )
            .await;
        let session = options.acquire.as_ref().or(options.release.as_ref());
        let answer = match (answer, session) {
            (Err(ConsulError::ServerError { body, .. }), Some(session))
                if body.starts_with("invalid session") =>
            {
                return Err(ConsulError::InvalidSession {
                    operation: OP,
                    session: session.clone(),
                });
            }
            (other, _) => other?,
        };
        self.decode_ok(OP, answer)
    }

    /// Deletes a key (`DELETE /v1/kv/:key`), only if its `ModifyIndex` is
    /// `cas` when given. Returns Consul's verdict (`true` also when the key
    /// did not exist and no `cas` was given).
    pub async fn kv_delete(&self, key: &str, cas: Option<u64>) -> Result<bool, ConsulError> {
        const OP: &str = "kv delete";
        let query: Vec<(&str, Option<String>)> = cas
            .map(|c| ("cas", Some(c.to_string())))
            .into_iter()
            .collect();
        let url = self.kv_url(OP, key, &query)?;
        let answer = self
            .send(OP, Method::DELETE, url, None, self.inner.timeout)
            .await?;
        self.decode_ok(OP, answer)
    }

    // --- Status ------------------------------------------------------------

    /// The address of the Raft leader (`GET /v1/status/leader`), e.g.
    /// `"10.0.0.1:8300"`; empty when the cluster has no leader.
    pub async fn status_leader(&self) -> Result<String, ConsulError> {
        const OP: &str = "status leader";
        let url = self.url(&["status", "leader"], Scope::Datacenter, &[])?;
        let answer = self
            .send(OP, Method::GET, url, None, self.inner.timeout)
            .await?;
        self.decode_ok(OP, answer)
    }

    // --- Plumbing ----------------------------------------------------------

    /// `base/v1/<segments>?<query>&dc=..&ns=..`, each segment percent-encoded.
    fn url(
        &self,
        segments: &[&str],
        scope: Scope,
        query: &[(&str, Option<String>)],
    ) -> Result<Url, ConsulError> {
        let mut url = self.inner.base.clone();
        {
            let mut path = url.path_segments_mut().map_err(|()| {
                ConsulError::InvalidConfig("the address cannot be a base URL".into())
            })?;
            path.pop_if_empty().push("v1");
            for segment in segments {
                if segment.is_empty() || *segment == "." || *segment == ".." {
                    return Err(ConsulError::InvalidConfig(format!(
                        "invalid path segment {segment:?} in a Consul request"
                    )));
                }
                path.push(segment);
            }
        }
        self.finish_query(&mut url, scope, query);
        Ok(url)
    }

    /// The URL of a KV key. Keys are split on `/` and each segment is
    /// percent-encoded; a leading `/` is ignored (as Consul's own client
    /// does), a trailing one kept. Empty keys, empty segments (`a//b`) and
    /// `.`/`..` segments cannot be expressed over HTTP and are refused.
    fn kv_url(
        &self,
        operation: &'static str,
        key: &str,
        query: &[(&str, Option<String>)],
    ) -> Result<Url, ConsulError> {
        let key = key.strip_prefix('/').unwrap_or(key);
        let (body, trailing_slash) = match key.strip_suffix('/') {
            Some(body) => (body, true),
            None => (key, false),
        };
        let bad = |why: &str| ConsulError::InvalidConfig(format!("{operation}: key {key:?} {why}"));
        if body.is_empty() {
            return Err(bad("is empty"));
        }
        let mut url = self.inner.base.clone();
        {
            let mut path = url.path_segments_mut().map_err(|()| {
                ConsulError::InvalidConfig("the address cannot be a base URL".into())
            })?;
            path.pop_if_empty().push("v1").push("kv");
            for segment in body.split('/') {
                if segment.is_empty() {
                    return Err(bad("has an empty path segment"));
                }
                if segment == "." || segment == ".." {
                    return Err(bad("has a `.` or `..` path segment"));
                }
                path.push(segment);
            }
            if trailing_slash {
                path.push("");
            }
        }
        self.finish_query(&mut url, Scope::Namespaced, query);
        Ok(url)
    }

    fn finish_query(&self, url: &mut Url, scope: Scope, query: &[(&str, Option<String>)]) {
        let dc = self.inner.datacenter.as_deref();
        let ns = match scope {
            Scope::Namespaced => self.inner.namespace.as_deref(),
            Scope::Datacenter => None,
        };
        if query.is_empty() && dc.is_none() && ns.is_none() {
            return;
        }
        let mut pairs = url.query_pairs_mut();
        for (name, value) in query {
            match value {
                Some(value) => pairs.append_pair(name, value),
                None => pairs.append_key_only(name),
            };
        }
        if let Some(dc) = dc {
            pairs.append_pair("dc", dc);
        }
        if let Some(ns) = ns {
            pairs.append_pair("ns", ns);
        }
    }

    /// Sends a request and classifies the status: 2xx and 404 are returned,
    /// everything else becomes an error.
    async fn send(
        &self,
        operation: &'static str,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Answer, ConsulError> {
        tracing::trace!(operation, %method, path = url.path(), "consul request");
        let mut request = self.inner.http.request(method, url).timeout(timeout);
        if let Some(body) = body {
            request = request.body(body);
        }
        let unreachable = |e: reqwest::Error| {
            let address = self.inner.display_address.clone();
            let reason = crate::error::chain(&e.without_url());
            // rustls reports certificate problems this way (the TLS types
            // are not reachable through reqwest's public API).
            if TLS_FAILURES.iter().any(|m| reason.contains(m)) {
                ConsulError::Tls {
                    operation,
                    address,
                    reason,
                }
            } else {
                ConsulError::Unreachable {
                    operation,
                    address,
                    reason,
                }
            }
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let index = response
            .headers()
            .get(INDEX_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = response.bytes().await.map_err(unreachable)?.to_vec();
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(Answer {
                status,
                index,
                body,
            });
        }
        Err(classify_failure(operation, status, &body))
    }

    /// Decodes the JSON body of a successful answer; a 404 here is
    /// unexpected and reported as a bad request.
    fn decode_ok<T: serde::de::DeserializeOwned>(
        &self,
        operation: &'static str,
        answer: Answer,
    ) -> Result<T, ConsulError> {
        if answer.status == StatusCode::NOT_FOUND {
            return Err(ConsulError::BadRequest {
                operation,
                status: answer.status.as_u16(),
                body: error_body(&answer.body),
            });
        }
        serde_json::from_slice(&answer.body).map_err(|e| ConsulError::InvalidResponse {
            operation,
            reason: format!("{e} in body {:?}", error_body(&answer.body)),
        })
    }
}

/// Maps a non-success, non-404 status to an error.
fn classify_failure(operation: &'static str, status: StatusCode, body: &[u8]) -> ConsulError {
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
        let invalid_input = [
            "Invalid Session TTL",
            "Invalid Behavior",
            "UUID must be 36 characters",
        ];
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
fn error_body(body: &[u8]) -> String {
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

fn parse_address(address: &str) -> Result<Url, ConsulError> {
    let address = address.trim();
    if address.is_empty() {
        return Err(ConsulError::InvalidConfig(
            "the Consul address is empty".into(),
        ));
    }
    let with_scheme = if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    };
    // The address may hold credentials or a token: messages show it redacted.
    let shown = crate::url::redact(address);
    let invalid =
        |why: String| ConsulError::InvalidConfig(format!("bad Consul address {shown:?}: {why}"));
    let mut url = Url::parse(&with_scheme).map_err(|e| invalid(e.to_string()))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(invalid(format!(
            "unsupported scheme {:?}, use http or https",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            "credentials in the address are not supported; pass the ACL token with \
             ConsulConfig::token (the consul:// URL form reads CONSUL_HTTP_TOKEN)"
                .into(),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid(
            "a query or fragment is not allowed; pass the ACL token with ConsulConfig::token \
             (the consul:// URL form reads CONSUL_HTTP_TOKEN) and the datacenter with \
             ConsulConfig::datacenter"
                .into(),
        ));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

// ---------------------------------------------------------------------------
// Durations and base64
// ---------------------------------------------------------------------------

/// Formats a duration the way Go's `time.ParseDuration` reads it: `"10s"`,
/// `"1500ms"`, `"0s"`.
fn format_go_duration(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else if duration.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", duration.as_millis())
    } else {
        format!("{}ns", duration.as_nanos())
    }
}

/// Parses a non-negative Go duration string (`"10s"`, `"1m30s"`, `"1.5h"`,
/// `"250ms"`, `"0"`). Returns `None` for anything else.
fn parse_go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        total = total.checked_add(whole.checked_mul(unit_nanos)?)?;
        if !fraction.is_empty() {
            // Keep at most 18 digits: enough below a nanosecond of an hour.
            let digits = &fraction[..fraction.len().min(18)];
            let numerator: u128 = digits.parse().ok()?;
            let denominator = 10u128.checked_pow(u32::try_from(digits.len()).ok()?)?;
            total = total.checked_add(numerator.checked_mul(unit_nanos)? / denominator)?;
        }
        rest = next;
    }
    let secs = u64::try_from(total / 1_000_000_000).ok()?;
    let nanos = u32::try_from(total % 1_000_000_000).ok()?;
    Some(Duration::new(secs, nanos))
}

/// Decodes standard base64 (RFC 4648 alphabet, padding optional), as Go's
/// `encoding/json` produces for `[]byte`. Returns `None` on invalid input.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn sextet(byte: u8) -> Option<u32> {
        match byte {
            b'A'..=b'Z' => Some(u32::from(byte - b'A')),
            b'a'..=b'z' => Some(u32::from(byte - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(byte - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let bytes = text.trim_end_matches('=').as_bytes();
    if text.len() - bytes.len() > 2 || bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc: u32 = 0;
        for &byte in chunk {
            acc = (acc << 6) | sextet(byte)?;
        }
        match chunk.len() {
            4 => out.extend_from_slice(&[(acc >> 16) as u8, (acc >> 8) as u8, acc as u8]),
            3 => out.extend_from_slice(&[(acc >> 10) as u8, (acc >> 2) as u8]),
            2 => out.push((acc >> 4) as u8),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_go_durations() {
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
        assert_eq!(format_go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(
            format_go_duration(Duration::from_nanos(1_000_000_001)),
            "1000000001ns"
        );
    }

    #[test]
    fn parses_go_durations() {
        let ok = |s: &str| parse_go_duration(s);
        assert_eq!(ok("0"), Some(Duration::ZERO));
        assert_eq!(ok("0s"), Some(Duration::ZERO));
        assert_eq!(ok("10s"), Some(Duration::from_secs(10)));
        assert_eq!(ok("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(ok("1h0m0s"), Some(Duration::from_secs(3600)));
        assert_eq!(ok("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(ok(".5s"), Some(Duration::from_millis(500)));
        assert_eq!(ok("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(ok("3us"), Some(Duration::from_micros(3)));
        assert_eq!(ok("3µs"), Some(Duration::from_micros(3)));
        for bad in [
            "",
            "s",
            "10",
            "-1s",
            "1x",
            "1..5s",
            ".s",
            "99999999999999999999999999999999999999999h",
        ] {
            assert_eq!(ok(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decodes_base64() {
        assert_eq!(base64_decode("").as_deref(), Some(&b""[..]));
        assert_eq!(base64_decode("aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(base64_decode("aGVsbA==").as_deref(), Some(&b"hell"[..]));
        assert_eq!(base64_decode("aGVs").as_deref(), Some(&b"hel"[..]));
        assert_eq!(base64_decode("aGVsbG8").as_deref(), Some(&b"hello"[..]));
        assert_eq!(base64_decode("/+8=").as_deref(), Some(&[0xff, 0xef][..]));
        for bad in ["a", "aGVsbG8===", "a*Vs", "aGV=sbG8", "===="] {
            assert_eq!(base64_decode(bad), None, "{bad:?}");
        }
    }

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

    #[test]
    fn parses_addresses() {
        assert_eq!(
            parse_address("127.0.0.1:8500").unwrap().as_str(),
            "http://127.0.0.1:8500/"
        );
        assert_eq!(
            parse_address("https://consul.example:8501/proxy")
                .unwrap()
                .as_str(),
            "https://consul.example:8501/proxy/"
        );
        for bad in [
            "",
            "ftp://x",
            "http://user:pw@host",
            "http://h/?a=b",
            "http://",
        ] {
            assert!(
                matches!(parse_address(bad), Err(ConsulError::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn builds_urls() {
        let client =
            ConsulClient::new(ConsulConfig::new("http://127.0.0.1:8500/p").datacenter("dc 2"))
                .unwrap();
        let url = client
            .kv_url(
                "t",
                "/a b/c?d%/",
                &[("index", Some("5".into())), ("consistent", None)],
            )
            .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:8500/p/v1/kv/a%20b/c%3Fd%25/?index=5&consistent&dc=dc+2"
        );
        for bad in ["", "/", "a//b", "a/../b", "./a"] {
            assert!(client.kv_url("t", bad, &[]).is_err(), "{bad:?}");
        }
        let url = client
            .url(&["status", "leader"], Scope::Datacenter, &[])
            .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:8500/p/v1/status/leader?dc=dc+2"
        );
    }

    #[test]
    fn debug_redacts_secrets() {
        let config = ConsulConfig::new("http://127.0.0.1:8500")
            .token("s3cr3t-token")
            .client_identity_pem("cert", "-----BEGIN PRIVATE KEY-----secret");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(!debug.contains("PRIVATE"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
        let client =
            ConsulClient::new(ConsulConfig::new("http://127.0.0.1:8500").token("s3cr3t-token"))
                .unwrap();
        let debug = format!("{client:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }

    #[test]
    fn addresses_with_secrets_are_refused_and_never_echoed() {
        for address in [
            "http://root:s3cret@127.0.0.1:8500",
            "http://s3cret@127.0.0.1:8500",
            "http://127.0.0.1:8500/?token=s3cret",
            "http://127.0.0.1:8500/#s3cret",
            "127.0.0.1:8500?token=s3cret",
            "http://u:s3cret@[::1",
        ] {
            let config = ConsulConfig::new(address).token("t0ken");
            let debug = format!("{config:?}");
            assert!(
                !debug.contains("s3cret") && !debug.contains("t0ken"),
                "{debug}"
            );
            let e = ConsulClient::new(config).unwrap_err();
            assert!(matches!(e, ConsulError::InvalidConfig(_)), "{e}");
            for shown in [e.to_string(), format!("{e:?}")] {
                assert!(!shown.contains("s3cret"), "{address}: {shown}");
                assert!(!shown.contains("t0ken"), "{address}: {shown}");
            }
        }
    }

    #[test]
    fn rejects_bad_tls_pem() {
        let e = ConsulClient::new(
            ConsulConfig::new("https://127.0.0.1:8501").ca_pem(b"garbage".to_vec()),
        )
        .unwrap_err();
        assert!(matches!(e, ConsulError::InvalidConfig(_)), "{e}");
        let e = ConsulClient::new(
            ConsulConfig::new("https://127.0.0.1:8501").client_identity_pem("garbage", "garbage"),
        )
        .unwrap_err();
        assert!(matches!(e, ConsulError::InvalidConfig(_)), "{e}");
    }
}
