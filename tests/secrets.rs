//! Secrets never reach errors, log lines, `Debug` or `Display` output (issue 10, point 2).
//!
//! Every secret in these tests contains [`MARK`]; each test scans everything it can see (the
//! errors' `Display` and `Debug`, the backends' and builders' `Debug`, the campaigns' status,
//! [`BackendUrl`]'s `Display` and `Debug`, the CLI's output) and the log lines that every
//! test of this file writes into one buffer (all levels, all crates), for the mark.
//!
//! Needs the `etcd` and `consul` binaries (`scripts/install-test-deps`); a missing binary
//! fails the tests that use it.

#![cfg(all(feature = "etcd", feature = "consul", feature = "cli"))]

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use incumbent::backend::Backend;
use incumbent::consul::{ConsulBackend, ConsulConfig};
use incumbent::etcd::EtcdBackend;
use incumbent::url::BackendUrl;
use incumbent::{Campaign, Election, Error};
use support::events::elected;
use support::net::free_addr;
use support::{ConsulDev, EtcdServer};
use tokio::time::timeout;

/// Every secret of this file contains this.
const MARK: &str = "s3cret";
const PASSWORD: &str = "pw-s3cret-1";
const TOKEN: &str = "tok-s3cret-2";
const PATIENCE: Duration = Duration::from_secs(20);

/// The log lines of every test in this binary, at every level, from every crate (the `log`
/// records of dependencies included).
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        use tracing_subscriber::util::SubscriberInitExt;
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let installed = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Buffer(writer.clone()))
            .finish()
            .try_init();
        assert!(installed.is_ok(), "install the log capture: {installed:?}");
        buffer
    })
}

struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Fails if `text` holds a secret.
fn hidden(what: &str, text: &str) {
    if let Some(at) = text.find(MARK) {
        let start = text[..at]
            .char_indices()
            .rev()
            .nth(200)
            .map_or(0, |(i, _)| i);
        panic!(
            "a secret leaked into {what}: …{}",
            &text[start..(at + 40).min(text.len())]
        );
    }
}

/// Fails if an error's `Display` or `Debug` holds a secret.
fn hidden_error(what: &str, error: &Error) {
    hidden(what, &error.to_string());
    hidden(what, &format!("{error:?}"));
}

/// Fails if any log line so far holds a secret; and checks that logging works at all.
fn logs_hidden() {
    tracing::info!("log capture check");
    let text = String::from_utf8_lossy(&logs().lock().unwrap_or_else(PoisonError::into_inner))
        .into_owned();
    assert!(text.contains("log capture check"), "logs are not captured");
    hidden("the log lines", &text);
}

fn election<B: Backend>(backend: B, name: &str) -> Election<B> {
    Election::builder(backend, name)
        .candidate("a")
        .ttl(Duration::from_secs(10))
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100))
        .build()
        .expect("valid election")
}

/// Waits until the campaign reports a problem (the store is unreachable), and checks the
/// status for secrets.
async fn reports_a_problem(campaign: &Campaign) {
    let mut status = campaign.status();
    timeout(PATIENCE, status.wait_for(|s| s.problem.is_some()))
        .await
        .expect("a problem reported within the patience")
        .expect("campaign running");
    let shown = format!("{:?}", campaign.status().borrow());
    hidden("the campaign's status", &shown);
}

/// A secret in every position of a backend URL: refused, and never echoed.
#[test]
fn urls_with_secrets_are_refused_without_echoing_them() {
    logs();
    let urls = [
        format!("etcd://root:{PASSWORD}@127.0.0.1:2379"),
        format!("etcd://{PASSWORD}@127.0.0.1:2379/prefix"),
        format!("etcd://127.0.0.1:2379,127.0.0.2:2379/p?password={PASSWORD}"),
        format!("etcd://127.0.0.1:2379/p#{PASSWORD}"),
        format!("consul://127.0.0.1:8500?token={TOKEN}"),
        format!("consul://127.0.0.1:8500/p?token={TOKEN}"),
        format!("consul://127.0.0.1:8500/p/#{TOKEN}"),
        format!("consul://anonymous:{TOKEN}@127.0.0.1:8500"),
        format!("consul://u:{TOKEN}@127.0.0.1:8500/p?token={TOKEN}"),
        format!("root:{PASSWORD}@127.0.0.1:2379"),
        format!("root:{PASSWORD}"),
        format!("{TOKEN}@consul:8500"),
    ];
    for url in &urls {
        match url.parse::<BackendUrl>() {
            Err(error @ Error::InvalidConfig { .. }) => {
                hidden_error(&format!("the error for {url}"), &error)
            }
            other => panic!("{url}: expected InvalidConfig, got {}", debug(&other)),
        }
    }
    let built = [
        BackendUrl::Etcd {
            endpoints: vec![format!("http://root:{PASSWORD}@127.0.0.1:2379")],
            prefix: Some(format!("p?password={PASSWORD}/")),
        },
        BackendUrl::Consul {
            address: format!("http://127.0.0.1:8500?token={TOKEN}"),
            prefix: Some(format!("p#{TOKEN}/")),
        },
    ];
    for url in &built {
        hidden("BackendUrl's Display", &url.to_string());
        hidden("BackendUrl's Debug", &format!("{url:?}"));
    }
    logs_hidden();
}

fn debug<T: std::fmt::Debug>(value: &T) -> String {
    let shown = format!("{value:?}");
    hidden("a parsed URL", &shown);
    shown
}

/// The library's own endpoint checks: user info and queries in endpoints and addresses.
#[test]
fn endpoints_and_addresses_with_secrets_are_refused_without_echoing_them() {
    logs();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    for endpoint in [
        format!("http://root:{PASSWORD}@127.0.0.1:2379"),
        format!("http://127.0.0.1:2379/?password={PASSWORD}"),
        format!("root:{PASSWORD}@127.0.0.1:2379"),
    ] {
        let builder = EtcdBackend::builder([endpoint.clone()]).user("root", PASSWORD);
        hidden("EtcdBuilder's Debug", &format!("{builder:?}"));
        match runtime.block_on(builder.connect()) {
            Err(error) => hidden_error(&format!("the error for {endpoint}"), &error),
            Ok(backend) => panic!("{endpoint}: connected: {backend:?}"),
        }
    }
    for address in [
        format!("http://anonymous:{TOKEN}@127.0.0.1:8500"),
        format!("http://127.0.0.1:8500/?token={TOKEN}"),
        format!("127.0.0.1:8500#{TOKEN}"),
    ] {
        let config = ConsulConfig::new(address.clone()).token(TOKEN);
        hidden("ConsulConfig's Debug", &format!("{config:?}"));
        let builder = ConsulBackend::builder(config);
        hidden("ConsulBuilder's Debug", &format!("{builder:?}"));
        match builder.build() {
            Err(error) => hidden_error(&format!("the error for {address}"), &error),
            Ok(backend) => panic!("{address}: built: {backend:?}"),
        }
    }
    logs_hidden();
}

/// etcd with a password, nothing listening: the connection error holds no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_connection_errors_hide_the_password() {
    logs();
    let nobody = free_addr();
    let builder = EtcdBackend::builder([format!("http://{nobody}")])
        .user("root", PASSWORD)
        .connect_timeout(Duration::from_secs(1));
    hidden("EtcdBuilder's Debug", &format!("{builder:?}"));
    match builder.connect().await {
        Err(error) => hidden_error("the connection error", &error),
        Ok(backend) => panic!("connected to nobody: {backend:?}"),
    }
    logs_hidden();
}

/// A real etcd with authentication: a wrong password and the right one, a campaign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_auth_never_shows_the_password() {
    logs();
    let etcd = EtcdServer::single().await;
    let mut admin = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .expect("operator client");
    admin
        .user_add("root", PASSWORD, None)
        .await
        .expect("add root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("grant root");
    admin.auth_enable().await.expect("enable auth");

    let wrong = format!("wrong-{MARK}");
    match EtcdBackend::builder(etcd.endpoints())
        .user("root", wrong)
        .connect()
        .await
    {
        Err(error @ Error::Unauthorized { .. }) => hidden_error("the refusal", &error),
        other => panic!("expected Unauthorized, got {other:?}"),
    }
    let backend = EtcdBackend::builder(etcd.endpoints())
        .user("root", PASSWORD)
        .connect()
        .await
        .expect("the right password connects");
    hidden("EtcdBackend's Debug", &format!("{backend:?}"));
    let mut campaign = election(backend.clone(), "secrets").campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    hidden("the term's Debug", &format!("{term:?}"));
    hidden(
        "the campaign's status",
        &format!("{:?}", campaign.status().borrow()),
    );
    campaign.shutdown().await.expect("shutdown");
    logs_hidden();
}

/// Consul with a token, nothing listening: the errors the campaign reports hold no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_connection_errors_hide_the_token() {
    logs();
    let nobody = free_addr();
    let backend = ConsulBackend::new(
        ConsulConfig::new(format!("http://{nobody}"))
            .token(TOKEN)
            .request_timeout(Duration::from_secs(1)),
    )
    .expect("valid backend");
    hidden("ConsulBackend's Debug", &format!("{backend:?}"));
    hidden("ConsulClient's Debug", &format!("{:?}", backend.client()));
    match backend.client().status_leader().await {
        Err(error) => {
            hidden("the client error", &error.to_string());
            hidden("the client error", &format!("{error:?}"));
        }
        Ok(leader) => panic!("nobody answered {leader:?}"),
    }
    let campaign = election(backend, "secrets").campaign();
    reports_a_problem(&campaign).await;
    campaign.shutdown().await.expect("shutdown");
    logs_hidden();
}

/// A real Consul agent, sent a token with every request (ACLs off, so any token does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_agent_never_sees_the_token_in_logs_or_debug() {
    logs();
    let consul = ConsulDev::start().await;
    let backend = ConsulBackend::builder(ConsulConfig::new(consul.http_url()).token(TOKEN))
        .prefix("secrets/")
        .build()
        .expect("valid backend");
    hidden("ConsulBackend's Debug", &format!("{backend:?}"));
    let mut campaign = election(backend.clone(), "secrets").campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    hidden("the term's Debug", &format!("{term:?}"));
    hidden(
        "the campaign's status",
        &format!("{:?}", campaign.status().borrow()),
    );
    campaign.shutdown().await.expect("shutdown");
    logs_hidden();
}

/// PostgreSQL with a password (SCRAM for the role `app`): a wrong one and a right one, from
/// the library and from the CLI (`PGPASSWORD`), never shown in errors, `Debug`, the status,
/// the logs or the CLI's output.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_never_shows_the_password() {
    use incumbent::postgres::{PostgresBackend, PostgresConfig, tokio_postgres};
    logs();
    let server = support::PostgresServer::start().await;
    // Through psql: the test's own client would log the statement, password and all.
    let created = Command::new(support::postgres::pg_bin("psql"))
        .args(["-h", "127.0.0.1", "-p", &server.addr().port().to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-q", "-c"])
        .arg(format!(
            "CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'; GRANT ALL ON SCHEMA public TO app"
        ))
        .output()
        .expect("run psql");
    assert!(created.status.success(), "psql: {created:?}");
    let admin = server.client().await;
    // SCRAM for `app` over TCP, before initdb's trust lines.
    let hba = server.data_dir().join("pg_hba.conf");
    let trusted = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
    std::fs::write(
        &hba,
        format!("host all app 127.0.0.1/32 scram-sha-256\n{trusted}"),
    )
    .expect("write pg_hba.conf");
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    let config = |password: &str| {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(server.addr().port())
            .user("app")
            .password(password)
            .dbname("postgres");
        PostgresConfig::from(config)
    };
    let wrong = format!("wrong-{PASSWORD}");
    let builder = PostgresBackend::builder(config(&wrong));
    hidden("PostgresBuilder's Debug", &format!("{builder:?}"));
    match builder.connect().await {
        Err(error @ Error::Unauthorized { .. }) => hidden_error("a refused password", &error),
        other => panic!("a wrong password was not refused as Unauthorized: {other:?}"),
    }
    let backend = PostgresBackend::builder(config(PASSWORD))
        .connect()
        .await
        .expect("connect with the password");
    hidden("PostgresBackend's Debug", &format!("{backend:?}"));
    let mut campaign = election(backend, "secrets").campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    hidden("the term's Debug", &format!("{term:?}"));
    hidden(
        "the campaign's status",
        &format!("{:?}", campaign.status().borrow()),
    );
    campaign.shutdown().await.expect("shutdown");
    let url = server.url();
    for password in [wrong.as_str(), PASSWORD] {
        let output = cli(
            &["status", "--election", "secrets", "--backend", &url],
            &[("PGUSER", "app"), ("PGPASSWORD", password)],
            Duration::from_secs(5),
        );
        hidden("the CLI's output with PGPASSWORD", &output);
        assert!(!output.is_empty(), "no output at all");
    }
    logs_hidden();
}

/// Runs the CLI with `args` and `env` for at most `limit`; returns stdout and stderr.
fn cli(args: &[&str], env: &[(&str, &str)], limit: Duration) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_incumbent"));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command.spawn().expect("start incumbent");
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let output = child.wait_with_output();
        let _ = done.send(());
        output
    });
    if finished.recv_timeout(limit).is_err() {
        // Still running (retrying an unreachable store): stop the process this test started.
        let pid = i32::try_from(pid).expect("pid fits");
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let output = waiter.join().expect("waiter").expect("incumbent output");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The CLI prints the backend URL and errors: never a secret, whether it came in the URL
/// (refused) or from the environment (used).
#[test]
fn cli_output_holds_no_secret() {
    let limit = Duration::from_secs(3);
    for url in [
        format!("consul://127.0.0.1:1/p?token={TOKEN}"),
        format!("consul://127.0.0.1:1?token={TOKEN}"),
        format!("etcd://root:{PASSWORD}@127.0.0.1:1/p"),
    ] {
        let output = cli(
            &["run", "--election", "e", "--backend", &url, "--", "true"],
            &[],
            limit,
        );
        hidden(&format!("the CLI's output for {url}"), &output);
        assert!(!output.is_empty(), "{url}: no message at all");
    }
    let nobody = free_addr().to_string();
    let consul = format!("consul://{nobody}/p");
    let etcd = format!("etcd://{nobody}/p");
    for (url, env) in [
        (&consul, vec![("CONSUL_HTTP_TOKEN", TOKEN)]),
        (
            &etcd,
            vec![("ETCDCTL_USER", "root"), ("ETCDCTL_PASSWORD", PASSWORD)],
        ),
        (&etcd, vec![("ETCDCTL_USER", "root:pw-s3cret-3")]),
    ] {
        for args in [
            vec!["run", "--election", "e", "--backend", url, "--", "true"],
            vec!["status", "--election", "e", "--backend", url],
        ] {
            let mut env = env.clone();
            env.push(("RUST_LOG", "trace"));
            let output = cli(&args, &env, limit);
            hidden(&format!("the CLI's output for {args:?}"), &output);
        }
    }
}
