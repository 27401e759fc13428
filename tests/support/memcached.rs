//! A memcached server on loopback.

use std::net::SocketAddr;

use tempfile::TempDir;

use super::bin::find_binary;
use super::net::free_addr;
use super::process::{Probe, ServerProcess};
use super::redis::TextProbe;

/// A `memcached` on a free loopback TCP port (no UDP), killed on drop. A restart comes back
/// empty, as memcached always does.
pub struct MemcachedServer {
    process: ServerProcess,
    addr: SocketAddr,
    _probe: TextProbe,
    // Declared last so it is removed after the process is killed.
    _dir: TempDir,
}

impl MemcachedServer {
    /// Starts a server with 64 MB of memory and waits until it answers `version`.
    pub async fn start() -> Self {
        Self::with_memory_mb(64).await
    }

    /// Starts a server with `mb` megabytes for items (a small one evicts soon).
    pub async fn with_memory_mb(mb: u32) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("incumbent-memcached-")
            .tempdir()
            .expect("create memcached temp dir");
        let memcached = find_binary("memcached");
        let addr = free_addr();
        let mut args: Vec<String> = vec![
            "-l".into(),
            "127.0.0.1".into(),
            "-p".into(),
            addr.port().to_string(),
            "-U".into(),
            "0".into(),
            "-m".into(),
            mb.to_string(),
        ];
        // memcached refuses to run as root unless told which user to be.
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            args.extend(["-u".into(), "root".into()]);
        }
        let probe = TextProbe::start(addr, b"version\r\n");
        let mut process = ServerProcess::spawn(
            "memcached",
            memcached,
            args,
            dir.path(),
            Probe::Http {
                addr: probe.addr,
                path: "/",
                check: |body| body.starts_with("VERSION"),
            },
        );
        process.wait_ready().await;
        MemcachedServer {
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

    /// The process, to kill, pause, resume or restart it (it comes back empty).
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}
