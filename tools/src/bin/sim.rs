//! Runs the deterministic simulation of the campaign engine over many seeds (SIMULATION.md).
//!
//! ```text
//! cargo run --release -p incumbent-tools --bin sim -- --seeds 100000 --time-budget 60s --jobs 2
//! # replay one seed, with its history
//! cargo run --release -p incumbent-tools --bin sim -- --seed 42
//! # plant a bug: some seed must fail
//! cargo run --release -p incumbent-tools --bin sim -- --bug short-lease
//! # the other stores, in turn
//! cargo run --release -p incumbent-tools --bin sim -- --store new --seeds 30000
//! ```
//!
//! Each job is a thread with its own current-thread runtime; seeds are handed out in order.
//! Every failing seed is printed with the command that replays it. Exits with 1 if any seed
//! failed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use incumbent_tools::sim::{Bug, Options, Report, StoreKind, run_seed};

const USAGE: &str = "usage: sim [--seeds N] [--start S] [--time-budget 60s] [--jobs J] [--store STORE] [--bug NAME] [--stop-at-first] | --seed S [--store STORE] [--bug NAME] [--quiet]
  stores: consul (the default), forgetful, non-atomic, queue; new (forgetful, non-atomic, queue
          in turn, by seed modulo 3); all (the four in turn, by seed modulo 4)
  planted bugs: short-lease, receive-time, token-reuse (consul); counter-from-zero (forgetful),
          no-settle (non-atomic), orphan (forgetful), predecessor-only (queue); a bug runs on its
          store unless --store says";

/// Which store each seed runs on.
#[derive(Clone, Copy, Debug)]
enum Stores {
    /// The default: Consul's, or the planted bug's store.
    Default,
    One(StoreKind),
    /// In turn, by seed.
    Cycle(&'static [StoreKind]),
}

impl Stores {
    fn parse(name: &str) -> Option<Stores> {
        match name {
            "new" => Some(Stores::Cycle(&StoreKind::NEW)),
            "all" => Some(Stores::Cycle(&StoreKind::ALL)),
            name => StoreKind::parse(name).map(Stores::One),
        }
    }

    fn of(self, seed: u64) -> Option<StoreKind> {
        match self {
            Stores::Default => None,
            Stores::One(kind) => Some(kind),
            Stores::Cycle(kinds) => Some(kinds[(seed % kinds.len() as u64) as usize]),
        }
    }
}

struct Args {
    seeds: u64,
    start: u64,
    budget: Option<Duration>,
    jobs: usize,
    bug: Option<Bug>,
    stores: Stores,
    replay: Option<u64>,
    quiet: bool,
    stop_at_first: bool,
}

fn parse_duration(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number.parse().ok()?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "m" => Some(Duration::from_secs(n * 60)),
        "h" => Some(Duration::from_secs(n * 3600)),
        _ => None,
    }
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: u64::MAX,
        start: 0,
        budget: None,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        bug: None,
        stores: Stores::Default,
        replay: None,
        quiet: false,
        stop_at_first: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seeds" => args.seeds = value()?.parse().map_err(|e| format!("--seeds: {e}"))?,
            "--start" => args.start = value()?.parse().map_err(|e| format!("--start: {e}"))?,
            "--seed" => args.replay = Some(value()?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--jobs" => args.jobs = value()?.parse().map_err(|e| format!("--jobs: {e}"))?,
            "--time-budget" => {
                let text = value()?;
                args.budget = Some(
                    parse_duration(&text).ok_or(format!("--time-budget: cannot read {text:?}"))?,
                );
            }
            "--bug" => {
                let name = value()?;
                args.bug = Some(Bug::parse(&name).ok_or(format!("unknown bug {name:?}"))?);
            }
            "--store" => {
                let name = value()?;
                args.stores = Stores::parse(&name).ok_or(format!("unknown store {name:?}"))?;
            }
            "--quiet" => args.quiet = true,
            "--stop-at-first" => args.stop_at_first = true,
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.seeds == u64::MAX && args.budget.is_none() && args.replay.is_none() {
        args.seeds = 1000;
    }
    args.jobs = args.jobs.max(1);
    Ok(args)
}

fn replay_command(seed: u64, options: Options) -> String {
    let bug = options
        .bug
        .map(|b| format!(" --bug {}", b.name()))
        .unwrap_or_default();
    let store = options
        .store
        .map(|s| format!(" --store {}", s.name()))
        .unwrap_or_default();
    format!("cargo run --release -p incumbent-tools --bin sim -- --seed {seed}{store}{bug}")
}

fn print_failure(report: &Report, options: Options) {
    println!("FAIL seed {} ({})", report.seed, report.settings);
    for violation in &report.violations {
        println!("  {violation}");
    }
    println!("  replay: {}", replay_command(report.seed, options));
}

fn replay(seed: u64, args: &Args) -> bool {
    let options = Options {
        bug: args.bug,
        verbose: !args.quiet,
        store: args.stores.of(seed),
    };
    let report = run_seed(seed, options);
    for line in &report.trace {
        println!("{line}");
    }
    println!("seed {seed}: {}", report.settings);
    println!(
        "simulated {:?}; {} grants, {} terms, {} requests (at most {} per second per candidate), {} session expiries, {} operator faults; leader {:?} after the faults stopped; history hash {:016x}",
        report.simulated,
        report.stats.grants,
        report.stats.terms,
        report.stats.requests,
        report.stats.max_requests_per_second,
        report.stats.expiries,
        report.stats.operator_faults,
        report.time_to_leader,
        report.history_hash
    );
    if report.passed() {
        println!("ok: every invariant held");
    } else {
        print_failure(&report, options);
    }
    report.passed()
}

#[derive(Default)]
struct Totals {
    seeds: u64,
    simulated: Duration,
    grants: u64,
    terms: u64,
    requests: u64,
    operator_faults: u64,
    operator_anomalies: u64,
    restart_anomalies: u64,
    max_rps: u32,
    max_time_to_leader: Duration,
    restarts: u64,
    failures: Vec<u64>,
}

fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("{message}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    if let Some(seed) = args.replay {
        std::process::exit(if replay(seed, &args) { 0 } else { 1 });
    }
    let began = Instant::now();
    let end = args.start.saturating_add(args.seeds);
    let next = AtomicU64::new(args.start);
    let stop = AtomicBool::new(false);
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|scope| {
        for _ in 0..args.jobs {
            scope.spawn(|| {
                loop {
                    if stop.load(Ordering::Relaxed)
                        || args.budget.is_some_and(|b| began.elapsed() >= b)
                    {
                        return;
                    }
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        return;
                    }
                    let options = Options {
                        bug: args.bug,
                        verbose: false,
                        store: args.stores.of(seed),
                    };
                    let report = run_seed(seed, options);
                    let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
                    t.seeds += 1;
                    t.simulated += report.simulated;
                    t.grants += report.stats.grants;
                    t.terms += report.stats.terms;
                    t.requests += report.stats.requests;
                    t.operator_faults += report.stats.operator_faults;
                    t.operator_anomalies += report.stats.operator_anomalies;
                    t.restart_anomalies += report.stats.restart_anomalies;
                    t.restarts += report.stats.restarts;
                    t.max_rps = t.max_rps.max(report.stats.max_requests_per_second);
                    if let Some(ttl) = report.time_to_leader {
                        t.max_time_to_leader = t.max_time_to_leader.max(ttl);
                    }
                    if !report.passed() {
                        t.failures.push(seed);
                        print_failure(&report, options);
                        if args.stop_at_first {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let t = totals.into_inner().unwrap_or_else(|p| p.into_inner());
    let wall = began.elapsed();
    let bug = args.bug.map_or("none".to_owned(), |b| b.name().to_owned());
    let stores = match args.stores {
        Stores::Default => args
            .bug
            .map_or(StoreKind::Consul, Bug::store)
            .name()
            .to_owned(),
        Stores::One(kind) => kind.name().to_owned(),
        Stores::Cycle(kinds) => {
            kinds
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(", ")
                + " in turn"
        }
    };
    println!(
        "{} seeds (from {}) in {:.1} s on {} jobs: {:.0} seeds/s; store: {stores}; planted bug: {bug}",
        t.seeds,
        args.start,
        wall.as_secs_f64(),
        args.jobs,
        t.seeds as f64 / wall.as_secs_f64().max(1e-9)
    );
    println!(
        "simulated {:.0} s in all ({:.0}x real time); {} grants, {} terms, {} store requests, {} operator faults ({} terms begun on a grant an operator had undone), {} store restarts ({} terms begun on a grant a restart had forgotten); at most {} requests per second per candidate; slowest leader after faults stopped: {:?}",
        t.simulated.as_secs_f64(),
        t.simulated.as_secs_f64() / wall.as_secs_f64().max(1e-9),
        t.grants,
        t.terms,
        t.requests,
        t.operator_faults,
        t.operator_anomalies,
        t.restarts,
        t.restart_anomalies,
        t.max_rps,
        t.max_time_to_leader
    );
    if t.failures.is_empty() {
        println!("no invariant broken");
    } else {
        let mut failures = t.failures;
        failures.sort_unstable();
        let shown = &failures[..failures.len().min(20)];
        println!("{} failing seeds, the first: {shown:?}", failures.len());
        std::process::exit(1);
    }
}
