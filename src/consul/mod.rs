//! Consul backend: leader election on Consul sessions and KV locks.

pub mod client;
