//! etcd's URL form, `etcd[+https]://host:port[,host:port…][/prefix]` or `etcd:[///prefix]`,
//! and its settings from the environment: endpoints (`ETCDCTL_ENDPOINTS`), user and password
//! (`ETCDCTL_USER`, `ETCDCTL_PASSWORD`, `INCUMBENT_ETCD_*`) and TLS files (`ETCDCTL_CACERT`,
//! `ETCDCTL_CERT`, `ETCDCTL_KEY`). See [`url`](crate::url) for the table of every store's.

use super::{EtcdBackend, EtcdBuilder};
use crate::secret::{
    TlsFiles, TlsPaths, TlsVars, endpoints_and_prefix, env, no_tls_files, show_endpoints,
    split_url, wrong_scheme,
};
use crate::{Error, Result};

/// The form, for messages.
pub(crate) const FORM: &str = "etcd[+https]://host:port[,host:port][/prefix]";

/// Where `etcd:` connects when `ETCDCTL_ENDPOINTS` is unset, as etcdctl does.
const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:2379";

pub(crate) const TLS_VARS: TlsVars = TlsVars {
    backend: "etcd",
    ca: "ETCDCTL_CACERT",
    cert: "ETCDCTL_CERT",
    key: "ETCDCTL_KEY",
};

/// `etcd:…` or `etcd+https:…`, after the scheme: the endpoints (none: from
/// `ETCDCTL_ENDPOINTS` when connecting) and the key prefix.
pub(crate) fn parse(
    shown: &str,
    scheme: &str,
    rest: &str,
) -> Result<(Vec<String>, Option<String>)> {
    endpoints_and_prefix(shown, scheme, rest, "ETCDCTL_ENDPOINTS")
}

/// How a URL with these endpoints and prefix is written (redacted).
pub(crate) fn show(endpoints: &[String], prefix: Option<&str>) -> String {
    show_endpoints("etcd", endpoints, prefix)
}

impl EtcdBackend {
    /// A builder for the etcd a URL names (`etcd://host:port[,host:port…][/prefix]`,
    /// `etcd+https://…`, or `etcd:` for `ETCDCTL_ENDPOINTS`), with the user, password and TLS
    /// files from the environment, as [`url`](crate::url) describes: set more with the
    /// builder, then [`connect`](EtcdBuilder::connect).
    ///
    /// ```no_run
    /// # async fn f() -> incumbent::Result<()> {
    /// let etcd = incumbent::etcd::EtcdBackend::from_url("etcd://127.0.0.1:2379/jobs")?
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a URL of another form (the message shows it redacted),
    /// credentials in it, or TLS settings that do not fit (a missing CA, an unreadable file).
    pub fn from_url(url: &str) -> Result<EtcdBuilder> {
        let (shown, scheme, rest) = split_url(url, FORM)?;
        if !matches!(scheme, "etcd" | "etcd+https") {
            return Err(wrong_scheme(&shown, FORM));
        }
        let (endpoints, prefix) = parse(&shown, scheme, rest)?;
        builder(&endpoints, prefix.as_deref(), &TlsFiles::default())
    }
}

/// The builder for these endpoints (none: `ETCDCTL_ENDPOINTS`) and prefix, with the TLS files
/// of `given` (each winning over its variable) and the credentials of the environment.
pub(crate) fn builder(
    endpoints: &[String],
    prefix: Option<&str>,
    given: &TlsFiles,
) -> Result<EtcdBuilder> {
    let from_env = endpoints.is_empty();
    let endpoints = if from_env {
        endpoints_from(env)
    } else {
        endpoints.to_vec()
    };
    let shown = show(&endpoints, None);
    let paths = TlsPaths::resolve(given, &TLS_VARS, env);
    // Endpoints without a scheme (from ETCDCTL_ENDPOINTS only) are https:// when a CA is
    // given, as etcdctl has them.
    let tls = endpoints.iter().any(|e| e.starts_with("https://"))
        || (from_env && !endpoints.iter().any(|e| e.contains("://")) && paths.ca.is_some());
    let mut builder = EtcdBackend::builder(endpoints.iter().cloned());
    if tls {
        let (ca, identity) = paths.read(&TLS_VARS)?;
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
    if let Some((user, password)) = credentials(env)? {
        builder = builder.user(user, password);
    }
    Ok(builder)
}

/// etcd's endpoints from `ETCDCTL_ENDPOINTS` (read through `var`), or etcdctl's default.
pub(crate) fn endpoints_from(var: impl Fn(&str) -> Option<String>) -> Vec<String> {
    match var("ETCDCTL_ENDPOINTS") {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
        None => vec![DEFAULT_ENDPOINT.to_owned()],
    }
}

/// The etcd user and password from the environment (see [`url`](crate::url)), read through
/// `var`.
pub(crate) fn credentials(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<(String, String)>> {
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
