//! PostgreSQL servers on loopback, each in a temp dir made by `initdb`: a primary, a
//! streaming replica of it, and PgBouncer in front of one. As root (CI), the servers run as
//! the `postgres` user (which refuses root) through `setpriv`, which execs, so the server's
//! pid is the one the harness signals.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use super::bin::{INSTALL_HINT, find_binary};
use super::net::free_addr;
use super::process::{Probe, ServerProcess, start_with_retries};
use super::redis::TextProbe;

/// The user every test connects as.
pub const USER: &str = "postgres";

/// A startup message for user and database `postgres` (protocol 3.0): a ready server
/// answers `R` (trust authentication), one that is starting or recovering answers `E`.
const STARTUP: &[u8] =
    b"\x00\x00\x00\x29\x00\x03\x00\x00user\x00postgres\x00database\x00postgres\x00\x00";

/// The directory of PostgreSQL's server programs: on PATH, or Debian's
/// `/usr/lib/postgresql/<version>/bin` (the newest).
pub fn pg_bin(name: &str) -> PathBuf {
    if let Some(found) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
    {
        return found;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin").join(name)))
        })
        .filter(|(_, path)| path.is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, path)| path).unwrap_or_else(|| {
        panic!(
            "`{name}` not found on PATH or in /usr/lib/postgresql/*/bin; install the test \
             servers with `{INSTALL_HINT}` (Debian's postgresql)"
        )
    })
}

/// The uid and gid of the `postgres` user while we run as root (servers refuse root), or
/// `None` when we are not root.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new(USER).expect("no NUL");
    // SAFETY: getpwnam with a valid C string; the result is read at once, on this thread.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "running as root, but there is no `postgres` user to run the servers as; install \
         the test servers with `{INSTALL_HINT}` (Debian's postgresql creates it)"
    );
    // SAFETY: a non-null passwd entry.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Some((uid, gid))
}

/// A temp dir the servers' user owns.
fn server_dir(prefix: &str) -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("create the server's temp dir");
    if let Some((uid, gid)) = run_as() {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the temp dir");
    }
    dir
}

/// `program args`, as the servers' user: the program and arguments to spawn.
fn as_server_user(program: PathBuf, args: Vec<String>) -> (PathBuf, Vec<String>) {
    if run_as().is_none() {
        return (program, args);
    }
    let mut wrapped = vec![
        format!("--reuid={USER}"),
        format!("--regid={USER}"),
        "--init-groups".into(),
        "--pdeathsig=KILL".into(),
        "--".into(),
        program.display().to_string(),
    ];
    wrapped.extend(args);
    (find_binary("setpriv"), wrapped)
}

/// Runs a PostgreSQL tool to its end (as the servers' user), panicking with its output on
/// failure.
fn run(program: &str, args: &[&str]) {
    let (program, args) = as_server_user(
        pg_bin(program),
        args.iter().map(|a| (*a).to_owned()).collect(),
    );
    let output = Command::new(&program)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {}: {}{}",
        program.display(),
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A new data directory at `data`: user `postgres`, trust authentication (replication from
/// loopback included), UTF-8.
fn initdb(data: &Path) {
    let data = data.display().to_string();
    let args = [
        "-D",
        &data,
        "-U",
        USER,
        "--auth=trust",
        "-E",
        "UTF8",
        "--no-sync",
    ];
    run("initdb", &[&args[..], &["--no-instructions"]].concat());
}

/// A `postgres` server on a free loopback port, its data in a temp dir (trust
/// authentication, user `postgres`, replication allowed from loopback). Killed on drop.
pub struct PostgresServer {
    process: ServerProcess,
    addr: SocketAddr,
    data: PathBuf,
    _probe: TextProbe,
    // Declared last so it is removed after the process is killed.
    dir: TempDir,
}

impl PostgresServer {
    /// Starts a new primary, and waits until it takes connections.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts a new primary with more settings (`name=value`, as `-c` takes them).
    pub async fn start_with(settings: &[&str]) -> Self {
        let more: Vec<String> = settings
            .iter()
            .flat_map(|setting| ["-c".to_owned(), (*setting).to_owned()])
            .collect();
        start_with_retries("postgres", || async {
            let dir = server_dir("incumbent-postgres-");
            let data = dir.path().join("data");
            initdb(&data);
            Self::spawn(dir, data, more.clone()).await
        })
        .await
    }

    /// Starts a new primary that also takes TLS (`ssl=on`), with a certificate for 127.0.0.1
    /// signed by a CA made for the test ([`make_certificates`](super::tls::make_certificates):
    /// `ca.pem`, `other-ca.pem`, `client.pem` and `client.key` in the returned directory).
    pub async fn with_tls() -> (Self, PathBuf) {
        let server = start_with_retries("postgres with tls", || async {
            let dir = server_dir("incumbent-postgres-tls-");
            let data = dir.path().join("data");
            let certs = dir.path().join("tls");
            std::fs::create_dir(&certs).expect("create the certificates' dir");
            super::tls::make_certificates(&certs);
            for entry in std::fs::read_dir(&certs).expect("read the certificates' dir") {
                let path = entry.expect("entry").path();
                if let Some((uid, gid)) = run_as() {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
                }
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .expect("chmod");
            }
            initdb(&data);
            let file = |name: &str| certs.join(name).display().to_string();
            let tls = vec![
                "-c".into(),
                "ssl=on".into(),
                "-c".into(),
                format!("ssl_cert_file={}", file("server.pem")),
                "-c".into(),
                format!("ssl_key_file={}", file("server.key")),
                "-c".into(),
                format!("ssl_ca_file={}", file("ca.pem")),
            ];
            Self::spawn(dir, data, tls).await
        })
        .await;
        let certs = server.dir.path().join("tls");
        (server, certs)
    }

    /// Starts a streaming replica of the primary at `primary` (`pg_basebackup -R`: a
    /// standby, in recovery, that streams from that address: a proxy, for a test that cuts
    /// the replication off), and waits until it takes connections.
    pub async fn replica_of(primary: SocketAddr) -> Self {
        start_with_retries("postgres replica", || async {
            let dir = server_dir("incumbent-postgres-replica-");
            let data = dir.path().join("data");
            run(
                "pg_basebackup",
                &[
                    "-D",
                    &data.display().to_string(),
                    "-h",
                    &primary.ip().to_string(),
                    "-p",
                    &primary.port().to_string(),
                    "-U",
                    USER,
                    "-R",
                    "-X",
                    "stream",
                    "--no-sync",
                ],
            );
            Self::spawn(dir, data, Vec::new()).await
        })
        .await
    }

    async fn spawn(dir: TempDir, data: PathBuf, more: Vec<String>) -> Result<Self, String> {
        let addr = free_addr();
        let mut args = vec![
            "-D".into(),
            data.display().to_string(),
            "-p".into(),
            addr.port().to_string(),
            "-k".into(),
            dir.path().display().to_string(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
            "-c".into(),
            "fsync=off".into(),
            "-c".into(),
            "max_connections=200".into(),
            "-c".into(),
            "shared_buffers=16MB".into(),
            "-c".into(),
            "hot_standby=on".into(),
        ];
        args.extend(more);
        let (program, args) = as_server_user(pg_bin("postgres"), args);
        let probe = TextProbe::start(addr, STARTUP);
        let mut process = ServerProcess::spawn(
            "postgres",
            program,
            args,
            dir.path(),
            Probe::Http {
                addr: probe.addr,
                path: "/",
                check: |body| body.starts_with('R'),
            },
        );
        process.try_wait_ready().await?;
        // The probe is this process's; the server's own port is checked here.
        process.verify_listener(addr)?;
        Ok(PostgresServer {
            process,
            addr,
            data,
            _probe: probe,
            dir,
        })
    }

    /// The server's address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `postgres://127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://{}/postgres", self.addr)
    }

    /// The process, to kill, pause (with its backends: the whole process group), resume or
    /// restart (same port and data) it.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// Promotes this standby to a primary (`pg_ctl promote`), and waits until it is.
    pub async fn promote(&self) {
        run(
            "pg_ctl",
            &["promote", "-w", "-D", &self.data.display().to_string()],
        );
    }

    /// A plain client of this server as user `postgres`, for the test's own statements.
    #[cfg(feature = "postgres")]
    pub async fn client(&self) -> incumbent::postgres::tokio_postgres::Client {
        client_at(self.addr).await
    }

    /// The server's data directory (`pg_hba.conf` is there).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The client settings for the server (or pooler) at `addr`: user `postgres`, database
/// `postgres`.
#[cfg(feature = "postgres")]
pub fn config_at(addr: SocketAddr) -> incumbent::postgres::tokio_postgres::Config {
    let mut config = incumbent::postgres::tokio_postgres::Config::new();
    config
        .host(addr.ip().to_string())
        .port(addr.port())
        .user(USER)
        .dbname("postgres");
    config
}

/// A plain client of the server (or pooler) at `addr`, as user `postgres`, database
/// `postgres`.
#[cfg(feature = "postgres")]
pub async fn client_at(addr: SocketAddr) -> incumbent::postgres::tokio_postgres::Client {
    use incumbent::postgres::tokio_postgres;
    let mut config = config_at(addr);
    config.application_name("test");
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect to postgres");
    tokio::spawn(connection);
    client
}

/// PgBouncer in front of a server, `pool_mode = transaction`, on a free loopback port.
/// Killed on drop.
pub struct PgBouncer {
    process: ServerProcess,
    addr: SocketAddr,
    _probe: TextProbe,
    _dir: TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in transaction mode in front of `server`, with at most `pool_size`
    /// server connections, and waits until it takes connections. `server_login_retry` is
    /// 1 s: with PgBouncer's default (15 s), a server restart makes it refuse every client
    /// for up to 15 s after the server is back.
    pub async fn transaction_mode(server: SocketAddr, pool_size: u32) -> Self {
        start_with_retries("pgbouncer", || async {
            let dir = server_dir("incumbent-pgbouncer-");
            let addr = free_addr();
            let ini = dir.path().join("pgbouncer.ini");
            let users = dir.path().join("userlist.txt");
            std::fs::write(&users, format!("\"{USER}\" \"\"\n")).expect("write userlist");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\n\
                     postgres = host={} port={} dbname=postgres\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {}\n\
                     unix_socket_dir =\n\
                     auth_type = trust\n\
                     auth_file = {}\n\
                     pool_mode = transaction\n\
                     default_pool_size = {pool_size}\n\
                     max_client_conn = 200\n\
                     server_lifetime = 3600\n\
                     server_login_retry = 1\n\
                     ignore_startup_parameters = extra_float_digits,options\n",
                    server.ip(),
                    server.port(),
                    addr.port(),
                    users.display()
                ),
            )
            .expect("write pgbouncer.ini");
            if let Some((uid, gid)) = run_as() {
                for file in [&ini, &users] {
                    std::os::unix::fs::chown(file, Some(uid), Some(gid)).expect("chown");
                }
            }
            let (program, args) =
                as_server_user(find_binary("pgbouncer"), vec![ini.display().to_string()]);
            let probe = TextProbe::start(addr, STARTUP);
            let mut process = ServerProcess::spawn(
                "pgbouncer",
                program,
                args,
                dir.path(),
                Probe::Http {
                    addr: probe.addr,
                    path: "/",
                    check: |body| body.starts_with('R'),
                },
            );
            process.try_wait_ready().await?;
            process.verify_listener(addr)?;
            Ok(PgBouncer {
                process,
                addr,
                _probe: probe,
                _dir: dir,
            })
        })
        .await
    }

    /// PgBouncer's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `postgres://127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://{}/postgres", self.addr)
    }

    /// The process.
    pub fn process(&mut self) -> &mut ServerProcess {
        &mut self.process
    }
}

/// A builder for the server (or pooler) at `addr`, as user `postgres`, database `postgres`.
#[cfg(feature = "postgres")]
pub fn backend(addr: SocketAddr) -> incumbent::postgres::PostgresBuilder {
    use incumbent::postgres::{PostgresBackend, PostgresConfig};
    PostgresBackend::builder(PostgresConfig::from(config_at(addr)))
}
