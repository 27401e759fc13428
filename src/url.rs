//! Backend URLs: choose a store at run time, from a string.
//!
//! | URL | backend | feature |
//! |---|---|---|
//! | `file:///path/to/dir`, or `file:` for the default directory | [`FileBackend`](crate::file::FileBackend) | `file` |
//! | `memory:` | [`MemoryBackend`](crate::memory::MemoryBackend) (this process only) | always |
//! | `etcd://host:port[,host:port…][/prefix]` | etcd | `etcd` |
//! | `consul://host:port[/prefix]` | Consul | `consul` |
//!
//! Credentials never go in the URL (it ends up in logs and process lists): they come from
//! the environment. etcd reads `INCUMBENT_ETCD_USER` and `INCUMBENT_ETCD_PASSWORD`; Consul
//! reads `CONSUL_HTTP_TOKEN`, as Consul's own tools do.
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// A Consul agent's HTTP address (`http://host:port`) and a key prefix.
    Consul {
        /// The agent's HTTP address.
        address: String,
        /// Key prefix, if given.
        prefix: Option<String>,
    },
}

/// Code to run with whichever backend a [`BackendUrl`] names.
pub trait WithBackend {
    /// What the code returns.
    type Output;
    /// Runs with the connected backend.
    fn call<B: Backend>(self, backend: B) -> impl Future<Output = Self::Output>;
}

const FORMS: &str = "use file:///dir, memory:, etcd://host:port[,host:port][/prefix] or consul://host:port[/prefix]";

fn bad(reason: String) -> Error {
    Error::InvalidConfig {
        backend: "url",
        reason,
    }
}

/// Splits `host:port[,host:port…][/prefix]` and checks each address.
fn hosts_and_prefix(url: &str, rest: &str) -> Result<(Vec<String>, Option<String>)> {
    let (hosts, prefix) = match rest.split_once('/') {
        Some((hosts, prefix)) => (hosts, Some(prefix).filter(|p| !p.is_empty())),
        None => (rest, None),
    };
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let valid = host
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !valid || host.contains('@') {
            return Err(bad(format!(
                "{url:?}: {host:?} is not host:port{}",
                if host.contains('@') {
                    " (credentials go in environment variables, not in the URL)"
                } else {
                    ""
                }
            )));
        }
        out.push(format!("http://{host}"));
    }
    Ok((out, prefix.map(|p| format!("{}/", p.trim_end_matches('/')))))
}

impl FromStr for BackendUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(bad(format!("{url:?} has no scheme; {FORMS}")));
        };
        match scheme {
            "memory" => Ok(BackendUrl::Memory),
            "file" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if !path.is_empty() && !path.starts_with('/') {
                    return Err(bad(format!(
                        "{url:?}: a file URL needs an absolute path, as in file:///var/lib/app/elections"
                    )));
                }
                Ok(BackendUrl::File {
                    dir: Some(path).filter(|p| !p.is_empty()).map(PathBuf::from),
                })
            }
            "etcd" | "consul" => {
                let Some(rest) = rest.strip_prefix("//").filter(|r| !r.is_empty()) else {
                    return Err(bad(format!("{url:?}: write {scheme}://host:port")));
                };
                let (hosts, prefix) = hosts_and_prefix(url, rest)?;
                if scheme == "etcd" {
                    Ok(BackendUrl::Etcd {
                        endpoints: hosts,
                        prefix,
                    })
                } else if hosts.len() > 1 {
                    Err(bad(format!(
                        "{url:?}: name one Consul agent (the local one); agents forward to the servers"
                    )))
                } else {
                    Ok(BackendUrl::Consul {
                        address: hosts.into_iter().next().unwrap_or_default(),
                        prefix,
                    })
                }
            }
            "zk" | "redis" | "memcached" => Err(bad(format!(
                "{url:?}: the {scheme} backend is not available in this version; {FORMS}"
            ))),
            other => Err(bad(format!("{url:?}: unknown scheme {other:?}; {FORMS}"))),
        }
    }
}

impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let strip = |e: &String| e.trim_start_matches("http://").to_owned();
        match self {
            BackendUrl::Memory => write!(f, "memory:"),
            BackendUrl::File { dir: None } => write!(f, "file:"),
            BackendUrl::File { dir: Some(dir) } => write!(f, "file://{}", dir.display()),
            BackendUrl::Etcd { endpoints, prefix } => write!(
                f,
                "etcd://{}{}",
                endpoints.iter().map(strip).collect::<Vec<_>>().join(","),
                prefix
                    .as_deref()
                    .map(|p| format!("/{p}"))
                    .unwrap_or_default()
            ),
            BackendUrl::Consul { address, prefix } => write!(
                f,
                "consul://{}{}",
                strip(address),
                prefix
                    .as_deref()
                    .map(|p| format!("/{p}"))
                    .unwrap_or_default()
            ),
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
            BackendUrl::Consul { address, prefix } => {
                connect_consul(address, prefix.as_deref(), code).await
            }
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
    if let Ok(user) = std::env::var("INCUMBENT_ETCD_USER")
        && !user.is_empty()
    {
        let password = std::env::var("INCUMBENT_ETCD_PASSWORD").unwrap_or_default();
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
    if let Ok(token) = std::env::var("CONSUL_HTTP_TOKEN") {
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
            ("zk://a:2181", "not available"),
        ] {
            let err = url.parse::<BackendUrl>().unwrap_err().to_string();
            assert!(err.contains(hint), "{url}: {err}");
        }
    }
}
