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
use url::Url;

mod error;
mod wire;

pub use error::ConsulError;
use error::{classify_failure, error_body};
pub use wire::{KvEntry, KvResponse, PutOptions, QueryOptions, SessionCreate, SessionInfo};
use wire::{KvWire, SessionCreated, SessionWire, format_go_duration};

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
            .field("address", &crate::secret::redact(&self.address))
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
        let body = serde_json::to_vec(&params.body())
            .map_err(|e| ConsulError::InvalidConfig(e.to_string()))?;
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

    /// Destroys a session (`PUT /v1/session/destroy/:id`), releasing its
    /// locks (the keys stay). Destroying an unknown session
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

    /// Moves a lock from session `from` to session `to` in one transaction
    /// (`PUT /v1/txn`): only while the key's `ModifyIndex` is still `index`,
    /// it is unlocked by `from` and locked by `to` with `value`. `false` when
    /// a check failed (Consul answers 409 and applies nothing).
    pub async fn kv_move_lock(
        &self,
        key: &str,
        index: u64,
        from: &str,
        to: &str,
        value: &[u8],
    ) -> Result<bool, ConsulError> {
        const OP: &str = "kv move lock";
        use base64::Engine as _;
        let key = key.strip_prefix('/').unwrap_or(key);
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        let ops = serde_json::json!([
            {"KV": {"Verb": "check-index", "Key": key, "Index": index}},
            {"KV": {"Verb": "unlock", "Key": key, "Session": from, "Value": encoded}},
            {"KV": {"Verb": "lock", "Key": key, "Session": to, "Value": encoded}},
        ]);
        let url = self.url(&["txn"], Scope::Namespaced, &[])?;
        let body = serde_json::to_vec(&ops).unwrap_or_default();
        match self
            .send(OP, Method::PUT, url, Some(body), self.inner.timeout)
            .await
        {
            Ok(answer) if answer.status.is_success() => Ok(true),
            Ok(answer) => Err(ConsulError::InvalidResponse {
                operation: OP,
                reason: format!("status {} to a transaction", answer.status),
            }),
            Err(ConsulError::BadRequest { status: 409, .. }) => Ok(false),
            Err(error) => Err(error),
        }
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
    let shown = crate::secret::redact(address);
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

#[cfg(test)]
mod tests {
    use super::*;

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
