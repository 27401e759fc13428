//! Support code for integration tests that run real servers.
//!
//! Include it from a test file with `mod support;`. Server binaries are looked
//! up, never installed: a missing one fails the test with a pointer to
//! `scripts/install-test-deps`. Every server listens on free loopback ports,
//! keeps its data and log in a temporary directory, and is killed on drop.
//! A later backend adds one file here with its server type. `events` waits for a
//! campaign's events the same way in every test.

// Each test file uses only part of this module.
#![allow(dead_code)]

pub mod beats;
pub mod bin;
pub mod consul;
pub mod etcd;
pub mod events;
pub mod http;
#[cfg(feature = "kubernetes")]
pub mod kube;
pub mod memcached;
pub mod net;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod tls;
pub mod zookeeper;

/// This machine, as benchmarks print it: "2 cores, AMD EPYC …".
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

// Not every test file uses every type.
#[allow(unused_imports)]
pub use self::{
    consul::ConsulDev,
    etcd::{EtcdCluster, EtcdServer},
    memcached::MemcachedServer,
    postgres::{PgBouncer, PostgresServer},
    process::{Probe, ServerProcess},
    proxy::Proxy,
    redis::RedisServer,
    zookeeper::ZookeeperServer,
};
