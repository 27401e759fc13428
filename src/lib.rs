//! Leader election for tokio services, on the coordination store you already run.
//!
//! Run several copies of a service; `incumbent` makes exactly one of them the leader of a
//! named election and hands it a [`Term`]: a cancellation token that fires the moment
//! leadership can no longer be trusted, and a [fencing token](Term::fencing_token) that
//! grows with every new term. When the leader dies, resigns or is cut off, another copy
//! takes over, in milliseconds where the store can tell it at once.
//!
//! # A service with a singleton worker
//!
//! [`Election::start`] runs a worker only while this process leads, and returns a
//! [`Runner`]: the one handle for everything else on the same candidate, the [`Status`] for
//! the health router and metrics, [`resign`](Runner::resign),
//! [`proclaim`](Runner::proclaim), the events, and [`shutdown`](Runner::shutdown). The
//! worker is cancelled on loss and stopped hard at the term's [`stop_by`](Term::stop_by),
//! before the store can hand the lock on; it is waited for (up to a grace) before the lock
//! is released, and runs again when re-elected. [`AnyBackend`] picks the store from a URL
//! in the service's configuration. `examples/service.rs` is the whole service, with its own
//! routes beside the health routes and metrics.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use std::time::Duration;
//! use incumbent::{AnyBackend, Election};
//!
//! // "file:" for processes of one host; etcd://, consul://, zk://, postgres://, redis://, memcached://
//! // for a store; "memory:" within one process, as here.
//! let backend = AnyBackend::connect("memory:").await?;
//! let election = Election::builder(backend, "jobs/index-builder")
//!     .candidate("host-a:8080")
//!     .ttl(Duration::from_secs(10))
//!     .on_demoted(|end| async move { eprintln!("demoted: {} (term {})", end.reason, end.fencing_token) })
//!     .build()?; // invalid settings are a typed error, never a panic
//!
//! let runner = election.start(|term| async move {
//!     while !term.is_cancelled() {
//!         // ... one step of the job, stamped with term.fencing_token() ...
//!         tokio::time::sleep(Duration::from_millis(100)).await;
//!     }
//! });
//! let mut status = runner.status(); // for incumbent::http::Health: /healthz, /readyz, /leader
//! # status.wait_for(|s| s.is_leader()).await.expect("runs");
//! // ... serve until told to stop (SIGTERM, Ctrl-C) ...
//! runner.shutdown().await?; // stop the worker, then release the lock: the next one leads now
//! # Ok(()) }
//! ```
//!
//! [`Election::run_until`] does the same in the caller's task, without a handle.
//!
//! A worker that returns, fails or panics while leading makes the candidate resign and
//! campaign again after the back-off; [`OnWorkerExit::Stop`] makes `run` return (and the
//! runner finish) instead. [`Election::leader`] says who leads without campaigning.
//!
//! # Events, status and callbacks
//!
//! [`Election::campaign`] starts a bare [`Campaign`], with no worker: a [`Stream`](futures_core::Stream) of
//! [`LeadershipEvent`]s (elected, demoted with a [`DemotionReason`], leader changed), a
//! [`Status`] in a [`watch`](tokio::sync::watch) channel for health endpoints,
//! [`proclaim`](CampaignHandle::proclaim) (the leader updates the metadata others read, e.g.
//! its address, without ending its term), and [`resign`](CampaignHandle::resign) /
//! [`shutdown`](CampaignHandle::shutdown):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use incumbent::{Election, LeadershipEvent, memory::MemoryBackend};
//!
//! let election = Election::builder(MemoryBackend::new(), "scheduler").build()?;
//! let mut campaign = election.campaign();
//! let status = campaign.status(); // status.borrow().is_leader(), .leader, .problem ...
//! while let Some(event) = campaign.recv().await {
//!     match event {
//!         LeadershipEvent::Elected(term) => {
//!             println!("leading, term {}", term.fencing_token());
//!             # break;
//!         }
//!         LeadershipEvent::Demoted { reason, .. } => println!("lost it: {reason}"),
//!         LeadershipEvent::LeaderChanged(leader) => println!("leader is now {leader:?}"),
//!     }
//! }
//! # assert!(status.borrow().is_leader());
//! campaign.shutdown().await?; // cancel, release the lock, close the session
//! # Ok(()) }
//! ```
//!
//! A shutdown starts when `shutdown()` is called. To stop many campaigns (or runners) at
//! once, [`Campaign::shutdown_all`] and [`Runner::shutdown_all`] ask every one at the call
//! and await them together in the caller's task: cheaper than a task per shutdown, or
//! `join_all` over thousands of them.
//!
//! # Thousands of elections in one process
//!
//! A [`Campaign`] is a task with its own status channel, event queue and settings: about
//! 7 KB per election on etcd. For a process that campaigns in thousands of elections (a
//! tenant each, a partition each), [`Election::set`] starts an [`ElectionSet`]: the
//! elections it [`join`](ElectionSet::join)s share the election's settings and one session,
//! and one task drives them all, holding each as a slot of its state and running only the
//! step under way (acquire, wait, hold, release). 100,000 etcd elections on one lease take
//! 1.3 to 1.6 KB of heap and under 2 KB resident each (BENCHMARKS.md, "Scale"). A set hands out the
//! same [`Term`]s, ends them first on any loss, and reports every member's events in one
//! stream; it runs no worker, and a member takes no resign, proclaim or hand-over of its own
//! (see [`ElectionSet`] for what it keeps and what it leaves out).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use incumbent::{Election, memory::MemoryBackend};
//!
//! let election = Election::builder(MemoryBackend::new(), "partitions").candidate("host-a").build()?;
//! let set = election.set();
//! for p in 0..1000 {
//!     set.join(&format!("partitions/{p}"))?;
//! }
//! # while set.leading() < 1000 { tokio::time::sleep(std::time::Duration::from_millis(10)).await; }
//! if let Some(term) = set.term("partitions/7").filter(|t| !t.is_cancelled()) {
//!     // ... work on partition 7, stamped with term.fencing_token(), until term.cancelled() ...
//! }
//! set.shutdown().await?; // every term ends, every lock is released, the session closes
//! # Ok(()) }
//! ```
//!
//! The builder's [`on_elected`](ElectionBuilder::on_elected),
//! [`on_demoted`](ElectionBuilder::on_demoted) and
//! [`on_leader_changed`](ElectionBuilder::on_leader_changed) take async closures, run in
//! a task of their own, in order; a slow callback never stalls the campaign.
//!
//! # Fencing tokens
//!
//! A leader can be paused (GC, a stopped VM, a slow disk) past its lease and wake up still
//! believing it leads. Self-fencing (below) makes that window small; fencing tokens close
//! it: send [`Term::fencing_token`] with every write to a downstream system and have it
//! reject any token lower than the highest it has seen.
//!
//! ```
//! use std::sync::Mutex;
//!
//! /// A downstream store that rejects writes from stale leaders.
//! struct Fenced { highest: Mutex<u64>, data: Mutex<Vec<String>> }
//!
//! impl Fenced {
//!     fn write(&self, token: u64, value: &str) -> Result<(), String> {
//!         let mut highest = self.highest.lock().unwrap();
//!         if token < *highest {
//!             return Err(format!("stale leader: token {token} < {}", *highest));
//!         }
//!         *highest = token; // check and write under one lock (or one transaction)
//!         self.data.lock().unwrap().push(value.to_owned());
//!         Ok(())
//!     }
//! }
//!
//! let store = Fenced { highest: Mutex::new(0), data: Mutex::new(vec![]) };
//! assert!(store.write(7, "from term 7").is_ok());
//! assert!(store.write(6, "from a paused old leader").is_err());
//! ```
//!
//! In SQL: `UPDATE jobs SET ..., token = $1 WHERE id = $2 AND token <= $1`. Each backend
//! documents where its token comes from (etcd: the leader key's create revision; Consul: the
//! key's ModifyIndex at acquisition; file and memory: a counter written under the lock).
//!
//! When the elections live in the same PostgreSQL as the data, a write can be tied to the
//! term itself: `PostgresBackend::guard(&tx, election, token)` (feature `postgres`) checks
//! the lease row in the write's own transaction and holds it until the commit, so a
//! deposed leader's write never commits, and the next term cannot begin while one is in
//! flight.
//!
//! # Self-fencing and timing
//!
//! Three durations, checked against each other by [`ElectionBuilder::build`]:
//!
//! - `ttl` (default 10 s): how long the store keeps our session without renewal, so how long
//!   a crashed leader keeps the lock;
//! - `renew_interval` (default ttl/3; ttl/2 on Consul): how often the session is renewed;
//! - `renew_deadline` (default 2/3 ttl, at most 4/5; on ZooKeeper 1/2 ttl, see
//!   [`DeadlineRule`](backend::DeadlineRule)): a leader that has not had a renewal
//!   *confirmed* within this long, counted from when that renewal was *sent*, cancels its
//!   term. The store restarts the ttl no earlier than it receives the renewal, so the lease
//!   cannot expire before `send time + ttl`; cancelling at `send time + renew_deadline`
//!   leaves `ttl - renew_deadline` for the worker to notice before anyone else can win.
//!
//! What this does *not* guarantee: it relies on the leader's clock and the store's clock
//! running at about the same *rate* (not on them agreeing on the time). A process frozen
//! for longer than the margin between its last check and the lease's expiry can still act
//! late; that is what fencing tokens are for. Consul only promises its TTL as a lower bound.
//!
//! # When a term ends
//!
//! The term ends first. The instant the campaign sees a loss (the renew deadline passed, the
//! session or the lock is gone) it cancels the term's token, before it logs, asks the store
//! why, or updates anything else; [`Status::is_leader`] turns false with the token itself,
//! so the status, `/readyz`, `/leader` and the `incumbent_is_leader` metric stop saying
//! "leader" in that same instant, and the role reads [`Role::SteppingDown`] while the work
//! winds down and the lock is released. The term is ended however the campaign's task ends:
//! a panic in it, or a runtime dropped under it, cancels the term, says
//! [`Role::Stopped`], and ends the event streams.
//!
//! After an *involuntary* loss the store may hand the lock on soon: [`Term::stop_by`] (and
//! the `stop_by` of [`LeadershipEvent::Demoted`]) says by when the work must have stopped,
//! the last confirmed renewal's send time plus the ttl, less a tenth of the ttl, or at once
//! when the store has already taken the lock. [`Election::run`] aborts a worker that ignores
//! cancellation then, even when the grace is longer; the `incumbent` CLI kills its command's
//! process group then. The grace applies in full only to voluntary ends (resign, shutdown,
//! the worker's exit), where the lock is kept until the work has stopped. So `grace` may be
//! longer than `ttl - renew_deadline`; on an involuntary loss the work gets
//! `ttl - renew_deadline - ttl/10` (at least a tenth of the ttl) to wind down.
//!
//! What no supervisor can prevent: a frozen process or host (a VM paused, a process
//! stopped with SIGSTOP, a long GC pause) runs no code, so it cannot stop its work, and may
//! resume after another leader began. Fencing tokens are the defence: a downstream store
//! that rejects the old token refuses the frozen leader's late writes.
//!
//! # Moving leadership on purpose
//!
//! Before a deploy or a drain, or back to the preferred region after a failover, hand the
//! election to a named candidate: [`Runner::hand_over`] (or [`CampaignHandle::hand_over`])
//! checks that the target is a live candidate, stops this leader's work as a resign does,
//! and keeps the next term for the target alone for the hand-over window (default: the
//! ttl); the target's token is greater, and a target that does not take office lapses into
//! an open election. Called on a follower, the request goes to the leader through the store;
//! [`Election::hand_over`] asks without campaigning, and `incumbent switchover` from the
//! command line. [`resign_for`](CampaignHandle::resign_for) steps down and stays out for a
//! while; [`ElectionBuilder::priority`] makes a preferred candidate that asks for the lead
//! once it has settled. The steps per store are in [`switchover`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use incumbent::{Election, HandOverError, Error, memory::MemoryBackend};
//!
//! let backend = MemoryBackend::new();
//! let build = |id: &str| Election::builder(backend.clone(), "scheduler").candidate(id).build();
//! let mut a = build("host-a")?.campaign();
//! # while !a.status().borrow().is_leader() { a.recv().await; }
//! let b = build("host-b")?.campaign();
//! # let mut s = b.status(); s.wait_for(|s| s.role == incumbent::Role::Follower).await.ok();
//! // host-a leads, host-b follows.
//! match a.hand_over("nobody").await {
//!     Err(Error::HandOver(HandOverError::NotACandidate { .. })) => {} // nothing moved
//!     other => panic!("{other:?}"),
//! }
//! let done = a.hand_over("host-b").await?; // returns once host-b leads
//! assert_eq!(done.to, "host-b");
//! # Ok(()) }
//! ```
//!
//! # One owner per shard, spread across processes
//!
//! When the work outgrows one singleton, split it into shards (partitions of a queue,
//! tenants, index segments) and let a [`ShardedElection`] spread them over the processes
//! that run it: each member registers in the store, every member computes the same balanced
//! map from what the members claim (each within one of `S / N`; a join or leave moves at most
//! `⌈S / N⌉` shards), and each shard it gets is a full term of its own election
//! (`<group>/<k>`), with its own fencing token and hard stop, a member of one
//! [`ElectionSet`] on the process's one session.
//! A shard that moves is released only after its worker stopped; the new owner takes it at
//! the release, or at the expiry if the old owner died. The details are in [`sharded`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use incumbent::{ShardedElection, ShardEvent, memory::MemoryBackend};
//!
//! let backend = MemoryBackend::new();
//! let partitions = ShardedElection::builder(backend, "queue/partitions", 16)
//!     .candidate("host-a")
//!     .build()?;
//! let runner = partitions.start(|shard, term| async move {
//!     // Consume partition `shard`, writing with `term.fencing_token()`, until it moves.
//!     term.cancelled().await;
//! });
//! let mut events = runner.subscribe();
//! if let Some(ShardEvent::Elected { shard, term }) = events.recv().await {
//!     println!("shard {shard} is mine, token {}", term.fencing_token());
//! }
//! // For a health endpoint: `incumbent::http::Health::new().sharded(runner.status())`.
//! runner.shutdown().await?; // every shard's worker stops, then its lock is released
//! # Ok(()) }
//! ```
//!
//! # Promises
//!
//! 1. At most one trusted leader: the term is cancelled before the store can grant the lock
//!    to anyone else, and a worker that ignores it is stopped by [`Term::stop_by`].
//! 2. Fencing tokens are strictly greater for every new term of an election.
//! 3. Every loss is reported, with its [`DemotionReason`].
//! 4. After any loss the campaign goes on by itself, after a cool-down: the store's
//!    lock-delay (waking exactly when it ends) or the jittered back-off. No hot loops, even
//!    while the store is down; the [`Status`] says why it waits.
//! 5. Graceful hand-off: cancel the worker, wait for it (bounded by the grace), *then*
//!    release and close the session, so the next leader starts at once and never overlaps.
//! 6. Followers do not poll where the store can notify: they wait in the kernel (file),
//!    on a watch of their predecessor (etcd) or a blocking query (Consul).
//! 7. Bad input gets a typed [`Error`] whose message says what to do.
//!
//! # Backends
//!
//! | backend | feature | for |
//! |---|---|---|
//! | [`memory`] | always | tasks of one process; tests with paused time and injected faults |
//! | `file` | `file` (default) | processes of one host, through a lock file; no server |
//! | `etcd` | `etcd` | a lease, revision-ordered candidate keys, one watch per backend that wakes only a key's successor |
//! | `consul` | `consul` | a session and a KV lock, blocking queries, lock-delay |
//! | `zookeeper` | `zookeeper` | a ZooKeeper session, ephemeral sequential candidate nodes, predecessor watches, czxid tokens; disconnected (suspended) vs expired sessions |
//! | `redis` | `redis` | a key per election, a fencing counter, keyspace notifications or polling; **not** safe across a restart without persistence or a failover (see its module docs) |
//! | [`postgres`] | `postgres` | a lease row per election, one statement per step and no session state (PgBouncer's transaction mode works), expiry on the database's clock, tokens that survive an asynchronous failover, `LISTEN`/`NOTIFY` or polling, [`guard`](postgres::PostgresBackend::guard) for writes in your own transaction |
//! | `memcached` | `memcached` | `add`/`gets`+`cas` on one key, an `incr` counter, polling; **best effort only**: eviction or a restart loses the lock (see its module docs) |
//! | `kubernetes` | `kubernetes` | a `coordination.k8s.io/v1` Lease per election, `resourceVersion`-preconditioned updates, expiry judged on this process's monotonic clock as client-go judges it, a fencing token in an annotation, a watch; contends with client-go's `leaderelection` on the same Lease |
//!
//! [`url::BackendUrl`] picks a backend from a string at run time. Writing your own backend
//! means implementing the contract in [`backend`].
//!
//! # Observability
//!
//! Every campaign runs in a `tracing` span `election{election, candidate, backend}`, each
//! term in a span `term{term}`, with an event at every transition. Metrics go through the
//! [`metrics`](https://docs.rs/metrics) facade; their names and labels are listed in
//! [`mod@metrics`].
#![deny(missing_docs)]
// docs.rs: badges naming the cargo feature each item needs (rustdoc infers them from cfg).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod any;
pub mod backend;
mod backoff;
mod campaign;
pub mod config;
mod election;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod event;
mod fence;
#[cfg(all(feature = "file", unix))]
pub mod file;
#[cfg(feature = "axum")]
pub mod http;
#[cfg(feature = "memcached")]
pub mod memcached;
pub mod memory;
pub mod metrics;
#[cfg(feature = "postgres")]
pub mod postgres;
mod queue;
#[cfg(feature = "redis")]
pub mod redis;
mod runner;
mod secret;
mod set;
pub mod sharded;
pub mod switchover;
mod term;
pub mod time;
pub mod url;

pub use any::{AnyBackend, AnyContender, AnyObserver, AnySession};
pub use backend::{Candidate, FencingToken, Leader};
pub use campaign::{Campaign, CampaignHandle, EVENT_QUEUE_CAPACITY, Events};
pub use election::{Election, ElectionBuilder};
pub use error::{Error, Result};
pub use event::{Demotion, DemotionReason, LeadershipEvent, Problem, Role, Status};
pub use runner::{OnWorkerExit, Runner, WorkerOutcome};
pub use set::{ElectionSet, SetEvent, SetEvents};
pub use sharded::{ShardEvent, ShardStatus, ShardedElection, ShardedRunner};
pub use switchover::{HandOverError, HandedOver};
pub use term::{Gap, Term, TermGuard};
#[cfg(feature = "consul")]
pub mod consul;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

/// The README's code, compiled (and run where it is not `no_run`) by `cargo test --doc`, so
/// that it cannot drift from the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
