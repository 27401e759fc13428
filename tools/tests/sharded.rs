//! The checker's sharded mode on real stores (`incumbent_tools::chaos::sharded`): 64 shards
//! over member processes of one sharded election, 3 → 4 (a join) → 3 (one killed with
//! kill -9) → 2 (one frozen with SIGSTOP past the ttl) → 3 (it resumes); at each step the map
//! read from the store must be balanced (each member within one of 64 / N) after at most
//! ⌈64 / N⌉ moves, and the ledger of every shard's terms must show no two trusted owners at
//! once and tokens that only grow. Needs etcd and ZooKeeper (`scripts/install-test-deps`); a
//! missing one fails, naming the command.

use std::path::Path;

use incumbent_tools::chaos::sharded;

async fn scenario_on(store: &str) {
    let started = sharded::start_store(store).await.expect("a store");
    let dir = tempfile::tempdir().expect("a temp dir");
    let this = Path::new(env!("CARGO_BIN_EXE_chaos"));
    let report = sharded::scenario(this, &started.url, 64, sharded::ttl_for(store), dir.path())
        .await
        .unwrap_or_else(|e| panic!("{store}: {e}"));
    for step in &report.steps {
        eprintln!("{store}: {step}");
    }
    assert!(
        report.violations.is_empty(),
        "{store}: {:#?}",
        report.violations
    );
    assert_eq!(report.steps.len(), 5, "{store}: every step ran");
    assert!(
        report.terms >= 64 + 16 + 16,
        "{store}: only {} terms in the ledger",
        report.terms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_shards_survive_joins_a_kill_and_a_freeze() {
    scenario_on("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_shards_survive_joins_a_kill_and_a_freeze() {
    scenario_on("zookeeper").await;
}
