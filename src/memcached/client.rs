//! The few memcached text-protocol commands the backend needs, over plain tokio TCP.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

use super::NAME;
use crate::backend::lock;
use crate::{Error, Result};

type Conn = BufStream<TcpStream>;

/// The longest line a reply may have: a `VALUE` header or a status.
const MAX_LINE: usize = 1024;
/// The largest value this backend reads (its own values are far smaller).
const MAX_VALUE: usize = 1 << 20;
/// Idle connections kept for reuse.
const MAX_IDLE: usize = 8;

/// What `cas` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cas {
    /// Stored: the item was unchanged since the `gets`.
    Stored,
    /// Someone changed the item since the `gets`.
    Exists,
    /// The item is gone.
    NotFound,
}

/// A value read by `gets`, with its cas unique.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Item {
    pub value: Vec<u8>,
    pub cas: u64,
}

/// One request's reply: the status line, and the items of a retrieval.
struct Reply {
    line: String,
    items: HashMap<String, Item>,
}

/// A memcached server: a few connections, each request on one of them, bounded by the
/// timeout. A connection that failed or timed out is dropped; the next request opens another.
pub struct Client {
    addr: String,
    timeout: Duration,
    idle: Mutex<Vec<Conn>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("address", &self.addr)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn unavailable(reason: String) -> Error {
    Error::Unavailable {
        backend: NAME,
        reason,
    }
}

fn protocol(reason: String) -> Error {
    Error::Store {
        backend: NAME,
        reason,
    }
}

impl Client {
    pub(super) fn new(addr: String, timeout: Duration) -> Self {
        Client {
            addr,
            timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    async fn request(&self, request: &[u8], retrieval: bool) -> Result<Reply> {
        let idle = lock(&self.idle).pop();
        let exchange = async {
            let mut conn = match idle {
                Some(conn) => conn,
                None => BufStream::new(TcpStream::connect(&self.addr).await?),
            };
            let reply = exchange(&mut conn, request, retrieval).await?;
            Ok::<_, std::io::Error>((conn, reply))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok((conn, reply))) => {
                let mut idle = lock(&self.idle);
                if idle.len() < MAX_IDLE {
                    idle.push(conn);
                }
                drop(idle);
                if reply.line.starts_with("ERROR")
                    || reply.line.starts_with("CLIENT_ERROR")
                    || reply.line.starts_with("SERVER_ERROR")
                {
                    return Err(protocol(format!("memcached answered {:?}", reply.line)));
                }
                Ok(reply)
            }
            Ok(Err(e)) => Err(unavailable(format!("{}: {e}", self.addr))),
            Err(_) => Err(unavailable(format!(
                "{}: no answer within {:?}",
                self.addr, self.timeout
            ))),
        }
    }

    /// `version`: whether the server answers.
    pub(super) async fn version(&self) -> Result<String> {
        Ok(self.request(b"version\r\n", false).await?.line)
    }

    /// `gets` of several keys at once: the items that exist.
    pub(super) async fn gets(&self, keys: &[&str]) -> Result<HashMap<String, Item>> {
        let mut request = b"gets".to_vec();
        for key in keys {
            request.push(b' ');
            request.extend_from_slice(key.as_bytes());
        }
        request.extend_from_slice(b"\r\n");
        Ok(self.request(&request, true).await?.items)
    }

    /// `gets` of one key.
    pub(super) async fn get(&self, key: &str) -> Result<Option<Item>> {
        Ok(self.gets(&[key]).await?.remove(key))
    }

    /// `add`: stores `value` only if `key` does not exist. Whether it did.
    pub(super) async fn add(&self, key: &str, value: &[u8], exptime: u64) -> Result<bool> {
        let mut request = format!("add {key} 0 {exptime} {}\r\n", value.len()).into_bytes();
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
        let reply = self.request(&request, false).await?;
        match reply.line.as_str() {
            "STORED" => Ok(true),
            "NOT_STORED" => Ok(false),
            other => Err(protocol(format!("add answered {other:?}"))),
        }
    }

    /// `cas`: stores `value` if the item is unchanged since the `gets` that gave `cas`.
    /// A negative `exptime` stores it already expired: a checked delete.
    pub(super) async fn cas(&self, key: &str, value: &[u8], exptime: i64, cas: u64) -> Result<Cas> {
        let mut request = format!("cas {key} 0 {exptime} {} {cas}\r\n", value.len()).into_bytes();
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
        let reply = self.request(&request, false).await?;
        match reply.line.as_str() {
            "STORED" => Ok(Cas::Stored),
            "EXISTS" => Ok(Cas::Exists),
            "NOT_FOUND" => Ok(Cas::NotFound),
            other => Err(protocol(format!("cas answered {other:?}"))),
        }
    }

    /// `incr`: the new value, `None` when the key does not exist.
    pub(super) async fn incr(&self, key: &str, delta: u64) -> Result<Option<u64>> {
        let reply = self
            .request(format!("incr {key} {delta}\r\n").as_bytes(), false)
            .await?;
        match reply.line.as_str() {
            "NOT_FOUND" => Ok(None),
            number => number
                .parse()
                .map(Some)
                .map_err(|_| protocol(format!("incr answered {number:?}"))),
        }
    }
}

/// Writes one request and reads its reply: one status line, or for a retrieval the items
/// up to `END`.
async fn exchange(conn: &mut Conn, request: &[u8], retrieval: bool) -> std::io::Result<Reply> {
    conn.write_all(request).await?;
    conn.flush().await?;
    let mut items = HashMap::new();
    loop {
        let line = read_line(conn).await?;
        if !retrieval {
            return Ok(Reply { line, items });
        }
        let Some(header) = line.strip_prefix("VALUE ") else {
            return Ok(Reply { line, items });
        };
        let fields: Vec<&str> = header.split(' ').collect();
        let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, line.clone());
        let [key, _flags, bytes, cas] = fields.as_slice() else {
            return Err(invalid());
        };
        let bytes: usize = bytes.parse().map_err(|_| invalid())?;
        let cas: u64 = cas.parse().map_err(|_| invalid())?;
        if bytes > MAX_VALUE {
            return Err(invalid());
        }
        let mut value = vec![0; bytes + 2];
        conn.read_exact(&mut value).await?;
        value.truncate(bytes);
        items.insert((*key).to_owned(), Item { value, cas });
    }
}

async fn read_line(conn: &mut Conn) -> std::io::Result<String> {
    let mut line = Vec::new();
    let read = (&mut *conn)
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut line)
        .await?;
    if read == 0 || !line.ends_with(b"\r\n") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "memcached closed the connection or sent an overlong line",
        ));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}
