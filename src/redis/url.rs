//! Redis's URL form, `redis[s]://host:port[/db]`, and its settings from the environment: the
//! user and password (`INCUMBENT_REDIS_USER`, `INCUMBENT_REDIS_PASSWORD`, `REDISCLI_AUTH`)
//! and, for `rediss://`, the CA file (`INCUMBENT_REDIS_CA_FILE`). See [`url`](crate::url).

use super::{RedisBackend, RedisBuilder, RedisConfig};
use crate::Result;
use crate::secret::{CREDENTIALS_HINT, bad, env, hosts_and_prefix, split_url, wrong_scheme};

/// The form, for messages.
pub(crate) const FORM: &str = "redis[s]://host:port[/db]";

/// `redis:…` (or `rediss:…`), after the scheme: the address and database.
pub(crate) fn parse(shown: &str, rest: &str) -> Result<(String, i64)> {
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
    Ok((host.to_owned(), db))
}

impl RedisBackend {
    /// A builder for the Redis server a URL names (`redis://host:port[/db]`, or `rediss://`
    /// for TLS), with the user, password and CA file from the environment, as
    /// [`url`](crate::url) describes: set more with the builder, then
    /// [`connect`](RedisBuilder::connect).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a URL of another form
    /// (shown redacted), credentials in it, or `rediss://` without the `redis-tls` feature.
    pub fn from_url(url: &str) -> Result<RedisBuilder> {
        let (shown, scheme, rest) = split_url(url, FORM)?;
        let tls = match scheme {
            "redis" => false,
            "rediss" => true,
            _ => return Err(wrong_scheme(&shown, FORM)),
        };
        let (address, db) = parse(&shown, rest)?;
        builder(&address, db, tls)
    }
}

/// The builder for this server and database, with TLS if asked, and the credentials and
/// poll interval (`INCUMBENT_POLL_INTERVAL`) of the environment.
pub(crate) fn builder(address: &str, db: i64, tls: bool) -> Result<RedisBuilder> {
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
        return Err(crate::secret::not_compiled("redis-tls"));
    }
    let (user, password) = credentials(env);
    if let Some(user) = user {
        config = config.username(user);
    }
    if let Some(password) = password {
        config = config.password(password);
    }
    RedisBackend::builder(config)
        .poll_interval_from(env(crate::backend::polled::POLL_INTERVAL_ENV), super::NAME)
}

/// The Redis user and password from the environment (see [`url`](crate::url)), read through
/// `var`.
pub(crate) fn credentials(
    var: impl Fn(&str) -> Option<String>,
) -> (Option<String>, Option<String>) {
    let password = var("INCUMBENT_REDIS_PASSWORD").or_else(|| var("REDISCLI_AUTH"));
    (var("INCUMBENT_REDIS_USER"), password)
}
