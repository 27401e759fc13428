//! A minimal HTTP/1.0 client over a raw TCP connection, for probes and checks.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one request may take in all.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Response {
    /// The status code, e.g. 200.
    pub status: u16,
    /// The body, read until the server closed the connection.
    pub body: String,
}

/// Sends `method path` with `body` to `addr` and reads the whole response,
/// failing with `TimedOut` after `REQUEST_TIMEOUT`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> io::Result<Response> {
    tokio::time::timeout(REQUEST_TIMEOUT, exchange(addr, method, path, body))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{method} {path} on {addr}"),
            )
        })?
}

/// `request(addr, "GET", path, "")`.
pub async fn get(addr: SocketAddr, path: &str) -> io::Result<Response> {
    request(addr, "GET", path, "").await
}

/// Parses a complete HTTP/1.x response (headers and body).
fn parse_response(raw: &[u8]) -> io::Result<Response> {
    let text = String::from_utf8_lossy(raw);
    let invalid = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad HTTP response: {text:?}"),
        )
    };
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(invalid)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(invalid)?;
    Ok(Response {
        status,
        body: body.to_owned(),
    })
}

async fn exchange(addr: SocketAddr, method: &str, path: &str, body: &str) -> io::Result<Response> {
    let mut stream = TcpStream::connect(addr).await?;
    // HTTP/1.0 keeps Go servers from answering with chunked encoding.
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse_response(&raw)
}
