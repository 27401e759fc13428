//! The library mode's candidate: one process that campaigns with [`Election::run_until`] on
//! a [`BackendUrl`] and, while it leads, runs the worker's loop as a task (the same ledger
//! lines and the same fence as [`super::worker`]), until SIGTERM.
//!
//! `candidate URL ID TTL_MS LEDGER_DIR FENCE_DIR`. Its ledger files are
//! `w-<pid>-<token>.log`, one per term; the worker's pid and its supervisor's are both this
//! process's. A term's task is aborted at its next `.await` when the term ends; a drop guard
//! then writes its `stop` line.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use incumbent::backend::Backend;
use incumbent::url::{BackendUrl, WithBackend};
use incumbent::{Election, Term};

use super::worker::{Fence, HEARTBEAT, mono_ns};

/// Runs the candidate until SIGTERM; returns the exit code.
pub fn candidate(url: &str, id: &str, ttl_ms: &str, ledger: &Path, fence: &Path) -> i32 {
    let (Ok(url), Ok(ttl)) = (url.parse::<BackendUrl>(), ttl_ms.parse::<u64>()) else {
        eprintln!("chaos candidate: bad URL {url} or ttl {ttl_ms}");
        return 2;
    };
    let fence = match Fence::open(fence) {
        Ok(fence) => Arc::new(fence),
        Err(e) => {
            eprintln!("chaos candidate: open the fence: {e}");
            return 1;
        }
    };
    let consul = matches!(url, BackendUrl::Consul { .. });
    let library = Library {
        id: id.to_owned(),
        ttl: Duration::from_millis(ttl),
        consul,
        ledger: ledger.to_path_buf(),
        fence,
    };
    run_library("chaos candidate", &url, library)
}

/// Runs `code` on the backend of `url` in a runtime of its own, until it returns; the exit
/// code: 0, or 1 with the error on stderr after `what`.
pub fn run_library<V>(what: &str, url: &BackendUrl, code: V) -> i32
where
    V: WithBackend<Output = Result<(), incumbent::Error>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{what}: start the async runtime: {e}");
            return 1;
        }
    };
    let outcome = runtime.block_on(url.connect(code));
    // A follower on the file backend waits in `flock` on a blocking thread: dropping the
    // runtime would wait for it (as `incumbent run` does, don't).
    runtime.shutdown_background();
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(e)) | Err(e) => {
            eprintln!("{what}: {e}");
            1
        }
    }
}

struct Library {
    id: String,
    ttl: Duration,
    consul: bool,
    ledger: PathBuf,
    fence: Arc<Fence>,
}

impl WithBackend for Library {
    type Output = Result<(), incumbent::Error>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let mut builder = Election::builder(backend, super::run::ELECTION)
            .candidate(&self.id)
            .ttl(self.ttl)
            .grace(Duration::from_secs(1));
        if self.consul {
            builder = builder.lock_delay(Duration::ZERO);
        }
        let election = builder.build()?;
        let shutdown = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => {
                    term.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        let (ledger, fence) = (self.ledger, self.fence);
        election
            .run_until(
                move |term| lead(term, ledger.clone(), fence.clone()),
                shutdown,
            )
            .await
    }
}

/// Writes `stop` when the term's task ends, returned or aborted.
struct Stop(File);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.write_all(format!("stop {}\n", mono_ns()).as_bytes());
    }
}

/// One term's work: the worker's loop, until the term is cancelled.
async fn lead(term: Term, ledger: PathBuf, fence: Arc<Fence>) {
    let pid = std::process::id();
    lead_as(term, &ledger, &fence, pid, pid, None).await;
}

/// The worker's loop as `worker` (an id in the ledger) of `supervisor`, until the term is
/// cancelled, or, while `ignore` is set, until the task is aborted (a worker that ignores
/// cancellation). Its ledger is `w-<worker>-<token>.log`.
pub async fn lead_as(
    term: Term,
    ledger: &Path,
    fence: &Fence,
    worker: u32,
    supervisor: u32,
    ignore: Option<Arc<AtomicBool>>,
) {
    let token = term.fencing_token();
    let Ok(mut log) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger.join(format!("w-{worker}-{token}.log")))
    else {
        return;
    };
    let start = format!("start {} {token} {worker} {supervisor}\n", mono_ns());
    if log.write_all(start.as_bytes()).is_err() {
        return;
    }
    let Ok(copy) = log.try_clone() else {
        return;
    };
    let _stop = Stop(copy);
    let ignoring = || ignore.as_ref().is_some_and(|i| i.load(Ordering::SeqCst));
    while !term.is_cancelled() || ignoring() {
        // Blocking, for microseconds: no `.await` between the write and its ledger line, so
        // an abort never separates them.
        let line = match fence.write(token, worker) {
            Ok((at, true)) => format!("beat {at} ok\n"),
            Ok((at, false)) => format!("beat {at} stale\n"),
            Err(_) => return,
        };
        if log.write_all(line.as_bytes()).is_err() {
            return;
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}
