//! `incumbent::consul::client` against a real `consul agent -dev`.
//!
//! Needs the `consul` binary (`scripts/install-test-deps`); a missing binary
//! fails the tests.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::net::free_port;
use crate::support::{ConsulDev, ServerProcess};
use incumbent::consul::client::{
    ConsulClient, ConsulConfig, ConsulError, PutOptions, QueryOptions, SessionCreate,
};

fn client(consul: &ConsulDev) -> ConsulClient {
    ConsulClient::new(ConsulConfig::new(consul.http_url())).expect("build client")
}

/// A TTL session tied to no node check, with the given lock delay.
fn ttl_session(name: &str, lock_delay: Option<Duration>) -> SessionCreate {
    SessionCreate {
        name: name.into(),
        ttl: Some(Duration::from_secs(10)),
        lock_delay,
        node_checks: Some(Vec::new()),
    }
}

/// Creates a ttl session (see [`ttl_session`]) and returns its id.
async fn session(client: &ConsulClient, name: &str, lock_delay: Option<Duration>) -> String {
    client
        .session_create(&ttl_session(name, lock_delay))
        .await
        .expect("create a session")
}

fn acquire(session: &str) -> PutOptions {
    PutOptions {
        acquire: Some(session.into()),
        ..PutOptions::default()
    }
}

fn release(session: &str) -> PutOptions {
    PutOptions {
        release: Some(session.into()),
        ..PutOptions::default()
    }
}

/// Retries `op` while it fails transiently, for up to ten seconds.
async fn eventually<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ConsulError>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match op().await {
            Ok(value) => return value,
            Err(err) if err.is_transient() && Instant::now() < deadline => {
                eprintln!("retrying: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("{err}"),
        }
    }
}

#[tokio::test]
async fn session_create_info_renew_destroy() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);

    let id = client
        .session_create(&SessionCreate {
            name: "lifecycle".into(),
            ttl: Some(Duration::from_secs(15)),
            lock_delay: Some(Duration::ZERO),
            node_checks: Some(Vec::new()),
        })
        .await
        .expect("session create");
    assert_eq!(id.len(), 36, "{id}");

    let info = client
        .session_info(&id)
        .await
        .expect("session info")
        .expect("session exists");
    assert_eq!(info.id, id);
    assert_eq!(info.name, "lifecycle");
    assert_eq!(info.ttl, Some(Duration::from_secs(15)));
    assert_eq!(
        info.lock_delay,
        Duration::ZERO,
        "explicit lock delay 0 is honoured"
    );
    assert!(info.node_checks.is_empty(), "{:?}", info.node_checks);
    assert!(!info.node.is_empty());

    let renewed = client
        .session_renew(&id)
        .await
        .expect("session renew")
        .expect("session still exists");
    assert_eq!(renewed.id, id);
    assert_eq!(renewed.ttl, Some(Duration::from_secs(15)));

    client.session_destroy(&id).await.expect("session destroy");
    assert_eq!(client.session_info(&id).await.expect("session info"), None);
    assert_eq!(
        client
            .session_renew(&id)
            .await
            .expect("renew after destroy"),
        None
    );
    // Destroying again is not an error.
    client.session_destroy(&id).await.expect("second destroy");
}

#[tokio::test]
async fn session_defaults_and_lock_delay_formats() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);

    // No lock delay, no TTL, default checks: Consul's defaults apply. Right
    // after startup the agent may not have registered `serfHealth` yet, which
    // the client reports as transient.
    let defaults = SessionCreate {
        name: "defaults".into(),
        ..SessionCreate::default()
    };
    let id = eventually(|| client.session_create(&defaults)).await;
    let info = client.session_info(&id).await.unwrap().expect("exists");
    assert_eq!(
        info.lock_delay,
        Duration::from_secs(15),
        "Consul's default lock delay"
    );
    assert_eq!(info.ttl, None);
    assert_eq!(info.node_checks, vec!["serfHealth".to_owned()]);

    // A sub-second lock delay and a TTL in minutes survive the round trip.
    let fractional = SessionCreate {
        name: "fractional".into(),
        ttl: Some(Duration::from_secs(90)),
        lock_delay: Some(Duration::from_millis(1500)),
        ..SessionCreate::default()
    };
    let id = eventually(|| client.session_create(&fractional)).await;
    let info = client.session_info(&id).await.unwrap().expect("exists");
    assert_eq!(info.lock_delay, Duration::from_millis(1500));
    assert_eq!(info.ttl, Some(Duration::from_secs(90)));
}

#[tokio::test]
async fn unknown_and_malformed_sessions() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);
    let unknown = "00000000-0000-0000-0000-000000000000";

    assert_eq!(client.session_renew(unknown).await.expect("renew"), None);
    assert_eq!(client.session_info(unknown).await.expect("info"), None);

    let err = client.session_renew("not-a-uuid").await.unwrap_err();
    assert!(matches!(err, ConsulError::BadRequest { .. }), "{err:?}");
    assert!(!err.is_transient());

    // An acquire naming a session Consul does not know.
    let err = client
        .kv_put("ghost", b"x", &acquire(unknown))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConsulError::InvalidSession { session, .. } if session == unknown),
        "{err:?}"
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn invalid_ttl_is_a_bad_request_with_advice() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);
    let err = client
        .session_create(&SessionCreate {
            ttl: Some(Duration::from_secs(1)),
            ..SessionCreate::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ConsulError::BadRequest { .. }), "{err:?}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("between 10s and 24h"), "{err}");
}

#[tokio::test]
async fn acquire_release_and_contention() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);
    let key = "service/acquire/leader";
    let s1 = session(&client, "s1", Some(Duration::ZERO)).await;
    let s2 = session(&client, "s2", Some(Duration::ZERO)).await;

    assert!(client.kv_put(key, b"one", &acquire(&s1)).await.unwrap());
    let entry = client
        .kv_get(key, &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .expect("key");
    assert_eq!(entry.session.as_deref(), Some(s1.as_str()));
    assert_eq!(entry.value, b"one");
    assert_eq!(entry.lock_index, 1);

    // Another session cannot take it, nor release it.
    assert!(!client.kv_put(key, b"two", &acquire(&s2)).await.unwrap());
    assert!(!client.kv_put(key, b"two", &release(&s2)).await.unwrap());
    // The holder may acquire again (updating the value) without a new lock index.
    assert!(
        client
            .kv_put(key, b"one-again", &acquire(&s1))
            .await
            .unwrap()
    );
    let entry = client
        .kv_get(key, &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .expect("key");
    assert_eq!(
        (entry.value.as_slice(), entry.lock_index),
        (&b"one-again"[..], 1)
    );

    assert!(
        client
            .kv_put(key, b"released", &release(&s1))
            .await
            .unwrap()
    );
    let entry = client
        .kv_get(key, &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .expect("key");
    assert_eq!(entry.session, None);
    assert_eq!(entry.value, b"released");

    assert!(client.kv_put(key, b"two", &acquire(&s2)).await.unwrap());
    let entry = client
        .kv_get(key, &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .expect("key");
    assert_eq!(entry.session.as_deref(), Some(s2.as_str()));
    assert_eq!(entry.lock_index, 2);

    // Destroying the holder releases the lock (behavior release).
    client.session_destroy(&s2).await.unwrap();
    let entry = client
        .kv_get(key, &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .expect("key kept");
    assert_eq!(entry.session, None);
}

#[tokio::test]
async fn lock_delay_blocks_acquisition_after_destroy() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);
    let key = "service/delay/leader";
    let delay = Duration::from_secs(2);
    let holder = session(&client, "holder", Some(delay)).await;
    let waiter = session(&client, "waiter", Some(Duration::ZERO)).await;

    assert!(client.kv_put(key, b"h", &acquire(&holder)).await.unwrap());
    client.session_destroy(&holder).await.unwrap();
    let destroyed = Instant::now();

    // Consul answers `false` (HTTP 200) while the lock delay runs.
    assert!(!client.kv_put(key, b"w", &acquire(&waiter)).await.unwrap());
    let acquired = loop {
        if client.kv_put(key, b"w", &acquire(&waiter)).await.unwrap() {
            break destroyed.elapsed();
        }
        assert!(destroyed.elapsed() < delay * 3, "lock delay never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        acquired >= delay - Duration::from_millis(300),
        "acquired after {acquired:?}"
    );
}

#[tokio::test]
async fn lock_delay_zero_allows_immediate_takeover() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);
    let key = "service/nodelay/leader";
    let holder = session(&client, "holder", Some(Duration::ZERO)).await;
    let waiter = session(&client, "waiter", Some(Duration::ZERO)).await;
    assert!(client.kv_put(key, b"h", &acquire(&holder)).await.unwrap());
    client.session_destroy(&holder).await.unwrap();
    assert!(client.kv_put(key, b"w", &acquire(&waiter)).await.unwrap());
}

#[tokio::test]
async fn blocking_query_returns_on_change_and_keeps_index_on_404() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);
    let key = "service/watch/leader";

    let missing = client.kv_get(key, &QueryOptions::default()).await.unwrap();
    assert_eq!(missing.entry, None);
    assert!(missing.index > 0, "404 carries X-Consul-Index");

    // A blocking query on a missing key times out with `None` and an index.
    let started = Instant::now();
    let waited = client
        .kv_get(
            key,
            &QueryOptions {
                index: Some(missing.index),
                wait: Some(Duration::from_secs(1)),
                consistent: false,
            },
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(waited.entry, None);
    assert!(waited.index >= missing.index);

    // A blocking query returns as soon as the key is written.
    let watcher = {
        let client = client.clone();
        let index = waited.index;
        tokio::spawn(async move {
            let started = Instant::now();
            let response = client
                .kv_get(
                    key,
                    &QueryOptions {
                        index: Some(index),
                        wait: Some(Duration::from_secs(30)),
                        consistent: true,
                    },
                )
                .await;
            (response, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !watcher.is_finished(),
        "the blocking query returned before the write"
    );
    assert!(
        client
            .kv_put(key, b"new", &PutOptions::default())
            .await
            .unwrap()
    );
    let (response, elapsed) = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("blocking query returned after the write")
        .unwrap();
    let response = response.unwrap();
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    let entry = response.entry.expect("written key");
    assert_eq!(entry.value, b"new");
    assert!(response.index > waited.index);
    assert_eq!(response.index, entry.modify_index);

    // Deleting it wakes a watcher too, with `None` and a newer index.
    let index = response.index;
    let watcher = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .kv_get(
                    key,
                    &QueryOptions {
                        index: Some(index),
                        wait: Some(Duration::from_secs(30)),
                        consistent: false,
                    },
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(client.kv_delete(key, None).await.unwrap());
    let gone = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("blocking query returned after the delete")
        .unwrap()
        .unwrap();
    assert_eq!(gone.entry, None);
    assert!(gone.index > index, "{} > {index}", gone.index);
}

#[tokio::test]
async fn blocking_wait_longer_than_request_timeout() {
    let consul = ConsulDev::start().await;
    let client = ConsulClient::new(
        ConsulConfig::new(consul.http_url()).request_timeout(Duration::from_millis(500)),
    )
    .unwrap();
    let index = client
        .kv_get("k", &QueryOptions::default())
        .await
        .unwrap()
        .index;
    let started = Instant::now();
    let response = client
        .kv_get(
            "k",
            &QueryOptions {
                index: Some(index),
                wait: Some(Duration::from_secs(2)),
                consistent: false,
            },
        )
        .await
        .expect("the wait extends the request timeout");
    assert!(started.elapsed() >= Duration::from_millis(1900));
    assert_eq!(response.entry, None);
}

#[tokio::test]
async fn check_and_set_and_delete() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);
    let key = "service/cas/value";
    let cas = |index| PutOptions {
        cas: Some(index),
        ..PutOptions::default()
    };

    assert!(
        client.kv_put(key, b"first", &cas(0)).await.unwrap(),
        "cas 0 creates"
    );
    assert!(
        !client.kv_put(key, b"again", &cas(0)).await.unwrap(),
        "cas 0 fails when present"
    );
    let entry = client
        .kv_get(key, &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry.value, b"first");
    assert_eq!(entry.create_index, entry.modify_index);

    assert!(
        !client
            .kv_put(key, b"x", &cas(entry.modify_index + 1000))
            .await
            .unwrap()
    );
    assert!(
        client
            .kv_put(key, b"second", &cas(entry.modify_index))
            .await
            .unwrap()
    );
    let entry2 = client
        .kv_get(key, &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry2.value, b"second");
    assert!(entry2.modify_index > entry.modify_index);

    assert!(
        !client
            .kv_delete(key, Some(entry.modify_index))
            .await
            .unwrap(),
        "stale cas"
    );
    assert!(
        client
            .kv_delete(key, Some(entry2.modify_index))
            .await
            .unwrap()
    );
    assert_eq!(
        client
            .kv_get(key, &QueryOptions::default())
            .await
            .unwrap()
            .entry,
        None
    );
    assert!(
        client.kv_delete(key, None).await.unwrap(),
        "deleting a missing key"
    );
}

#[tokio::test]
async fn values_and_odd_keys_round_trip() {
    let consul = ConsulDev::start().await;
    let client = client(&consul);

    let bytes: Vec<u8> = (0..=255).collect();
    let put = PutOptions::default();
    let key = "odd keys/with space?and%percent#hash+plus";
    assert!(client.kv_put(key, &bytes, &put).await.unwrap());
    let entry = client
        .kv_get(key, &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry.key, key);
    assert_eq!(entry.value, bytes);

    // An empty value comes back as JSON null and decodes to no bytes.
    assert!(
        client
            .kv_put("/empty", b"", &PutOptions::default())
            .await
            .unwrap()
    );
    let entry = client
        .kv_get("empty", &QueryOptions::default())
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(entry.key, "empty");
    assert!(entry.value.is_empty());

    let err = client
        .kv_get("a/../b", &QueryOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ConsulError::InvalidConfig(_)), "{err:?}");
}

#[tokio::test]
async fn status_leader_names_the_leader() {
    let consul = ConsulDev::start().await;
    let leader = client(&consul).status_leader().await.unwrap();
    assert!(leader.starts_with("127.0.0.1:"), "{leader:?}");
}

#[tokio::test]
async fn enterprise_namespace_on_open_source_consul_is_a_bad_request() {
    let consul = ConsulDev::start().await;
    let client =
        ConsulClient::new(ConsulConfig::new(consul.http_url()).namespace("default")).unwrap();
    let err = client
        .kv_get("k", &QueryOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ConsulError::BadRequest { status: 400, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("do not set a namespace"), "{err}");
    // Status endpoints ignore the namespace.
    assert!(!client.status_leader().await.unwrap().is_empty());
}

#[tokio::test]
async fn unreachable_agent_is_transient() {
    let (nobody, _refusing) = crate::support::net::refused_addr();
    let client = ConsulClient::new(
        ConsulConfig::new(format!("http://{nobody}")).request_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    let err = client.status_leader().await.unwrap_err();
    assert!(matches!(err, ConsulError::Unreachable { .. }), "{err:?}");
    assert!(err.is_transient());
    assert!(err.to_string().contains("refused"), "{err}");
}

#[tokio::test]
async fn paused_agent_times_out_as_unreachable() {
    let mut consul = ConsulDev::start().await;
    let client = ConsulClient::new(
        ConsulConfig::new(consul.http_url()).request_timeout(Duration::from_millis(500)),
    )
    .unwrap();
    client.status_leader().await.unwrap();
    consul.process().pause();
    let started = Instant::now();
    let err = client.status_leader().await.unwrap_err();
    consul.process().resume();
    assert!(matches!(err, ConsulError::Unreachable { .. }), "{err:?}");
    assert!(err.is_transient());
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    client
        .status_leader()
        .await
        .expect("answers again after resume");
}

/// A dev agent with ACLs on (default deny) and the master token `root-secret`.
async fn start_acl_agent() -> (ServerProcess, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let hcl = r#"acl { enabled = true default_policy = "deny" tokens { master = "root-secret" } }"#;
    let (process, http) =
        crate::support::consul::spawn_dev("consul-acl", dir.path(), &["-hcl".into(), hcl.into()])
            .await;
    (process, format!("http://{http}"), dir)
}

/// Runs `consul tls ...` in `dir`, which writes its files there.
fn consul_tls(dir: &Path, args: &[&str]) {
    let output = Command::new(crate::support::bin::find_binary("consul"))
        .arg("tls")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run consul tls");
    assert!(output.status.success(), "consul tls {args:?}: {output:?}");
}

#[tokio::test]
async fn https_with_ca_and_client_certificate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    consul_tls(d, &["ca", "create"]);
    consul_tls(d, &["cert", "create", "-server"]);
    consul_tls(d, &["cert", "create", "-client"]);
    let https_port = free_port();
    let hcl = format!(
        r#"ports {{ https = {https_port} }}
           ca_file = "{ca}"
           cert_file = "{cert}"
           key_file = "{key}"
           verify_incoming_https = true"#,
        ca = d.join("consul-agent-ca.pem").display(),
        cert = d.join("dc1-server-consul-0.pem").display(),
        key = d.join("dc1-server-consul-0-key.pem").display(),
    );
    let (_process, _http) =
        crate::support::consul::spawn_dev("consul-tls", d, &["-hcl".into(), hcl]).await;
    let read = |name: &str| std::fs::read(d.join(name)).expect("read PEM");
    let url = format!("https://127.0.0.1:{https_port}");

    let client = ConsulClient::new(
        ConsulConfig::new(&url)
            .ca_pem(read("consul-agent-ca.pem"))
            .client_identity_pem(
                read("dc1-client-consul-0.pem"),
                read("dc1-client-consul-0-key.pem"),
            ),
    )
    .expect("build TLS client");
    assert!(
        !client
            .status_leader()
            .await
            .expect("leader over HTTPS")
            .is_empty()
    );
    assert!(
        client
            .kv_put("tls", b"ok", &PutOptions::default())
            .await
            .unwrap()
    );
    assert!(!format!("{client:?}").contains("PRIVATE KEY"));

    // Without a client certificate the agent refuses the connection.
    let no_identity =
        ConsulClient::new(ConsulConfig::new(&url).ca_pem(read("consul-agent-ca.pem"))).unwrap();
    let err = no_identity.status_leader().await.unwrap_err();
    assert!(matches!(err, ConsulError::Tls { .. }), "{err:?}");
    assert!(!err.is_transient());

    // Without the CA the agent's certificate is not trusted.
    let no_ca = ConsulClient::new(ConsulConfig::new(&url).client_identity_pem(
        read("dc1-client-consul-0.pem"),
        read("dc1-client-consul-0-key.pem"),
    ))
    .unwrap();
    let err = no_ca.status_leader().await.unwrap_err();
    assert!(matches!(err, ConsulError::Tls { .. }), "{err:?}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("check ca_pem"), "{err}");
}

#[tokio::test]
async fn acl_errors_name_the_token_and_are_not_transient() {
    let (_process, url, _dir) = start_acl_agent().await;

    let anonymous = ConsulClient::new(ConsulConfig::new(&url)).unwrap();
    let err = anonymous
        .kv_put("k", b"v", &PutOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ConsulError::PermissionDenied { .. }),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert!(err.to_string().contains("check the ACL token"), "{err}");

    let wrong = ConsulClient::new(ConsulConfig::new(&url).token("not-a-real-token")).unwrap();
    let err = wrong
        .session_create(&SessionCreate::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ConsulError::Unauthorized { .. }), "{err:?}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("check the ACL token"), "{err}");
    assert!(!format!("{err:?} {err} {wrong:?}").contains("not-a-real-token"));

    // The ACL bootstrap may still be settling right after the leader election.
    let root = ConsulClient::new(ConsulConfig::new(&url).token("root-secret")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let session = loop {
        match root.session_create(&ttl_session("root", None)).await {
            Ok(session) => break session,
            Err(err) if Instant::now() < deadline => {
                eprintln!("retrying: {err}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("root token rejected: {err}"),
        }
    };
    assert!(root.kv_put("k", b"v", &acquire(&session)).await.unwrap());
}
