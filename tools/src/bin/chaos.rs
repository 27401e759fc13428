//! The safety checker: runs `incumbent run` candidates against a real store, injects seeded
//! faults into the leader, its link, its stderr and the store, records what every leader's
//! command did (a history), and checks the history afterwards: no two terms at once (unless
//! the old leader's supervisor was frozen, where the fence must have refused every stale
//! write), tokens strictly growing and never shared, no command outliving its supervisor,
//! and one leader again within the promised bound after every fault. See RELIABILITY.md.
//!
//! ```text
//! cargo build --release --all-features      # builds target/release/incumbent
//! cargo run --release -p incumbent-tools --bin chaos -- --backend etcd --faults 50 --seed 7
//! ```
//!
//! Options: `--backend memory,file,etcd,etcd-cluster,consul,zookeeper,redis,redis-volatile,
//! memcached,zookeeper-ensemble,redis-failover` (default: all eleven, one after another;
//! `memory` runs in process),
//! `--mode cli|library|in-process` (candidates as `incumbent run` processes, or as processes
//! running a library campaign, `chaos candidate …`; default cli; `in-process` is
//! `--backend memory`: campaigns in this process on one shared memory backend),
//! `--faults N` per backend (default 20), `--seed S` (default 1), `--candidates N` (default
//! 3), `--max-time SECS` per backend (default 1200), `--kinds a,b` (fault names, default all
//! that apply), `--keep DIR` (keep the histories in DIR/<backend>/), `--plant fence-off|escape`
//! (plant a bug in the workers: a fence that accepts every token, or a worker that escapes
//! its supervisor; the run must then fail). `chaos check DIR` checks
//! a kept history again. Servers (etcd, consul, ZooKeeper, Redis, memcached) are started on free loopback ports in temp
//! dirs: install them with `scripts/install-test-deps`. Exit code 1 on any violation.
//!
//! `chaos sharded [--backend etcd,zookeeper,…] [--shards 64] [--rounds R] [--keep DIR]` is the
//! sharded mode (`incumbent_tools::chaos::sharded`): member processes of one sharded
//! election (this program again, as `chaos shard-member …`) go 3 → 4 (a join) → 3 (kill -9)
//! → 2 (SIGSTOP past the ttl) → 3 (resumed); at each step the map read from the store must
//! be balanced after at most ⌈S/N⌉ moves, and every shard's ledger must show no two trusted
//! terms at once and tokens that only grow. Default: etcd and ZooKeeper.
//!
//! `chaos set [--backend etcd,…] [--elections 32] [--rounds R] [--keep DIR]` is the set mode
//! (`incumbent_tools::chaos::set`): member processes that each run one `ElectionSet` over
//! the same elections (this program again, as `chaos set-member …`), each term's worker
//! aborted at its `must_stop`; 3 members, then kill -9, then SIGSTOP past the ttl, then
//! resumed; every election must be held by a live member after each step, and every
//! election's ledger must show no two trusted terms at once and tokens that only grow.
//! Default: etcd and ZooKeeper.
//!
//! Each candidate's command is this program again, as `chaos worker LEDGER_DIR FENCE_DIR`; in
//! library mode each candidate is this program, as `chaos candidate URL ID TTL_MS LEDGER_DIR
//! FENCE_DIR`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use incumbent_tools::chaos::run::{self, Backend, Config, Fault};
use incumbent_tools::chaos::{candidate, check, set, sharded, worker};

const USAGE: &str = "usage: chaos \
[--backend memory,file,etcd,etcd-cluster,consul,zookeeper,redis,redis-volatile,memcached,\
zookeeper-ensemble,redis-failover,postgres,postgres-pooled] \
[--mode cli|library|in-process] \
[--faults N] [--seed S] [--candidates N] [--max-time SECS] [--kinds NAME,...] [--keep DIR] \
[--plant fence-off|escape] \
| chaos check DIR \
| chaos sharded [--backend etcd,zookeeper,postgres,consul,redis,memcached,file] [--shards N] [--rounds R] [--keep DIR] \
| chaos set [--backend etcd,zookeeper,postgres,consul,redis,memcached,file] [--elections N] [--rounds R] [--keep DIR]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("worker") if args.len() == 3 => {
            let code = worker::worker(Path::new(&args[1]), Path::new(&args[2]));
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Some("candidate") if args.len() == 6 => {
            let (ledger, fence) = (Path::new(&args[4]), Path::new(&args[5]));
            let code = candidate::candidate(&args[1], &args[2], &args[3], ledger, fence);
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Some("check") if args.len() == 2 => recheck(Path::new(&args[1])),
        Some("shard-member") => {
            let code = sharded::member(&args[1..]);
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Some("sharded") => scenario_mode(Scenario::Sharded, &args[1..]),
        Some("set-member") => {
            let code = set::member(&args[1..]);
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Some("set") => scenario_mode(Scenario::Set, &args[1..]),
        Some("--help" | "-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => match options(&args) {
            Ok(configs) => run_all(&configs, &args),
            Err(e) => {
                eprintln!("chaos: {e}\n{USAGE}");
                ExitCode::from(2)
            }
        },
    }
}

/// The `incumbent` binary built next to this program: `target/<profile>/incumbent`.
fn incumbent_binary() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("where am I: {e}"))?;
    let profile = me
        .parent()
        .ok_or("this program is not in target/<profile>/")?;
    let binary = profile.join("incumbent");
    if binary.is_file() {
        Ok(binary)
    } else {
        let release = if profile.ends_with("release") {
            " --release"
        } else {
            ""
        };
        Err(format!(
            "{} is missing: build it first with `cargo build{release} --all-features`",
            binary.display()
        ))
    }
}

fn options(args: &[String]) -> Result<Vec<Config>, String> {
    let mut backends = Backend::ALL.to_vec();
    let mut config = Config {
        backend: Backend::File,
        candidates: 3,
        faults: 20,
        seed: 1,
        max_time: Duration::from_secs(1200),
        kinds: Vec::new(),
        in_turn: false,
        library: false,
        plant: None,
        incumbent: PathBuf::new(),
        this: PathBuf::new(),
        keep: None,
    };
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} {value}: not a number"))
        };
        match flag.as_str() {
            "--backend" => {
                backends = value
                    .split(',')
                    .map(|b| {
                        Backend::ALL
                            .into_iter()
                            .find(|x| x.name() == b)
                            .ok_or(format!("unknown backend {b}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--faults" => config.faults = number()? as usize,
            "--seed" => config.seed = number()?,
            "--candidates" => config.candidates = (number()? as usize).max(2),
            "--max-time" => config.max_time = Duration::from_secs(number()?),
            "--kinds" => {
                config.kinds = value
                    .split(',')
                    .map(|k| {
                        Fault::ALL
                            .into_iter()
                            .find(|f| f.name() == k)
                            .ok_or(format!("unknown fault {k}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--keep" => config.keep = Some(PathBuf::from(value)),
            "--plant" => config.plant = Some(value.clone()),
            "--mode" => {
                config.library = match value.as_str() {
                    "cli" => false,
                    "library" => true,
                    "in-process" => {
                        backends = vec![Backend::Memory];
                        false
                    }
                    _ => return Err(format!("--mode {value}: cli, library or in-process")),
                };
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    config.incumbent = incumbent_binary()?;
    config.this = std::env::current_exe().map_err(|e| format!("where am I: {e}"))?;
    Ok(backends
        .into_iter()
        .map(|backend| Config {
            backend,
            ..config.clone()
        })
        .collect())
}

fn run_all(configs: &[Config], args: &[String]) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("start the async runtime");
    let command = format!(
        "cargo run --release -p incumbent-tools --bin chaos -- {}",
        args.join(" ")
    );
    let mut table = String::from(check::TABLE_HEADER);
    let mut failed = false;
    for config in configs {
        eprintln!(
            "chaos: {}: {} faults, seed {}, {} candidates…",
            config.label(),
            config.faults,
            config.seed,
            config.candidates
        );
        let outcome = runtime.block_on(run::run(config));
        let name = config.label();
        table.push_str(&check::table_rows(&name, &outcome.verdict));
        eprintln!(
            "chaos: {}: {} faults in {:.0} s, {} violation(s){}",
            name,
            outcome.injected,
            outcome.elapsed.as_secs_f64(),
            outcome.verdict.violations.len(),
            config
                .keep
                .as_ref()
                .map(|d| format!(", history in {}", d.join(name.replace(' ', "-")).display()))
                .unwrap_or_default()
        );
        print!("{}", check::lines(&name, &outcome.verdict));
        failed |= !outcome.verdict.violations.is_empty();
    }
    println!("\nseed {}; command: {command}\n", configs[0].seed);
    println!("{table}");
    if failed {
        println!("FAILED: see the violations above");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Checks a kept history again.
fn recheck(dir: &Path) -> ExitCode {
    let history = match check::History::read(dir) {
        Ok(history) => history,
        Err(e) => {
            eprintln!("chaos: read the history in {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    let verdict = check::check(&history);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    print!("{}", check::lines(&name, &verdict));
    println!(
        "{}{}",
        check::TABLE_HEADER,
        check::table_rows(&name, &verdict)
    );
    if verdict.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The scenarios of member processes: [`sharded::scenario`] and [`set::scenario`].
#[derive(Clone, Copy)]
enum Scenario {
    Sharded,
    Set,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Sharded => "sharded",
            Scenario::Set => "set",
        }
    }
}

/// `chaos sharded` and `chaos set`: the scenario on each store named.
fn scenario_mode(scenario: Scenario, args: &[String]) -> ExitCode {
    let mode = scenario.name();
    let mut stores = vec!["etcd".to_owned(), "zookeeper".to_owned()];
    let mut shards = match scenario {
        Scenario::Sharded => 64u32,
        Scenario::Set => 32,
    };
    let mut keep: Option<PathBuf> = None;
    let mut rounds = 1u32;
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest.next();
        match (flag.as_str(), value) {
            ("--backend", Some(v)) => stores = v.split(',').map(str::to_owned).collect(),
            ("--shards" | "--elections", Some(v)) if v.parse::<u32>().is_ok() => {
                shards = v.parse().unwrap_or(shards)
            }
            ("--keep", Some(v)) => keep = Some(PathBuf::from(v)),
            ("--rounds", Some(v)) if v.parse::<u32>().is_ok() => rounds = v.parse().unwrap_or(1),
            _ => {
                eprintln!("chaos {mode}: unknown or incomplete option {flag}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if std::env::var_os("PGUSER").is_none() {
        // SAFETY: no other thread runs yet (the runtime starts below). The harness's
        // PostgreSQL trusts this user on loopback; the members get it in their environment.
        unsafe { std::env::set_var("PGUSER", incumbent_tools::support::postgres::USER) };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("start the async runtime");
    let Ok(this) = std::env::current_exe() else {
        eprintln!("chaos {mode}: where am I?");
        return ExitCode::from(2);
    };
    let mut failed = false;
    for (store, round) in stores
        .iter()
        .flat_map(|s| (1..=rounds).map(move |r| (s, r)))
    {
        let dir = match &keep {
            Some(keep) => keep.join(format!("{store}-{round}")),
            None => std::env::temp_dir().join(format!(
                "chaos-{mode}-{}-{store}-{round}",
                std::process::id()
            )),
        };
        let outcome = runtime.block_on(async {
            let started = sharded::start_store(store).await?;
            let (url, ttl) = (&started.url, sharded::ttl_for(store));
            match scenario {
                Scenario::Sharded => sharded::scenario(&this, url, shards, ttl, &dir).await,
                Scenario::Set => set::scenario(&this, url, shards, ttl, &dir).await,
            }
        });
        match outcome {
            Ok(report) => {
                for step in &report.steps {
                    println!("{store} #{round}: {step}");
                }
                println!(
                    "{store} #{round}: {} terms, {} stale writes refused, {} violation(s)",
                    report.terms,
                    report.refused,
                    report.violations.len()
                );
                for v in &report.violations {
                    println!("{store}: VIOLATION {v}");
                }
                failed |= !report.violations.is_empty();
            }
            Err(e) => {
                println!("{store}: FAILED {e}");
                failed = true;
            }
        }
        if keep.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
