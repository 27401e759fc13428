//! Deterministic simulation of the campaign engine: a fixed set of seeds, each a run of
//! three candidates against a simulated store with network faults, on tokio's paused clock.
//! See SIMULATION.md; `cargo run --release -p incumbent-tools --bin sim` runs many more.

use incumbent_tools::sim::{Bug, Options, Report, StoreKind, run_seed};

/// Seeds run by `cargo test`, split across tests so the harness runs them in parallel.
const SEEDS: u64 = 200;
const SHARDS: u64 = 4;

/// Seeds that once failed, run by `cargo test` too: 256304 (ttl 500 ms), where every
/// follower's blocking query was lost just before the heal and the first leader came 4.96 s
/// after it, past the old liveness bound of 4 s (it counted an ordinary request's timeout, not a blocking
/// query's `max_wait + request_timeout`).
const REGRESSION_SEEDS: &[u64] = &[256304];

/// Seeds of the forgetful store that once failed: 31092 and 44007, where a late acquisition of
/// an earlier try wrote a new key naming the candidate while a try adopted the old one (the
/// orphan check took the new key for the old); 640176, where c0's term began on a grant the
/// store had forgotten in a restart while the reply was on its way, after c1's term on the
/// next grant (an anomaly no engine can prevent, exempt like an operator's).
const FORGETFUL_REGRESSION_SEEDS: &[u64] = &[31092, 44007, 640176];

/// Seeds run by `cargo test` on each of the other stores (forgetful, non-atomic, queue).
const STORE_SEEDS: u64 = 25;

fn run_shard(shard: u64) {
    check_seeds(
        (0..SEEDS).filter(|seed| seed % SHARDS == shard),
        Options::default(),
    );
}

fn run_store(store: StoreKind) {
    let options = Options {
        store: Some(store),
        ..Options::default()
    };
    check_seeds(0..STORE_SEEDS, options);
}

fn check_seeds(seeds: impl Iterator<Item = u64>, options: Options) {
    let failures: Vec<Report> = seeds
        .map(|seed| run_seed(seed, options))
        .filter(|report| !report.passed())
        .collect();
    for report in &failures {
        eprintln!(
            "seed {} failed ({}); replay: \
             cargo run --release -p incumbent-tools --bin sim -- --seed {} --store {}",
            report.seed,
            report.settings,
            report.seed,
            options.store().name()
        );
        for violation in &report.violations {
            eprintln!("  {violation}");
        }
    }
    assert!(
        failures.is_empty(),
        "{} seeds broke an invariant",
        failures.len()
    );
}

#[test]
fn seeds_0_mod_4_keep_every_invariant() {
    run_shard(0);
}

#[test]
fn seeds_1_mod_4_keep_every_invariant() {
    run_shard(1);
}

#[test]
fn seeds_2_mod_4_keep_every_invariant() {
    run_shard(2);
}

#[test]
fn seeds_3_mod_4_keep_every_invariant() {
    run_shard(3);
}

#[test]
fn regression_seeds_keep_every_invariant() {
    check_seeds(REGRESSION_SEEDS.iter().copied(), Options::default());
}

#[test]
fn forgetful_regression_seeds_keep_every_invariant() {
    let options = Options {
        store: Some(StoreKind::Forgetful),
        ..Options::default()
    };
    check_seeds(FORGETFUL_REGRESSION_SEEDS.iter().copied(), options);
}

#[test]
fn a_store_that_forgets_keeps_every_invariant() {
    run_store(StoreKind::Forgetful);
}

#[test]
fn a_non_atomic_store_keeps_every_invariant() {
    run_store(StoreKind::NonAtomic);
}

#[test]
fn an_ordered_queue_keeps_every_invariant() {
    run_store(StoreKind::Queue);
}

#[test]
fn a_seed_replays_the_same_history() {
    for store in StoreKind::ALL {
        let options = Options {
            store: Some(store),
            ..Options::default()
        };
        for seed in [7, 198, 1234] {
            let first = run_seed(seed, options);
            let second = run_seed(seed, options);
            let name = store.name();
            assert_eq!(
                first.history_hash, second.history_hash,
                "{name} seed {seed}"
            );
            assert_eq!(
                first.stats.requests, second.stats.requests,
                "{name} seed {seed}"
            );
            assert!(
                first.stats.terms > 0,
                "{name} seed {seed}: nobody was ever elected"
            );
        }
    }
}

/// The first seed (below `limit`) whose run with `bug` planted breaks an invariant.
fn first_catch(bug: Bug, limit: u64) -> Option<Report> {
    first_catch_in(bug, 0..limit)
}

/// The first seed of `seeds` whose run with `bug` planted breaks an invariant (on the bug's
/// store).
fn first_catch_in(bug: Bug, seeds: std::ops::Range<u64>) -> Option<Report> {
    let options = Options {
        bug: Some(bug),
        ..Options::default()
    };
    seeds
        .map(|seed| run_seed(seed, options))
        .find(|report| !report.passed())
}

#[test]
fn a_store_that_shortens_leases_is_caught() {
    let report = first_catch(Bug::ShortLease, 50).expect("some seed catches the short lease");
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.contains("was not cancelled")),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_backend_that_reports_receive_times_is_caught() {
    // Rarer: it takes a slow reply to be the last renewal confirmed before a loss. Seed 297
    // is the first to catch it today (seed 124 when this test was written; the engine has
    // changed since). Scanning from 0 took 16 s in debug on a loaded machine: the test scans
    // from 280; `--bug receive-time` scans from 0.
    let report =
        first_catch_in(Bug::ReceiveTime, 280..400).expect("some seed catches receive times");
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.contains("the store granted")),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_store_that_reuses_tokens_is_caught() {
    let report = first_catch(Bug::TokenReuse, 50).expect("some seed catches a reused token");
    assert!(
        report.violations.iter().any(|v| v.contains("did not grow")),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_counter_from_zero_after_a_restart_is_caught() {
    let report =
        first_catch(Bug::CounterFromZero, 50).expect("some seed catches a counter from zero");
    assert!(
        report.violations.iter().any(|v| v.contains("did not grow")),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_non_atomic_acquire_without_settling_is_caught() {
    // Rare: an `add` must be held up while another candidate's whole term begins and ends.
    // From seed 0, seed 13256 is the first to catch it since tokens are raised to the clock
    // (5 of the first 30,000; SIMULATION.md): the test scans from 13,250, to stay quick in
    // debug; `--bug no-settle` scans from 0.
    let report =
        first_catch_in(Bug::NoSettle, 13250..13270).expect("some seed catches a missing settle");
    assert!(
        report.violations.iter().any(|v| v.contains("did not grow")),
        "{:?}",
        report.violations
    );
}

#[test]
fn an_orphaned_key_is_caught() {
    let report = first_catch(Bug::Orphan, 100).expect("some seed catches an orphan");
    assert!(
        report.violations.iter().any(|v| v.contains("an orphan")),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_follower_that_only_watches_its_predecessor_is_caught() {
    let report = first_catch(Bug::PredecessorOnly, 100)
        .expect("some seed catches a follower that skips the nodes ahead");
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.contains("two terms in force")
                || v.contains("several candidates lead")
                || v.contains("not cancelled")),
        "{:?}",
        report.violations
    );
}

/// A finding of the million-seed run, not fixed (in `src/memcached`, not here): seed 244930
/// of the non-atomic store. After a restart, c0 found the counter missing and sent `add` of
/// the counter seeded with its clock (15,099 ms); the request was held up. Meanwhile c1
/// created the counter at 15,453 and led with 15,454; the store restarted again (15,683 ms)
/// and forgot it; then c0's late `add` arrived and created the counter at the stale 15,099,
/// and c0, on its next try, led with 15,100. A process restart resets the connections, so a
/// request cannot cross one; a `flush_all` or an eviction of the counter keeps them. Fixed
/// as in Redis: a token below the clock is raised to it (`src/memcached/store.rs`).
#[test]
fn a_counter_seeded_by_a_delayed_add_does_not_send_tokens_back() {
    let options = Options {
        store: Some(StoreKind::NonAtomic),
        ..Options::default()
    };
    check_seeds([244930].into_iter(), options);
}
