//! memcached's URL form, `memcached://host:port` (memcached has no authentication). See
//! [`url`](crate::url).

use super::{MemcachedBackend, MemcachedBuilder};
use crate::Result;
use crate::secret::{bad, hosts_and_prefix, split_url, wrong_scheme};

/// The form, for messages.
pub(crate) const FORM: &str = "memcached://host:port";

/// `memcached:…`, after the scheme: the server's address.
pub(crate) fn parse(shown: &str, rest: &str) -> Result<String> {
    if rest.contains(['?', '#']) || rest.trim_start_matches("//").contains('/') {
        return Err(bad(format!(
            "{shown:?}: write memcached://host:port (no path, no query string)"
        )));
    }
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (hosts, _) = hosts_and_prefix(shown, rest)?;
    if hosts.len() > 1 {
        return Err(bad(format!("{shown:?}: name one memcached server")));
    }
    Ok(rest.to_owned())
}

impl MemcachedBackend {
    /// A builder for the memcached server a URL names (`memcached://host:port`), with the
    /// poll interval of `INCUMBENT_POLL_INTERVAL` if set: set more with the builder, then
    /// [`connect`](MemcachedBuilder::connect).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a URL of another form (shown
    /// redacted), or an `INCUMBENT_POLL_INTERVAL` that is not a duration.
    pub fn from_url(url: &str) -> Result<MemcachedBuilder> {
        let (shown, scheme, rest) = split_url(url, FORM)?;
        if scheme != "memcached" {
            return Err(wrong_scheme(&shown, FORM));
        }
        builder(&parse(&shown, rest)?)
    }
}

/// The builder for this server, with the poll interval of the environment.
pub(crate) fn builder(address: &str) -> Result<MemcachedBuilder> {
    MemcachedBackend::builder(address).poll_interval_from(
        crate::secret::env(crate::backend::polled::POLL_INTERVAL_ENV),
        super::NAME,
    )
}
