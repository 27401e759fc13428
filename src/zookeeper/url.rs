//! ZooKeeper's URL form, `zk://host:port[,host:port…][/chroot]`, and its credentials from the
//! environment (`INCUMBENT_ZK_AUTH`). See [`url`](crate::url).

use super::{ZookeeperBackend, ZookeeperBuilder};
use crate::Result;
use crate::secret::{CREDENTIALS_HINT, bad, hosts_and_prefix, split_url, wrong_scheme};

/// The form, for messages.
pub(crate) const FORM: &str = "zk://host:port[,host:port][/chroot]";

/// `zk:…`, after the scheme: the servers and chroot.
pub(crate) fn parse(shown: &str, rest: &str) -> Result<(Vec<String>, Option<String>)> {
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
    Ok((
        hosts
            .iter()
            .map(|h| h.trim_start_matches("http://").to_owned())
            .collect(),
        chroot.map(|c| format!("/{}", c.trim_end_matches('/'))),
    ))
}

impl ZookeeperBackend {
    /// A builder for the ensemble a URL names (`zk://host:port[,host:port…][/chroot]`), with
    /// the digest credentials of `INCUMBENT_ZK_AUTH`, as [`url`](crate::url) describes: set
    /// more with the builder, then [`connect`](ZookeeperBuilder::connect).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a URL of another form (shown
    /// redacted), credentials in it, or a malformed `INCUMBENT_ZK_AUTH`.
    pub fn from_url(url: &str) -> Result<ZookeeperBuilder> {
        let (shown, scheme, rest) = split_url(url, FORM)?;
        if scheme != "zk" {
            return Err(wrong_scheme(&shown, FORM));
        }
        let (servers, chroot) = parse(&shown, rest)?;
        builder(&servers, chroot.as_deref())
    }
}

/// The builder for these servers and chroot, with the credentials of the environment.
pub(crate) fn builder(servers: &[String], chroot: Option<&str>) -> Result<ZookeeperBuilder> {
    let connect = format!("{}{}", servers.join(","), chroot.unwrap_or_default());
    ZookeeperBackend::builder(connect).auth_from_env()
}
