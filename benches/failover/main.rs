//! Failover and hand-off figures, printed (never asserted).
//!
//! ```text
//! cargo bench --bench failover --all-features            # every backend
//! cargo bench --bench failover -- memory file            # only these sections
//! cargo bench --bench failover --all-features -- etcd consul
//! cargo bench --bench failover --features redis,memcached -- redis memcached
//! cargo bench --bench failover --features postgres -- postgres
//! cargo bench --bench failover --features k8s-latest -- kubernetes
//! ```
//!
//! Each section prints medians and p99s over many rounds, measured in this one run, so the
//! figures can be compared with each other; these machines are shared and noisy. Targets are
//! printed in brackets beside the figures, never asserted. The etcd and Consul sections start
//! their own servers on loopback (see tests/support); BENCHMARKS.md explains each figure.

#[path = "../../tests/support/mod.rs"]
mod support;

mod common;
#[cfg(feature = "consul")]
mod consul;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "kubernetes")]
mod kubernetes;
#[cfg(feature = "memcached")]
mod memcached;
#[cfg(any(
    feature = "redis",
    feature = "memcached",
    feature = "postgres",
    feature = "kubernetes"
))]
mod polled;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod switchover;
#[cfg(feature = "zookeeper")]
mod zookeeper;

use std::time::{Duration, Instant};

use incumbent::memory::MemoryBackend;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    println!("machine: {}", support::machine());
    let run = Instant::now();
    if wanted("memory") {
        let section = Instant::now();
        memory().await;
        common::took("memory", section);
    }
    #[cfg(all(feature = "file", unix))]
    if wanted("file") {
        let section = Instant::now();
        file().await;
        common::took("file", section);
    }
    #[cfg(feature = "etcd")]
    if wanted("etcd") {
        let section = Instant::now();
        etcd::run().await;
        common::took("etcd", section);
    }
    #[cfg(feature = "consul")]
    if wanted("consul") {
        let section = Instant::now();
        consul::run().await;
        common::took("consul", section);
    }
    #[cfg(feature = "zookeeper")]
    if wanted("zookeeper") {
        let section = Instant::now();
        zookeeper::run().await;
        common::took("zookeeper", section);
    }
    #[cfg(feature = "redis")]
    if wanted("redis") {
        let section = Instant::now();
        redis::run().await;
        common::took("redis", section);
    }
    #[cfg(feature = "memcached")]
    if wanted("memcached") {
        let section = Instant::now();
        memcached::run().await;
        common::took("memcached", section);
    }
    #[cfg(feature = "postgres")]
    if wanted("postgres") {
        let section = Instant::now();
        postgres::run().await;
        common::took("postgres", section);
    }
    #[cfg(feature = "kubernetes")]
    if wanted("kubernetes") {
        let section = Instant::now();
        kubernetes::run().await;
        common::took("kubernetes", section);
    }
    println!();
    common::took("the whole run", run);
}

async fn memory() {
    println!("\n## memory");
    let store = MemoryBackend::new();
    let ttl = Duration::from_secs(3);
    let handoff = common::handoff_rounds(|| store.client(), ttl, 200).await;
    common::print_latencies("hand-off after resign", &handoff);
    let (gaps, calls) = switchover::rounds(
        vec![store.client(), store.client(), store.client()],
        ttl,
        200,
    )
    .await;
    let window = Duration::from_millis(500);
    let connect = {
        let store = store.clone();
        move || {
            let store = store.clone();
            async move { store.client() }
        }
    };
    let fallback = switchover::dead_target(connect, ttl, window, 5).await;
    switchover::print("memory", &gaps, &calls, &fallback, window);
    common::elections_at_scale("memory", 10_000, || store.clone(), "", String::new).await;
    common::idle_cpu("memory", || store.client(), ttl, Duration::from_secs(5)).await;
}

#[cfg(all(feature = "file", unix))]
async fn file() {
    use incumbent::file::FileBackend;
    println!("\n## file");
    let dir = tempfile::tempdir().expect("a temp dir");
    let ttl = Duration::from_secs(3);
    let backend = || FileBackend::in_dir(dir.path());
    let handoff = common::handoff_rounds(backend, ttl, 200).await;
    common::print_latencies("hand-off after resign", &handoff);
    // A candidate that the gate keeps out waits the window before it follows again.
    let (gaps, calls) = switchover::rounds(vec![backend(), backend(), backend()], ttl, 30).await;
    let path = dir.path().to_owned();
    let connect = move || {
        let path = path.clone();
        async move { FileBackend::in_dir(path) }
    };
    let crash = common::crash_rounds(connect.clone(), ttl, 30, ttl * 3).await;
    common::print_latencies("failover after a crash (fd closed, as on kill -9)", &crash);
    let window = Duration::from_millis(500);
    let fallback = switchover::dead_target(connect.clone(), ttl, window, 5).await;
    switchover::print("file", &gaps, &calls, &fallback, window);
    common::idle_cpu("file", backend, ttl, Duration::from_secs(5)).await;
}
