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
    /// A builder for the memcached server a URL names (`memcached://host:port`): set more
    /// with the builder, then [`connect`](MemcachedBuilder::connect).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a URL of another form (shown
    /// redacted).
    pub fn from_url(url: &str) -> Result<MemcachedBuilder> {
        let (shown, scheme, rest) = split_url(url, FORM)?;
        if scheme != "memcached" {
            return Err(wrong_scheme(&shown, FORM));
        }
        Ok(MemcachedBackend::builder(parse(&shown, rest)?))
    }
}
