//! The PostgreSQL backend: an election is a row of a lease table (holder, fencing token,
//! expiry), taken, renewed, proclaimed and released by one statement each, with no session
//! state, so it works through PgBouncer in transaction mode as well as on a direct connection.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use incumbent::Election;
//! use incumbent::postgres::PostgresBackend;
//!
//! // Hosts and database from the URL; user, password (PGPASSWORD or ~/.pgpass) and TLS
//! // (PGSSLMODE, PGSSLROOTCERT) from the libpq variables.
//! let backend = PostgresBackend::from_url("postgres://db-a:5432,db-b:5432/app")?
//!     .connect()
//!     .await?;
//!
//! let election = Election::builder(backend, "jobs/index-builder")
//!     .candidate("host-a:8080")
//!     .ttl(Duration::from_secs(10))
//!     .build()?;
//! election
//!     .run(|term| async move {
//!         // pass term.fencing_token() with every write, or guard the write's transaction
//!         // (PostgresBackend::guard); stop when term.cancelled() fires
//!         term.cancelled().await;
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # The table
//!
//! The backend creates its table when it is missing (turn that off with
//! [`PostgresBuilder::create_table`]; [`create_table_statement`] gives the statement for a
//! migration):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS incumbent_leases (
//!     election   text PRIMARY KEY,  -- the election's name (after the prefix, if any)
//!     holder     text,              -- the leader as JSON (id, metadata, fencing_token, since_unix_ms, owner); NULL when free
//!     token      bigint NOT NULL,   -- the last fencing token handed out; it only grows
//!     expires_at timestamptz        -- when the holder's lease ends, on the database's clock
//! );
//! ```
//!
//! The role needs `SELECT, INSERT, UPDATE` on it (rows are never deleted: a released row
//! keeps its token), and `CREATE` on the schema only while the backend creates the table.
//! `SELECT holder::jsonb->>'id', token, expires_at FROM incumbent_leases` shows who leads.
//!
//! # How it works
//!
//! - **Acquire** is one `INSERT … ON CONFLICT DO UPDATE … WHERE` the row is free (no holder,
//!   or its lease ran out on the database's clock), `RETURNING` the new token. Two
//!   candidates racing for one row give one winner: the second waits for the first's row
//!   lock and finds it taken. The answer of a losing attempt carries the holder and the time
//!   its lease has left, and the follower tries again right after it.
//! - **Renewals are one statement per process**, however many elections it holds: one
//!   `UPDATE … FROM unnest(…)` restarts every lease whose row still holds our value. A
//!   lease that ran out is never renewed: it is free for others, and our term has ended by
//!   then on our side (see below).
//! - **Expiry is judged on the database's clock only.** Our own deadlines run on this
//!   process's monotonic clock from when the renewal was *sent*, so the term always ends
//!   here before the row can be taken there. No application clock is ever compared with
//!   the database's: skew a host's clock by minutes, and nothing changes.
//! - **Fencing tokens never go back.** A new term's token is the greatest of the row's
//!   token + 1, the database's clock in milliseconds, and the highest token this process
//!   has seen + 1. An asynchronous failover to a standby that missed the last commit (the
//!   row's token set back) still hands out a token above every earlier one, as long as the
//!   new primary's clock is not behind the old one's by more than the time between the two
//!   terms. A term that finds the row's token below what this process saw (a failover that
//!   lost data) waits one ttl before it leads, as on Redis.
//! - **A standby is refused**: `connect` and every session's check ask
//!   `pg_is_in_recovery()`, and a write refused as read-only (SQLSTATE 25006) is
//!   [`Error::ReadOnly`]. With several hosts in the URL, the connection goes to the one that
//!   takes writes (`target_session_attrs=read-write`), again after each failover.
//! - **Cancel-safe.** Every step is a single statement that commits on its own, and the
//!   backend keeps no lock between statements, so a dropped future leaks nothing on the
//!   server: an acquire whose answer was lost leaves a row with our owner id, which the
//!   next acquire adopts and a release frees, or which expires within a ttl.
//! - **Hand-off.** Every acquire, proclaim and release sends `NOTIFY` in its own statement
//!   (`pg_notify`, delivered when it commits). Followers with a direct connection `LISTEN`
//!   on one extra connection per process and try at once; behind a transaction pooler,
//!   where `LISTEN` cannot work, turn it off ([`PostgresBuilder::listen`], or
//!   `INCUMBENT_PG_LISTEN=off`) and followers poll with jitter
//!   ([`PostgresBuilder::poll_interval`]). Either way a crashed leader's row is retried the
//!   moment its lease runs out. Behind PgBouncer, set its `server_login_retry` to a second
//!   or two: after a server restart it refuses every client for that long (default 15 s),
//!   and no candidate can lead meanwhile.
//! - **Guarded writes.** [`PostgresBackend::guard`] makes a write in the application's own
//!   transaction commit only while its term holds: it locks the lease row (`FOR SHARE`) for
//!   the rest of the transaction, so no other candidate can take it until the write has
//!   committed or rolled back. See the `index_builder` example.
//!
//! # Connections
//!
//! One connection for the statements of every election of the backend (pipelined), and
//! one for `LISTEN` when it is on. A connection that breaks, or a statement unanswered
//! within [`PostgresBuilder::timeout`], drops the connection; the next statement connects
//! again. Statements use the extended protocol's unnamed statement, never a named prepared
//! statement, so PgBouncer needs no `max_prepared_statements`.
//!
//! # Why tokio-postgres
//!
//! The backend speaks through [`tokio_postgres`] (re-exported here), with rustls for TLS:
//! it sends a statement with its parameter types in one round trip without preparing it
//! (`query_typed`), pipelines the statements of many elections on one connection, exposes
//! `LISTEN` notifications as they arrive, and has no pool or statement cache of its own that
//! would put session state behind a pooler. sqlx caches named prepared statements per
//! connection and wraps notifications in a pool listener: both get in the way here.

mod notify;
mod store;
pub(crate) mod url;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client};

pub use self::store::PostgresStore;
use self::store::{Conn, Statements};
use crate::backend::polled::{
    self, PolledBackend, PolledBuilder, PolledContender, PolledObserver, PolledSession,
};
pub use crate::backend::polled::{
    COURTESY_POLLS, DEFAULT_POLL_INTERVAL, MAX_POLL_INTERVAL, MAX_TOKEN, PUSH_COURTESY,
};
use crate::backend::{BackendInfo, FencingToken, Wakeup};
use crate::{Error, Result};
pub use tokio_postgres;

const NAME: &str = "postgres";

/// The smallest ttl: renewals every third of it must fit in, with a few round trips.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The largest ttl: a day.
pub const MAX_TTL: Duration = Duration::from_secs(86_400);
/// How long one statement (or connecting) may take unless [`PostgresBuilder::timeout`] says
/// otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The table unless [`PostgresBuilder::table`] says otherwise.
pub const DEFAULT_TABLE: &str = "incumbent_leases";
/// How often followers poll while they `LISTEN`, in case a notification was lost (a
/// dropped connection wakes them all anyway).
pub const SAFETY_NET_POLL: Duration = Duration::from_secs(5);

/// Where and how to reach PostgreSQL: the hosts, database, user and password of a
/// [`tokio_postgres::Config`], and TLS.
///
/// `Debug` output shows the hosts, database and user, never the password.
#[derive(Clone)]
pub struct PostgresConfig {
    pg: tokio_postgres::Config,
    tls: Tls,
}

/// TLS settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Tls {
    /// Plain TCP (or a Unix socket).
    #[default]
    Off,
    /// TLS, the server's certificate checked against the CA file (or the system's roots)
    /// and its host name; a client certificate when the server asks for one.
    #[cfg_attr(not(feature = "postgres-tls"), allow(dead_code))]
    Verify {
        ca_file: Option<PathBuf>,
        client: Option<(PathBuf, PathBuf)>,
    },
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<String> = self
            .pg
            .get_hosts()
            .iter()
            .map(|host| match host {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        f.debug_struct("PostgresConfig")
            .field("hosts", &hosts)
            .field("ports", &self.pg.get_ports())
            .field("dbname", &self.pg.get_dbname())
            .field("user", &self.pg.get_user())
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl From<tokio_postgres::Config> for PostgresConfig {
    /// A configuration from tokio-postgres's (parsed from a connection string, say), without
    /// TLS; set it with [`PostgresConfig::tls`]. The backend always asks for a host that
    /// takes writes (`target_session_attrs=read-write`).
    fn from(pg: tokio_postgres::Config) -> Self {
        PostgresConfig { pg, tls: Tls::Off }
    }
}

impl PostgresConfig {
    /// The server at `host` (`host`, `host:port`, `[::1]:port`, or a Unix socket directory
    /// such as `/var/run/postgresql`), port 5432 unless given, with the user, password and
    /// database of the environment's libpq variables (see [`url`](crate::url)); set others
    /// with the methods below.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a port that is not a number, or an unreadable `PGPASSFILE`.
    pub fn new(host: &str) -> Result<Self> {
        url::config(&[host.to_owned()], None, crate::secret::env)
    }

    /// The configuration the libpq variables describe (`PGHOST`, `PGPORT`, `PGDATABASE`,
    /// `PGUSER`, `PGPASSWORD` or `PGPASSFILE`, `PGSSLMODE`, …; see [`url`](crate::url)).
    ///
    /// # Errors
    /// As [`new`](Self::new), and for a `PGSSLMODE` that asks for TLS without the
    /// `postgres-tls` feature.
    pub fn from_env() -> Result<Self> {
        url::config(&[], None, crate::secret::env)
    }

    /// The user to log in as.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.pg.user(user.into());
        self
    }

    /// The password (never shown by `Debug` or logs).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.pg.password(password.into());
        self
    }

    /// The database.
    pub fn dbname(mut self, dbname: impl Into<String>) -> Self {
        self.pg.dbname(dbname.into());
        self
    }

    /// TLS, with the server's certificate and host name checked against the system's roots
    /// (or [`ca_file`](Self::ca_file)). Stricter than libpq's `sslmode=require`, which
    /// checks nothing.
    #[cfg(feature = "postgres-tls")]
    pub fn tls(mut self) -> Self {
        if self.tls == Tls::Off {
            self.tls = Tls::Verify {
                ca_file: None,
                client: None,
            };
        }
        self
    }

    /// TLS, with the server's certificate checked against the CA certificates in `path`
    /// (PEM), as libpq's `PGSSLROOTCERT`.
    #[cfg(feature = "postgres-tls")]
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        let client = match self.tls {
            Tls::Verify { client, .. } => client,
            Tls::Off => None,
        };
        self.tls = Tls::Verify {
            ca_file: Some(path.into()),
            client,
        };
        self
    }

    /// TLS, with a client certificate and its key (PEM files), as libpq's `PGSSLCERT` and
    /// `PGSSLKEY`.
    #[cfg(feature = "postgres-tls")]
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        let ca_file = match self.tls {
            Tls::Verify { ca_file, .. } => ca_file,
            Tls::Off => None,
        };
        self.tls = Tls::Verify {
            ca_file,
            client: Some((cert.into(), key.into())),
        };
        self
    }
}

/// Connects, again and again: the settings of one backend's connections.
pub(crate) struct Connector {
    pg: tokio_postgres::Config,
    #[cfg(feature = "postgres-tls")]
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    timeout: Duration,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        PostgresConfig::from(self.pg.clone()).fmt(f)
    }
}

impl Connector {
    fn new(config: PostgresConfig, timeout: Duration) -> Result<Self> {
        let PostgresConfig { mut pg, tls } = config;
        pg.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite)
            .connect_timeout(timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        if pg.get_application_name().is_none() {
            pg.application_name("incumbent");
        }
        if pg.get_user().is_none() {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: "no user: set PGUSER (or give one with PostgresConfig::user)".into(),
            });
        }
        #[cfg(feature = "postgres-tls")]
        let tls = match tls {
            Tls::Off => None,
            Tls::Verify { ca_file, client } => {
                pg.ssl_mode(tokio_postgres::config::SslMode::Require);
                Some(tls::connector(ca_file.as_deref(), client.as_ref())?)
            }
        };
        #[cfg(not(feature = "postgres-tls"))]
        if tls != Tls::Off {
            return Err(crate::secret::not_compiled("postgres-tls"));
        }
        Ok(Connector {
            pg,
            #[cfg(feature = "postgres-tls")]
            tls,
            timeout,
        })
    }

    /// A new connection, its messages (notices, notifications) handed to `on_message` by the
    /// task that drives it; that task ends when the connection does.
    async fn open(
        &self,
        on_message: impl FnMut(AsyncMessage) + Send + 'static,
    ) -> Result<(Client, tokio::task::JoinHandle<()>)> {
        let opened = async {
            #[cfg(feature = "postgres-tls")]
            if let Some(tls) = &self.tls {
                let (client, connection) = self.pg.connect(tls.clone()).await.map_err(from_pg)?;
                return Ok((client, tokio::spawn(drive(connection, on_message))));
            }
            let (client, connection) = self
                .pg
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(from_pg)?;
            Ok((client, tokio::spawn(drive(connection, on_message))))
        };
        match tokio::time::timeout(self.timeout, opened).await {
            Ok(opened) => opened,
            Err(_) => Err(Error::Unavailable {
                backend: NAME,
                reason: format!("could not connect within {:?}", self.timeout),
            }),
        }
    }

    /// A connection for statements, to a server that takes writes.
    pub(crate) async fn connect(&self) -> Result<Client> {
        let (client, _driver) = self.open(|_| {}).await?;
        let checked = tokio::time::timeout(
            self.timeout,
            client.query_typed("SELECT pg_is_in_recovery()", &[]),
        )
        .await;
        match checked {
            // An answer of another type (a hostile pooler) is an error, never a panic.
            Ok(Ok(rows)) if recovering(&rows)? => Err(read_only(
                "the server is a standby in recovery (pg_is_in_recovery() is true)",
            )),
            Ok(Ok(_)) => Ok(client),
            Ok(Err(error)) => Err(from_pg(error)),
            Err(_) => Err(Error::Unavailable {
                backend: NAME,
                reason: format!("no answer within {:?}", self.timeout),
            }),
        }
    }

    /// A connection that `LISTEN`s on `channel`, its notifications handed to `on_message`.
    /// The future resolves when the connection ends; dropping it closes the connection.
    async fn listen(
        &self,
        channel: &str,
        on_message: impl FnMut(AsyncMessage) + Send + 'static,
    ) -> Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
        let (client, driver) = self.open(on_message).await?;
        let listen = format!("LISTEN {}", quote(channel));
        match tokio::time::timeout(self.timeout, client.batch_execute(&listen)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(from_pg(error)),
            Err(_) => {
                return Err(Error::Unavailable {
                    backend: NAME,
                    reason: format!("LISTEN unanswered within {:?}", self.timeout),
                });
            }
        }
        Ok(Box::pin(async move {
            let _client = client;
            let _ = driver.await;
        }))
    }
}

/// Whether the answer to `SELECT pg_is_in_recovery()` says the server is a standby.
fn recovering(rows: &[tokio_postgres::Row]) -> Result<bool> {
    match rows.first() {
        Some(row) => store::column::<bool>(row, 0),
        None => Ok(false),
    }
}

/// Drives a connection, handing its messages to `on_message`, until it ends.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    mut on_message: impl FnMut(AsyncMessage),
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(message)) => on_message(message),
            Some(Err(error)) => {
                tracing::debug!(%error, "postgres: connection ended");
                return;
            }
            None => return,
        }
    }
}

#[cfg(feature = "postgres-tls")]
mod tls {
    use std::path::Path;
    use std::sync::Arc;

    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    use super::NAME;
    use crate::{Error, Result};

    fn invalid(reason: String) -> Error {
        Error::InvalidConfig {
            backend: NAME,
            reason,
        }
    }

    /// A rustls connector that checks the server against `ca_file` (or the system's roots),
    /// with a client certificate if given.
    pub(super) fn connector(
        ca_file: Option<&Path>,
        client: Option<&(std::path::PathBuf, std::path::PathBuf)>,
    ) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
        let mut roots = rustls::RootCertStore::empty();
        match ca_file {
            Some(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|error| {
                        invalid(format!(
                            "cannot read the CA file {}: {error} (PGSSLROOTCERT)",
                            path.display()
                        ))
                    })?;
                for cert in certs {
                    roots.add(cert).map_err(|error| {
                        invalid(format!("the CA file {}: {error}", path.display()))
                    })?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| invalid(format!("TLS: {error}")))?
            .with_root_certificates(roots);
        let config = match client {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|error| {
                        invalid(format!(
                            "cannot read the client certificate {}: {error} (PGSSLCERT)",
                            cert.display()
                        ))
                    })?;
                // Never echo the key's contents.
                let key = PrivateKeyDer::from_pem_file(key).map_err(|_| {
                    invalid(format!(
                        "cannot read a PEM private key from {} (PGSSLKEY)",
                        key.display()
                    ))
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|error| invalid(format!("the client certificate: {error}")))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }
}

/// `name` as a quoted SQL identifier.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `table` (`name` or `schema.name`: letters, digits and `_`, not starting with a digit, up
/// to 63 bytes each) quoted, or why not.
fn quoted_table(table: &str) -> Result<String> {
    let valid_part = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !part.starts_with(|c: char| c.is_ascii_digit())
    };
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() > 2 || !parts.iter().all(|p| valid_part(p)) || table.len() > 63 {
        return Err(Error::InvalidConfig {
            backend: NAME,
            reason: format!(
                "the table {table:?} is not `name` or `schema.name` of letters, digits and \
                 '_' (at most 63 bytes in all; e.g. incumbent_leases)"
            ),
        });
    }
    Ok(parts.iter().map(|p| quote(p)).collect::<Vec<_>>().join("."))
}

/// The statement that creates the lease table `table` (`name` or `schema.name`), for a
/// migration run by a role that may create tables, when the backend's own role may not
/// ([`PostgresBuilder::create_table`]).
///
/// # Errors
/// [`Error::InvalidConfig`] for a table name that is not `name` or `schema.name` of letters,
/// digits and `_`.
pub fn create_table_statement(table: &str) -> Result<String> {
    let table = quoted_table(table)?;
    Ok(format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n    \
         election   text PRIMARY KEY,\n    \
         holder     text,\n    \
         token      bigint NOT NULL,\n    \
         expires_at timestamptz\n)"
    ))
}

/// An [`Error::ReadOnly`] of this backend.
pub(crate) fn read_only(reason: &str) -> Error {
    Error::ReadOnly {
        backend: NAME,
        reason: reason.to_owned(),
    }
}

/// Maps a tokio-postgres error: refused credentials, a read-only server, an unreachable or
/// restarting server, or anything else.
pub(crate) fn from_pg(error: tokio_postgres::Error) -> Error {
    if let Some(db) = error.as_db_error() {
        let code = db.code().code();
        let reason = format!("{} (SQLSTATE {code})", db.message());
        return match code {
            // invalid_password, invalid_authorization_specification, insufficient_privilege
            "28P01" | "28000" | "42501" => Error::Unauthorized {
                backend: NAME,
                reason,
            },
            // read_only_sql_transaction
            "25006" => Error::ReadOnly {
                backend: NAME,
                reason,
            },
            // connection exceptions, operator intervention (a shutdown, a terminated
            // backend), insufficient resources (too many connections), a serialization
            // failure or deadlock, a lock not available.
            c if c.starts_with("08")
                || c.starts_with("57")
                || c.starts_with("53")
                || matches!(c, "40001" | "40P01" | "55P03") =>
            {
                Error::Unavailable {
                    backend: NAME,
                    reason,
                }
            }
            _ => Error::Store {
                backend: NAME,
                reason,
            },
        };
    }
    let reason = crate::error::chain(&error);
    if reason.contains("certificate") || reason.contains("UnknownIssuer") {
        return Error::InvalidConfig {
            backend: NAME,
            reason: format!(
                "TLS: {reason} (check PGSSLROOTCERT: the CA that signed the server's certificate)"
            ),
        };
    }
    // tokio-postgres, when no host takes writes (target_session_attrs=read-write).
    if reason.contains("does not allow writes") || reason.contains("read-write") {
        return Error::ReadOnly {
            backend: NAME,
            reason,
        };
    }
    Error::Unavailable {
        backend: NAME,
        reason,
    }
}

/// Settings for a [`PostgresBackend`]: made by [`PostgresBackend::builder`] or
/// [`PostgresBackend::from_url`], finished by [`connect`](PostgresBuilder::connect).
pub type PostgresBuilder = PolledBuilder<Settings>;

/// The PostgreSQL part of a [`PostgresBuilder`].
#[derive(Clone, Debug)]
pub struct Settings {
    config: PostgresConfig,
    table: String,
    listen: bool,
    create_table: bool,
    timeout: Duration,
}

impl PolledBuilder<Settings> {
    /// The lease table (default [`DEFAULT_TABLE`]): `name` or `schema.name`. Its name is
    /// also the `NOTIFY` channel.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.store.table = table.into();
        self
    }

    /// Whether followers `LISTEN` for releases (default `true`): one more connection per
    /// process, which must go to the server itself. Set `false` behind a transaction pooler
    /// (PgBouncer's `pool_mode = transaction`), where `LISTEN` hears nothing: followers then
    /// poll every [`poll_interval`](PolledBuilder::poll_interval), with jitter.
    pub fn listen(mut self, listen: bool) -> Self {
        self.store.listen = listen;
        self
    }

    /// Whether `connect` creates the lease table when it is missing (default `true`; needs
    /// `CREATE` on the schema). `false`: the table must exist (see
    /// [`create_table_statement`]).
    pub fn create_table(mut self, create: bool) -> Self {
        self.store.create_table = create;
        self
    }

    /// How long one statement, or connecting, may take (default [`DEFAULT_TIMEOUT`]). A
    /// statement unanswered by then counts as a failure, and its connection is dropped.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.store.timeout = timeout;
        self
    }

    /// Connects (to a host that takes writes), makes sure the table exists, starts
    /// listening if asked, and builds the backend.
    ///
    /// Errors: [`Error::InvalidConfig`] for an unusable table name, poll interval or TLS
    /// file, or a missing table that may not be created; [`Error::Unauthorized`] for refused
    /// credentials or grants; [`Error::ReadOnly`] for a standby; [`Error::Unavailable`] when
    /// no server can be reached.
    pub async fn connect(self) -> Result<PostgresBackend> {
        self.dial().await.map_err(Error::not_retried)
    }

    /// The one attempt of [`connect`](Self::connect).
    async fn dial(self) -> Result<PostgresBackend> {
        self.check_poll(NAME)?;
        let Settings {
            config,
            table,
            listen,
            create_table,
            timeout,
        } = self.store;
        let quoted = quoted_table(&table)?;
        if timeout.is_zero() {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: "the timeout must be above zero (e.g. 2s)".into(),
            });
        }
        let connector = Arc::new(Connector::new(config, timeout)?);
        let client = connector.connect().await?;
        let conn = Conn::new(connector.clone(), client, timeout);
        prepare_table(&conn, &table, &quoted, create_table).await?;
        let notifier = if listen {
            notify::start(connector.clone(), table.clone()).await
        } else {
            tracing::info!(poll = ?self.poll_interval, "postgres: LISTEN off by configuration; followers poll");
            None
        };
        let (wakeup, poll) = match notifier {
            Some(_) => (Wakeup::Push, SAFETY_NET_POLL),
            None => (Wakeup::Poll(self.poll_interval), self.poll_interval),
        };
        let info = BackendInfo {
            min_ttl: MIN_TTL,
            max_ttl: MAX_TTL,
            ..polled::info(NAME, wakeup)
        };
        let store = PostgresStore {
            conn,
            statements: Statements::new(&quoted),
            table: table.clone(),
            channel: table,
            notifier,
        };
        Ok(PolledBackend::new(store, self.prefix, poll, info))
    }
}

/// The advisory lock that serializes the creation of lease tables (any number, any
/// database): an arbitrary constant, "incumbent" in ASCII.
const CREATE_LOCK: i64 = 0x0069_6e63_756d_6265;

/// Creates the table if it is missing (when allowed), then checks it has the columns the
/// statements use.
async fn prepare_table(conn: &Conn, table: &str, quoted: &str, create: bool) -> Result<()> {
    let exists = conn
        .query(
            "SELECT to_regclass($1) IS NOT NULL",
            &[(&quoted, Type::TEXT)],
        )
        .await?;
    let exists = match exists.first() {
        Some(row) => store::column::<bool>(row, 0)?,
        None => false,
    };
    if !exists {
        if !create {
            return Err(Error::InvalidConfig {
                backend: NAME,
                reason: format!(
                    "the lease table {table} does not exist, and creating it is off: create it \
                     with `{}` (incumbent::postgres::create_table_statement), or allow \
                     create_table",
                    create_table_statement(table)?.replace('\n', " ")
                ),
            });
        }
        // `CREATE TABLE IF NOT EXISTS` is not safe against itself: when several processes
        // create the table at once, all but one fail on the catalog's unique indexes. One
        // transaction, serialized by a transaction-scoped advisory lock (released at its
        // commit: no session state, so a transaction pooler is fine).
        let create = format!(
            "BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK}); {}; COMMIT",
            create_table_statement(table)?
        );
        conn.batch(&create).await?;
        tracing::info!(%table, "postgres: the lease table exists (created if it was missing)");
    }
    let probe = format!("SELECT election, holder, token, expires_at FROM {quoted} LIMIT 0");
    conn.query(&probe, &[]).await.map_err(|error| match error {
        Error::Store { reason, .. } => Error::InvalidConfig {
            backend: NAME,
            reason: format!(
                "the table {table} is not a lease table of incumbent ({reason}); see \
                 incumbent::postgres::create_table_statement"
            ),
        },
        other => other,
    })?;
    Ok(())
}

/// A connection to a PostgreSQL server (or a pooler in front of it), for any number of
/// elections. Cheap to clone: clones share the connection and the sessions.
///
/// `Debug` output shows the hosts, database and user, never the password. See the
/// [module docs](self).
pub type PostgresBackend = PolledBackend<PostgresStore>;

impl PolledBackend<PostgresStore> {
    /// Starts configuring a backend on the server `config` describes.
    pub fn builder(config: PostgresConfig) -> PostgresBuilder {
        // Elections are rows of their own table: no key prefix unless one is asked for.
        PolledBuilder::new(Settings {
            config,
            table: DEFAULT_TABLE.to_owned(),
            listen: true,
            create_table: true,
            timeout: DEFAULT_TIMEOUT,
        })
        .prefix("")
    }

    /// Whether followers wake on `NOTIFY` (else they poll).
    pub fn listening(&self) -> bool {
        self.store().notifier.is_some()
    }

    /// The lease table.
    pub fn table(&self) -> &str {
        &self.store().table
    }

    /// Makes the rest of the application's transaction `client` count only while the term
    /// of `election` with `token` holds: checks, in that transaction, that the lease row
    /// still carries the token and has not run out on the database's clock, and locks the
    /// row (`FOR SHARE`) until the transaction ends, so that no other candidate can take it
    /// before the transaction has committed or rolled back. Call it first in the
    /// transaction, then write, then commit:
    ///
    /// ```no_run
    /// # async fn demo(backend: incumbent::postgres::PostgresBackend, term: incumbent::Term,
    /// #     client: &mut incumbent::postgres::tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let tx = client.transaction().await?;
    /// backend.guard(&tx, "jobs/index-builder", term.fencing_token()).await?;
    /// tx.execute("UPDATE checkpoints SET position = $1 WHERE job = 'index'", &[&42_i64]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Keep such transactions shorter than the renew interval: the holder's own renewal
    /// waits for the row lock too. The statement is [`guard_statement`](Self::guard_statement),
    /// for clients other than tokio-postgres.
    ///
    /// # Errors
    /// [`Error::NotLeader`] when the term no longer holds (roll the transaction back; it
    /// changed nothing), or the error of the statement.
    pub async fn guard(
        &self,
        client: &impl tokio_postgres::GenericClient,
        election: &str,
        token: FencingToken,
    ) -> Result<()> {
        let key = self.key(election);
        let token = i64::try_from(token).map_err(|_| Error::NotLeader)?;
        let rows = client
            .query_typed(
                &self.store().statements.guard,
                &[(&key, Type::TEXT), (&token, Type::INT8)],
            )
            .await
            .map_err(from_pg)?;
        if rows.is_empty() {
            return Err(Error::NotLeader);
        }
        Ok(())
    }

    /// The statement behind [`guard`](Self::guard), with `$1` the election's row
    /// (`prefix + election`, see [`key`](PolledBackend::key)) as `text` and `$2` the token as
    /// `bigint`: it returns a row while the term holds, and locks it until the transaction
    /// ends.
    pub fn guard_statement(&self) -> &str {
        &self.store().statements.guard
    }
}

/// A session on PostgreSQL: process-local, alive as long as one statement renews every
/// lease its elections hold, every renew interval. Closing (or dropping) the last handle
/// releases the leases it still holds.
pub type PostgresSession = PolledSession<PostgresStore>;
/// One session's claim on one PostgreSQL election, the row `<prefix><election>`: taken by
/// one `INSERT … ON CONFLICT DO UPDATE`; see the [module docs](self).
pub type PostgresContender = PolledContender<PostgresStore>;
/// Follows the holder of one PostgreSQL election: a `SELECT` of its row at each `NOTIFY`
/// for it (while listening) or jittered poll.
pub type PostgresObserver = PolledObserver<PostgresStore>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_checked_and_quoted() {
        assert_eq!(
            quoted_table("incumbent_leases").unwrap(),
            "\"incumbent_leases\""
        );
        assert_eq!(quoted_table("ops.Leases").unwrap(), "\"ops\".\"Leases\"");
        for bad in ["", "a.b.c", "a;drop", "1a", "a\"b", "a b", &"x".repeat(64)] {
            assert!(
                matches!(quoted_table(bad), Err(Error::InvalidConfig { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn debug_shows_no_password() {
        let mut pg = tokio_postgres::Config::new();
        pg.host("db").user("u").password("s3cret");
        let shown = format!("{:?}", PostgresConfig::from(pg));
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("\"u\""), "{shown}");
    }
}
