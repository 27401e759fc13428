//! A memcached server on loopback.

use super::redis::TextServer;

/// Marks a [`TextServer`] that runs memcached.
pub struct Memcached;

/// A `memcached` on a free loopback TCP port (no UDP), killed on drop. A restart comes back
/// empty, as memcached always does.
pub type MemcachedServer = TextServer<Memcached>;

impl TextServer<Memcached> {
    /// Starts a server with 64 MB of memory and waits until it answers `version`.
    pub async fn start() -> Self {
        Self::with_memory_mb(64).await
    }

    /// Starts a server with `mb` megabytes for items (a small one evicts soon).
    pub async fn with_memory_mb(mb: u32) -> Self {
        let args = |addr: std::net::SocketAddr, _: &std::path::Path| {
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
            args
        };
        let server = TextServer::spawn("memcached", "memcached", args, b"version\r\n", |body| {
            body.starts_with("VERSION")
        });
        server.await
    }
}
