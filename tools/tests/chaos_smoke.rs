//! A short, seeded run of the safety checker (`src/bin/chaos.rs`, RELIABILITY.md) on the
//! file backend, etcd (one member and a three-member cluster), Consul, ZooKeeper (one server
//! and a three-member ensemble with a member cut off), Redis (with and without persistence,
//! and a primary failing over to its replica) and memcached with `incumbent run` candidates, on file and etcd with library candidates, and
//! on the memory backend in process: a few faults each; any violation fails the test.
//!
//! It shares the checker's code with the `chaos` program; this binary is also the worker that
//! the candidates run (`chaos_smoke worker LEDGER_DIR FENCE_DIR`), and the library-mode
//! candidate (`chaos_smoke candidate …`), hence `harness = false`.
//! Needs etcd, consul, ZooKeeper (Java), redis-server and memcached
//! (`scripts/install-test-deps`); a missing one fails.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, SystemTime};

use incumbent_tools::chaos::run::{self, Backend, Config, Fault};
use incumbent_tools::chaos::{candidate, check, worker};

/// The seed of every smoke run.
const SEED: u64 = 11;

/// Each run: the backend, whether candidates are library campaigns (else `incumbent run`),
/// and the faults it gets, in this order: those that end quickly on each store.
fn plan() -> Vec<(Backend, bool, Vec<Fault>)> {
    vec![
        (
            Backend::Memory,
            false,
            vec![
                Fault::AbortTask,
                Fault::FreezeRuntime,
                Fault::IgnoreCancel,
                Fault::DropRuntime,
                Fault::Shutdown,
            ],
        ),
        (
            Backend::File,
            false,
            vec![
                Fault::Kill9,
                Fault::FreezeSupervisor,
                Fault::Sigterm,
                Fault::FreezeGroup,
                Fault::StderrStall,
            ],
        ),
        (
            Backend::Etcd,
            false,
            vec![
                Fault::Kill9,
                Fault::FreezeSupervisor,
                Fault::Blackhole,
                Fault::StoreRestart,
                Fault::StderrStall,
            ],
        ),
        (
            Backend::EtcdCluster,
            false,
            vec![Fault::MemberLoss, Fault::Kill9],
        ),
        // Consul's ttl is 10 s, so only one fault that waits for it.
        (
            Backend::Consul,
            false,
            vec![Fault::Sigterm, Fault::StderrStall, Fault::Kill9],
        ),
        (
            Backend::File,
            true,
            vec![Fault::Kill9, Fault::FreezeGroup, Fault::Sigterm],
        ),
        // A switchover asked while the leader's link is cut or slow (library candidates
        // serve it as `incumbent run` does).
        (
            Backend::Etcd,
            true,
            vec![
                Fault::Blackhole,
                Fault::SwitchoverDuringFault,
                Fault::Sigterm,
            ],
        ),
        (
            Backend::Zookeeper,
            false,
            vec![Fault::Kill9, Fault::StoreRestart, Fault::Sigterm],
        ),
        // Not a Redis restart: its next leader came a few hundred ms over the bound on a
        // loaded host (RELIABILITY.md); the long runs count those.
        (
            Backend::Redis,
            false,
            vec![Fault::Kill9, Fault::StorePause, Fault::Sigterm],
        ),
        // Redis without persistence: a restart forgets the lock and the counter, and the
        // next token must still be the highest (seeded from the server's clock).
        (
            Backend::RedisVolatile,
            false,
            vec![Fault::StoreRestart, Fault::StoreRestart, Fault::Kill9],
        ),
        // A restart that loses the lock and the counter: the fence must refuse every stale
        // write.
        (
            Backend::Memcached,
            false,
            vec![Fault::StoreRestart, Fault::Kill9, Fault::Sigterm],
        ),
        // The member the leader is connected to, cut off from the other two: its session
        // must end before another candidate's term begins.
        (
            Backend::ZookeeperEnsemble,
            false,
            vec![Fault::PartitionMember, Fault::Kill9],
        ),
        // Two failovers: the second to the fresh replica the first one started.
        (
            Backend::RedisFailover,
            false,
            vec![Fault::PromoteReplica, Fault::PromoteReplica],
        ),
        // The whole server frozen (the postmaster and every backend), a restart on the same
        // data, a kill: the lease rows survive, the leader fences itself.
        (
            Backend::Postgres,
            false,
            vec![Fault::StorePause, Fault::StoreRestart, Fault::Kill9],
        ),
        // Behind PgBouncer in transaction mode: a kill -9 of the leader strands no lock in
        // the pool, and the server restarted behind it keeps the rows.
        (
            Backend::PostgresPooled,
            false,
            vec![Fault::Kill9, Fault::StoreRestart],
        ),
        // A real kube-apiserver: the etcd behind it frozen past the ttl, the API server
        // killed and restarted, the leader killed: the Lease's holder changes only by a
        // preconditioned write, and the leader fences itself.
        (
            Backend::Kubernetes,
            false,
            vec![Fault::StorePause, Fault::StoreRestart, Fault::Kill9],
        ),
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") && args.len() == 3 {
        let code = worker::worker(Path::new(&args[1]), Path::new(&args[2]));
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if args.first().map(String::as_str) == Some("candidate") && args.len() == 6 {
        let (ledger, fence) = (Path::new(&args[4]), Path::new(&args[5]));
        let code = candidate::candidate(&args[1], &args[2], &args[3], ledger, fence);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if args.iter().any(|a| a == "--list") {
        println!("chaos_smoke: test");
        return ExitCode::SUCCESS;
    }
    let me = std::env::current_exe().expect("current_exe");
    let incumbent = incumbent_cli(&me);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("start the async runtime");
    let mut table = String::from(check::TABLE_HEADER);
    let mut failed = false;
    let plan = plan();
    // Every backend the checker knows gets its smoke.
    for backend in Backend::ALL {
        assert!(
            plan.iter().any(|(b, _, _)| *b == backend),
            "no smoke run planned for {}",
            backend.name()
        );
    }
    for (backend, library, kinds) in plan {
        let config = Config {
            backend,
            candidates: 3,
            faults: kinds.len(),
            seed: SEED,
            max_time: Duration::from_secs(90),
            kinds,
            in_turn: true,
            library,
            incumbent: incumbent.clone(),
            this: me.clone(),
            // To look at a failed smoke's histories: CHAOS_SMOKE_KEEP=DIR.
            keep: std::env::var_os("CHAOS_SMOKE_KEEP").map(PathBuf::from),
            plant: None,
        };
        let name = config.label();
        let outcome = runtime.block_on(run::run(&config));
        table.push_str(&check::table_rows(&name, &outcome.verdict));
        let (injected, took) = (outcome.injected, outcome.elapsed.as_secs_f64());
        eprintln!("chaos_smoke: {name}: {injected} faults in {took:.1} s");
        if injected < config.faults {
            eprintln!("chaos_smoke: {name}: only {injected} faults ran");
            failed = true;
        }
        eprint!("{}", check::lines(&name, &outcome.verdict));
        failed |= !outcome.verdict.violations.is_empty();
    }
    eprintln!("seed {SEED}\n{table}");
    if failed {
        eprintln!("chaos_smoke: FAILED");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The `incumbent` CLI that the candidates run: `target/<profile>/incumbent`, where cargo puts
/// it, next to this test's `deps/`. Cargo gives the path of a binary only to the tests of its
/// own package, so this test builds it (as the `chaos` program asks its user to) when it is
/// missing or older than incumbent's sources or manifest: after `scripts/test`, which builds
/// the whole workspace first, it is neither.
fn incumbent_cli(me: &Path) -> PathBuf {
    let profile = me
        .parent()
        .and_then(Path::parent)
        .expect("this test is in target/<profile>/deps/");
    let cli = profile.join("incumbent");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let built = std::fs::metadata(&cli).and_then(|m| m.modified()).ok();
    let sources = newest(&root.join("src")).max(newest(&root.join("Cargo.toml")));
    if built.is_none_or(|built| built < sources) {
        let mut build = Command::new(env!("CARGO"));
        build
            .args([
                "build",
                "-p",
                "incumbent",
                "--bin",
                "incumbent",
                "--all-features",
            ])
            .arg("--target-dir")
            .arg(profile.parent().expect("target/"))
            .current_dir(root);
        if profile.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "cargo build --all-features failed");
    }
    assert!(
        cli.is_file(),
        "{} is missing: build it with `cargo build --all-features`",
        cli.display()
    );
    cli
}

/// The latest modification time of `path` or of any file under it.
fn newest(path: &Path) -> SystemTime {
    let own = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let entries = std::fs::read_dir(path).into_iter().flatten().flatten();
    entries
        .map(|e| newest(&e.path()))
        .fold(own, SystemTime::max)
}
