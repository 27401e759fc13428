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
//! | `k8s://[namespace]`, `kubernetes:` | Kubernetes Leases: the kubeconfig (`KUBECONFIG`, `~/.kube/config`) else the pod's service account, in the namespace given or the configuration's; `kubernetes:` the service account and the pod's namespace only | `kubernetes` |
//! | `redis://host:port[/db]`, `rediss://host:port[/db]` | Redis (database `db`, default 0; `rediss://`: TLS, the server's certificate checked against `INCUMBENT_REDIS_CA_FILE` or the system's roots) | `redis` (`redis-tls` for `rediss://`) |
//! | `zk://host:port[,host:port…][/chroot]` | ZooKeeper | `zookeeper` |
//! | `postgres://host[:port][,host[:port]…][/dbname]`, `postgresql://…`, or `postgres:` | PostgreSQL (the first host that takes writes; `postgres:`: `PGHOST`, `PGPORT` and `PGDATABASE`; TLS by `PGSSLMODE`) | `postgres` (`postgres-tls` for TLS) |
//!
//! Each store owns its form and its settings from the environment: its `from_url` gives the
//! store's builder, to set more before connecting
//! ([`EtcdBackend::from_url`](crate::etcd::EtcdBackend::from_url),
//! [`ConsulBackend::from_url`](crate::consul::ConsulBackend::from_url),
//! [`RedisBackend::from_url`](crate::redis::RedisBackend::from_url),
//! [`MemcachedBackend::from_url`](crate::memcached::MemcachedBackend::from_url),
//! [`ZookeeperBackend::from_url`](crate::zookeeper::ZookeeperBackend::from_url),
//! [`PostgresBackend::from_url`](crate::postgres::PostgresBackend::from_url),
//! [`FileBackend::from_url`](crate::file::FileBackend::from_url)). [`BackendUrl`] is the
//! dispatch above them: it picks the store by the scheme, and a store whose feature is not
//! compiled in is an [`Error::InvalidConfig`] that names the feature.
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
//! | `PGUSER` | PostgreSQL | the user (unset: the OS user, as libpq) |
//! | `PGPASSWORD` | PostgreSQL | the password; unset: the password file's |
//! | `PGPASSFILE` | PostgreSQL | the password file (default `~/.pgpass`; `host:port:database:user:password` lines, as libpq reads them; ignored when group or others may read it) |
//! | `PGSSLMODE` | PostgreSQL | `require`, `verify-ca` or `verify-full`: TLS, the server's certificate and host name always checked (stricter than libpq's `require`); unset, `disable`, `allow` or `prefer`: no TLS |
//! | `PGSSLROOTCERT` | PostgreSQL | the CA certificate file (PEM); unset: the system's roots |
//! | `PGSSLCERT`, `PGSSLKEY` | PostgreSQL | the client certificate and key files (PEM) |
//! | `PGHOST`, `PGPORT`, `PGDATABASE`, `PGAPPNAME` | PostgreSQL | the hosts (comma-separated) and port of `postgres:`, the database when the URL names none (default: the user), the application name (default `incumbent`) |
//! | `INCUMBENT_PG_TABLE` | PostgreSQL | the lease table (default `incumbent_leases`) |
//! | `INCUMBENT_PG_LISTEN` | PostgreSQL | `off` behind a transaction pooler (PgBouncer's `pool_mode = transaction`), where `LISTEN` hears nothing: followers poll |
//! | `INCUMBENT_POLL_INTERVAL` | Redis, memcached, PostgreSQL | how often followers poll, a whole number of `ms` or `s` (default `500ms`): a hand-off takes about half of it, and each poll is one request per follower and election |
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
//! `CONSUL_HTTP_ADDR`) turn TLS on; for `postgres://`, `PGSSLMODE` or a [`TlsFiles`] file
//! (which wins over `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`) does. The certificate files come from [`TlsFiles`] (the CLI's
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
pub use crate::secret::TlsFiles;
#[allow(unused_imports)]
use crate::secret::{bad, not_compiled, redact, redact_prefix, show_endpoints, split_url};
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
    /// PostgreSQL servers (`host[:port]`, the first that takes writes) and a database.
    Postgres {
        /// The hosts, as given; none: `PGHOST` (see the [module docs](self)).
        hosts: Vec<String>,
        /// The database, if given.
        dbname: Option<String>,
    },
    /// A Kubernetes cluster's Leases (`k8s://namespace`, `kubernetes:`).
    Kubernetes {
        /// The pod's service account only (`kubernetes:`), never a kubeconfig.
        in_cluster: bool,
        /// The namespace; none: the configuration's.
        namespace: Option<String>,
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

const FORMS: &str = "use file:///dir, memory:, etcd[+https]://host:port[,host:port][/prefix], consul[+https]://host:port[/prefix], redis[s]://host:port[/db], memcached://host:port, postgres://host[:port][,host[:port]][/dbname], zk://host:port[,host:port][/chroot], k8s://[namespace] or kubernetes:";

/// Each scheme goes to its store's URL form (`etcd/url.rs`, `consul/url.rs`, …); a store
/// whose feature is not compiled in says which feature to enable.
impl FromStr for BackendUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        let (shown, scheme, rest) = split_url(url, FORMS)?;
        let shown = shown.as_str();
        match scheme {
            "memory" => Ok(BackendUrl::Memory),
            "file" => parse_file(shown, rest),
            "etcd" | "etcd+https" => parse_etcd(shown, scheme, rest),
            "consul" | "consul+https" => parse_consul(shown, scheme, rest),
            "zk" => parse_zookeeper(shown, rest),
            "redis" | "rediss" => parse_redis(shown, rest, scheme == "rediss"),
            "memcached" => parse_memcached(shown, rest),
            "postgres" | "postgresql" => parse_postgres(shown, rest),
            "k8s" | "kubernetes" => parse_kubernetes(shown, scheme, rest),
            // Only the scheme is shown: what follows may be a password (`user:password`).
            other => Err(bad(format!("unknown scheme {other:?}; {FORMS}"))),
        }
    }
}

/// Defines `parse_<store>` (the store's URL form, or "not compiled") and `connect_<store>`
/// (the store's builder from the parsed parts, connected, or "not compiled") for a store
/// behind a feature.
macro_rules! store_form {
    ($feature:literal, $parse:ident ($($arg:ident : $ty:ty),*) $parse_body:block,
     $connect:ident ($code:ident $(, $carg:ident : $cty:ty)*) $connect_body:block) => {
        #[cfg(feature = $feature)]
        fn $parse($($arg: $ty),*) -> Result<BackendUrl> $parse_body

        #[cfg(not(feature = $feature))]
        fn $parse($(_: $ty),*) -> Result<BackendUrl> {
            Err(not_compiled($feature))
        }

        #[cfg(feature = $feature)]
        async fn $connect<V: WithBackend>($code: V $(, $carg: $cty)*) -> Result<V::Output> $connect_body

        #[cfg(not(feature = $feature))]
        async fn $connect<V: WithBackend>(_: V $(, _: $cty)*) -> Result<V::Output> {
            Err(not_compiled($feature))
        }
    };
}

store_form!(
    "etcd",
    parse_etcd(shown: &str, scheme: &str, rest: &str) {
        let (endpoints, prefix) = crate::etcd::url::parse(shown, scheme, rest)?;
        Ok(BackendUrl::Etcd { endpoints, prefix })
    },
    connect_etcd(code, endpoints: &[String], prefix: Option<&str>, tls: &TlsFiles) {
        let backend = crate::etcd::url::builder(endpoints, prefix, tls)?.connect().await?;
        Ok(code.call(backend).await)
    }
);

store_form!(
    "consul",
    parse_consul(shown: &str, scheme: &str, rest: &str) {
        let (address, prefix) = crate::consul::url::parse(shown, scheme, rest)?;
        Ok(BackendUrl::Consul { address, prefix })
    },
    connect_consul(code, address: &str, prefix: Option<&str>, tls: &TlsFiles) {
        let backend = crate::consul::url::builder(address, prefix, tls)?.build()?;
        Ok(code.call(backend).await)
    }
);

store_form!(
    "zookeeper",
    parse_zookeeper(shown: &str, rest: &str) {
        let (servers, chroot) = crate::zookeeper::url::parse(shown, rest)?;
        Ok(BackendUrl::Zookeeper { servers, chroot })
    },
    connect_zookeeper(code, servers: &[String], chroot: Option<&str>) {
        let backend = crate::zookeeper::url::builder(servers, chroot)?.connect().await?;
        Ok(code.call(backend).await)
    }
);

store_form!(
    "redis",
    parse_redis(shown: &str, rest: &str, tls: bool) {
        let (address, db) = crate::redis::url::parse(shown, rest)?;
        Ok(BackendUrl::Redis { address, db, tls })
    },
    connect_redis(code, address: &str, db: i64, tls: bool) {
        let backend = crate::redis::url::builder(address, db, tls)?.connect().await?;
        Ok(code.call(backend).await)
    }
);

store_form!(
    "kubernetes",
    parse_kubernetes(shown: &str, scheme: &str, rest: &str) {
        let (in_cluster, namespace) = crate::kubernetes::url::parse(shown, scheme, rest)?;
        Ok(BackendUrl::Kubernetes { in_cluster, namespace })
    },
    connect_kubernetes(code, in_cluster: bool, namespace: Option<&str>) {
        let backend = crate::kubernetes::url::builder(in_cluster, namespace).connect().await?;
        Ok(code.call(backend).await)
    }
);

store_form!(
    "memcached",
    parse_memcached(shown: &str, rest: &str) {
        let address = crate::memcached::url::parse(shown, rest)?;
        Ok(BackendUrl::Memcached { address })
    },
    connect_memcached(code, address: &str) {
        let backend = crate::memcached::url::builder(address)?.connect().await?;
        Ok(code.call(backend).await)
    }
);

store_form!(
    "postgres",
    parse_postgres(shown: &str, rest: &str) {
        let (hosts, dbname) = crate::postgres::url::parse(shown, rest)?;
        Ok(BackendUrl::Postgres { hosts, dbname })
    },
    connect_postgres(code, hosts: &[String], dbname: Option<&str>, tls: &TlsFiles) {
        let dbname = dbname.map(str::to_owned);
        let builder = crate::postgres::url::builder(hosts, dbname, tls, crate::secret::env)?;
        Ok(code.call(builder.connect().await?).await)
    }
);

#[cfg(all(feature = "file", unix))]
fn parse_file(shown: &str, rest: &str) -> Result<BackendUrl> {
    Ok(BackendUrl::File {
        dir: crate::file::parse_url(shown, rest)?,
    })
}

#[cfg(not(all(feature = "file", unix)))]
fn parse_file(_shown: &str, _rest: &str) -> Result<BackendUrl> {
    Err(not_compiled("file"))
}

#[cfg(all(feature = "file", unix))]
async fn connect_file<V: WithBackend>(code: V, dir: Option<PathBuf>) -> Result<V::Output> {
    let backend = match dir {
        Some(dir) => crate::file::FileBackend::in_dir(dir),
        None => crate::file::FileBackend::new(),
    };
    Ok(code.call(backend).await)
}

#[cfg(not(all(feature = "file", unix)))]
async fn connect_file<V: WithBackend>(_code: V, _dir: Option<PathBuf>) -> Result<V::Output> {
    Err(not_compiled("file"))
}

/// The URL as written, with user info, query strings and fragments redacted (a parsed URL
/// has none, but the fields are public).
impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendUrl::Memory => write!(f, "memory:"),
            BackendUrl::File { dir: None } => write!(f, "file:"),
            BackendUrl::File { dir: Some(dir) } => write!(f, "file://{}", dir.display()),
            BackendUrl::Etcd { endpoints, prefix } => {
                f.write_str(&show_endpoints("etcd", endpoints, prefix.as_deref()))
            }
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
            BackendUrl::Consul { address, prefix } => {
                let hosts: &[String] = if address.is_empty() {
                    &[]
                } else {
                    std::slice::from_ref(address)
                };
                f.write_str(&show_endpoints("consul", hosts, prefix.as_deref()))
            }
            BackendUrl::Redis { address, db, tls } => {
                let scheme = if *tls { "rediss" } else { "redis" };
                write!(f, "{scheme}://{}/{db}", redact(address))
            }
            BackendUrl::Memcached { address } => write!(f, "memcached://{}", redact(address)),
            BackendUrl::Kubernetes {
                in_cluster: true, ..
            } => f.write_str("kubernetes:"),
            BackendUrl::Kubernetes { namespace, .. } => {
                write!(f, "k8s://{}", namespace.as_deref().unwrap_or_default())
            }
            BackendUrl::Postgres { hosts, dbname } => write!(
                f,
                "postgres://{}{}",
                hosts
                    .iter()
                    .map(|h| redact(h))
                    .collect::<Vec<_>>()
                    .join(","),
                dbname
                    .as_deref()
                    .map(|d| format!("/{}", redact_prefix(d)))
                    .unwrap_or_default()
            ),
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
            BackendUrl::Kubernetes {
                in_cluster,
                namespace,
            } => f
                .debug_struct("Kubernetes")
                .field("in_cluster", in_cluster)
                .field("namespace", namespace)
                .finish(),
            BackendUrl::Postgres { hosts, dbname } => f
                .debug_struct("Postgres")
                .field(
                    "hosts",
                    &hosts.iter().map(|h| redact(h)).collect::<Vec<_>>(),
                )
                .field("dbname", &dbname.as_deref().map(redact_prefix))
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
            BackendUrl::Kubernetes { .. } => "kubernetes",
            BackendUrl::Redis { .. } => "redis",
            BackendUrl::Postgres { .. } => "postgres",
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
        let tls_capable = matches!(
            self,
            BackendUrl::Etcd { .. } | BackendUrl::Consul { .. } | BackendUrl::Postgres { .. }
        );
        if !tls_capable && !tls.is_empty() {
            return Err(bad(format!(
                "TLS certificate files were given, but {self} has no TLS; they apply to \
                 etcd+https://, consul+https:// and postgres:// only"
            )));
        }
        match self {
            BackendUrl::Memory => Ok(code.call(crate::memory::MemoryBackend::new()).await),
            BackendUrl::File { dir } => connect_file(code, dir.clone()).await,
            BackendUrl::Etcd { endpoints, prefix } => {
                connect_etcd(code, endpoints, prefix.as_deref(), tls).await
            }
            BackendUrl::Zookeeper { servers, chroot } => {
                connect_zookeeper(code, servers, chroot.as_deref()).await
            }
            BackendUrl::Consul { address, prefix } => {
                connect_consul(code, address, prefix.as_deref(), tls).await
            }
            BackendUrl::Redis { address, db, tls } => connect_redis(code, address, *db, *tls).await,
            BackendUrl::Memcached { address } => connect_memcached(code, address).await,
            BackendUrl::Kubernetes {
                in_cluster,
                namespace,
            } => connect_kubernetes(code, *in_cluster, namespace.as_deref()).await,
            BackendUrl::Postgres { hosts, dbname } => {
                connect_postgres(code, hosts, dbname.as_deref(), tls).await
            }
        }
    }
}

/// Consul's longest lock-delay (`consul::MAX_LOCK_DELAY`, here in builds without Consul too).
const CONSUL_MAX_LOCK_DELAY: std::time::Duration = std::time::Duration::from_secs(60);

// The forms of every store, so only with every store compiled in (`--all-features`).
#[cfg(all(
    test,
    unix,
    feature = "file",
    feature = "etcd",
    feature = "consul",
    feature = "redis",
    feature = "memcached",
    feature = "zookeeper"
))]
mod tests {
    use super::*;
    use crate::consul::url::{
        TLS_VARS as CONSUL_TLS_VARS, address_from as consul_address, token as consul_token,
    };
    use crate::etcd::url::{
        TLS_VARS as ETCD_TLS_VARS, credentials as etcd_credentials,
        endpoints_from as etcd_endpoints,
    };
    use crate::redis::url::credentials as redis_credentials;
    use crate::secret::TlsPaths;

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

    #[test]
    fn each_store_builds_from_its_own_url_and_refuses_the_others() {
        use crate::consul::ConsulBackend;
        use crate::etcd::EtcdBackend;
        use crate::file::FileBackend;
        use crate::memcached::MemcachedBackend;
        use crate::redis::RedisBackend;
        use crate::zookeeper::ZookeeperBackend;

        assert!(EtcdBackend::from_url("etcd://127.0.0.1:2379/jobs").is_ok());
        assert!(ConsulBackend::from_url("consul://127.0.0.1:8500").is_ok());
        assert!(RedisBackend::from_url("redis://127.0.0.1:6379/2").is_ok());
        assert!(MemcachedBackend::from_url("memcached://127.0.0.1:11211").is_ok());
        assert!(ZookeeperBackend::from_url("zk://127.0.0.1:2181/app").is_ok());
        assert_eq!(
            FileBackend::from_url("file:///var/lib/x")
                .expect("a file URL")
                .dir(),
            std::path::Path::new("/var/lib/x")
        );

        let wrong = [
            EtcdBackend::from_url("consul://127.0.0.1:8500").map(drop),
            ConsulBackend::from_url("etcd://127.0.0.1:2379").map(drop),
            RedisBackend::from_url("memcached://127.0.0.1:11211").map(drop),
            MemcachedBackend::from_url("redis://127.0.0.1:6379").map(drop),
            ZookeeperBackend::from_url("etcd://127.0.0.1:2379").map(drop),
            FileBackend::from_url("memory:").map(drop),
        ];
        for refused in wrong {
            let message = refused.expect_err("another store's URL").to_string();
            assert!(message.contains("is not a URL of this store"), "{message}");
        }
        // Secrets in a store's own URL are refused and never echoed, as by `BackendUrl`.
        let message = EtcdBackend::from_url("etcd://root:hunter2@127.0.0.1:2379")
            .map(drop)
            .expect_err("user info")
            .to_string();
        assert!(!message.contains("hunter2"), "{message}");
        let message = RedisBackend::from_url("redis://127.0.0.1:6379?password=hunter2")
            .map(drop)
            .expect_err("a query string")
            .to_string();
        assert!(!message.contains("hunter2"), "{message}");
    }
}
