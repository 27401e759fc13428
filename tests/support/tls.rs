//! TLS for the servers of the tests: certificates made with `openssl`, etcd serving clients
//! over TLS, and a Consul dev agent with an HTTPS port.
//!
//! [`make_certificates`] writes, into a directory: `ca.pem` (and its key), a second CA
//! `other-ca.pem` that signed nothing the servers present, and `server.pem`/`server.key` and
//! `client.pem`/`client.key`, both for 127.0.0.1 and localhost, signed by `ca.pem`.

use std::net::SocketAddr;
use std::path::Path;

/// Writes a CA, a server certificate for 127.0.0.1 and a client certificate into `dir`, with
/// the `openssl` command.
pub fn make_certificates(dir: &Path) {
    certificates(dir, &[]);
}

/// Like [`make_certificates`], valid from a day ago for three days (openssl run under
/// libfaketime): for servers whose clients' wall clocks are skewed by minutes.
pub fn make_certificates_backdated(dir: &Path) {
    let faketime = super::bin::libfaketime();
    certificates(
        dir,
        &[("LD_PRELOAD", faketime.as_str()), ("FAKETIME", "-1d")],
    );
}

fn certificates(dir: &Path, env: &[(&str, &str)]) {
    // Valid for a day, or for three when made a day early.
    let days = if env.is_empty() { "1" } else { "3" };
    let openssl = |args: &[&str]| {
        let output = std::process::Command::new("openssl")
            .args(args)
            .envs(env.iter().copied())
            .current_dir(dir)
            .output()
            .expect("run openssl (Debian: apt-get install openssl)");
        assert!(output.status.success(), "openssl {args:?}: {output:?}");
    };
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &[
                "req",
                "-x509",
                "-days",
                days,
                "-subj",
                "/CN=incumbent test CA",
            ][..],
            &key,
            &["-keyout", "ca.key", "-out", "ca.pem"],
            &["-addext", "basicConstraints=critical,CA:TRUE"],
            &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req", "-x509", "-days", days, "-subj", "/CN=some other CA"][..],
            &key,
            &["-keyout", "other-ca.key", "-out", "other-ca.pem"],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
         extendedKeyUsage=serverAuth,clientAuth\n\
         basicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\n",
    )
    .expect("write extensions");
    for leaf in ["server", "client"] {
        let (csr, pem, private) = (
            format!("{leaf}.csr"),
            format!("{leaf}.pem"),
            format!("{leaf}.key"),
        );
        openssl(
            &[
                &["req", "-subj", &format!("/CN={leaf}")][..],
                &key,
                &["-keyout", &private, "-out", &csr],
            ]
            .concat(),
        );
        openssl(&[
            "x509",
            "-req",
            "-days",
            days,
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "leaf.ext",
            "-out",
            &pem,
        ]);
    }
}

/// Starts etcd serving clients over TLS and requiring client certificates; its health is
/// probed on a plain-HTTP metrics listener.
pub async fn etcd_with_tls(dir: &Path) -> (super::ServerProcess, String) {
    let client = super::net::free_addr();
    let peer = super::net::free_addr();
    let metrics = super::net::free_addr();
    let file = |name: &str| dir.join(name).display().to_string();
    let args = vec![
        "--name=tls".to_owned(),
        format!("--data-dir={}", file("data")),
        format!("--listen-client-urls=https://{client}"),
        format!("--advertise-client-urls=https://{client}"),
        format!("--listen-peer-urls=http://{peer}"),
        format!("--initial-advertise-peer-urls=http://{peer}"),
        format!("--initial-cluster=tls=http://{peer}"),
        format!("--listen-metrics-urls=http://{metrics}"),
        format!("--cert-file={}", file("server.pem")),
        format!("--key-file={}", file("server.key")),
        format!("--trusted-ca-file={}", file("ca.pem")),
        "--client-cert-auth".to_owned(),
    ];
    let probe = super::Probe::Http {
        addr: metrics,
        path: "/health",
        check: super::etcd::is_healthy,
    };
    let mut process = super::ServerProcess::spawn(
        "etcd-tls",
        super::bin::find_binary("etcd"),
        args,
        dir,
        probe,
    );
    process.wait_ready().await;
    (process, format!("https://{client}"))
}

/// Starts a Consul dev agent with an HTTPS port that requires client certificates
/// (`verify_incoming_https`), with the certificates of [`make_certificates`] in `dir`.
/// Returns the process (killed on drop) and the HTTPS address.
pub async fn consul_with_tls(dir: &Path) -> (super::ServerProcess, SocketAddr) {
    let https = super::net::free_addr();
    let file = |name: &str| dir.join(name).display().to_string();
    let hcl = format!(
        r#"ports {{ https = {port} }}
           ca_file = "{ca}"
           cert_file = "{cert}"
           key_file = "{key}"
           verify_incoming_https = true"#,
        port = https.port(),
        ca = file("ca.pem"),
        cert = file("server.pem"),
        key = file("server.key"),
    );
    let data = dir.join("consul");
    std::fs::create_dir_all(&data).expect("consul dir");
    let (process, _http) =
        super::consul::spawn_dev("consul-tls", &data, &["-hcl".into(), hcl]).await;
    (process, https)
}
