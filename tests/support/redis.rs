//! A Redis server on loopback, without persistence, in a temp dir.

use std::io::{Read, Write};
use std::marker::PhantomData;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tempfile::TempDir;

use super::bin::find_binary;
use super::net::free_addr;
use super::process::{Probe, ServerProcess};

/// Marks a [`TextServer`] that runs Redis.
pub struct Redis;

/// A `redis-server` on a free loopback port, keeping no data (no RDB, no AOF): a restart
/// comes back empty. Killed on drop.
pub type RedisServer = TextServer<Redis>;

impl TextServer<Redis> {
    /// Starts a server without keyspace notifications (Redis's default) and waits until it
    /// answers `PING`.
    pub async fn start() -> Self {
        Self::redis(None).await
    }

    /// Starts a server that publishes keyspace notifications for generic commands, string
    /// commands and expiries (`notify-keyspace-events Kg$x`).
    pub async fn with_notifications() -> Self {
        Self::redis(Some("Kg$x")).await
    }

    async fn redis(notifications: Option<&str>) -> Self {
        let args = |addr: SocketAddr, dir: &Path| {
            let mut args: Vec<String> = vec![
                "--port".into(),
                addr.port().to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                "no".into(),
                "--dir".into(),
                dir.display().to_string(),
            ];
            if let Some(flags) = notifications {
                args.extend(["--notify-keyspace-events".into(), flags.into()]);
            }
            args
        };
        let server = TextServer::spawn("redis", "redis-server", args, b"PING\r\n", |body| {
            body.starts_with("+PONG")
        });
        server.await
    }
}

/// A server that speaks a text protocol (`K`: Redis, memcached) on a free loopback port, in
/// a temp dir, killed on drop.
pub struct TextServer<K> {
    kind: PhantomData<K>,
    process: ServerProcess,
    addr: SocketAddr,
    _probe: TextProbe,
    // Declared last so it is removed after the process is killed.
    _dir: TempDir,
}

impl<K> TextServer<K> {
    /// Starts `binary` (looked up on PATH) with the arguments `args` gives for its address
    /// and temp dir, and waits until its answer to `request` passes `ready`.
    pub async fn spawn(
        name: &'static str,
        binary: &str,
        args: impl FnOnce(SocketAddr, &Path) -> Vec<String>,
        request: &'static [u8],
        ready: fn(&str) -> bool,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("incumbent-{name}-"))
            .tempdir()
            .expect("create the server's temp dir");
        let binary = find_binary(binary);
        let addr = free_addr();
        let args = args(addr, dir.path());
        let probe = TextProbe::start(addr, request);
        let mut process = ServerProcess::spawn(
            name,
            binary,
            args,
            dir.path(),
            Probe::Http {
                addr: probe.addr,
                path: "/",
                check: ready,
            },
        );
        process.wait_ready().await;
        TextServer {
            kind: PhantomData,
            process,
            addr,
            _probe: probe,
            _dir: dir,
        }
    }

    /// The server's address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process, to kill, pause, resume or restart it. A restarted server comes back
    /// empty: it keeps no data.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

/// The harness's readiness probes speak HTTP, Redis and memcached do not (Redis drops
/// connections that look like HTTP): a loopback HTTP responder whose every answer is `200`
/// with the body the server gave to `request` (`+PONG` to Redis's `PING`), and `503` when
/// the server cannot be reached.
pub struct TextProbe {
    /// The responder's HTTP address, for `Probe::Http`.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl TextProbe {
    /// Starts answering probes for the server at `server`.
    pub fn start(server: SocketAddr, request: &'static [u8]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the ping shim");
        let addr = listener.local_addr().expect("the ping shim's address");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut client) = client else { continue };
                // Reads the request first: closing on unread bytes would reset the connection.
                let _ = client.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = client.read(&mut [0; 1024]);
                let reply = ask(server, request);
                let status = if reply.is_some() {
                    "200 OK"
                } else {
                    "503 Unavailable"
                };
                let body = reply.unwrap_or_default();
                let _ = write!(
                    client,
                    "HTTP/1.0 {status}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        TextProbe { addr, stop }
    }
}

impl Drop for TextProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// The server's answer to `request`, bounded by a second.
fn ask(server: SocketAddr, request: &[u8]) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&server, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(request).ok()?;
    let mut buffer = [0; 64];
    let read = stream.read(&mut buffer).ok()?;
    Some(String::from_utf8_lossy(&buffer[..read]).into_owned())
}
