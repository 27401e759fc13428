//! `incumbent` against etcd and Consul serving clients over TLS with client certificates
//! required: the URL forms (`etcd+https://`, `consul+https://`, `etcd:` and `consul:` reading
//! `ETCDCTL_ENDPOINTS` and `CONSUL_HTTP_ADDR`), the flags `--ca-file`, `--cert-file` and
//! `--key-file`, the variables etcdctl and Consul's tools read, their precedence (flag > URL >
//! environment), and a CA that did not sign the server's certificate, which ends the program
//! at once with exit code 2 and a message that says which setting to check. Certificates are
//! made in each test with `openssl`. Every wait is bounded; every process is killed at the end.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_incumbent");
const ELECTION: &str = "jobs/tls";
/// How long one `incumbent` may take before the test calls it hung.
const LIMIT: Duration = Duration::from_secs(15);

/// Every variable that could change what these tests check, removed from each command.
const STORE_VARIABLES: &[&str] = &[
    "INCUMBENT_BACKEND",
    "ETCDCTL_ENDPOINTS",
    "ETCDCTL_CACERT",
    "ETCDCTL_CERT",
    "ETCDCTL_KEY",
    "ETCDCTL_USER",
    "ETCDCTL_PASSWORD",
    "CONSUL_HTTP_ADDR",
    "CONSUL_HTTP_SSL",
    "CONSUL_CACERT",
    "CONSUL_CLIENT_CERT",
    "CONSUL_CLIENT_KEY",
    "CONSUL_HTTP_TOKEN",
    "CONSUL_HTTP_TOKEN_FILE",
    "RUST_LOG",
];

/// `incumbent ARGS` with the variables `env` and no other store variable.
fn command(args: &[&str], env: &[(&str, String)]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args).stdin(Stdio::null());
    for name in STORE_VARIABLES {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

/// A process killed and reaped on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `incumbent ARGS` to completion; fails the test if it takes longer than [`LIMIT`].
fn output(args: &[&str], env: &[(&str, String)]) -> (Output, Duration) {
    let began = Instant::now();
    let mut guard = Guard(
        command(args, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn incumbent"),
    );
    loop {
        if let Ok(Some(_)) = guard.0.try_wait() {
            break;
        }
        assert!(began.elapsed() < LIMIT, "incumbent {args:?} hangs");
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = began.elapsed();
    let child = std::mem::replace(
        &mut guard.0,
        Command::new("true").spawn().expect("spawn true"),
    );
    (child.wait_with_output().expect("output"), took)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// `status --json` succeeds and prints JSON.
fn status_ok(args: &[&str], env: &[(&str, String)]) -> serde_json::Value {
    let (output, _) = output(args, env);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {}",
        stderr(&output)
    );
    serde_json::from_slice(&output.stdout).expect("status --json prints JSON")
}

/// A configuration error: exit code 2 at once (well before any retry could give up), one
/// line that contains every one of `hints`.
fn refused(args: &[&str], env: &[(&str, String)], hints: &[&str]) {
    let (output, took) = output(args, env);
    let text = stderr(&output);
    eprintln!("{args:?} ({took:?}): {text}");
    assert_eq!(output.status.code(), Some(2), "{args:?}: {text}");
    assert_eq!(text.trim().lines().count(), 1, "{args:?}: {text}");
    let chain: Vec<&str> = text
        .split("; ")
        .next()
        .unwrap_or_default()
        .split(": ")
        .collect();
    for (i, part) in chain.iter().enumerate() {
        assert!(
            !chain[i + 1..].contains(part),
            "{args:?}: {part:?} twice: {text}"
        );
    }
    for hint in hints {
        assert!(text.contains(hint), "{args:?}: no {hint:?} in: {text}");
    }
    assert!(
        !text.contains("PRIVATE KEY"),
        "{args:?}: key material: {text}"
    );
    assert!(took < Duration::from_secs(8), "{args:?}: took {took:?}");
}

/// Starts `incumbent run ... -- sh -c 'echo $INCUMBENT_FENCING_TOKEN > FILE; exec sleep 600'`
/// and waits until the command wrote its token.
fn leads(args: &[&str], env: &[(&str, String)], dir: &Path) -> Guard {
    let marker = dir.join("token");
    let script = r#"echo "$INCUMBENT_FENCING_TOKEN" > "$0"; exec sleep 600"#;
    let marker_arg = marker.display().to_string();
    let mut all = vec!["run", "--election", ELECTION, "--grace", "1s"];
    all.extend(args);
    all.extend(["--", "sh", "-c", script, &marker_arg]);
    let log = dir.join("run.log");
    let guard = Guard(
        command(&all, env)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn incumbent run"),
    );
    let began = Instant::now();
    while !std::fs::read_to_string(&marker).is_ok_and(|t| !t.trim().is_empty()) {
        assert!(
            began.elapsed() < LIMIT,
            "the command never ran: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    guard
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_from_flags_or_etcdctls_variables_and_a_wrong_ca_is_exit_code_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    crate::support::tls::make_certificates(d);
    let (_etcd, endpoint) = crate::support::tls::etcd_with_tls(d).await;
    let url = endpoint.replace("https://", "etcd+https://");
    let (ca, other_ca) = (path(d, "ca.pem"), path(d, "other-ca.pem"));
    let (cert, key) = (path(d, "client.pem"), path(d, "client.key"));
    let target = ["--election", ELECTION, "--timeout", "3s"];
    let flags = [
        "--ca-file",
        ca.as_str(),
        "--cert-file",
        cert.as_str(),
        "--key-file",
        key.as_str(),
    ];
    let etcdctl = vec![
        ("ETCDCTL_ENDPOINTS", endpoint.clone()),
        ("ETCDCTL_CACERT", ca.clone()),
        ("ETCDCTL_CERT", cert.clone()),
        ("ETCDCTL_KEY", key.clone()),
    ];

    // The URL and the flags.
    let args = [
        &["status", "--json", "--backend", &url][..],
        &target,
        &flags,
    ]
    .concat();
    assert!(status_ok(&args, &[])["leader"].is_null());

    // Everything from etcdctl's variables: `run` leads, `status` sees it.
    let _leader = leads(&["--backend", "etcd:"], &etcdctl, d);
    let status = status_ok(
        &[&["status", "--json", "--backend", "etcd:"][..], &target].concat(),
        &etcdctl,
    );
    assert!(status["leader"]["fencing_token"].is_u64(), "{status}");

    // As with etcdctl, endpoints without a scheme are https:// when a CA is given.
    let mut schemeless = etcdctl.clone();
    schemeless[0].1 = endpoint.replace("https://", "");
    let args = [&["status", "--json", "--backend", "etcd:"][..], &target].concat();
    assert!(status_ok(&args, &schemeless)["leader"].is_object());

    // The URL wins over ETCDCTL_ENDPOINTS (which names nothing that answers).
    let elsewhere = [
        ("ETCDCTL_ENDPOINTS", "https://127.0.0.1:1".to_owned()),
        ("ETCDCTL_CACERT", ca.clone()),
        ("ETCDCTL_CERT", cert.clone()),
        ("ETCDCTL_KEY", key.clone()),
    ];
    let args = [&["status", "--json", "--backend", &url][..], &target].concat();
    assert!(status_ok(&args, &elsewhere)["leader"].is_object());

    // A flag wins over its variable: a CA that signed nothing here fails, at once, as a
    // configuration error naming the flag, though ETCDCTL_CACERT is right.
    for command in ["status", "observe", "run"] {
        let mut args = vec![command, "--backend", "etcd:", "--ca-file", &other_ca];
        args.extend(target.iter().take(2));
        if command != "status" {
            args.extend(["--fail-after", "3s"]);
        }
        if command == "run" {
            args.extend(["--", "true"]);
        }
        refused(&args, &etcdctl, &["TLS", "--ca-file or ETCDCTL_CACERT"]);
    }
    // The same from the variable alone.
    let mut wrong = etcdctl.clone();
    wrong[1].1 = other_ca.clone();
    refused(
        &[&["status", "--backend", "etcd:"][..], &target].concat(),
        &wrong,
        &["TLS", "ETCDCTL_CACERT"],
    );
    // TLS without a CA; TLS flags on a plain-HTTP URL; a certificate without its key.
    refused(
        &[&["status", "--backend", &url][..], &target].concat(),
        &[],
        &["CA certificate", "--ca-file", "ETCDCTL_CACERT"],
    );
    let plain = url.replace("etcd+https://", "etcd://");
    refused(
        &[
            &["status", "--backend", &plain, "--ca-file", &ca][..],
            &target,
        ]
        .concat(),
        &[],
        &["plain HTTP", "etcd+https://"],
    );
    refused(
        &[
            &["status", "--backend", &url, "--ca-file", &ca][..],
            &target,
        ]
        .concat(),
        &[("ETCDCTL_CERT", cert.clone())],
        &["ETCDCTL_KEY"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_over_https_from_flags_or_consuls_variables_and_a_wrong_ca_is_exit_code_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    crate::support::tls::make_certificates(d);
    let (_consul, https) = crate::support::tls::consul_with_tls(d).await;
    let url = format!("consul+https://{https}");
    let (ca, other_ca) = (path(d, "ca.pem"), path(d, "other-ca.pem"));
    let (cert, key) = (path(d, "client.pem"), path(d, "client.key"));
    let target = ["--election", ELECTION, "--timeout", "3s"];
    let flags = [
        "--ca-file",
        ca.as_str(),
        "--cert-file",
        cert.as_str(),
        "--key-file",
        key.as_str(),
    ];
    let consul = vec![
        ("CONSUL_HTTP_ADDR", https.to_string()),
        ("CONSUL_HTTP_SSL", "true".to_owned()),
        ("CONSUL_CACERT", ca.clone()),
        ("CONSUL_CLIENT_CERT", cert.clone()),
        ("CONSUL_CLIENT_KEY", key.clone()),
    ];

    let args = [
        &["status", "--json", "--backend", &url][..],
        &target,
        &flags,
    ]
    .concat();
    assert!(status_ok(&args, &[])["leader"].is_null());

    let _leader = leads(&["--backend", "consul:", "--lock-delay", "0s"], &consul, d);
    let status = status_ok(
        &[&["status", "--json", "--backend", "consul:"][..], &target].concat(),
        &consul,
    );
    assert!(status["leader"]["fencing_token"].is_u64(), "{status}");

    // A flag wins over its variable.
    refused(
        &[
            &["status", "--backend", "consul:", "--ca-file", &other_ca][..],
            &target,
        ]
        .concat(),
        &consul,
        &["TLS", "--ca-file or CONSUL_CACERT"],
    );
    // Without a client certificate the agent refuses the handshake: at once, not retried.
    refused(
        &[
            &["status", "--backend", &url, "--ca-file", &ca][..],
            &target,
        ]
        .concat(),
        &[],
        &["TLS", "--cert-file and --key-file"],
    );
    let plain = url.replace("consul+https://", "consul://");
    refused(
        &[
            &["status", "--backend", &plain, "--ca-file", &ca][..],
            &target,
        ]
        .concat(),
        &[],
        &["plain HTTP", "consul+https://"],
    );
}
