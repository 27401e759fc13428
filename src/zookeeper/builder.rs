//! [`ZookeeperBuilder`]: connect string, digest credentials, node prefix and timeouts.

use std::fmt;
use std::time::Duration;

use super::client as zk;

use super::{NAME, Settings, ZookeeperBackend, from_client};
use crate::secret::redact;
use crate::{Error, Result};

/// The prefix (under the chroot) of the nodes elections live in, unless
/// [`ZookeeperBuilder::prefix`] says otherwise.
pub const DEFAULT_PREFIX: &str = "/incumbent";
/// How long connecting may take by default before it counts as
/// [`Error::Unavailable`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request (create, list, delete, read) may take by default before it counts as
/// [`Error::Unavailable`]. Renewals are timed by the session's renew interval instead.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The environment variable [`ZookeeperBuilder::auth_from_env`] reads digest credentials
/// from: `user:password`.
pub const AUTH_ENV: &str = "INCUMBENT_ZK_AUTH";
/// The session timeout of the client that observers read with.
pub(super) const READER_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Digest credentials; the password never appears in `Debug` output.
#[derive(Clone)]
pub(super) struct Digest {
    pub user: String,
    password: String,
}

impl Digest {
    /// The `user:password` that ZooKeeper's `addauth digest` takes.
    fn auth(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password).into_bytes()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Digest")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Settings for a [`ZookeeperBackend`]; made by [`ZookeeperBackend::builder`], finished by
/// [`connect`](ZookeeperBuilder::connect), which checks them all.
///
/// `Debug` output shows the connect string (with anything in it that may be a credential,
/// such as `user:password@`, hidden), prefix and user name, never the password.
#[derive(Clone)]
pub struct ZookeeperBuilder {
    connect_string: String,
    prefix: String,
    auth: Option<Digest>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

impl fmt::Debug for ZookeeperBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZookeeperBuilder")
            .field("connect_string", &redact(&self.connect_string))
            .field("prefix", &self.prefix)
            .field("auth", &self.auth)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl ZookeeperBuilder {
    pub(super) fn new(connect_string: String) -> Self {
        ZookeeperBuilder {
            connect_string,
            prefix: DEFAULT_PREFIX.to_owned(),
            auth: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// The node (under the chroot) whose children are the elections (default
    /// [`DEFAULT_PREFIX`]); a leading `/` is added and a trailing one removed.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.prefix = format!("/{}", prefix.trim_matches('/'));
        self
    }

    /// Authenticates with ZooKeeper's digest scheme (`addauth digest user:password`); nodes
    /// are then created with the `CREATOR_ALL` ACL. The password never appears in `Debug`
    /// output, logs or errors.
    pub fn digest_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some(Digest {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Takes digest credentials from [`AUTH_ENV`] (`user:password`) when it is set and not
    /// empty. A value without `:` is an [`Error::InvalidConfig`] (which does not show it).
    pub fn auth_from_env(self) -> Result<Self> {
        let value = std::env::var(AUTH_ENV).unwrap_or_default();
        if value.is_empty() {
            return Ok(self);
        }
        let Some((user, password)) = value.split_once(':') else {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: format!("{AUTH_ENV} must be user:password (the value is not shown)"),
            });
        };
        Ok(self.digest_auth(user, password))
    }

    crate::backend::timeout_setters!(
        "How long [`connect`](Self::connect) and every new session wait for the ensemble \
         (default [`DEFAULT_CONNECT_TIMEOUT`])."
    );

    /// Checks the settings and connects: a first session (for observers) proves the ensemble
    /// answers and the credentials are accepted; the chroot is created if missing.
    ///
    /// Errors: [`Error::InvalidConfig`] for a malformed connect string, chroot or prefix,
    /// [`Error::Unavailable`] when no server answers within the connect timeout,
    /// [`Error::Unauthorized`] when the credentials are refused.
    pub async fn connect(self) -> Result<ZookeeperBackend> {
        self.dial().await.map_err(Error::not_retried)
    }

    /// The one attempt of [`connect`](Self::connect).
    async fn dial(self) -> Result<ZookeeperBackend> {
        let (servers, chroot) = split_connect_string(&self.connect_string)?;
        if self.prefix.len() < 2 || self.prefix.contains("//") || self.prefix.contains('@') {
            return Err(invalid(format!(
                "prefix {:?}: use a node path such as /incumbent, without '@'",
                redact(&self.prefix)
            )));
        }
        for duration in [self.connect_timeout, self.request_timeout] {
            if duration.is_zero() {
                return Err(invalid("the connect and request timeouts must not be zero"));
            }
        }
        let settings = Settings {
            servers,
            chroot,
            prefix: self.prefix,
            auth: self.auth,
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
        };
        let reader = open_client(&settings, READER_SESSION_TIMEOUT, acl_of(&settings)).await?;
        let probe = tokio::time::timeout(settings.request_timeout, reader.check_stat("/")).await;
        match probe {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(from_client(e, "reading the root node")),
            Err(_) => return Err(unavailable("reading the root node timed out")),
        }
        Ok(ZookeeperBackend::new(settings, reader))
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        backend: NAME,
        reason: reason.into(),
    }
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: NAME,
        reason: reason.into(),
    }
}

/// Whether a server of the connect string is `host`, `host:port` or `[v6]:port`, with a port
/// from 1 to 65535 when there is one (the client adds 2181, ZooKeeper's, when there is not).
fn valid_server(server: &str) -> bool {
    let server = server.trim();
    let (host, port) = match server.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, rest)) => match rest.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match server.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (server, None),
        },
    };
    !host.is_empty() && port.is_none_or(|port| port.parse::<u16>().is_ok_and(|port| port > 0))
}

/// Splits `host:port[,host:port…][/chroot]` into the servers and the chroot (`None` for `/`
/// or none). Errors show the connect string only [redacted](redact): it may hold credentials
/// (`user:password@host`, or a URL's `?password=`), which belong elsewhere.
pub(super) fn split_connect_string(connect: &str) -> Result<(String, Option<String>)> {
    let (servers, chroot) = match connect.find('/') {
        Some(i) => (&connect[..i], Some(&connect[i..])),
        None => (connect, None),
    };
    if servers.is_empty() || servers.split(',').any(|s| s.trim().is_empty()) {
        return Err(invalid(format!(
            "connect string {:?}: use host:port[,host:port...][/chroot]",
            redact(connect)
        )));
    }
    if servers.contains('@') {
        return Err(invalid(
            "put credentials in INCUMBENT_ZK_AUTH or digest_auth(), not in the connect string",
        ));
    }
    if let Some(server) = servers.split(',').find(|server| !valid_server(server)) {
        return Err(invalid(format!(
            "server {:?} in the connect string: use host or host:port, with a port from 1 to \
             65535 (2181 when left out)",
            redact(server)
        )));
    }
    let chroot = chroot
        .map(|c| c.trim_end_matches('/'))
        .filter(|c| !c.is_empty());
    if let Some(chroot) = chroot
        && (chroot.contains("//") || chroot.contains(['?', '#']))
    {
        return Err(invalid(format!(
            "chroot {:?}: use a node path such as /myapp",
            redact(chroot)
        )));
    }
    Ok((servers.to_owned(), chroot.map(str::to_owned)))
}

/// Connects a client with the session timeout `timeout`, within the connect timeout: digest
/// auth if set, rooted at the chroot, which is created (with `acls`) if missing.
pub(super) async fn open_client(
    settings: &Settings,
    timeout: Duration,
    acl: zk::Acl,
) -> Result<zk::Client> {
    let mut connector = zk::Connector::new(timeout);
    if let Some(auth) = &settings.auth {
        connector = connector.with_digest(auth.auth());
    }
    let connected = tokio::time::timeout(
        settings.connect_timeout,
        connector.connect(&settings.servers),
    )
    .await
    .map_err(|_| {
        unavailable(format!(
            "no server of {} answered within {:?}",
            redact(&settings.servers),
            settings.connect_timeout
        ))
    })?;
    let client = connected.map_err(|e| from_client(e, "connecting"))?;
    let Some(chroot) = &settings.chroot else {
        return Ok(client);
    };
    let created = tokio::time::timeout(settings.request_timeout, client.mkdir(chroot, acl))
        .await
        .map_err(|_| unavailable("creating the chroot timed out"))?;
    created.map_err(|e| from_client(e, "creating the chroot"))?;
    Ok(client.chroot(chroot))
}

/// The ACL of the nodes a backend creates: its user's alone with credentials, anyone's
/// without.
pub(super) fn acl_of(settings: &Settings) -> zk::Acl {
    match settings.auth {
        Some(_) => zk::Acl::CreatorAll,
        None => zk::Acl::Open,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_strings_split_into_servers_and_chroot() {
        let split = |s: &str| split_connect_string(s).ok();
        assert_eq!(split("a:1"), Some(("a:1".into(), None)));
        assert_eq!(
            split("a:1,b:2/app/x/"),
            Some(("a:1,b:2".into(), Some("/app/x".into())))
        );
        assert_eq!(split("a:1/"), Some(("a:1".into(), None)));
        assert_eq!(split(""), None);
        assert_eq!(split("a:1,,b:2"), None);
        assert_eq!(split("u:p@a:1"), None);
        assert_eq!(split("a"), Some(("a".into(), None)));
        assert_eq!(split("a:1,b"), Some(("a:1,b".into(), None)));
        assert_eq!(
            split("[::1]:2181,[::2]"),
            Some(("[::1]:2181,[::2]".into(), None))
        );
        assert_eq!(split("a:http"), None);
        assert_eq!(split("a:0"), None);
        assert_eq!(split(":2181"), None);
        assert_eq!(split("[::1]2181"), None);
    }

    #[test]
    fn the_password_is_not_in_debug_output() {
        let builder = ZookeeperBackend::builder("a:1").digest_auth("me", "s3cret");
        let shown = format!("{builder:?}");
        assert!(shown.contains("me") && !shown.contains("s3cret"), "{shown}");
    }
}
