//! The checker's member-process modes on real stores. Needs etcd and ZooKeeper
//! (`scripts/install-test-deps`); a missing one fails, naming the command.
//!
//! - Sharded (`incumbent_tools::chaos::sharded`): 64 shards over member processes of one
//!   sharded election, 3 → 4 (a join) → 3 (one killed with kill -9) → 2 (one frozen with
//!   SIGSTOP past the ttl) → 3 (it resumes); at each step the map read from the store must be
//!   balanced (each member within one of 64 / N) after at most ⌈64 / N⌉ moves.
//! - Set (`incumbent_tools::chaos::set`): 32 elections, each joined by the `ElectionSet` of
//!   every member process; 3 members, then the busiest killed with kill -9, then the busiest
//!   left frozen with SIGSTOP past the ttl, then resumed; after each step every election must
//!   be held by a live member.
//!
//! In both, the ledger of every shard's (election's) terms must show no two trusted owners at
//! once and tokens that only grow.

use std::path::Path;

use incumbent_tools::chaos::{set, sharded};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Sharded,
    Set,
}

/// One scenario at a time: each runs a store and three or four member processes, and their
/// steps are timed against the ttl; four at once on two cores would time the machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn scenario_on(store: &str, mode: Mode) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let started = sharded::start_store(store).await.expect("a store");
    let dir = tempfile::tempdir().expect("a temp dir");
    let this = Path::new(env!("CARGO_BIN_EXE_chaos"));
    let ttl = sharded::ttl_for(store);
    // Each mode's steps, and the fewest terms its ledger can hold: every shard's first term
    // and those handed on by the killed and the frozen member (a quarter of 64 each), or
    // every election's first term and at least one handed on.
    let (report, steps, fewest) = match mode {
        Mode::Sharded => (
            sharded::scenario(this, &started.url, 64, ttl, dir.path()).await,
            5,
            64 + 16 + 16,
        ),
        Mode::Set => (
            set::scenario(this, &started.url, 32, ttl, dir.path()).await,
            4,
            33,
        ),
    };
    let report = report.unwrap_or_else(|e| panic!("{store}: {e}"));
    for step in &report.steps {
        eprintln!("{store}: {step}");
    }
    assert!(
        report.violations.is_empty(),
        "{store}: {:#?}",
        report.violations
    );
    assert_eq!(report.steps.len(), steps, "{store}: every step ran");
    assert!(
        report.terms >= fewest,
        "{store}: only {} terms in the ledger",
        report.terms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_shards_survive_joins_a_kill_and_a_freeze() {
    scenario_on("etcd", Mode::Sharded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_shards_survive_joins_a_kill_and_a_freeze() {
    scenario_on("zookeeper", Mode::Sharded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_sets_survive_a_kill_and_a_freeze() {
    scenario_on("etcd", Mode::Set).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_sets_survive_a_kill_and_a_freeze() {
    scenario_on("zookeeper", Mode::Set).await;
}
