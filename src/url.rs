//! Backend URLs: choose a store at run time, from a string.
//!
//! | URL | backend | feature |
//! |---|---|---|
//! | `file:///path/to/dir`, or `file:` for the default directory | [`FileBackend`](crate::file::FileBackend) | `file` |
//! | `memory:` | [`MemoryBackend`](crate::memory::MemoryBackend) (this process only) | always |
//! | `etcd://host:port[,host:port…][/prefix]` | etcd | `etcd` |
//! | `consul://host:port[/prefix]` | Consul | `consul` |
//! | `memcached://host:port` | memcached (best effort: see its module docs) | `memcached` |
//! | `redis://host:port[/db]`, `rediss://host:port[/db]` | Redis (database `db`, default 0; `rediss://`: TLS, the server's certificate checked against `INCUMBENT_REDIS_CA_FILE` or the system's roots) | `redis` (`redis-tls` for `rediss://`) |
//! | `zk://host:port[,host:port…][/chroot]` | ZooKeeper | `zookeeper` |
//!
//! # Credentials
//!
//! Credentials never go in the URL (it ends up in logs, process lists and shell histories):
//! a URL with user info (`user:password@`), a query string (`?token=…`) or a fragment is
//! rejected with [`Error::InvalidConfig`], and so is a `?` or `#` in a key prefix. They come
//! from the environment, from the variables the stores' own tools read:
//!
//! | variable | backend | meaning |
//! |---|---|---|
//! | `ETCDCTL_USER` | etcd | `user:password`, as etcdctl's `--user`; or just `user` when `ETCDCTL_PASSWORD` is set |
//! | `ETCDCTL_PASSWORD` | etcd | the password of `ETCDCTL_USER` (then `ETCDCTL_USER` is the whole user name) |
//! | `INCUMBENT_ETCD_USER` | etcd | the user name; when set (not empty), it wins over `ETCDCTL_USER` |
//! | `INCUMBENT_ETCD_PASSWORD` | etcd | the password of `INCUMBENT_ETCD_USER` (empty if unset) |
//! | `CONSUL_HTTP_TOKEN` | Consul | the ACL token, sent as `X-Consul-Token` |
//! | `INCUMBENT_ZK_AUTH` | ZooKeeper | `user:password` for ZooKeeper's digest scheme (`addauth digest`) |
//! | `INCUMBENT_REDIS_USER` | Redis | the ACL user name (Redis 6 and later); unset: `AUTH` with the password alone |
//! | `INCUMBENT_REDIS_PASSWORD` | Redis | the password; when set (not empty), it wins over `REDISCLI_AUTH` |
//! | `REDISCLI_AUTH` | Redis | the password, as `redis-cli` reads it |
//! | `INCUMBENT_REDIS_CA_FILE` | Redis, `rediss://` | a PEM file of the CA certificates that sign the server's certificate; unset: the system's roots |
//! | `CONSUL_HTTP_TOKEN_FILE` | Consul | a file holding the ACL token (surrounding white space is trimmed); when set and not empty, it wins over `CONSUL_HTTP_TOKEN`, as in Consul's own tools |
//!
//! Empty variables count as unset. `ETCDCTL_USER` without a `:` and without
//! `ETCDCTL_PASSWORD`, and a `CONSUL_HTTP_TOKEN_FILE` that cannot be read, are
//! [`Error::InvalidConfig`] (no value is ever echoed).
//!
//! Nothing formats a secret: [`BackendUrl`]'s `Display` and `Debug`, and every error message
//! about a URL or endpoint, replace user info with `***@` and a query string or fragment with
//! `?***`; the backends' `Debug` output shows user names at most, never a password, token or
//! private key.
//!
//! Because [`Backend`] is generic, code that picks a backend at run time implements
//! [`WithBackend`] once and is handed the concrete backend:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use incumbent::backend::Backend;
//! use incumbent::url::{BackendUrl, WithBackend};
//!
//! struct Name;
//! impl WithBackend for Name {
//!     type Output = &'static str;
//!     async fn call<B: Backend>(self, backend: B) -> &'static str {
//!         backend.info().name
//!     }
//! }
//!
//! let url: BackendUrl = "memory:".parse()?;
//! assert_eq!(url.connect(Name).await?, "memory");
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::backend::Backend;
use crate::{Error, Result};

/// A parsed backend URL. See the [module docs](self) for the forms.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendUrl {
    /// The in-process memory backend.
    Memory,
    /// The file backend, in `dir` (`None`: the default directory).
    File {
        /// The lock directory.
        dir: Option<PathBuf>,
    },
    /// etcd, with its client endpoints (`http://host:port`) and a key prefix.
    Etcd {
        /// Client endpoints.
        endpoints: Vec<String>,
        /// Key prefix, if given.
        prefix: Option<String>,
    },
    /// A ZooKeeper ensemble: its servers (`host:port`) and a chroot.
    Zookeeper {
        /// The servers of the connect string.
        servers: Vec<String>,
        /// The chroot (`/app`), if given.
        chroot: Option<String>,
    },
    /// A Consul agent's HTTP address (`http://host:port`) and a key prefix.
    Consul {
        /// The agent's HTTP address.
        address: String,
        /// Key prefix, if given.
        prefix: Option<String>,
    },
    /// A memcached server (`host:port`).
    Memcached {
        /// The server's address, `host:port`.
        address: String,
    },
    /// A Redis server (`host:port`) and database number.
    Redis {
        /// The server's address, `host:port`.
        address: String,
        /// The database number.
        db: i64,
        /// Whether to talk TLS (`rediss://`).
        tls: bool,
    },
}

/// Code to run with whichever backend a [`BackendUrl`] names.
pub trait WithBackend {
    /// What the code returns.
    type Output;
    /// Runs with the connected backend.
    fn call<B: Backend>(self, backend: B) -> impl Future<Output = Self::Output>;
}

const FORMS: &str = "use file:///dir, memory:, etcd://host:port[,host:port][/prefix], consul://host:port[/prefix], redis://host:port[/db] (rediss:// for TLS), memcached://host:port or zk://host:port[,host:port][/chroot]";

/// Where credentials go instead of the URL.
const CREDENTIALS_HINT: &str = "credentials come from the environment, never the URL: \
     ETCDCTL_USER=user:password (or ETCDCTL_USER and ETCDCTL_PASSWORD) for etcd, \
     CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE for Consul, \
     INCUMBENT_ZK_AUTH=user:password for ZooKeeper, \
     INCUMBENT_REDIS_USER and INCUMBENT_REDIS_PASSWORD (or REDISCLI_AUTH) for Redis (memcached has no authentication)";

fn bad(reason: String) -> Error {
    Error::InvalidConfig {
        backend: "url",
        reason,
    }
}

/// `text` (a URL, an endpoint or an address) with anything that may be a secret replaced by
/// `***`: user info (`user:password@`) becomes `***@`, a query string or fragment becomes
/// `?***`. When both `@` and `?` or `#` occur, which part is which cannot be told, and all
/// but the scheme is hidden. Use it wherever a URL given by a user is formatted.
pub(crate) fn redact(text: &str) -> String {
    let (scheme, rest) = match text.find("://") {
        Some(i) => text.split_at(i + 3),
        None => ("", text),
    };
    let query = rest.find(['?', '#']);
    match (rest.rfind('@'), query) {
        (Some(_), Some(_)) => format!("{scheme}***"),
        (Some(at), None) => format!("{scheme}***{}", &rest[at..]),
        (None, Some(q)) => format!("{scheme}{}?***", &rest[..q]),
        (None, None) => text.to_owned(),
    }
}

/// A key prefix as shown: cut at a `?` or `#`, which [`BackendUrl::from_str`] refuses anyway.
fn redact_prefix(prefix: &str) -> String {
    match prefix.find(['?', '#', '@']) {
        Some(i) => format!("{}***", &prefix[..i]),
        None => prefix.to_owned(),
    }
}

/// Splits `host:port[,host:port…][/prefix]` and checks each address.
fn hosts_and_prefix(shown: &str, rest: &str) -> Result<(Vec<String>, Option<String>)> {
    let (hosts, prefix) = match rest.split_once('/') {
        Some((hosts, prefix)) => (hosts, Some(prefix).filter(|p| !p.is_empty())),
        None => (rest, None),
    };
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let valid = host
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !valid {
            return Err(bad(format!("{shown:?}: {host:?} is not host:port")));
        }
        out.push(format!("http://{host}"));
    }
    Ok((out, prefix.map(|p| format!("{}/", p.trim_end_matches('/')))))
}

impl FromStr for BackendUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        // Every message shows the URL redacted: it may hold a password or token.
        let shown = redact(url);
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(bad(format!("{shown:?} has no scheme; {FORMS}")));
        };
        if url.contains('@') && scheme != "file" {
            return Err(bad(format!(
                "{shown:?}: user info (user:password@) is not allowed in a backend URL; \
                 {CREDENTIALS_HINT}"
            )));
        }
        match scheme {
            "memory" => Ok(BackendUrl::Memory),
            "file" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if !path.is_empty() && !path.starts_with('/') {
                    return Err(bad(format!(
                        "{shown:?}: a file URL needs an absolute path, as in file:///var/lib/app/elections"
                    )));
                }
                Ok(BackendUrl::File {
                    dir: Some(path).filter(|p| !p.is_empty()).map(PathBuf::from),
                })
            }
            "etcd" | "consul" => {
                if rest.contains(['?', '#']) {
                    return Err(bad(format!(
                        "{shown:?}: '?' and '#' are not allowed, neither as a query string \
                         (e.g. ?token=…) nor in the key prefix, where they would end up in \
                         store keys and logs; write {scheme}://host:port[/prefix] with a \
                         prefix of letters, digits, '/', '.', '_' or '-', and note that \
                         {CREDENTIALS_HINT}"
                    )));
                }
                let Some(rest) = rest.strip_prefix("//").filter(|r| !r.is_empty()) else {
                    return Err(bad(format!("{shown:?}: write {scheme}://host:port")));
                };
                let (hosts, prefix) = hosts_and_prefix(&shown, rest)?;
                if scheme == "etcd" {
                    Ok(BackendUrl::Etcd {
                        endpoints: hosts,
                        prefix,
                    })
                } else if hosts.len() > 1 {
                    Err(bad(format!(
                        "{shown:?}: name one Consul agent (the local one); agents forward to the servers"
                    )))
                } else {
                    Ok(BackendUrl::Consul {
                        address: hosts.into_iter().next().unwrap_or_default(),
                        prefix,
                    })
                }
            }
            "zk" => zk_url(&shown, rest),
            "redis" => redis_url(&shown, rest, false),
            "rediss" => redis_url(&shown, rest, true),
            "memcached" => {
                if rest.contains(['?', '#']) || rest.trim_start_matches("//").contains('/') {
                    return Err(bad(format!(
                        "{shown:?}: write memcached://host:port (no path, no query string)"
                    )));
                }
                let rest = rest.strip_prefix("//").unwrap_or(rest);
                let (hosts, _) = hosts_and_prefix(&shown, rest)?;
                if hosts.len() > 1 {
                    return Err(bad(format!("{shown:?}: name one memcached server")));
                }
                Ok(BackendUrl::Memcached {
                    address: rest.to_owned(),
                })
            }
            // Only the scheme is shown: what follows may be a password (`user:password`).
            other => Err(bad(format!("unknown scheme {other:?}; {FORMS}"))),
        }
    }
}

/// The URL as written, with user info, query strings and fragments redacted (a parsed URL
/// has none, but the fields are public).
impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let strip = |e: &String| redact(e.trim_start_matches("http://"));
        let prefix = |p: &Option<String>| {
            p.as_deref()
                .map(|p| format!("/{}", redact_prefix(p)))
                .unwrap_or_default()
        };
        match self {
            BackendUrl::Memory => write!(f, "memory:"),
            BackendUrl::File { dir: None } => write!(f, "file:"),
            BackendUrl::File { dir: Some(dir) } => write!(f, "file://{}", dir.display()),
            BackendUrl::Etcd {
                endpoints,
                prefix: p,
            } => write!(
                f,
                "etcd://{}{}",
                endpoints.iter().map(strip).collect::<Vec<_>>().join(","),
                prefix(p)
            ),
            BackendUrl::Zookeeper { servers, chroot } => write!(
                f,
                "zk://{}{}",
                servers
                    .iter()
                    .map(|s| redact(s))
                    .collect::<Vec<_>>()
                    .join(","),
                chroot.as_deref().map(redact_prefix).unwrap_or_default()
            ),
            BackendUrl::Consul { address, prefix: p } => {
                write!(f, "consul://{}{}", strip(address), prefix(p))
            }
            BackendUrl::Redis { address, db, tls } => {
                let scheme = if *tls { "rediss" } else { "redis" };
                write!(f, "{scheme}://{}/{db}", redact(address))
            }
            BackendUrl::Memcached { address } => write!(f, "memcached://{}", redact(address)),
        }
    }
}

/// Like the derived `Debug`, with user info, query strings and fragments redacted.
impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = |p: &Option<String>| p.as_deref().map(redact_prefix);
        match self {
            BackendUrl::Memory => f.write_str("Memory"),
            BackendUrl::File { dir } => f.debug_struct("File").field("dir", dir).finish(),
            BackendUrl::Etcd {
                endpoints,
                prefix: p,
            } => f
                .debug_struct("Etcd")
                .field(
                    "endpoints",
                    &endpoints.iter().map(|e| redact(e)).collect::<Vec<_>>(),
                )
                .field("prefix", &prefix(p))
                .finish(),
            BackendUrl::Zookeeper { servers, chroot } => f
                .debug_struct("Zookeeper")
                .field(
                    "servers",
                    &servers.iter().map(|s| redact(s)).collect::<Vec<_>>(),
                )
                .field("chroot", &chroot.as_deref().map(redact_prefix))
                .finish(),
            BackendUrl::Consul { address, prefix: p } => f
                .debug_struct("Consul")
                .field("address", &redact(address))
                .field("prefix", &prefix(p))
                .finish(),
            BackendUrl::Memcached { address } => f
                .debug_struct("Memcached")
                .field("address", &redact(address))
                .finish(),
            BackendUrl::Redis { address, db, tls } => f
                .debug_struct("Redis")
                .field("address", &redact(address))
                .field("db", db)
                .field("tls", tls)
                .finish(),
        }
    }
}

impl BackendUrl {
    /// Connects to the backend and runs `code` with it.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the backend's cargo feature is not compiled in (the
    /// message names the feature), or the backend's own connection errors.
    pub async fn connect<V: WithBackend>(&self, code: V) -> Result<V::Output> {
        match self {
            BackendUrl::Memory => Ok(code.call(crate::memory::MemoryBackend::new()).await),
            BackendUrl::File { dir } => connect_file(dir.clone(), code).await,
            BackendUrl::Etcd { endpoints, prefix } => {
                connect_etcd(endpoints, prefix.as_deref(), code).await
            }
            BackendUrl::Zookeeper { servers, chroot } => {
                connect_zookeeper(servers, chroot.as_deref(), code).await
            }
            BackendUrl::Consul { address, prefix } => {
                connect_consul(address, prefix.as_deref(), code).await
            }
            BackendUrl::Redis { address, db, tls } => connect_redis(address, *db, *tls, code).await,
            BackendUrl::Memcached { address } => connect_memcached(address, code).await,
        }
    }
}

#[cfg_attr(
    all(feature = "file", unix, feature = "etcd", feature = "consul"),
    allow(dead_code)
)]
fn not_compiled(feature: &'static str) -> Error {
    Error::InvalidConfig {
        backend: feature,
        reason: format!(
            "this build has no {feature} backend; rebuild with `--features {feature}` (or `full`)"
        ),
    }
}

/// A variable of the process environment; empty counts as unset.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The etcd user and password from the environment (see the [module docs](self)), read
/// through `var`.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn etcd_credentials(var: impl Fn(&str) -> Option<String>) -> Result<Option<(String, String)>> {
    if let Some(user) = var("INCUMBENT_ETCD_USER") {
        let password = var("INCUMBENT_ETCD_PASSWORD").unwrap_or_default();
        return Ok(Some((user, password)));
    }
    let Some(user) = var("ETCDCTL_USER") else {
        return Ok(None);
    };
    if let Some(password) = var("ETCDCTL_PASSWORD") {
        return Ok(Some((user, password)));
    }
    match user.split_once(':') {
        Some((name, password)) if !name.is_empty() => {
            Ok(Some((name.to_owned(), password.to_owned())))
        }
        _ => Err(Error::InvalidConfig {
            backend: "etcd",
            reason: "ETCDCTL_USER has no password and ETCDCTL_PASSWORD is unset; write \
                     ETCDCTL_USER=user:password, or set ETCDCTL_PASSWORD"
                .into(),
        }),
    }
}

/// The Consul ACL token from the environment (see the [module docs](self)), read through
/// `var`, the token file through `read`.
#[cfg_attr(not(feature = "consul"), allow(dead_code))]
fn consul_token(
    var: impl Fn(&str) -> Option<String>,
    read: impl Fn(&str) -> std::io::Result<String>,
) -> Result<Option<String>> {
    if let Some(path) = var("CONSUL_HTTP_TOKEN_FILE") {
        // The error names the file, never its contents.
        let text = read(&path).map_err(|e| Error::InvalidConfig {
            backend: "consul",
            reason: format!(
                "cannot read the ACL token from CONSUL_HTTP_TOKEN_FILE ({path:?}): {e}; \
                 fix the path or its permissions, or unset the variable"
            ),
        })?;
        let token = text.trim();
        if !token.is_empty() {
            return Ok(Some(token.to_owned()));
        }
    }
    Ok(var("CONSUL_HTTP_TOKEN"))
}

/// `redis://host:port[/db]` (or `rediss://`, `tls`), after the scheme: the address and
/// database.
fn redis_url(shown: &str, rest: &str, tls: bool) -> Result<BackendUrl> {
    if rest.contains(['?', '#']) {
        return Err(bad(format!(
            "{shown:?}: '?' and '#' are not allowed (no query string, e.g. ?password=…); \
             write redis://host:port[/db], and note that {CREDENTIALS_HINT}"
        )));
    }
    let Some(rest) = rest.strip_prefix("//").filter(|r| !r.is_empty()) else {
        return Err(bad(format!("{shown:?}: write redis://host:port[/db]")));
    };
    let (host, db) = match rest.split_once('/') {
        Some((host, "")) => (host, 0),
        Some((host, db)) => match db.parse::<i64>() {
            Ok(db) if db >= 0 => (host, db),
            _ => {
                return Err(bad(format!(
                    "{shown:?}: {db:?} is not a database number; write redis://host:port[/db]"
                )));
            }
        },
        None => (rest, 0),
    };
    let (hosts, _) = hosts_and_prefix(shown, host)?;
    if hosts.len() > 1 {
        return Err(bad(format!(
            "{shown:?}: name one Redis server, the primary (Redis Cluster is not supported)"
        )));
    }
    Ok(BackendUrl::Redis {
        address: host.to_owned(),
        db,
        tls,
    })
}

/// The Redis user and password from the environment (see the [module docs](self)), read
/// through `var`.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
fn redis_credentials(var: impl Fn(&str) -> Option<String>) -> (Option<String>, Option<String>) {
    let password = var("INCUMBENT_REDIS_PASSWORD").or_else(|| var("REDISCLI_AUTH"));
    (var("INCUMBENT_REDIS_USER"), password)
}

#[cfg(feature = "redis")]
async fn connect_redis<V: WithBackend>(
    address: &str,
    db: i64,
    tls: bool,
    code: V,
) -> Result<V::Output> {
    use crate::redis::{RedisBackend, RedisConfig};
    let mut config = RedisConfig::new(address).db(db);
    if tls {
        #[cfg(feature = "redis-tls")]
        {
            config = match env("INCUMBENT_REDIS_CA_FILE") {
                Some(ca_file) => config.ca_file(ca_file),
                None => config.tls(),
            };
        }
        #[cfg(not(feature = "redis-tls"))]
        return Err(not_compiled("redis-tls"));
    }
    let (user, password) = redis_credentials(env);
    if let Some(user) = user {
        config = config.username(user);
    }
    if let Some(password) = password {
        config = config.password(password);
    }
    let backend = RedisBackend::builder(config).connect().await?;
    Ok(code.call(backend).await)
}

#[cfg(not(feature = "redis"))]
async fn connect_redis<V: WithBackend>(
    _address: &str,
    _db: i64,
    _tls: bool,
    _code: V,
) -> Result<V::Output> {
    Err(not_compiled("redis"))
}

#[cfg(feature = "memcached")]
async fn connect_memcached<V: WithBackend>(address: &str, code: V) -> Result<V::Output> {
    let backend = crate::memcached::MemcachedBackend::connect(address).await?;
    Ok(code.call(backend).await)
}

#[cfg(not(feature = "memcached"))]
async fn connect_memcached<V: WithBackend>(_address: &str, _code: V) -> Result<V::Output> {
    Err(not_compiled("memcached"))
}

#[cfg(all(feature = "file", unix))]
async fn connect_file<V: WithBackend>(dir: Option<PathBuf>, code: V) -> Result<V::Output> {
    let backend = match dir {
        Some(dir) => crate::file::FileBackend::in_dir(dir),
        None => crate::file::FileBackend::new(),
    };
    Ok(code.call(backend).await)
}

#[cfg(not(all(feature = "file", unix)))]
async fn connect_file<V: WithBackend>(_dir: Option<PathBuf>, _code: V) -> Result<V::Output> {
    Err(not_compiled("file"))
}

#[cfg(feature = "etcd")]
async fn connect_etcd<V: WithBackend>(
    endpoints: &[String],
    prefix: Option<&str>,
    code: V,
) -> Result<V::Output> {
    let mut builder = crate::etcd::EtcdBackend::builder(endpoints.iter().cloned());
    if let Some(prefix) = prefix {
        builder = builder.prefix(prefix);
    }
    if let Some((user, password)) = etcd_credentials(env)? {
        builder = builder.user(user, password);
    }
    Ok(code.call(builder.connect().await?).await)
}

#[cfg(not(feature = "etcd"))]
async fn connect_etcd<V: WithBackend>(
    _endpoints: &[String],
    _prefix: Option<&str>,
    _code: V,
) -> Result<V::Output> {
    Err(not_compiled("etcd"))
}

#[cfg(feature = "consul")]
async fn connect_consul<V: WithBackend>(
    address: &str,
    prefix: Option<&str>,
    code: V,
) -> Result<V::Output> {
    use crate::consul::{ConsulBackend, ConsulConfig};
    let mut config = ConsulConfig::new(address);
    if let Some(token) = consul_token(env, |path| std::fs::read_to_string(path))? {
        config = config.token(token);
    }
    let mut builder = ConsulBackend::builder(config);
    if let Some(prefix) = prefix {
        builder = builder.prefix(prefix);
    }
    Ok(code.call(builder.build()?).await)
}

#[cfg(not(feature = "consul"))]
async fn connect_consul<V: WithBackend>(
    _address: &str,
    _prefix: Option<&str>,
    _code: V,
) -> Result<V::Output> {
    Err(not_compiled("consul"))
}

/// `zk://host:port[,host:port…][/chroot]`, after the scheme: the servers and chroot.
fn zk_url(shown: &str, rest: &str) -> Result<BackendUrl> {
    if rest.contains(['?', '#']) {
        return Err(bad(format!(
            "{shown:?}: '?' and '#' are not allowed (no query string, e.g. ?auth=…); write \
             zk://host:port[,host:port][/chroot], and note that {CREDENTIALS_HINT}"
        )));
    }
    let Some(rest) = rest.strip_prefix("//").filter(|r| !r.is_empty()) else {
        return Err(bad(format!(
            "{shown:?}: write zk://host:port[,host:port][/chroot]"
        )));
    };
    let (hosts, chroot) = hosts_and_prefix(shown, rest)?;
    if chroot.as_deref().is_some_and(|c| c.contains("//")) {
        return Err(bad(format!(
            "{shown:?}: the chroot must be a node path such as /app"
        )));
    }
    Ok(BackendUrl::Zookeeper {
        servers: hosts
            .iter()
            .map(|h| h.trim_start_matches("http://").to_owned())
            .collect(),
        chroot: chroot.map(|c| format!("/{}", c.trim_end_matches('/'))),
    })
}

#[cfg(feature = "zookeeper")]
async fn connect_zookeeper<V: WithBackend>(
    servers: &[String],
    chroot: Option<&str>,
    code: V,
) -> Result<V::Output> {
    let connect = format!("{}{}", servers.join(","), chroot.unwrap_or_default());
    let builder = crate::zookeeper::ZookeeperBackend::builder(connect).auth_from_env()?;
    Ok(code.call(builder.connect().await?).await)
}

#[cfg(not(feature = "zookeeper"))]
async fn connect_zookeeper<V: WithBackend>(
    _servers: &[String],
    _chroot: Option<&str>,
    _code: V,
) -> Result<V::Output> {
    Err(not_compiled("zookeeper"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses() {
        assert_eq!(
            "memory:".parse::<BackendUrl>().ok(),
            Some(BackendUrl::Memory)
        );
        assert_eq!(
            "file:".parse::<BackendUrl>().ok(),
            Some(BackendUrl::File { dir: None })
        );
        assert_eq!(
            "file:///var/lib/x".parse::<BackendUrl>().ok(),
            Some(BackendUrl::File {
                dir: Some("/var/lib/x".into())
            })
        );
        assert_eq!(
            "etcd://a:2379,b:2379/jobs".parse::<BackendUrl>().ok(),
            Some(BackendUrl::Etcd {
                endpoints: vec!["http://a:2379".into(), "http://b:2379".into()],
                prefix: Some("jobs/".into())
            })
        );
        assert_eq!(
            "consul://127.0.0.1:8500".parse::<BackendUrl>().ok(),
            Some(BackendUrl::Consul {
                address: "http://127.0.0.1:8500".into(),
                prefix: None
            })
        );
    }

    #[test]
    fn zookeeper_urls_name_servers_and_a_chroot() {
        assert_eq!(
            "zk://a:2181,b:2181/app/x/".parse::<BackendUrl>().ok(),
            Some(BackendUrl::Zookeeper {
                servers: vec!["a:2181".into(), "b:2181".into()],
                chroot: Some("/app/x".into()),
            })
        );
        let url: BackendUrl = "zk://a:2181".parse().expect("valid");
        assert_eq!(
            url,
            BackendUrl::Zookeeper {
                servers: vec!["a:2181".into()],
                chroot: None,
            }
        );
        assert_eq!(url.to_string(), "zk://a:2181");
        let url: BackendUrl = "zk://a:1,b:2/app".parse().expect("valid");
        assert_eq!(url.to_string(), "zk://a:1,b:2/app");
    }

    #[test]
    fn redis_urls_name_a_server_and_a_database() {
        assert_eq!(
            "redis://127.0.0.1:6379/2".parse::<BackendUrl>().ok(),
            Some(BackendUrl::Redis {
                address: "127.0.0.1:6379".into(),
                db: 2,
                tls: false
            })
        );
        assert_eq!(
            "redis://h:6379".parse::<BackendUrl>().ok(),
            Some(BackendUrl::Redis {
                address: "h:6379".into(),
                db: 0,
                tls: false
            })
        );
        let tls: BackendUrl = "rediss://h:6380/1".parse().expect("valid");
        assert_eq!(tls.to_string(), "rediss://h:6380/1");
        for (url, hint) in [
            ("redis://h:6379/x", "database number"),
            ("redis://h", "not host:port"),
            ("redis://a:1,b:2", "one Redis server"),
            ("redis://:s3cret@h:6379", "REDISCLI_AUTH"),
            ("redis://h:6379/0?password=s3cret", "REDISCLI_AUTH"),
        ] {
            let err = url.parse::<BackendUrl>().unwrap_err().to_string();
            assert!(err.contains(hint), "{url}: {err}");
            assert!(!err.contains("s3cret"), "{url}: {err}");
        }
        let url: BackendUrl = "redis://h:6379/3".parse().expect("valid");
        assert_eq!(url.to_string(), "redis://h:6379/3");
    }

    #[test]
    fn memcached_urls_name_one_server() {
        assert_eq!(
            "memcached://127.0.0.1:11211".parse::<BackendUrl>().ok(),
            Some(BackendUrl::Memcached {
                address: "127.0.0.1:11211".into()
            })
        );
        for (url, hint) in [
            ("memcached://h", "not host:port"),
            ("memcached://a:1,b:2", "one memcached server"),
            ("memcached://h:1/x", "no path"),
        ] {
            let err = url.parse::<BackendUrl>().unwrap_err().to_string();
            assert!(err.contains(hint), "{url}: {err}");
        }
    }

    #[test]
    fn redis_credentials_come_from_the_environment() {
        assert_eq!(redis_credentials(vars(&[])), (None, None));
        assert_eq!(
            redis_credentials(vars(&[("REDISCLI_AUTH", "pw")])),
            (None, Some("pw".into()))
        );
        assert_eq!(
            redis_credentials(vars(&[
                ("REDISCLI_AUTH", "pw"),
                ("INCUMBENT_REDIS_USER", "app"),
                ("INCUMBENT_REDIS_PASSWORD", "apppw"),
            ])),
            (Some("app".into()), Some("apppw".into()))
        );
    }

    #[test]
    fn malformed_urls_say_what_to_write() {
        for (url, hint) in [
            ("nothing", "no scheme"),
            ("ftp://x", "unknown scheme"),
            ("file://relative", "absolute path"),
            ("etcd://", "host:port"),
            ("etcd://host", "not host:port"),
            ("etcd://host:0", "not host:port"),
            ("etcd://user:pw@host:2379", "environment"),
            ("consul://a:1,b:2", "one Consul agent"),
            ("zk://a:2181/app?auth=x", "not allowed"),
            ("zk://a", "not host:port"),
        ] {
            let err = url.parse::<BackendUrl>().unwrap_err().to_string();
            assert!(err.contains(hint), "{url}: {err}");
        }
    }

    #[test]
    fn redaction_hides_user_info_queries_and_fragments() {
        for (text, shown) in [
            ("etcd://u:pw@h:2379/p", "etcd://***@h:2379/p"),
            ("http://u:pa/ss@h:2379", "http://***@h:2379"),
            ("consul://h:8500?token=t", "consul://h:8500?***"),
            ("consul://h:8500/p#frag", "consul://h:8500/p?***"),
            ("consul://u:p@h?token=t", "consul://***"),
            ("u:pw@h:2379", "***@h:2379"),
            ("etcd://h:2379/jobs", "etcd://h:2379/jobs"),
        ] {
            assert_eq!(redact(text), shown, "{text}");
        }
    }

    #[test]
    fn secrets_in_urls_are_refused_and_never_echoed() {
        for (url, hint) in [
            ("etcd://root:s3cret@127.0.0.1:2379", "ETCDCTL_USER"),
            ("etcd://s3cret@127.0.0.1:2379/p", "ETCDCTL_USER"),
            ("etcd://127.0.0.1:2379/p?password=s3cret", "ETCDCTL_USER"),
            ("consul://127.0.0.1:8500?token=s3cret", "CONSUL_HTTP_TOKEN"),
            (
                "consul://127.0.0.1:8500/p?token=s3cret",
                "CONSUL_HTTP_TOKEN",
            ),
            ("consul://127.0.0.1:8500/p#s3cret", "prefix"),
            ("consul://a:s3cret@127.0.0.1:8500", "CONSUL_HTTP_TOKEN"),
            ("root:s3cret@127.0.0.1:2379", "environment"),
            ("root:s3cret", "unknown scheme"),
        ] {
            let err = url.parse::<BackendUrl>().unwrap_err();
            assert!(matches!(err, Error::InvalidConfig { .. }), "{url}: {err:?}");
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains("s3cret"), "{url}: {shown}");
                assert!(shown.contains(hint), "{url}: {shown}");
            }
        }
    }

    #[test]
    fn display_and_debug_redact_even_hand_built_urls() {
        let urls = [
            BackendUrl::Etcd {
                endpoints: vec!["http://root:s3cret@h:2379".into()],
                prefix: Some("p?token=s3cret/".into()),
            },
            BackendUrl::Consul {
                address: "http://h:8500?token=s3cret".into(),
                prefix: Some("p#s3cret".into()),
            },
        ];
        for url in urls {
            for shown in [url.to_string(), format!("{url:?}")] {
                assert!(!shown.contains("s3cret"), "{shown}");
                assert!(shown.contains("***"), "{shown}");
            }
        }
        let url: BackendUrl = "etcd://a:2379,b:2379/jobs".parse().expect("valid");
        assert_eq!(url.to_string(), "etcd://a:2379,b:2379/jobs/");
    }

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, v)| *n == name && !v.is_empty())
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn etcd_credentials_come_from_etcdctl_or_incumbent_variables() {
        let creds = |pairs| etcd_credentials(vars(pairs)).expect("valid");
        assert_eq!(creds(&[]), None);
        assert_eq!(
            creds(&[("ETCDCTL_USER", "root:pw:with:colons")]),
            Some(("root".into(), "pw:with:colons".into()))
        );
        assert_eq!(
            creds(&[("ETCDCTL_USER", "ro:ot"), ("ETCDCTL_PASSWORD", "pw")]),
            Some(("ro:ot".into(), "pw".into()))
        );
        assert_eq!(
            creds(&[
                ("ETCDCTL_USER", "root:pw"),
                ("INCUMBENT_ETCD_USER", "app"),
                ("INCUMBENT_ETCD_PASSWORD", "apppw"),
            ]),
            Some(("app".into(), "apppw".into()))
        );
        let err = etcd_credentials(vars(&[("ETCDCTL_USER", "s3cret")])).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn consul_token_comes_from_the_variable_or_the_file() {
        let no_file =
            |_: &str| -> std::io::Result<String> { Err(std::io::ErrorKind::NotFound.into()) };
        let file = |_: &str| -> std::io::Result<String> { Ok(" from-file\n".into()) };
        let empty_file = |_: &str| -> std::io::Result<String> { Ok("\n".into()) };
        let token = |pairs, read: &dyn Fn(&str) -> std::io::Result<String>| {
            consul_token(vars(pairs), read).expect("valid")
        };
        assert_eq!(token(&[], &no_file), None);
        assert_eq!(
            token(&[("CONSUL_HTTP_TOKEN", "t")], &no_file),
            Some("t".into())
        );
        let both: &'static [(&str, &str)] =
            &[("CONSUL_HTTP_TOKEN", "t"), ("CONSUL_HTTP_TOKEN_FILE", "/f")];
        assert_eq!(token(both, &file), Some("from-file".into()));
        assert_eq!(token(both, &empty_file), Some("t".into()));
        let err = consul_token(vars(both), no_file).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().contains("CONSUL_HTTP_TOKEN_FILE"), "{err}");
    }
}
