//! The wire: one statement per step, over one connection (pipelined), with no session
//! state: no advisory lock, no named prepared statement, no `SET`. Every statement is sent
//! with the extended protocol's unnamed statement (`query_typed`), so it runs the same
//! through PgBouncer in transaction mode as on a direct connection.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::notify::Notifier;
use super::{Connector, NAME, from_pg};
use crate::backend::polled::{Acquired, Claim, KeyState, Renewing, Store, checked_token};
use crate::{Error, Result};

/// The statements, written once for the table at hand.
#[derive(Debug)]
pub(super) struct Statements {
    acquire: String,
    renew: String,
    replace: String,
    release: String,
    read: String,
    read_expiring: String,
    counter: String,
    pub(super) guard: String,
}

/// A token above this is refused (2^53 - 1: exact in JSON readers that use doubles).
const MAX_TOKEN_SQL: &str = "9007199254740991";

impl Statements {
    /// The statements on `table` (already quoted).
    pub(super) fn new(table: &str) -> Self {
        let ms = "(extract(epoch FROM clock_timestamp()) * 1000)::int8";
        Statements {
            // $1 key, $2 value before the token, $3 after it, $4 ttl in ms, $5 the floor (the
            // highest token this process saw), $6 the NOTIFY channel, $7 a hand-over's escrow
            // ('' for none): the row is taken while its holder is exactly that, too.
            //
            // The row is taken when it is free (no holder, or its lease ran out on the
            // database's clock), with the token max(the row's token + 1, the database's
            // clock in ms, floor + 1): a row that an asynchronous failover set back still
            // gets a token above every earlier one. A concurrent acquirer of the same row
            // waits for ours and finds it taken (READ COMMITTED re-checks the WHERE on the
            // newest row). Otherwise the holder (while its lease runs) and the time its lease
            // has left come back, with outcome 0.
            acquire: format!(
                "WITH prev AS (SELECT token FROM {table} WHERE election = $1), \
                 won AS ( \
                   INSERT INTO {table} AS l (election, holder, token, expires_at) \
                   SELECT $1, $2 || n.token::text || $3, n.token, \
                          clock_timestamp() + $4 * interval '1 millisecond' \
                     FROM (SELECT greatest({ms}, $5 + 1) AS token) n \
                   ON CONFLICT (election) DO UPDATE \
                     SET holder = $2 || greatest(l.token + 1, EXCLUDED.token)::text || $3, \
                         token = greatest(l.token + 1, EXCLUDED.token), \
                         expires_at = EXCLUDED.expires_at \
                     WHERE (l.holder IS NULL OR l.expires_at IS NULL \
                            OR l.expires_at <= clock_timestamp() \
                            OR ($7 <> '' AND l.holder = $7)) \
                       AND l.token >= 0 AND l.token < {MAX_TOKEN_SQL} \
                   RETURNING l.token, l.holder, pg_notify($6, $1) \
                 ) \
                 SELECT 1::int4, token, holder, NULL::int8, (SELECT token FROM prev) FROM won \
                 UNION ALL \
                 SELECT 0::int4, token, \
                        CASE WHEN expires_at > clock_timestamp() THEN holder END, \
                        greatest((extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8, 0), \
                        token \
                   FROM {table} WHERE election = $1 AND NOT EXISTS (SELECT 1 FROM won)"
            ),
            // $1 the keys, $2 our values, $3 the pending values ('' for none), $4 the ttl in
            // ms. Per key, in order: 1 renewed, 3 renewed holding the pending value, 2 held by
            // another, 0 free (gone). A lease that ran out is never renewed: it is free.
            renew: format!(
                "WITH want AS ( \
                   SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) \
                     WITH ORDINALITY AS w(election, value, pending, i) \
                 ), renewed AS ( \
                   UPDATE {table} AS l \
                      SET expires_at = clock_timestamp() + $4 * interval '1 millisecond' \
                     FROM want w \
                    WHERE l.election = w.election AND l.expires_at > clock_timestamp() \
                      AND (l.holder = w.value OR (w.pending <> '' AND l.holder = w.pending)) \
                   RETURNING l.election, l.holder = w.value AS exact \
                 ) \
                 SELECT (CASE WHEN r.exact THEN 1 WHEN NOT r.exact THEN 3 \
                              WHEN c.holder IS NOT NULL AND c.expires_at > clock_timestamp() \
                              THEN 2 ELSE 0 END)::int4 \
                   FROM want w \
                   LEFT JOIN renewed r ON r.election = w.election \
                   LEFT JOIN {table} c ON c.election = w.election \
                  ORDER BY w.i"
            ),
            // $1 key, $2 ours, $3 new, $4 ttl in ms, $5 the channel. A row when replaced (or
            // already holding the new value: a retry).
            replace: format!(
                "UPDATE {table} \
                    SET holder = $3, expires_at = clock_timestamp() + $4 * interval '1 millisecond' \
                  WHERE election = $1 AND expires_at > clock_timestamp() \
                    AND (holder = $2 OR holder = $3) \
                 RETURNING pg_notify($5, $1)"
            ),
            // $1 key, $2 ours, $3 the channel. The token stays: the next one grows from it.
            release: format!(
                "UPDATE {table} SET holder = NULL, expires_at = NULL \
                  WHERE election = $1 AND holder = $2 \
                 RETURNING pg_notify($3, $1)"
            ),
            // $1 key: the holder, while its lease runs.
            read: format!(
                "SELECT holder FROM {table} \
                  WHERE election = $1 AND holder IS NOT NULL AND expires_at > clock_timestamp()"
            ),
            // $1 key: the holder, while its lease runs, and the milliseconds it runs yet.
            read_expiring: format!(
                "SELECT holder, \
                        (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8 \
                   FROM {table} \
                  WHERE election = $1 AND holder IS NOT NULL AND expires_at > clock_timestamp()"
            ),
            // $1 key: the last token handed out.
            counter: format!("SELECT token FROM {table} WHERE election = $1"),
            // $1 key, $2 token: a row while that term holds, locked until the transaction
            // ends.
            guard: format!(
                "SELECT 1 FROM {table} \
                  WHERE election = $1 AND token = $2 AND holder IS NOT NULL \
                    AND expires_at > clock_timestamp() \
                  FOR SHARE"
            ),
        }
    }
}

/// One connection to the server, made again when it breaks or a statement goes unanswered.
pub(super) struct Conn {
    connector: Arc<Connector>,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    timeout: Duration,
}

impl Conn {
    pub(super) fn new(connector: Arc<Connector>, client: Client, timeout: Duration) -> Self {
        Conn {
            connector,
            client: tokio::sync::Mutex::new(Some(Arc::new(client))),
            timeout,
        }
    }

    /// The connection, made again if it is closed.
    async fn client(&self) -> Result<Arc<Client>> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        *slot = None;
        let client = Arc::new(self.connector.connect().await?);
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Drops `client` (if it is still the connection): the next statement connects again.
    async fn discard(&self, client: &Arc<Client>) {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *slot = None;
        }
    }

    /// Runs `statements` (several, `;`-separated, with no parameters) with the simple query
    /// protocol, within the timeout.
    pub(super) async fn batch(&self, statements: &str) -> Result<()> {
        let mut used = None;
        let attempt = async {
            let client = self.client().await?;
            used = Some(client.clone());
            client.batch_execute(statements).await.map_err(from_pg)
        };
        let error = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => error,
            Err(_) => Error::Unavailable {
                backend: NAME,
                reason: format!("no answer within {:?}", self.timeout),
            },
        };
        // A failed batch may leave its transaction block open (aborted): never reuse it.
        if let Some(client) = &used {
            self.discard(client).await;
        }
        Err(error)
    }

    /// Runs one statement, within the timeout. A statement that goes unanswered, or that
    /// the server refuses as read-only (a failover made it a standby), drops the connection:
    /// the next one connects again (to a writable host, when several are given).
    pub(super) async fn query(
        &self,
        statement: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>> {
        let mut used = None;
        let attempt = async {
            let client = self.client().await?;
            used = Some(client.clone());
            client.query_typed(statement, params).await.map_err(from_pg)
        };
        let outcome = tokio::time::timeout(self.timeout, attempt).await;
        let error = match outcome {
            Ok(Ok(rows)) => return Ok(rows),
            Ok(Err(error)) => error,
            Err(_) => Error::Unavailable {
                backend: NAME,
                reason: format!("no answer within {:?}", self.timeout),
            },
        };
        if let Some(client) = &used
            && matches!(error, Error::Unavailable { .. } | Error::ReadOnly { .. })
        {
            self.discard(client).await;
        }
        Err(error)
    }
}

/// The PostgreSQL part of a [`PostgresBuilder`](super::PostgresBuilder)'s backend: the
/// connection, the statements, and the listener.
pub struct PostgresStore {
    pub(super) conn: Conn,
    pub(super) statements: Statements,
    pub(super) table: String,
    pub(super) channel: String,
    pub(super) notifier: Option<Notifier>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("connector", &self.conn.connector)
            .field("table", &self.table)
            .field("listen", &self.notifier.is_some())
            .finish_non_exhaustive()
    }
}

fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// A token as the row holds it, checked.
fn token(what: &str, token: i64) -> Result<u64> {
    let token = u64::try_from(token).map_err(|_| Error::Store {
        backend: NAME,
        reason: format!(
            "{what} holds the fencing token {token}: a corrupt or hostile value, refused \
             (set it to 0; incumbent seeds the next token from the database's clock)"
        ),
    })?;
    checked_token(NAME, what, token)
}

/// A column of a row this module's statements return, typed.
pub(super) fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    index: usize,
) -> Result<T> {
    row.try_get(index).map_err(|error| Error::Store {
        backend: NAME,
        reason: format!("unexpected answer: {error}"),
    })
}

impl PostgresStore {
    /// The text of `value`: values are the JSON this crate writes, always UTF-8.
    fn text(value: &[u8]) -> &str {
        std::str::from_utf8(value).unwrap_or_default()
    }
}

impl crate::backend::polled::sealed::Sealed for PostgresStore {}

impl Store for PostgresStore {
    const NAME: &'static str = NAME;
    /// The token lives in the election's own row.
    const COUNTER_SUFFIX: &'static str = "";

    /// `SELECT pg_is_in_recovery()`: a server that became a standby is refused.
    async fn ping(&self) -> Result<()> {
        let rows = self.conn.query("SELECT pg_is_in_recovery()", &[]).await?;
        if super::recovering(&rows)? {
            return Err(super::read_only(
                "the server is a standby in recovery (pg_is_in_recovery() is true)",
            ));
        }
        Ok(())
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let rows = self
            .conn
            .query(&self.statements.read, &[(&key, Type::TEXT)])
            .await?;
        match rows.first() {
            Some(row) => Ok(Some(column::<String>(row, 0)?.into_bytes())),
            None => Ok(None),
        }
    }

    async fn read_expiring(&self, key: &str) -> Result<Option<(Vec<u8>, Option<Duration>)>> {
        let rows = self
            .conn
            .query(&self.statements.read_expiring, &[(&key, Type::TEXT)])
            .await?;
        match rows.first() {
            Some(row) => {
                let holder = column::<String>(row, 0)?.into_bytes();
                let left: Option<i64> = column(row, 1)?;
                let left = left.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
                Ok(Some((holder, left)))
            }
            None => Ok(None),
        }
    }

    async fn counter(&self, key: &str) -> Result<Option<u64>> {
        let rows = self
            .conn
            .query(&self.statements.counter, &[(&key, Type::TEXT)])
            .await?;
        rows.first()
            .map(|row| token(key, column(row, 0)?))
            .transpose()
    }

    async fn acquire(&self, claim: Claim<'_>) -> Result<Acquired> {
        let (before, after) = (Self::text(claim.before), Self::text(claim.after));
        let floor = i64::try_from(claim.floor).unwrap_or(i64::MAX - 1);
        let ttl = millis(claim.ttl);
        let escrow = claim.escrow.map(Self::text).unwrap_or_default();
        let rows = self
            .conn
            .query(
                &self.statements.acquire,
                &[
                    (&claim.key, Type::TEXT),
                    (&before, Type::TEXT),
                    (&after, Type::TEXT),
                    (&ttl, Type::INT8),
                    (&floor, Type::INT8),
                    (&self.channel, Type::TEXT),
                    (&escrow, Type::TEXT),
                ],
            )
            .await?;
        let Some(row) = rows.first() else {
            // Neither taken nor there: a row deleted between the two reads. Try again later.
            return Ok(Acquired::Held {
                value: None,
                expires_in: None,
            });
        };
        let outcome: i32 = column(row, 0)?;
        let new_token = token(claim.key, column(row, 1)?)?;
        if outcome == 1 {
            let before: Option<i64> = column(row, 4)?;
            let went_back = claim.floor > 0 && before.is_none_or(|b| b < floor);
            return Ok(Acquired::Won {
                token: new_token,
                went_back,
            });
        }
        let holder: Option<String> = column(row, 2)?;
        let left: Option<i64> = column(row, 3)?;
        Ok(Acquired::Held {
            value: holder.map(String::into_bytes),
            expires_in: left.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        })
    }

    async fn renew(&self, held: &[Renewing], ttl: Duration) -> Result<Vec<KeyState>> {
        let keys: Vec<&str> = held.iter().map(|h| h.key.as_str()).collect();
        let values: Vec<&str> = held.iter().map(|h| Self::text(&h.value)).collect();
        let pending: Vec<&str> = held
            .iter()
            .map(|h| h.pending.as_deref().map(Self::text).unwrap_or_default())
            .collect();
        let ttl = millis(ttl);
        let rows = self
            .conn
            .query(
                &self.statements.renew,
                &[
                    (&keys, Type::TEXT_ARRAY),
                    (&values, Type::TEXT_ARRAY),
                    (&pending, Type::TEXT_ARRAY),
                    (&ttl, Type::INT8),
                ],
            )
            .await?;
        if rows.len() != held.len() {
            return Err(Error::Store {
                backend: NAME,
                reason: format!(
                    "a renewal of {} leases answered {} rows",
                    held.len(),
                    rows.len()
                ),
            });
        }
        rows.iter()
            .map(|row| {
                Ok(match column::<i32>(row, 0)? {
                    1 => KeyState::Renewed,
                    3 => KeyState::RenewedPending,
                    2 => KeyState::Other,
                    _ => KeyState::Gone,
                })
            })
            .collect()
    }

    async fn replace(&self, key: &str, ours: &[u8], new: &[u8], ttl: Duration) -> Result<bool> {
        let (ours, new, ttl) = (Self::text(ours), Self::text(new), millis(ttl));
        let rows = self
            .conn
            .query(
                &self.statements.replace,
                &[
                    (&key, Type::TEXT),
                    (&ours, Type::TEXT),
                    (&new, Type::TEXT),
                    (&ttl, Type::INT8),
                    (&self.channel, Type::TEXT),
                ],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn release(&self, key: &str, ours: &[u8]) -> Result<()> {
        let ours = Self::text(ours);
        self.conn
            .query(
                &self.statements.release,
                &[
                    (&key, Type::TEXT),
                    (&ours, Type::TEXT),
                    (&self.channel, Type::TEXT),
                ],
            )
            .await?;
        Ok(())
    }

    fn subscribe(&self, key: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.notifier.as_ref().map(|n| n.subscribe(key))
    }
}
