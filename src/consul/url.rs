//! Consul's URL form, `consul[+https]://host:port[/prefix]` or `consul:[///prefix]`, and its
//! settings from the environment: the agent (`CONSUL_HTTP_ADDR`, `CONSUL_HTTP_SSL`), the ACL
//! token (`CONSUL_HTTP_TOKEN`, `CONSUL_HTTP_TOKEN_FILE`) and TLS files (`CONSUL_CACERT`,
//! `CONSUL_CLIENT_CERT`, `CONSUL_CLIENT_KEY`). See [`url`](crate::url) for every store's.

use super::{ConsulBackend, ConsulBuilder, ConsulConfig};
use crate::secret::{
    TlsFiles, TlsPaths, TlsVars, bad, endpoints_and_prefix, env, no_tls_files, show_endpoints,
    split_url, wrong_scheme,
};
use crate::{Error, Result};

/// The form, for messages.
pub(crate) const FORM: &str = "consul[+https]://host:port[/prefix]";

/// Where `consul:` connects when `CONSUL_HTTP_ADDR` is unset, as Consul's tools do.
const DEFAULT_ADDRESS: &str = "http://127.0.0.1:8500";

pub(crate) const TLS_VARS: TlsVars = TlsVars {
    backend: "consul",
    ca: "CONSUL_CACERT",
    cert: "CONSUL_CLIENT_CERT",
    key: "CONSUL_CLIENT_KEY",
};

/// `consul:…` or `consul+https:…`, after the scheme: the agent's address (empty: from
/// `CONSUL_HTTP_ADDR` when connecting) and the key prefix.
pub(crate) fn parse(shown: &str, scheme: &str, rest: &str) -> Result<(String, Option<String>)> {
    let (hosts, prefix) = endpoints_and_prefix(shown, scheme, rest, "CONSUL_HTTP_ADDR")?;
    if hosts.len() > 1 {
        return Err(bad(format!(
            "{shown:?}: name one Consul agent (the local one); agents forward to the servers"
        )));
    }
    Ok((hosts.into_iter().next().unwrap_or_default(), prefix))
}

impl ConsulBackend {
    /// A builder for the Consul agent a URL names (`consul://host:port[/prefix]`,
    /// `consul+https://…`, or `consul:` for `CONSUL_HTTP_ADDR`), with the ACL token and TLS
    /// files from the environment, as [`url`](crate::url) describes: set more with the
    /// builder, then [`build`](ConsulBuilder::build).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a URL of another form (shown redacted), credentials in
    /// it, an unreadable token or TLS file.
    pub fn from_url(url: &str) -> Result<ConsulBuilder> {
        let (shown, scheme, rest) = split_url(url, FORM)?;
        if !matches!(scheme, "consul" | "consul+https") {
            return Err(wrong_scheme(&shown, FORM));
        }
        let (address, prefix) = parse(&shown, scheme, rest)?;
        builder(&address, prefix.as_deref(), &TlsFiles::default())
    }
}

/// The builder for this agent (empty: `CONSUL_HTTP_ADDR`) and prefix, with the TLS files of
/// `given` (each winning over its variable) and the token of the environment.
pub(crate) fn builder(
    address: &str,
    prefix: Option<&str>,
    given: &TlsFiles,
) -> Result<ConsulBuilder> {
    let address = if address.is_empty() {
        address_from(env)
    } else {
        address.to_owned()
    };
    let mut config = ConsulConfig::new(&address);
    if address.starts_with("https://") {
        let paths = TlsPaths::resolve(given, &TLS_VARS, env);
        let (ca, identity) = paths.read(&TLS_VARS)?;
        if let Some(ca) = ca {
            config = config.ca_pem(ca);
        }
        if let Some((cert, key)) = identity {
            config = config.client_identity_pem(cert, key);
        }
    } else {
        let shown = show_endpoints("consul", std::slice::from_ref(&address), None);
        no_tls_files(given, "consul", &shown)?;
    }
    if let Some(token) = token(env, |path| std::fs::read_to_string(path))? {
        config = config.token(token);
    }
    let mut builder = ConsulBackend::builder(config);
    if let Some(prefix) = prefix {
        builder = builder.prefix(prefix);
    }
    Ok(builder)
}

/// The Consul agent's address from `CONSUL_HTTP_ADDR` and `CONSUL_HTTP_SSL` (read through
/// `var`), or Consul's default.
pub(crate) fn address_from(var: impl Fn(&str) -> Option<String>) -> String {
    let Some(address) = var("CONSUL_HTTP_ADDR") else {
        return DEFAULT_ADDRESS.to_owned();
    };
    if address.contains("://") {
        return address;
    }
    let ssl = var("CONSUL_HTTP_SSL")
        .is_some_and(|v| matches!(v.as_str(), "true" | "1" | "TRUE" | "True"));
    format!("{}://{address}", if ssl { "https" } else { "http" })
}

/// The Consul ACL token from the environment (see [`url`](crate::url)), read through `var`,
/// the token file through `read`.
pub(crate) fn token(
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
