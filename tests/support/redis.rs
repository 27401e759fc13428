//! A Redis server on loopback, without persistence, in a temp dir.

use std::io::{Read, Write};
use std::marker::PhantomData;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tempfile::TempDir;

use super::bin::find_binary;
use super::net::free_addr;
use super::process::{Probe, ServerProcess, start_with_retries};

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

    /// Starts a server with keyspace notifications that also listens for TLS on another
    /// port, with a certificate for 127.0.0.1 signed by a CA made for the test (clients are
    /// not asked for certificates). The files are in the server's temp dir.
    pub async fn with_tls() -> (Self, RedisTls) {
        let tls_addr = free_addr();
        let files = std::cell::RefCell::new(None);
        let server = Self::spawn_with("Kg$x", |args, dir| {
            let made = RedisTls::make(dir, tls_addr);
            args.extend(
                [
                    "--tls-port",
                    &tls_addr.port().to_string(),
                    "--tls-cert-file",
                    &made.dir_file("server.pem"),
                    "--tls-key-file",
                    &made.dir_file("server.key"),
                    "--tls-ca-cert-file",
                    &made.ca.display().to_string(),
                    "--tls-auth-clients",
                    "no",
                ]
                .map(String::from),
            );
            files.replace(Some(made));
        })
        .await;
        let files = files.into_inner().expect("the certificates were made");
        (server, files)
    }

    /// Starts a replica of the server at `primary` (`--replicaof`), without persistence.
    pub async fn replica_of(primary: SocketAddr) -> Self {
        Self::spawn_with("", |args, _| {
            args.extend([
                "--replicaof".into(),
                primary.ip().to_string(),
                primary.port().to_string(),
            ]);
        })
        .await
    }

    async fn redis(notifications: Option<&str>) -> Self {
        Self::spawn_with(notifications.unwrap_or(""), |_, _| {}).await
    }

    /// A server with `notifications` as `notify-keyspace-events` (empty: none), and the
    /// arguments `more` adds.
    async fn spawn_with(notifications: &str, more: impl Fn(&mut Vec<String>, &Path)) -> Self {
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
            if !notifications.is_empty() {
                args.extend(["--notify-keyspace-events".into(), notifications.into()]);
            }
            more(&mut args, dir);
            args
        };
        let server = TextServer::spawn("redis", "redis-server", args, b"PING\r\n", |body| {
            body.starts_with("+PONG")
        });
        server.await
    }
}

/// Where a TLS Redis listens, and the files a client needs.
pub struct RedisTls {
    /// The TLS port's address.
    pub addr: SocketAddr,
    /// The PEM file of the CA that signed the server's certificate.
    pub ca: PathBuf,
    /// The PEM file of a CA that signed nothing the server has.
    pub other_ca: PathBuf,
}

impl RedisTls {
    /// Writes a CA, another CA and a server certificate for 127.0.0.1 into `dir`, with the
    /// `openssl` command.
    fn make(dir: &Path, addr: SocketAddr) -> RedisTls {
        let openssl = |args: &str| {
            let output = std::process::Command::new("openssl")
                .args(args.split(' '))
                .current_dir(dir)
                .output()
                .expect("run openssl (Debian: apt-get install openssl)");
            assert!(output.status.success(), "openssl {args}: {output:?}");
        };
        let key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        for ca in ["ca", "other-ca"] {
            openssl(&format!(
                "req -x509 -days 1 -subj /CN={ca} {key} -keyout {ca}.key -out {ca}.pem \
                 -addext basicConstraints=critical,CA:TRUE \
                 -addext keyUsage=critical,keyCertSign,cRLSign"
            ));
        }
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
             extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
        )
        .expect("write the extensions");
        openssl(&format!(
            "req -subj /CN=redis {key} -keyout server.key -out server.csr"
        ));
        openssl(
            "x509 -req -days 1 -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
             -extfile server.ext -out server.pem",
        );
        RedisTls {
            addr,
            ca: dir.join("ca.pem"),
            other_ca: dir.join("other-ca.pem"),
        }
    }

    fn dir_file(&self, name: &str) -> String {
        self.ca.with_file_name(name).display().to_string()
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
        args: impl Fn(SocketAddr, &Path) -> Vec<String>,
        request: &'static [u8],
        ready: fn(&str) -> bool,
    ) -> Self {
        // Again on new ports when the server exits during startup ([`start_with_retries`]).
        start_with_retries(name, || {
            Self::try_spawn(name, binary, &args, request, ready)
        })
        .await
    }

    async fn try_spawn(
        name: &'static str,
        binary: &str,
        args: &impl Fn(SocketAddr, &Path) -> Vec<String>,
        request: &'static [u8],
        ready: fn(&str) -> bool,
    ) -> Result<Self, String> {
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
        process.try_wait_ready().await?;
        // The probe is this process's; the server's own port is checked here.
        process.verify_listener(addr)?;
        Ok(TextServer {
            kind: PhantomData,
            process,
            addr,
            _probe: probe,
            _dir: dir,
        })
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
