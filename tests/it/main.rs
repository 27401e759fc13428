//! The integration tests: one test binary, a module per subject.
//!
//! One crate links the library and its dependencies once, where a binary per file linked
//! them some thirty times. Run one subject, or one store, with a filter on the test path:
//! `scripts/test --test it redis` runs `redis::*`, `conformance::redis*::*` and every other
//! test with "redis" in its name.
//!
//! A module that needs store features is compiled only with them (`cargo test` without
//! features runs the rest). Tests that change process-wide state stay in binaries of their
//! own: `tests/metrics.rs` (the metrics recorder), `tests/campaign_panic.rs`, `tests/set_panic.rs` and
//! `tests/secrets.rs` (the global `tracing` subscriber).
//!
//! Every test here may run next to any other: servers listen on free loopback ports and keep
//! their data in temporary directories, and no test sets an environment variable of this
//! process or a fixed path. The one process-wide setting, the Prometheus recorder of
//! `http::metrics_are_scraped_over_http_after_an_election`, records every test's campaigns;
//! that test reads only its own election's series.

#[path = "../support/mod.rs"]
mod support;

mod claims;
#[cfg(feature = "cli")]
mod cli;
#[cfg(all(feature = "cli", feature = "etcd", feature = "consul"))]
mod cli_failover;
#[cfg(all(feature = "cli", feature = "etcd"))]
mod cli_observe;
#[cfg(all(feature = "cli", feature = "etcd-tls", feature = "consul"))]
mod cli_tls;
#[cfg(all(feature = "cli", feature = "zookeeper"))]
mod cli_zookeeper;
mod conformance;
#[cfg(feature = "consul")]
mod consul;
#[cfg(feature = "consul")]
mod consul_client;
#[cfg(feature = "consul")]
mod consul_since;
mod dashboards;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(all(feature = "axum", feature = "file"))]
mod examples_exit;
mod file_processes;
mod harness;
mod house;
#[cfg(feature = "axum")]
mod http;
mod index_builder;
#[cfg(feature = "kubernetes")]
mod kubernetes;
#[cfg(feature = "memcached")]
mod memcached;
#[cfg(feature = "etcd")]
mod observer_recovery;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(all(feature = "etcd", feature = "consul"))]
mod renewal;
mod sets;
mod sharded;
mod state_machine;
mod yielding;
#[cfg(feature = "zookeeper")]
mod zookeeper;
