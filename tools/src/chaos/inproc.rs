//! The in-process mode: N campaigns on one shared [`MemoryBackend`] in this process, each on
//! a current-thread runtime of its own (its "process"), with the worker's loop as its term's
//! task. Faults: abort the leader's election task (a crash), drop its whole runtime, shut it
//! down (a graceful hand-off), freeze its runtime's thread for longer than the ttl (a pause),
//! make the store hang, fail or lag for its client, and hang its client while its worker
//! ignores cancellation (the runner must stop it hard in time). The history has the same
//! form as a process run's, with ids instead of pids, and the same checker judges it.
//!
//! `--plant escape` plants a bug: each term's worker also spawns a task of its own that
//! ignores cancellation, out of the runner's reach, which beats on for
//! [`ESCAPE_LIFETIME`]; the run must then fail.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use incumbent::Election;
use incumbent::memory::{MemoryBackend, Reachability};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use super::check::{self, Death, FaultRecord};
use super::run::{
    Config, ELECTION, FRESH_BEAT, Fault, Faulty, HANDOFF_BOUND, Outcome, Seen, fault_loop,
    history_dir, outcome, scan_ledgers,
};
use super::worker::{ESCAPE_LIFETIME, Fence, mono_ns};

/// How long the first leader may take.
const FIRST_LEADER: Duration = Duration::from_secs(10);

/// How long a shut-down candidate may take to hand off and return.
const EXIT_LIMIT: Duration = Duration::from_secs(10);

/// How long a crashed candidate's runtime keeps running (without its election task), so
/// that a worker the crash left behind would show as an orphan.
const CRASHED_RUNTIME_LINGERS: Duration = Duration::from_secs(2);

/// Ids in the ledger: candidates ("supervisors") and workers (terms), in ranges that no
/// real pid of this host reaches in a run.
static NEXT_SUPERVISOR: AtomicU32 = AtomicU32::new(10_000_000);
static NEXT_WORKER: AtomicU32 = AtomicU32::new(100_000_000);

/// One candidate: an election task on a runtime driven by a thread of its own.
struct Candidate {
    id: u32,
    client: MemoryBackend,
    handle: tokio::runtime::Handle,
    task: JoinHandle<()>,
    shutdown: Option<oneshot::Sender<()>>,
    /// Ends the thread's `block_on`, which drops the runtime and every task on it.
    exit: Option<oneshot::Sender<()>>,
    ignore: Arc<AtomicBool>,
}

impl Candidate {
    fn exit(&mut self) {
        if let Some(exit) = self.exit.take() {
            let _ = exit.send(());
        }
    }
}

struct World {
    config: Config,
    ttl: Duration,
    dir: PathBuf,
    ledger: PathBuf,
    fence: Arc<Fence>,
    store: MemoryBackend,
    candidates: Vec<Option<Candidate>>,
    /// Crashed candidates whose runtimes still run, until the instant they are dropped.
    crashed: Vec<(Candidate, Instant)>,
    seen: Vec<Seen>,
    faults_log: File,
    deaths_log: File,
}

/// Runs the in-process fault loop and checks its history.
pub async fn run(config: &Config) -> Outcome {
    let started = Instant::now();
    let (_temp, dir) = history_dir(config);
    let mut errors = Vec::new();
    let mut world = World::start(config, &dir);
    let applicable = config.backend.faults(false);
    let injected = fault_loop(&mut world, config, applicable, &mut errors).await;
    world.shut_down(&mut errors).await;
    drop(world);
    outcome(&dir, errors, injected, started)
}

impl World {
    fn start(config: &Config, dir: &Path) -> World {
        let ledger = dir.join("ledger");
        let fence = dir.join("fence");
        std::fs::create_dir_all(&ledger).expect("create the ledger dir");
        std::fs::create_dir_all(&fence).expect("create the fence dir");
        let open = |name: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(name))
                .expect("open a history file")
        };
        let mut world = World {
            config: config.clone(),
            ttl: config.backend.ttl(),
            dir: dir.to_path_buf(),
            ledger,
            fence: Arc::new(Fence::open(&fence).expect("open the fence")),
            store: MemoryBackend::new(),
            candidates: (0..config.candidates).map(|_| None).collect(),
            crashed: Vec::new(),
            seen: Vec::new(),
            faults_log: open(check::FAULTS_FILE),
            deaths_log: open(check::DEATHS_FILE),
        };
        for index in 0..config.candidates {
            world.spawn(index);
        }
        world
    }

    fn spawn(&mut self, index: usize) {
        let id = NEXT_SUPERVISOR.fetch_add(1, Ordering::SeqCst);
        let runtime: Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("start a candidate's runtime");
        let client = self.store.client();
        let ignore = Arc::new(AtomicBool::new(false));
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let (exit_tx, exit_rx) = oneshot::channel::<()>();
        let election = Election::builder(client.clone(), ELECTION)
            .candidate(format!("c{index}-{id}"))
            .ttl(self.ttl)
            .grace(Duration::from_secs(1))
            .build()
            .expect("valid election settings");
        let (ledger, fence, ignoring) = (self.ledger.clone(), self.fence.clone(), ignore.clone());
        let escape = self.config.plant.as_deref() == Some("escape");
        let task = runtime.spawn(async move {
            let worker = move |term: incumbent::Term| {
                let (ledger, fence, ignoring) = (ledger.clone(), fence.clone(), ignoring.clone());
                async move {
                    if escape {
                        // The planted bug: a task of its own, which ignores cancellation and
                        // which the runner cannot abort, beating on for a while.
                        let (ledger, fence, term) = (ledger.clone(), fence.clone(), term.clone());
                        tokio::spawn(async move {
                            let copy = NEXT_WORKER.fetch_add(1, Ordering::SeqCst);
                            let always = Some(Arc::new(AtomicBool::new(true)));
                            let beat =
                                super::candidate::lead_as(term, &ledger, &fence, copy, id, always);
                            let _ = tokio::time::timeout(ESCAPE_LIFETIME, beat).await;
                        });
                    }
                    let worker = NEXT_WORKER.fetch_add(1, Ordering::SeqCst);
                    super::candidate::lead_as(term, &ledger, &fence, worker, id, Some(ignoring))
                        .await;
                }
            };
            let shutdown = async {
                let _ = shutdown_rx.await;
            };
            if let Err(e) = election.run_until(worker, shutdown).await {
                eprintln!("chaos: in-process candidate {id}: {e}");
            }
        });
        let handle = runtime.handle().clone();
        std::thread::spawn(move || {
            runtime.block_on(async {
                let _ = exit_rx.await;
            });
            // Dropping the runtime drops every task still on it.
            drop(runtime);
        });
        self.candidates[index] = Some(Candidate {
            id,
            client,
            handle,
            task,
            shutdown: Some(shutdown_tx),
            exit: Some(exit_tx),
            ignore,
        });
    }

    fn record_death(&mut self, id: u32, at_ns: u64) {
        let death = Death {
            pid: id as i32,
            at_ns,
        };
        let line = serde_json::to_string(&death).expect("serialize");
        let _ = writeln!(self.deaths_log, "{line}");
    }

    fn scan(&mut self) {
        scan_ledgers(&self.ledger, &mut self.seen, |s| super::run::ended(&s.path));
    }

    /// The one running leader: exactly one worker whose ledger has no `stop` and whose last
    /// beat is fresh.
    fn running_leader(&mut self) -> Option<Seen> {
        self.scan();
        let fresh = |s: &Seen| {
            super::run::last_beat_ns(&s.path)
                .is_some_and(|at| mono_ns().saturating_sub(at) < FRESH_BEAT.as_nanos() as u64)
        };
        let running: Vec<&Seen> = self.seen.iter().filter(|s| !s.gone && fresh(s)).collect();
        let [leader] = running[..] else {
            return None;
        };
        Some(leader.clone())
    }

    /// Drops the runtimes of crashed candidates whose time is up (all of them: `all`).
    fn drop_lingering(&mut self, all: bool) {
        let now = Instant::now();
        for (candidate, until) in &mut self.crashed {
            if all || *until <= now {
                candidate.exit();
            }
        }
        self.crashed.retain(|(c, _)| c.exit.is_some());
    }

    fn candidate_by_id(&self, id: i32) -> Option<usize> {
        self.candidates
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.id as i32 == id))
    }

    /// Shuts candidate `index` down gracefully and waits for its election to return.
    async fn shut_down_one(&mut self, index: usize, errors: &mut Vec<String>) {
        let Some(mut candidate) = self.candidates[index].take() else {
            return;
        };
        if let Some(shutdown) = candidate.shutdown.take() {
            let _ = shutdown.send(());
        }
        let deadline = Instant::now() + EXIT_LIMIT;
        while !candidate.task.is_finished() {
            if Instant::now() >= deadline {
                errors.push(format!(
                    "candidate {} did not return within {EXIT_LIMIT:?} of its shutdown",
                    candidate.id
                ));
                break;
            }
            sleep(Duration::from_millis(5)).await;
        }
        self.record_death(candidate.id, mono_ns());
        candidate.exit();
    }

    async fn inject_fault(
        &mut self,
        fault: Fault,
        index: usize,
        rng: &mut fastrand::Rng,
        errors: &mut Vec<String>,
    ) -> (u64, u64, Duration) {
        let ttl = self.ttl;
        let hold = ttl * 3 / 2 + Duration::from_millis(rng.u64(..ttl.as_millis() as u64));
        let inject = mono_ns();
        match fault {
            Fault::AbortTask => {
                let candidate = self.candidates[index].take().expect("the leader");
                candidate.task.abort();
                self.record_death(candidate.id, inject);
                self.crashed
                    .push((candidate, Instant::now() + CRASHED_RUNTIME_LINGERS));
                self.spawn(index);
            }
            Fault::DropRuntime => {
                let mut candidate = self.candidates[index].take().expect("the leader");
                candidate.exit();
                self.record_death(candidate.id, inject);
                self.spawn(index);
            }
            Fault::Shutdown => {
                self.shut_down_one(index, errors).await;
                self.spawn(index);
            }
            Fault::FreezeRuntime => {
                let candidate = self.candidates[index].as_ref().expect("the leader");
                // Blocks the runtime's only thread: the campaign, its renewals and the
                // worker stop together, as in a paused process.
                candidate
                    .handle
                    .spawn(async move { std::thread::sleep(hold) });
                sleep(hold).await;
            }
            Fault::Unreachable | Fault::IgnoreCancel | Fault::Failing => {
                let candidate = self.candidates[index].as_ref().expect("the leader");
                let ignore = fault == Fault::IgnoreCancel;
                candidate.ignore.store(ignore, Ordering::SeqCst);
                let reachability = if fault == Fault::Failing {
                    Reachability::Failing
                } else {
                    Reachability::Hanging
                };
                candidate.client.set_reachability(reachability);
                sleep(hold).await;
                let candidate = self.candidates[index].as_ref().expect("the leader");
                candidate.client.set_reachability(Reachability::Reachable);
                candidate.ignore.store(false, Ordering::SeqCst);
            }
            Fault::Latency => {
                let ms = ttl.as_millis() as u64;
                let delay = Duration::from_millis(ms / 20 + rng.u64(..ms * 3 / 20));
                let candidate = self.candidates[index].as_ref().expect("the leader");
                candidate.client.set_latency(delay);
                sleep(ttl).await;
                candidate.client.set_latency(Duration::ZERO);
            }
            other => unreachable!("{} is not an in-process fault", other.name()),
        }
        let heal = mono_ns();
        let bound = match fault {
            Fault::Shutdown => HANDOFF_BOUND + Duration::from_nanos(heal - inject),
            _ => Duration::from_nanos(heal - inject) + self.config.backend.failover_bound(),
        };
        (inject, heal, bound)
    }

    async fn shut_down(&mut self, errors: &mut Vec<String>) {
        for index in 0..self.candidates.len() {
            self.shut_down_one(index, errors).await;
        }
        self.drop_lingering(true);
        sleep(Duration::from_millis(check::ORPHAN_GRACE_MS)).await;
        self.scan();
        // A worker still beating after every candidate is gone.
        let leftover: Vec<String> = self
            .seen
            .iter()
            .filter(|s| !s.gone)
            .filter(|s| {
                super::run::last_beat_ns(&s.path).is_some_and(|at| {
                    mono_ns().saturating_sub(at) < check::ORPHAN_GRACE_MS * 1_000_000
                })
            })
            .map(|s| s.pid.to_string())
            .collect();
        let _ = std::fs::write(self.dir.join(check::LEFTOVER_FILE), leftover.join("\n"));
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for candidate in self.candidates.iter_mut().flatten() {
            candidate.exit();
        }
        self.drop_lingering(true);
    }
}

impl Faulty for World {
    const FIRST_LEADER: Duration = FIRST_LEADER;

    fn running_leader(&mut self) -> Option<Seen> {
        World::running_leader(self)
    }

    fn between_looks(&mut self) {
        self.drop_lingering(false);
    }

    fn locate(&self, leader: &Seen) -> Result<usize, String> {
        self.candidate_by_id(leader.supervisor)
            .ok_or_else(|| format!("the leader's candidate {} is unknown", leader.supervisor))
    }

    async fn inject(
        &mut self,
        fault: Fault,
        index: usize,
        _leader: &Seen,
        rng: &mut fastrand::Rng,
        errors: &mut Vec<String>,
    ) -> (u64, u64, Duration) {
        self.inject_fault(fault, index, rng, errors).await
    }

    fn record(&self, fault: Fault, leader: &Seen) -> FaultRecord {
        FaultRecord {
            freezes_supervisor: fault == Fault::FreezeRuntime,
            ..FaultRecord::new(fault, leader.supervisor, leader.pid, leader.token)
        }
    }

    fn faults_log(&mut self) -> &mut File {
        &mut self.faults_log
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}
