//! Self-test of the test harness in `tests/support` against real servers.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::etcd::is_healthy;
use crate::support::{ConsulDev, EtcdCluster, EtcdServer, Proxy, http};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Base64 of the key `incumbent-harness` and the value `survives-restart`.
const PUT_KEY: &str = r#"{"key":"aW5jdW1iZW50LWhhcm5lc3M=","value":"c3Vydml2ZXMtcmVzdGFydA=="}"#;
const RANGE_KEY: &str = r#"{"key":"aW5jdW1iZW50LWhhcm5lc3M="}"#;
const VALUE: &str = "c3Vydml2ZXMtcmVzdGFydA==";

/// One keep-alive `/health` request, as a client with a long-lived connection sends it.
const KEEP_ALIVE_HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: etcd\r\n\r\n";

async fn assert_healthy(addr: SocketAddr) {
    let response = http::get(addr, "/health").await.expect("GET /health");
    assert!(is_healthy(&response.body), "{addr} unhealthy: {response:?}");
}

/// Polls `/health` until it reports healthy, for up to five seconds.
async fn eventually_healthy(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match http::get(addr, "/health").await {
            Ok(response) if is_healthy(&response.body) => return,
            last if Instant::now() >= deadline => panic!("{addr} never healthy: {last:?}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Reads until a complete `/health` JSON body (ending in `}`) has arrived.
async fn read_health_response(stream: &mut TcpStream) -> io::Result<String> {
    let mut raw = Vec::new();
    while !raw.ends_with(b"}") {
        let mut chunk = [0; 1024];
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        raw.extend_from_slice(&chunk[..read]);
    }
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

#[tokio::test]
async fn etcd_single_serves_metrics_and_keeps_data_across_restart() {
    let mut etcd = EtcdServer::single().await;
    let addr = etcd.client_addr();
    assert_eq!(etcd.endpoints(), vec![format!("http://{addr}")]);

    let metrics = reqwest::get(etcd.metrics_url()).await.expect("GET metrics");
    let metrics = metrics.text().await.expect("metrics body");
    assert!(
        metrics.contains("etcd_server_has_leader 1"),
        "no leader in metrics"
    );

    let put = http::request(addr, "POST", "/v3/kv/put", PUT_KEY)
        .await
        .expect("put");
    assert_eq!(put.status, 200, "{put:?}");
    etcd.process().kill9();
    assert!(etcd.process().pid().is_none());
    assert!(
        http::get(addr, "/health").await.is_err(),
        "killed etcd still answers"
    );

    etcd.process().restart().await;
    let range = http::request(addr, "POST", "/v3/kv/range", RANGE_KEY)
        .await
        .expect("range");
    assert!(
        range.body.contains(VALUE),
        "value lost across restart: {range:?}"
    );
}

#[tokio::test]
async fn etcd_cluster_survives_member_loss_and_pause() {
    let mut cluster = EtcdCluster::three().await;
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    for (index, endpoint) in endpoints.iter().enumerate() {
        assert_eq!(endpoint, &format!("http://{}", cluster.client_addr(index)));
        assert_healthy(cluster.client_addr(index)).await;
    }

    cluster.member(0).kill9();
    assert!(http::get(cluster.client_addr(0), "/health").await.is_err());
    // Two of three keep a quorum, after a new election if 0 led.
    eventually_healthy(cluster.client_addr(1)).await;
    cluster.member(0).restart().await;
    assert_healthy(cluster.client_addr(0)).await;

    cluster.member(2).pause();
    let paused = tokio::time::timeout(
        Duration::from_millis(300),
        http::get(cluster.client_addr(2), "/health"),
    );
    assert!(paused.await.is_err(), "paused member answered");
    cluster.member(2).resume();
    eventually_healthy(cluster.client_addr(2)).await;
}

#[tokio::test]
async fn consul_dev_elects_itself_and_serves_kv() {
    let consul = ConsulDev::start().await;
    assert_eq!(consul.http_url(), format!("http://{}", consul.http_addr()));
    assert!(consul.http_addr().ip().is_loopback());

    let addr = consul.http_addr();
    let put = http::request(addr, "PUT", "/v1/kv/incumbent-harness", "hello")
        .await
        .expect("put");
    assert_eq!((put.status, put.body.trim()), (200, "true"));
    let get = http::get(addr, "/v1/kv/incumbent-harness?raw")
        .await
        .expect("get");
    assert_eq!((get.status, get.body.as_str()), (200, "hello"));
}

#[tokio::test]
async fn proxy_relays_and_adds_latency() {
    let etcd = EtcdServer::single().await;
    let proxy = Proxy::start(etcd.client_addr());
    assert_healthy(proxy.addr()).await;

    proxy.set_latency(Duration::from_millis(150));
    let started = Instant::now();
    assert_healthy(proxy.addr()).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(300),
        "round trip took only {elapsed:?}"
    );
}

#[tokio::test]
async fn proxy_blackhole_withholds_bytes_until_healed() {
    let etcd = EtcdServer::single().await;
    let proxy = Proxy::start(etcd.client_addr());
    let mut stream = TcpStream::connect(proxy.addr()).await.expect("connect");
    stream.write_all(KEEP_ALIVE_HEALTH).await.expect("write");
    let first = read_health_response(&mut stream)
        .await
        .expect("first response");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");

    proxy.blackhole(true);
    stream
        .write_all(KEEP_ALIVE_HEALTH)
        .await
        .expect("write while black-holed");
    let withheld = tokio::time::timeout(
        Duration::from_millis(500),
        read_health_response(&mut stream),
    );
    assert!(withheld.await.is_err(), "bytes crossed the black hole");
    assert_healthy(etcd.client_addr()).await;

    proxy.blackhole(false);
    let second = read_health_response(&mut stream)
        .await
        .expect("withheld response");
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
}

#[tokio::test]
async fn proxy_reset_all_resets_open_connections() {
    let etcd = EtcdServer::single().await;
    let proxy = Proxy::start(etcd.client_addr());
    let mut stream = TcpStream::connect(proxy.addr()).await.expect("connect");
    stream.write_all(KEEP_ALIVE_HEALTH).await.expect("write");
    read_health_response(&mut stream).await.expect("response");

    proxy.reset_all();
    let mut byte = [0; 1];
    let error = stream
        .read(&mut byte)
        .await
        .expect_err("connection survived reset_all");
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
    assert_healthy(proxy.addr()).await;
}

/// A server whose port another process took answers the probe through that process: the
/// harness must see that the listener is not its server's, or two tests share a store.
#[tokio::test]
async fn a_probe_answered_by_another_process_is_not_taken_as_ready() {
    // Another process's server (an etcd) holds the port.
    let other = EtcdServer::single().await;
    let addr = other.client_addr();
    let dir = tempfile::tempdir().expect("temp dir");
    // A "server" that never listens: its probe reaches the etcd.
    let mut process = crate::support::process::ServerProcess::spawn(
        "sleeper",
        "sleep".into(),
        vec!["30".into()],
        dir.path(),
        crate::support::process::Probe::Tcp { addr },
    );
    let refused = process
        .try_wait_ready()
        .await
        .expect_err("the listener is the etcd's, not the server's");
    assert!(
        refused.contains("another process listens"),
        "the reason names the taken port: {refused}"
    );
    assert_eq!(process.pid(), None, "the server process was stopped");
}
