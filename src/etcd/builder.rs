//! [`EtcdBuilder`]: endpoints, credentials, TLS, key prefix and timeouts.

use std::fmt;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::time::timeout;

use super::tls::{self, TlsMaterial};
use super::{EtcdBackend, NAME, error};
use crate::secret::{Secret, redact};
use crate::{Error, Result};

/// The key prefix under which elections live unless [`EtcdBuilder::prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "incumbent/";
/// How long [`EtcdBuilder::connect`] waits for the cluster to answer by default: long enough
/// for a TCP and TLS handshake across a slow network, short enough that a wrong address is
/// reported while someone is still looking.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request (acquire, release, a read) may take by default before it counts as
/// [`Error::Unavailable`]. Renewals are timed by the session's renew interval instead.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on every connection at this interval find a connection that died without a
/// reset (a partition, a host that vanished), so new requests do not queue on it forever.
/// etcd refuses pings more often than every 5 s by default.
const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long an HTTP/2 ping may go unanswered before the connection is dropped.
const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings for an [`EtcdBackend`]; made by [`EtcdBackend::builder`], finished by
/// [`connect`](EtcdBuilder::connect), which checks them all.
///
/// `Debug` output shows the endpoints (user info and query strings redacted), prefix and
/// user name, never the password or the client key.
#[derive(Clone)]
pub struct EtcdBuilder {
    endpoints: Vec<String>,
    prefix: String,
    user: Option<(String, Secret)>,
    tls: Option<TlsMaterial>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl fmt::Debug for EtcdBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoints: Vec<String> = self.endpoints.iter().map(|e| redact(e)).collect();
        f.debug_struct("EtcdBuilder")
            .field("endpoints", &endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl EtcdBuilder {
    pub(super) fn new(endpoints: Vec<String>) -> Self {
        EtcdBuilder {
            endpoints,
            prefix: DEFAULT_PREFIX.to_owned(),
            user: None,
            tls: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// The prefix of every key this backend writes (default [`DEFAULT_PREFIX`],
    /// `"incumbent/"`); a `/` is appended if it does not end with one, so `"myapp"` puts
    /// election `jobs` under `myapp/jobs@`. An empty prefix puts elections at the top of the
    /// key space. Grant the user read, write and watch permission on this prefix. A prefix
    /// with `?` or `#` is refused by [`connect`](Self::connect): those start a query string
    /// or fragment in a URL, so such a prefix is most likely a pasted URL whose query (a
    /// token, say) would end up in every key.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        let mut prefix = prefix.into();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        self.prefix = prefix;
        self
    }

    /// Authenticates as `user` with `password` (etcd's `--auth` users). The token is renewed
    /// by itself when it expires. The password never appears in `Debug` output or logs.
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), Secret(password.into())));
        self
    }

    /// Verifies the servers with this CA certificate (PEM). Turns on TLS: endpoints without a
    /// scheme become `https://`, and `http://` endpoints are refused. Needs the `etcd-tls`
    /// feature.
    pub fn ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.get_or_insert_with(TlsMaterial::default).ca = Some(pem.into());
        self
    }

    /// Presents this client certificate and private key (both PEM) to the servers, for
    /// etcd's `--client-cert-auth`. Needs [`ca_certificate`](Self::ca_certificate) too.
    /// The key never appears in `Debug` output or logs.
    pub fn client_identity(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.get_or_insert_with(TlsMaterial::default).identity =
            Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// The name the servers' certificates must carry, when it differs from the host in the
    /// endpoint URLs (e.g. endpoints given as IP addresses).
    pub fn tls_domain_name(mut self, name: impl Into<String>) -> Self {
        self.tls.get_or_insert_with(TlsMaterial::default).domain = Some(name.into());
        self
    }

    crate::backend::timeout_setters!(
        "How long [`connect`](Self::connect) waits for the cluster (default \
         [`DEFAULT_CONNECT_TIMEOUT`]); also the limit on each TCP connection attempt."
    );

    /// Checks the settings, connects, authenticates, and reads the prefix once to prove the
    /// cluster answers and the user may read it.
    ///
    /// # Errors
    /// - [`Error::InvalidConfig`]: no endpoints, a malformed endpoint URL (one with user info
    ///   or a query included; the message shows it redacted), a prefix with `?` or `#`,
    ///   unusable TLS material, TLS without the `etcd-tls` feature, a zero timeout. Retrying
    ///   cannot help.
    /// - [`Error::Unauthorized`]: the cluster refused the user or password, requires
    ///   credentials that were not given, or denies access to the prefix. Retrying cannot help.
    /// - [`Error::Unavailable`]: no endpoint answered within the connect timeout. Transient:
    ///   retry later (see [`Error::is_transient`]).
    pub async fn connect(self) -> Result<EtcdBackend> {
        self.dial().await.map_err(Error::not_retried)
    }

    /// The one attempt of [`connect`](Self::connect).
    async fn dial(self) -> Result<EtcdBackend> {
        let tls = self.tls.is_some();
        if self.endpoints.is_empty() {
            return Err(invalid(
                "no endpoints were given; pass at least one client URL, e.g. \
                 http://127.0.0.1:2379 (several for a cluster)"
                    .into(),
            ));
        }
        let endpoints = self
            .endpoints
            .iter()
            .map(|raw| parse_endpoint(raw, tls))
            .collect::<Result<Vec<_>>>()?;
        if endpoints.iter().any(|e| e.starts_with("https://")) && !tls {
            return Err(invalid(if tls::SUPPORTED {
                "https:// endpoints need the CA certificate that signed the servers' \
                 certificates; call .ca_certificate(pem)"
                    .into()
            } else {
                tls::FEATURE_NEEDED.into()
            }));
        }
        if self.prefix.contains(['?', '#']) {
            return Err(invalid(format!(
                "the key prefix {:?} has a '?' or '#', which would put what looks like a URL's \
                 query or fragment into every key; use letters, digits, '/', '.', '_' or '-' \
                 (credentials go in .user())",
                crate::secret::redact(&self.prefix)
            )));
        }
        for (name, limit) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if limit.is_zero() {
                return Err(invalid(format!(
                    "{name} is zero; give it a positive duration"
                )));
            }
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_keep_alive(HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT)
            // A member cut off from the others fails requests and cancels watches instead of
            // serving stale reads and silent watches.
            .with_require_leader(true);
        if let Some((user, password)) = &self.user {
            if user.is_empty() {
                return Err(invalid(
                    "the user name is empty; pass the etcd user to .user()".into(),
                ));
            }
            options = options
                .with_user(user.clone(), password.0.clone())
                .with_auto_token_refresh(true);
        }
        if let Some(material) = &self.tls {
            options = material.apply(options)?;
        }
        let client = match timeout(
            self.connect_timeout,
            Client::connect(&endpoints, Some(options)),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(at(&endpoints, error::from_client(e))),
            Err(_) => return Err(no_answer(&endpoints, self.connect_timeout)),
        };
        let backend = EtcdBackend::new(
            client,
            super::Settings {
                endpoints,
                prefix: self.prefix,
                user: self.user.map(|(name, _)| name),
                tls,
                request_timeout: self.request_timeout,
            },
        );
        match timeout(self.connect_timeout, backend.probe()).await {
            Ok(Ok(())) => Ok(backend),
            Ok(Err(e)) => Err(at(&backend.inner.settings.endpoints, e)),
            Err(_) => Err(no_answer(
                &backend.inner.settings.endpoints,
                self.connect_timeout,
            )),
        }
    }
}

/// `error`, naming `endpoints` when it says the cluster is unavailable without saying where.
fn at(endpoints: &[String], error: Error) -> Error {
    match error {
        Error::Unavailable { backend, reason }
            if !endpoints.iter().any(|e| reason.contains(e.as_str())) =>
        {
            Error::Unavailable {
                backend,
                reason: format!("{}: {reason}", endpoints.join(",")),
            }
        }
        other => other,
    }
}

fn no_answer(endpoints: &[String], limit: Duration) -> Error {
    error::unavailable(format!(
        "no endpoint of {endpoints:?} answered within {limit:?}; check that etcd runs there \
         and that the address and port are its client URL"
    ))
}

fn invalid(reason: String) -> Error {
    Error::InvalidConfig {
        backend: NAME,
        reason,
    }
}

/// Checks one endpoint and writes it as `scheme://host:port`. Without a scheme it is
/// `https://` when TLS is configured, else `http://`.
///
/// Messages show the endpoint redacted ([`redact`]): it may hold a password or token.
fn parse_endpoint(raw: &str, tls: bool) -> Result<String> {
    let shown = redact(raw);
    let bad = |why: &str| {
        invalid(format!(
            "endpoint {shown:?} {why}; write it as http://host:port or https://host:port, \
             e.g. http://127.0.0.1:2379"
        ))
    };
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(bad("is empty"));
    }
    if trimmed.contains('@') {
        return Err(bad(
            "has user info (user:password@), which would end up in logs; pass the \
             credentials with .user(user, password) (the URL form reads ETCDCTL_USER)",
        ));
    }
    let (scheme, rest) = if let Some(rest) = trimmed.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = trimmed.strip_prefix("https://") {
        ("https", rest)
    } else if let Some((scheme, _)) = trimmed.split_once("://") {
        return Err(bad(&format!(
            "has the scheme {scheme:?}, which etcd does not speak"
        )));
    } else {
        (if tls { "https" } else { "http" }, trimmed)
    };
    if scheme == "http" && tls {
        return Err(invalid(format!(
            "endpoint {shown:?} is http:// but TLS certificates were given; use https:// \
             endpoints with TLS, or drop the certificates"
        )));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '/' | '?' | '#' | '@'))
    {
        return Err(bad("has a path, query, user or space"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err(bad("has an unclosed '['"));
        };
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.'))
        {
            return Err(bad("has a malformed IPv6 address"));
        }
        let Some(port) = after.strip_prefix(':') else {
            return Err(bad("has no port (etcd's client port is usually 2379)"));
        };
        (format!("[{addr}]"), port)
    } else {
        let Some((host, port)) = authority.rsplit_once(':') else {
            return Err(bad("has no port (etcd's client port is usually 2379)"));
        };
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(bad("has a malformed host"));
        }
        (host.to_owned(), port)
    };
    match port.parse::<u16>() {
        Ok(port) if port > 0 => Ok(format!("{scheme}://{host}:{port}")),
        _ => Err(bad(&format!(
            "has the port {port:?}, not a number from 1 to 65535"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_cluster_is_named_in_the_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("address"));
        drop(listener);
        let error = EtcdBackend::builder([endpoint.clone()])
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .expect_err("nothing listens there");
        match error {
            Error::Unavailable { reason, .. } => {
                assert!(reason.contains(&endpoint), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn endpoints_are_normalised() {
        let ok = |raw, tls| parse_endpoint(raw, tls).expect(raw);
        assert_eq!(ok("http://127.0.0.1:2379", false), "http://127.0.0.1:2379");
        assert_eq!(ok("127.0.0.1:2379/", false), "http://127.0.0.1:2379");
        assert_eq!(ok("etcd-0.local:2379", true), "https://etcd-0.local:2379");
        assert_eq!(ok("https://[::1]:2379", true), "https://[::1]:2379");
    }

    #[test]
    fn malformed_endpoints_say_what_to_write() {
        for raw in [
            "",
            "http//127.0.0.1:2379",
            "127.0.0.1",
            "http://127.0.0.1:notaport",
            "http://127.0.0.1:0",
            "http://user:pw@127.0.0.1:2379",
            "http://127.0.0.1:2379/v3",
            "unix:///run/etcd.sock",
            "http://[::1:2379",
        ] {
            match parse_endpoint(raw, false) {
                Err(Error::InvalidConfig { reason, .. }) => {
                    assert!(reason.contains("http://host:port"), "{raw:?}: {reason}")
                }
                other => panic!("{raw:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn http_with_tls_is_refused() {
        assert!(matches!(
            parse_endpoint("http://127.0.0.1:2379", true),
            Err(Error::InvalidConfig { .. })
        ));
    }

    #[test]
    fn prefix_ends_with_a_slash() {
        let prefix = |p: &str| EtcdBuilder::new(Vec::new()).prefix(p).prefix;
        assert_eq!(prefix("myapp"), "myapp/");
        assert_eq!(prefix("myapp/"), "myapp/");
        assert_eq!(prefix(""), "");
    }

    #[test]
    fn endpoint_errors_never_show_a_secret() {
        for raw in [
            "http://root:s3cret@127.0.0.1:2379",
            "http://s3cret@127.0.0.1:2379",
            "root:s3cret@127.0.0.1:2379",
            "http://127.0.0.1:2379/?password=s3cret",
            "http://127.0.0.1:2379#s3cret",
            "http://127.0.0.1:2379?s3cret",
        ] {
            let err = parse_endpoint(raw, false).expect_err(raw);
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains("s3cret"), "{raw}: {shown}");
            }
        }
        let builder = EtcdBuilder::new(vec!["http://root:s3cret@127.0.0.1:2379".into()]);
        let shown = format!("{builder:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[tokio::test]
    async fn prefixes_with_a_query_or_fragment_are_refused() {
        for prefix in ["app?token=s3cret", "app#s3cret"] {
            let builder = EtcdBuilder::new(vec!["http://127.0.0.1:2379".into()]).prefix(prefix);
            match builder.connect().await {
                Err(Error::InvalidConfig { reason, .. }) => {
                    assert!(!reason.contains("s3cret"), "{reason}");
                    assert!(reason.contains("prefix"), "{reason}");
                }
                other => panic!("{prefix}: {other:?}"),
            }
        }
    }

    #[test]
    fn debug_hides_the_password_and_key() {
        let builder = EtcdBuilder::new(vec!["http://127.0.0.1:2379".into()])
            .user("root", "hunter2")
            .client_identity("-----BEGIN CERTIFICATE-----", "very-secret-key");
        let shown = format!("{builder:?}");
        assert!(shown.contains("root"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("very-secret-key"), "{shown}");
    }
}
