//! A short, seeded run of the safety checker (`examples/chaos.rs`, RELIABILITY.md) on the
//! file backend, etcd and Consul: a few faults each, and any violation fails the test.
//!
//! It shares the checker's code with the example; this binary is also the worker that the
//! candidates run (`chaos_smoke worker LEDGER_DIR FENCE_DIR`), hence `harness = false`.
//! Needs the `etcd` and `consul` binaries (`scripts/install-test-deps`); a missing one fails.

#[path = "../examples/chaos/check.rs"]
mod check;
#[path = "../examples/chaos/run.rs"]
mod run;
mod support;
#[path = "../examples/chaos/worker.rs"]
mod worker;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use run::{Backend, Config, Fault};

/// The seed of every smoke run.
const SEED: u64 = 11;

/// The faults each backend gets, in this order: those that end quickly on each store.
fn plan(backend: Backend) -> Vec<Fault> {
    match backend {
        Backend::File => vec![
            Fault::Kill9,
            Fault::FreezeSupervisor,
            Fault::Sigterm,
            Fault::FreezeGroup,
            Fault::StderrStall,
        ],
        Backend::Etcd => vec![
            Fault::Kill9,
            Fault::FreezeSupervisor,
            Fault::Blackhole,
            Fault::StoreRestart,
            Fault::StderrStall,
        ],
        // Consul's ttl is 10 s, so only one fault that waits for it.
        Backend::Consul => vec![Fault::Sigterm, Fault::StderrStall, Fault::Kill9],
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") && args.len() == 3 {
        let code = worker::worker(Path::new(&args[1]), Path::new(&args[2]));
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if args.iter().any(|a| a == "--list") {
        println!("chaos_smoke: test");
        return ExitCode::SUCCESS;
    }
    let me = std::env::current_exe().expect("current_exe");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("start the async runtime");
    let mut table = String::from(check::TABLE_HEADER);
    let mut failed = false;
    for backend in Backend::ALL {
        let kinds = plan(backend);
        let config = Config {
            backend,
            candidates: 3,
            faults: kinds.len(),
            seed: SEED,
            max_time: Duration::from_secs(90),
            kinds,
            in_turn: true,
            incumbent: PathBuf::from(env!("CARGO_BIN_EXE_incumbent")),
            worker: vec![me.clone().into_os_string(), OsString::from("worker")],
            keep: None,
        };
        let outcome = runtime.block_on(run::run(&config));
        table.push_str(&check::table_rows(backend.name(), &outcome.verdict));
        eprintln!(
            "chaos_smoke: {}: {} faults in {:.1} s",
            backend.name(),
            outcome.injected,
            outcome.elapsed.as_secs_f64()
        );
        if outcome.injected < config.faults {
            eprintln!(
                "chaos_smoke: {}: only {} faults ran",
                backend.name(),
                outcome.injected
            );
            failed = true;
        }
        for note in &outcome.verdict.notes {
            eprintln!("note: {note}");
        }
        for violation in &outcome.verdict.violations {
            eprintln!("VIOLATION ({}): {violation}", backend.name());
            failed = true;
        }
    }
    eprintln!("seed {SEED}\n{table}");
    if failed {
        eprintln!("chaos_smoke: FAILED");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
