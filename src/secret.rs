//! Secrets and URLs, below every store: redaction, the one URL error, the pieces of URL
//! forms that several stores share, credentials and TLS files from the environment.
//!
//! A leaf: it imports nothing of the crate but [`Error`]. Every store module owns its URL
//! form (e.g. [`etcd`](crate::etcd)'s in `etcd/url.rs`) and builds it from these pieces; the
//! scheme dispatch, [`url::BackendUrl`](crate::url::BackendUrl), sits above the stores, and no
//! store imports it.

use std::path::PathBuf;

use crate::{Error, Result};

/// Where credentials go instead of the URL.
pub(crate) const CREDENTIALS_HINT: &str = "credentials come from the environment, never the URL: \
     ETCDCTL_USER=user:password (or ETCDCTL_USER and ETCDCTL_PASSWORD) for etcd, \
     CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE for Consul, \
     INCUMBENT_ZK_AUTH=user:password for ZooKeeper, \
     INCUMBENT_REDIS_USER and INCUMBENT_REDIS_PASSWORD (or REDISCLI_AUTH) for Redis, \
     the kubeconfig (KUBECONFIG) or the pod's service account for Kubernetes \
     (memcached has no authentication)";

/// An invalid URL: [`Error::InvalidConfig`] with backend `"url"`. The reason must show the
/// URL redacted ([`redact`]), never as given.
pub(crate) fn bad(reason: String) -> Error {
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

/// A key prefix as shown: cut at a `?` or `#`, which every store's URL form refuses anyway.
pub(crate) fn redact_prefix(prefix: &str) -> String {
    match prefix.find(['?', '#', '@']) {
        Some(i) => format!("{}***", &prefix[..i]),
        None => prefix.to_owned(),
    }
}

/// Splits `host:port[,host:port…][/prefix]` and checks each address.
pub(crate) fn hosts_and_prefix(shown: &str, rest: &str) -> Result<(Vec<String>, Option<String>)> {
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

/// Splits a backend URL into its scheme and the rest, refusing user info (`user:password@`)
/// in any scheme but `file:`. Returns the URL as it may be shown (redacted), the scheme, and
/// what follows the `:`.
pub(crate) fn split_url<'u>(url: &'u str, forms: &str) -> Result<(String, &'u str, &'u str)> {
    // Every message shows the URL redacted: it may hold a password or token.
    let shown = redact(url);
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(bad(format!("{shown:?} has no scheme; {forms}")));
    };
    if url.contains('@') && scheme != "file" {
        return Err(bad(format!(
            "{shown:?}: user info (user:password@) is not allowed in a backend URL; \
             {CREDENTIALS_HINT}"
        )));
    }
    Ok((shown, scheme, rest))
}

/// A store's `from_url` given another store's URL.
#[allow(dead_code)]
pub(crate) fn wrong_scheme(shown: &str, form: &str) -> Error {
    bad(format!(
        "{shown:?} is not a URL of this store; write {form}"
    ))
}

/// `etcd[+https]:…` and `consul[+https]:…`, after the scheme: the endpoints (`http://` or,
/// with `+https`, `https://`; none: from the variable `from_env`) and the key prefix.
#[allow(dead_code)]
pub(crate) fn endpoints_and_prefix(
    shown: &str,
    scheme: &str,
    rest: &str,
    from_env: &str,
) -> Result<(Vec<String>, Option<String>)> {
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
    let hosts = if tls {
        hosts
            .iter()
            .map(|h| h.replacen("http://", "https://", 1))
            .collect()
    } else {
        hosts
    };
    Ok((hosts, prefix))
}

/// TLS certificate files for etcd and Consul, given directly (the CLI's `--ca-file`,
/// `--cert-file` and `--key-file`). Each file given here wins over its environment variable
/// (`ETCDCTL_CACERT`, `CONSUL_CACERT`, …); see [`url`](crate::url#tls).
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
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

/// The environment variables of one store's TLS files.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub(crate) struct TlsVars {
    pub backend: &'static str,
    pub ca: &'static str,
    pub cert: &'static str,
    pub key: &'static str,
}

/// The PEM of a store's CA and client identity, read from the files of `given` or, for each
/// one not given, of the variables `vars` names (through `var`).
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsPaths {
    /// Each path, with where it came from (a variable's name, or "" when given directly).
    pub ca: Option<(PathBuf, &'static str)>,
    pub cert: Option<(PathBuf, &'static str)>,
    pub key: Option<(PathBuf, &'static str)>,
}

#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
impl TlsPaths {
    /// Each file of `given`, or else of its variable.
    pub(crate) fn resolve(
        given: &TlsFiles,
        vars: &TlsVars,
        var: impl Fn(&str) -> Option<String>,
    ) -> Self {
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
    pub(crate) fn read(
        &self,
        vars: &TlsVars,
    ) -> Result<(Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>)> {
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
pub(crate) fn no_tls_files(given: &TlsFiles, backend: &'static str, shown: &str) -> Result<()> {
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

#[cfg_attr(
    all(feature = "file", unix, feature = "etcd", feature = "consul"),
    allow(dead_code)
)]
pub(crate) fn not_compiled(feature: &'static str) -> Error {
    Error::InvalidConfig {
        backend: feature,
        reason: format!(
            "this build has no {feature} backend; rebuild with `--features {feature}` (or `full`)"
        ),
    }
}

/// A variable of the process environment; empty counts as unset.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A password, token or key, kept out of `Debug` output and logs.
#[derive(Clone, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `etcd` or `consul`, with `+https` when the endpoints are https://, and `store:` when
/// they come from the environment.
pub(crate) fn show_endpoints(name: &str, hosts: &[String], prefix: Option<&str>) -> String {
    let prefix = prefix
        .map(|p| format!("/{}", redact_prefix(p)))
        .unwrap_or_default();
    if hosts.is_empty() {
        return if prefix.is_empty() {
            format!("{name}:")
        } else {
            format!("{name}://{prefix}")
        };
    }
    let tls = if hosts.iter().any(|h| h.starts_with("https://")) {
        "+https"
    } else {
        ""
    };
    let hosts: Vec<String> = hosts
        .iter()
        .map(|e| {
            redact(
                e.trim_start_matches("http://")
                    .trim_start_matches("https://"),
            )
        })
        .collect();
    format!("{name}{tls}://{}{prefix}", hosts.join(","))
}
