//! Backend URLs: choose a store at run time, from a string.
//!
//! | URL | backend | feature |
//! |---|---|---|
//! | `file:///path/to/dir`, or `file:` for the default directory | [`FileBackend`](crate::file::FileBackend) | `file` |
//! | `memory:` | [`MemoryBackend`](crate::memory::MemoryBackend) (this process only) | always |
//! | `etcd://host:port[,host:port…][/prefix]` | etcd | `etcd` |
//! | `etcd+https://host:port[,host:port…][/prefix]` | etcd over TLS | `etcd-tls` |
//! | `etcd:` or `etcd:///prefix` | etcd at the endpoints of `ETCDCTL_ENDPOINTS` (default `http://127.0.0.1:2379`) | `etcd` |
//! | `consul://host:port[/prefix]` | Consul | `consul` |
//! | `consul+https://host:port[/prefix]` | Consul over HTTPS | `consul` |
//! | `consul:` or `consul:///prefix` | Consul at `CONSUL_HTTP_ADDR` (default `http://127.0.0.1:8500`) | `consul` |
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
//! | `ETCDCTL_ENDPOINTS` | etcd | the endpoints of `etcd:` / `etcd:///prefix` (`https://host:port,…`; `host:port` is `https://` when a CA is given, else `http://`) |
//! | `ETCDCTL_CACERT` | etcd | the CA certificate file (PEM) that signed etcd's certificates |
//! | `ETCDCTL_CERT`, `ETCDCTL_KEY` | etcd | the client certificate and key files (PEM), for `--client-cert-auth` |
//! | `CONSUL_HTTP_ADDR` | Consul | the agent of `consul:` / `consul:///prefix` (`host:port`, `http://…` or `https://…`) |
//! | `CONSUL_HTTP_SSL` | Consul | `true`: a `CONSUL_HTTP_ADDR` without a scheme is `https://` |
//! | `CONSUL_CACERT` | Consul | the CA certificate file (PEM) to trust instead of the system's roots |
//! | `CONSUL_CLIENT_CERT`, `CONSUL_CLIENT_KEY` | Consul | the client certificate and key files (PEM), for agents with `verify_incoming` |
//!
//! # TLS
//!
//! `etcd+https://` and `consul+https://` (or `https://` endpoints in `ETCDCTL_ENDPOINTS` or
//! `CONSUL_HTTP_ADDR`) turn TLS on. The certificate files come from [`TlsFiles`] (the CLI's
//! `--ca-file`, `--cert-file` and `--key-file`) and, for each file not given there, from the
//! variables above. Precedence, for every setting: what is given directly ([`TlsFiles`], the
//! CLI's flags) wins over the URL, which wins over the environment; so `etcd://host:port`
//! ignores `ETCDCTL_ENDPOINTS`, and a plain-HTTP URL ignores the TLS variables (which are
//! often set for a whole shell) but refuses [`TlsFiles`] with [`Error::InvalidConfig`]. etcd
//! over TLS needs a CA (there is no system default in etcd's client); Consul uses the
//! system's roots when none is given. A server certificate that the CA did not sign, or a
//! refused client certificate, is [`Error::InvalidConfig`] (not retried): the message says
//! which file to check.
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
    /// etcd, with its client endpoints (`http://host:port` or `https://host:port`) and a key
    /// prefix.
    Etcd {
        /// Client endpoints; none: those of `ETCDCTL_ENDPOINTS` (see the [module docs](self)).
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
    /// A Consul agent's HTTP address (`http://host:port` or `https://host:port`) and a key
    /// prefix.
    Consul {
        /// The agent's HTTP address; empty: `CONSUL_HTTP_ADDR` (see the [module docs](self)).
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

const FORMS: &str = "use file:///dir, memory:, etcd[+https]://host:port[,host:port][/prefix], consul[+https]://host:port[/prefix], redis[s]://host:port[/db], memcached://host:port or zk://host:port[,host:port][/chroot]";

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

/// `etcd[+https]:…` and `consul[+https]:…`, after the scheme: the endpoints (none: from the
/// environment) and the prefix.
fn store_url(shown: &str, scheme: &str, rest: &str) -> Result<BackendUrl> {
    let (store, tls) = match scheme.split_once('+') {
        Some((store, _)) => (store, true),
        None => (scheme, false),
    };
    if rest.contains(['?', '#']) {
        return Err(bad(format!(
            "{shown:?}: '?' and '#' are not allowed, neither as a query string \
             (e.g. ?token=…) nor in the key prefix, where they would end up in \
             store keys and logs; write {scheme}://host:port[/prefix] with a \
             prefix of letters, digits, '/', '.', '_' or '-', and note that \
             {CREDENTIALS_HINT}"
        )));
    }
    let from_env = if store == "etcd" {
        "ETCDCTL_ENDPOINTS"
    } else {
        "CONSUL_HTTP_ADDR"
    };
    let authority = match rest.strip_prefix("//") {
        Some(after) => after,
        None if rest.is_empty() || rest.starts_with('/') => "",
        None => return Err(bad(format!("{shown:?}: write {scheme}://host:port"))),
    };
    let (hosts, prefix) = if authority.is_empty() || authority.starts_with('/') {
        if tls {
            return Err(bad(format!(
                "{shown:?}: write {scheme}://host:port, or {store}: to take the address from \
                 {from_env} (where https:// turns TLS on)"
            )));
        }
        let prefix = authority.trim_matches('/');
        let prefix = Some(prefix).filter(|p| !p.is_empty());
        (Vec::new(), prefix.map(|p| format!("{p}/")))
    } else {
        hosts_and_prefix(shown, authority)?
    };
    let hosts: Vec<String> = if tls {
        hosts
            .iter()
            .map(|h| h.replacen("http://", "https://", 1))
            .collect()
    } else {
        hosts
    };
    if store == "etcd" {
        return Ok(BackendUrl::Etcd {
            endpoints: hosts,
            prefix,
        });
    }
    if hosts.len() > 1 {
        return Err(bad(format!(
            "{shown:?}: name one Consul agent (the local one); agents forward to the servers"
        )));
    }
    Ok(BackendUrl::Consul {
        address: hosts.into_iter().next().unwrap_or_default(),
        prefix,
    })
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
            "etcd" | "etcd+https" | "consul" | "consul+https" => store_url(&shown, scheme, rest),
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
        let strip = |e: &String| {
            redact(
                e.trim_start_matches("http://")
                    .trim_start_matches("https://"),
            )
        };
        let prefix = |p: &Option<String>| {
            p.as_deref()
                .map(|p| format!("/{}", redact_prefix(p)))
                .unwrap_or_default()
        };
        // `etcd+https://` when the endpoints are https://; `etcd:` when they come from the
        // environment.
        let store =
            |f: &mut fmt::Formatter<'_>, name: &str, hosts: &[String], p: &Option<String>| {
                if hosts.is_empty() {
                    return match p {
                        Some(_) => write!(f, "{name}://{}", prefix(p)),
                        None => write!(f, "{name}:"),
                    };
                }
                let tls = if hosts.iter().any(|h| h.starts_with("https://")) {
                    "+https"
                } else {
                    ""
                };
                let hosts: Vec<String> = hosts.iter().map(strip).collect();
                write!(f, "{name}{tls}://{}{}", hosts.join(","), prefix(p))
            };
        match self {
            BackendUrl::Memory => write!(f, "memory:"),
            BackendUrl::File { dir: None } => write!(f, "file:"),
            BackendUrl::File { dir: Some(dir) } => write!(f, "file://{}", dir.display()),
            BackendUrl::Etcd {
                endpoints,
                prefix: p,
            } => store(f, "etcd", endpoints, p),
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
                let hosts: &[String] = if address.is_empty() {
                    &[]
                } else {
                    std::slice::from_ref(address)
                };
                store(f, "consul", hosts, p)
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

/// TLS certificate files for etcd and Consul, given directly (the CLI's `--ca-file`,
/// `--cert-file` and `--key-file`). Each file given here wins over its environment variable
/// (`ETCDCTL_CACERT`, `CONSUL_CACERT`, …); see the [module docs](self#tls).
///
/// Only paths are held: the files are read when connecting, and their contents (a private
/// key) never appear in `Debug` output or messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate (PEM) that signed the store's certificates.
    pub ca: Option<PathBuf>,
    /// The client certificate (PEM), for stores that require one; needs [`key`](Self::key).
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

impl BackendUrl {
    /// The name of the backend, as its [`BackendInfo::name`](crate::backend::BackendInfo::name)
    /// says it, known before connecting.
    pub fn backend_name(&self) -> &'static str {
        match self {
            BackendUrl::Memory => "memory",
            BackendUrl::File { .. } => "file",
            BackendUrl::Etcd { .. } => "etcd",
            BackendUrl::Zookeeper { .. } => "zookeeper",
            BackendUrl::Consul { .. } => "consul",
            BackendUrl::Memcached { .. } => "memcached",
            BackendUrl::Redis { .. } => "redis",
        }
    }

    /// The backend's [`BackendInfo::max_lock_delay`](crate::backend::BackendInfo::max_lock_delay),
    /// known before connecting, so that a lock-delay the store cannot have is refused before
    /// anything is sent (as [`ElectionBuilder::build`](crate::ElectionBuilder::build) would
    /// refuse it afterwards).
    pub fn max_lock_delay(&self) -> Option<std::time::Duration> {
        match self {
            BackendUrl::Memory => Some(std::time::Duration::MAX),
            BackendUrl::Consul { .. } => Some(CONSUL_MAX_LOCK_DELAY),
            _ => None,
        }
    }

    /// Connects to the backend and runs `code` with it; TLS files, if any, come from the
    /// environment. Same as [`connect_with_tls`](Self::connect_with_tls) with no [`TlsFiles`].
    ///
    /// # Errors
    /// See [`connect_with_tls`](Self::connect_with_tls).
    pub async fn connect<V: WithBackend>(&self, code: V) -> Result<V::Output> {
        self.connect_with_tls(&TlsFiles::default(), code).await
    }

    /// Connects to the backend and runs `code` with it, with the TLS files of `tls` (each
    /// winning over its environment variable).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the backend's cargo feature is not compiled in (the
    /// message names the feature), when `tls` names files for a backend or URL without TLS,
    /// or a file cannot be read; or the backend's own connection errors.
    pub async fn connect_with_tls<V: WithBackend>(
        &self,
        tls: &TlsFiles,
        code: V,
    ) -> Result<V::Output> {
        let tls_capable = matches!(self, BackendUrl::Etcd { .. } | BackendUrl::Consul { .. });
        if !tls_capable && !tls.is_empty() {
            return Err(bad(format!(
                "TLS certificate files were given, but {self} has no TLS; they apply to \
                 etcd+https:// and consul+https:// only"
            )));
        }
        match self {
            BackendUrl::Memory => Ok(code.call(crate::memory::MemoryBackend::new()).await),
            BackendUrl::File { dir } => connect_file(dir.clone(), code).await,
            BackendUrl::Etcd { endpoints, prefix } => {
                connect_etcd(endpoints, prefix.as_deref(), tls, code).await
            }
            BackendUrl::Zookeeper { servers, chroot } => {
                connect_zookeeper(servers, chroot.as_deref(), code).await
            }
            BackendUrl::Consul { address, prefix } => {
                connect_consul(address, prefix.as_deref(), tls, code).await
            }
            BackendUrl::Redis { address, db, tls } => connect_redis(address, *db, *tls, code).await,
            BackendUrl::Memcached { address } => connect_memcached(address, code).await,
        }
    }
}

/// The environment variables of one store's TLS files.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
struct TlsVars {
    backend: &'static str,
    ca: &'static str,
    cert: &'static str,
    key: &'static str,
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
const ETCD_TLS_VARS: TlsVars = TlsVars {
    backend: "etcd",
    ca: "ETCDCTL_CACERT",
    cert: "ETCDCTL_CERT",
    key: "ETCDCTL_KEY",
};

#[cfg_attr(not(feature = "consul"), allow(dead_code))]
const CONSUL_TLS_VARS: TlsVars = TlsVars {
    backend: "consul",
    ca: "CONSUL_CACERT",
    cert: "CONSUL_CLIENT_CERT",
    key: "CONSUL_CLIENT_KEY",
};

/// The PEM of a store's CA and client identity, read from the files of `given` or, for each
/// one not given, of the variables `vars` names (through `var`).
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
#[derive(Debug, Default, PartialEq, Eq)]
struct TlsPaths {
    /// Each path, with where it came from (a variable's name, or "" when given directly).
    ca: Option<(PathBuf, &'static str)>,
    cert: Option<(PathBuf, &'static str)>,
    key: Option<(PathBuf, &'static str)>,
}

#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
impl TlsPaths {
    /// Each file of `given`, or else of its variable.
    fn resolve(given: &TlsFiles, vars: &TlsVars, var: impl Fn(&str) -> Option<String>) -> Self {
        let pick = |given: &Option<PathBuf>, name: &'static str| match given {
            Some(path) => Some((path.clone(), "")),
            None => var(name).map(|path| (PathBuf::from(path), name)),
        };
        TlsPaths {
            ca: pick(&given.ca, vars.ca),
            cert: pick(&given.cert, vars.cert),
            key: pick(&given.key, vars.key),
        }
    }

    /// The CA's PEM, and the client certificate's and key's, read from their files.
    #[allow(clippy::type_complexity)]
    fn read(&self, vars: &TlsVars) -> Result<(Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>)> {
        let read =
            |file: &Option<(PathBuf, &'static str)>, what: &str| -> Result<Option<Vec<u8>>> {
                let Some((path, from)) = file else {
                    return Ok(None);
                };
                let from = if from.is_empty() {
                    String::new()
                } else {
                    format!(" (from {from})")
                };
                std::fs::read(path).map(Some).map_err(|e| Error::InvalidConfig {
                backend: vars.backend,
                reason: format!(
                    "cannot read the {what} file {}{from}: {e}; fix the path or its permissions",
                    path.display()
                ),
            })
            };
        let identity = match (&self.cert, &self.key) {
            (None, None) => None,
            (Some(_), Some(_)) => Some((
                read(&self.cert, "client certificate")?.unwrap_or_default(),
                read(&self.key, "client key")?.unwrap_or_default(),
            )),
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::InvalidConfig {
                    backend: vars.backend,
                    reason: format!(
                        "a client certificate needs its private key and the other way round; \
                         give both files (incumbent: --cert-file and --key-file; or {} and {})",
                        vars.cert, vars.key
                    ),
                });
            }
        };
        Ok((read(&self.ca, "CA certificate")?, identity))
    }
}

/// Refuses TLS files given directly for a URL without TLS (the variables are ignored then:
/// they are often set for a whole shell).
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
fn no_tls_files(given: &TlsFiles, backend: &'static str, shown: &str) -> Result<()> {
    if given.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidConfig {
        backend,
        reason: format!(
            "TLS certificate files were given, but {shown} is plain HTTP; write \
             {backend}+https://host:port to use TLS, or drop the files"
        ),
    })
}

/// etcd's endpoints from `ETCDCTL_ENDPOINTS` (read through `var`), or etcdctl's default.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn etcd_endpoints(var: impl Fn(&str) -> Option<String>) -> Vec<String> {
    match var("ETCDCTL_ENDPOINTS") {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
        None => vec![DEFAULT_ETCD_ENDPOINT.to_owned()],
    }
}

/// Consul's longest lock-delay (`consul::MAX_LOCK_DELAY`, here in builds without Consul too).
const CONSUL_MAX_LOCK_DELAY: std::time::Duration = std::time::Duration::from_secs(60);

/// Where `etcd:` connects when `ETCDCTL_ENDPOINTS` is unset, as etcdctl does.
const DEFAULT_ETCD_ENDPOINT: &str = "http://127.0.0.1:2379";
/// Where `consul:` connects when `CONSUL_HTTP_ADDR` is unset, as Consul's tools do.
const DEFAULT_CONSUL_ADDRESS: &str = "http://127.0.0.1:8500";

/// The Consul agent's address from `CONSUL_HTTP_ADDR` and `CONSUL_HTTP_SSL` (read through
/// `var`), or Consul's default.
#[cfg_attr(not(feature = "consul"), allow(dead_code))]
fn consul_address(var: impl Fn(&str) -> Option<String>) -> String {
    let Some(address) = var("CONSUL_HTTP_ADDR") else {
        return DEFAULT_CONSUL_ADDRESS.to_owned();
    };
    if address.contains("://") {
        return address;
    }
    let ssl = var("CONSUL_HTTP_SSL")
        .is_some_and(|v| matches!(v.as_str(), "true" | "1" | "TRUE" | "True"));
    format!("{}://{address}", if ssl { "https" } else { "http" })
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
    given: &TlsFiles,
    code: V,
) -> Result<V::Output> {
    let from_env = endpoints.is_empty();
    let endpoints = if from_env {
        etcd_endpoints(env)
    } else {
        endpoints.to_vec()
    };
    let shown = BackendUrl::Etcd {
        endpoints: endpoints.clone(),
        prefix: None,
    }
    .to_string();
    let paths = TlsPaths::resolve(given, &ETCD_TLS_VARS, env);
    // Endpoints without a scheme (from ETCDCTL_ENDPOINTS only) are https:// when a CA is
    // given, as etcdctl has them.
    let tls = endpoints.iter().any(|e| e.starts_with("https://"))
        || (from_env && !endpoints.iter().any(|e| e.contains("://")) && paths.ca.is_some());
    let mut builder = crate::etcd::EtcdBackend::builder(endpoints.iter().cloned());
    if tls {
        let (ca, identity) = paths.read(&ETCD_TLS_VARS)?;
        let Some(ca) = ca else {
            return Err(Error::InvalidConfig {
                backend: "etcd",
                reason: format!(
                    "{shown} needs the CA certificate that signed etcd's certificates; give \
                     its file (incumbent: --ca-file; or ETCDCTL_CACERT)"
                ),
            });
        };
        builder = builder.ca_certificate(ca);
        if let Some((cert, key)) = identity {
            builder = builder.client_identity(cert, key);
        }
    } else {
        no_tls_files(given, "etcd", &shown)?;
    }
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
    _given: &TlsFiles,
    _code: V,
) -> Result<V::Output> {
    Err(not_compiled("etcd"))
}

#[cfg(feature = "consul")]
async fn connect_consul<V: WithBackend>(
    address: &str,
    prefix: Option<&str>,
    given: &TlsFiles,
    code: V,
) -> Result<V::Output> {
    use crate::consul::{ConsulBackend, ConsulConfig};
    let address = if address.is_empty() {
        consul_address(env)
    } else {
        address.to_owned()
    };
    let mut config = ConsulConfig::new(&address);
    if address.starts_with("https://") {
        let paths = TlsPaths::resolve(given, &CONSUL_TLS_VARS, env);
        let (ca, identity) = paths.read(&CONSUL_TLS_VARS)?;
        if let Some(ca) = ca {
            config = config.ca_pem(ca);
        }
        if let Some((cert, key)) = identity {
            config = config.client_identity_pem(cert, key);
        }
    } else {
        let shown = BackendUrl::Consul {
            address: address.clone(),
            prefix: None,
        };
        no_tls_files(given, "consul", &shown.to_string())?;
    }
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
    _given: &TlsFiles,
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
            ("etcd+https://", "ETCDCTL_ENDPOINTS"),
            ("consul+https:", "CONSUL_HTTP_ADDR"),
            ("etcdx", "no scheme"),
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

    struct Info;
    impl WithBackend for Info {
        type Output = crate::backend::BackendInfo;
        async fn call<B: Backend>(self, backend: B) -> crate::backend::BackendInfo {
            backend.info()
        }
    }

    #[tokio::test]
    async fn what_a_url_knows_before_connecting_is_what_the_backend_says() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut urls = vec![
            "memory:".to_owned(),
            format!("file://{}", dir.path().display()),
        ];
        if cfg!(feature = "consul") {
            // Nothing is sent to Consul before a campaign: no agent is needed.
            urls.push("consul://127.0.0.1:1".to_owned());
        }
        for text in urls {
            let url: BackendUrl = text.parse().expect("valid");
            let info = url.connect(Info).await.expect("connect");
            assert_eq!(url.backend_name(), info.name, "{text}");
            assert_eq!(url.max_lock_delay(), info.max_lock_delay, "{text}");
        }
    }

    #[test]
    fn tls_schemes_make_https_endpoints_and_print_back() {
        let url: BackendUrl = "etcd+https://a:2379,b:2379/jobs".parse().expect("valid");
        assert_eq!(
            url,
            BackendUrl::Etcd {
                endpoints: vec!["https://a:2379".into(), "https://b:2379".into()],
                prefix: Some("jobs/".into())
            }
        );
        assert_eq!(url.to_string(), "etcd+https://a:2379,b:2379/jobs/");
        let url: BackendUrl = "consul+https://c:8501/p".parse().expect("valid");
        assert_eq!(
            url,
            BackendUrl::Consul {
                address: "https://c:8501".into(),
                prefix: Some("p/".into())
            }
        );
        assert_eq!(url.to_string(), "consul+https://c:8501/p/");
        assert_eq!(url.to_string().parse::<BackendUrl>().ok(), Some(url));
    }

    #[test]
    fn urls_without_a_host_take_the_address_from_the_environment() {
        for (text, url, shown) in [
            (
                "etcd:",
                BackendUrl::Etcd {
                    endpoints: vec![],
                    prefix: None,
                },
                "etcd:",
            ),
            (
                "etcd:///jobs",
                BackendUrl::Etcd {
                    endpoints: vec![],
                    prefix: Some("jobs/".into()),
                },
                "etcd:///jobs/",
            ),
            (
                "consul://",
                BackendUrl::Consul {
                    address: String::new(),
                    prefix: None,
                },
                "consul:",
            ),
        ] {
            let parsed: BackendUrl = text.parse().expect(text);
            assert_eq!(parsed, url, "{text}");
            assert_eq!(parsed.to_string(), shown, "{text}");
            assert_eq!(shown.parse::<BackendUrl>().ok(), Some(url), "{shown}");
        }
        assert_eq!(etcd_endpoints(vars(&[])), vec!["http://127.0.0.1:2379"]);
        assert_eq!(
            etcd_endpoints(vars(&[("ETCDCTL_ENDPOINTS", "https://a:1, b:2")])),
            vec!["https://a:1", "b:2"]
        );
        assert_eq!(consul_address(vars(&[])), "http://127.0.0.1:8500");
        assert_eq!(
            consul_address(vars(&[("CONSUL_HTTP_ADDR", "c:8501")])),
            "http://c:8501"
        );
        assert_eq!(
            consul_address(vars(&[
                ("CONSUL_HTTP_ADDR", "c:8501"),
                ("CONSUL_HTTP_SSL", "true")
            ])),
            "https://c:8501"
        );
        assert_eq!(
            consul_address(vars(&[("CONSUL_HTTP_ADDR", "https://c:8501")])),
            "https://c:8501"
        );
    }

    #[test]
    fn tls_files_given_directly_win_over_the_variables() {
        let env = vars(&[
            ("ETCDCTL_CACERT", "/env/ca.pem"),
            ("ETCDCTL_CERT", "/env/cert.pem"),
            ("CONSUL_CLIENT_KEY", "/env/consul-key.pem"),
        ]);
        let given = TlsFiles {
            ca: Some("/flag/ca.pem".into()),
            ..TlsFiles::default()
        };
        let etcd = TlsPaths::resolve(&given, &ETCD_TLS_VARS, &env);
        assert_eq!(etcd.ca, Some(("/flag/ca.pem".into(), "")));
        assert_eq!(etcd.cert, Some(("/env/cert.pem".into(), "ETCDCTL_CERT")));
        assert_eq!(etcd.key, None);
        let err = etcd.read(&ETCD_TLS_VARS).unwrap_err().to_string();
        assert!(
            err.contains("--key-file") && err.contains("ETCDCTL_KEY"),
            "{err}"
        );
        let consul = TlsPaths::resolve(&TlsFiles::default(), &CONSUL_TLS_VARS, &env);
        assert_eq!(consul.ca, None);
        assert_eq!(
            consul.key,
            Some(("/env/consul-key.pem".into(), "CONSUL_CLIENT_KEY"))
        );
        let missing = TlsPaths {
            ca: Some(("/no/such/ca.pem".into(), "CONSUL_CACERT")),
            ..TlsPaths::default()
        };
        let err = missing.read(&CONSUL_TLS_VARS).unwrap_err().to_string();
        assert!(
            err.contains("/no/such/ca.pem") && err.contains("CONSUL_CACERT"),
            "{err}"
        );
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
