//! The checker: reads a run's history (the workers' ledgers, the fence's log, the faults and
//! the supervisors' deaths) after the run, and judges it. It knows nothing of how the faults
//! were made, so it can be pointed at the history of any backend.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::worker::FENCE_LOG;

/// A worker that was still running this long after its supervisor died is an orphan.
pub const ORPHAN_GRACE_MS: u64 = 250;

/// Beats further apart than this mean the worker was not running in between (frozen).
const RUNNING_GAP_MS: u64 = 50;

/// One injected fault, as the fault loop recorded it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaultRecord {
    /// The fault's name, e.g. `kill9-leader`.
    pub kind: String,
    /// The leader's supervisor (`incumbent run`) pid when the fault began.
    pub supervisor: i32,
    /// The leader's worker pid when the fault began.
    pub worker: i32,
    /// The leader's fencing token when the fault began.
    pub token: u64,
    /// Whether the fault freezes the leader's supervisor (then its command may outlive the
    /// term, and only the fence protects the resource).
    pub freezes_supervisor: bool,
    /// Whether the fault made the store lose the lock and the fencing counter (a memcached
    /// restart, a Redis restart without persistence): then the old leader learns of its loss
    /// only at its next renewal, so terms may overlap, by at most
    /// [`lost_data_overlap_ms`](Self::lost_data_overlap_ms). Tokens must still grow.
    #[serde(default)]
    pub store_lost_data: bool,
    /// The longest overlap allowed after the store lost its data: the candidates' renewal
    /// interval plus a margin for the renewal's answer and the kill (0 in older histories:
    /// none allowed).
    #[serde(default)]
    pub lost_data_overlap_ms: u64,
    /// When it began (CLOCK_MONOTONIC ns).
    pub inject_ns: u64,
    /// When it was lifted.
    pub heal_ns: u64,
    /// When exactly one worker ran again, if it did within the bound.
    pub settled_ns: Option<u64>,
    /// When exactly one worker ran again, if it did only after the bound (within a minute
    /// more); `None` in histories whose loop did not wait after a bound passed (it stopped
    /// there), `Some(None)` when no leader came within that minute.
    #[serde(default, deserialize_with = "present")]
    pub late_settled_ns: Option<Option<u64>>,
    /// The promised bound from `inject_ns` to one leader again, in ms.
    pub bound_ms: u64,
}

impl FaultRecord {
    /// A fault on the leader (`worker` under `supervisor`, with `token`), its times and
    /// flags not yet set.
    pub fn new(fault: super::run::Fault, supervisor: i32, worker: i32, token: u64) -> FaultRecord {
        FaultRecord {
            kind: fault.name().to_owned(),
            supervisor,
            worker,
            token,
            freezes_supervisor: false,
            store_lost_data: false,
            lost_data_overlap_ms: 0,
            inject_ns: 0,
            heal_ns: 0,
            settled_ns: None,
            late_settled_ns: None,
            bound_ms: 0,
        }
    }
}

/// Tells a field that is there (even `null`) from one that is missing.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(d).map(Some)
}

/// A supervisor that died (killed or exited), as the fault loop recorded it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Death {
    pub pid: i32,
    pub at_ns: u64,
}

/// One worker's ledger.
#[derive(Clone, Debug, Default)]
pub struct Worker {
    pub pid: i32,
    pub supervisor: i32,
    pub token: u64,
    pub start_ns: u64,
    pub beats: Vec<u64>,
    pub stop_ns: Option<u64>,
}

impl Worker {
    /// The last instant it is known to have run.
    pub fn end_ns(&self) -> u64 {
        let last = self.beats.last().copied().unwrap_or(self.start_ns);
        self.stop_ns.unwrap_or(last).max(last)
    }
}

/// One decision of the fence.
#[derive(Clone, Debug)]
pub struct FenceEntry {
    pub accepted: bool,
    pub at_ns: u64,
    pub token: u64,
    pub pid: i32,
}

/// Parses one worker's ledger file; `None` if it has no complete `start` line. A file with
/// more than one `start` (a pid reused by a later worker, in histories whose ledger names
/// had no token) gives its first worker; [`parse_workers`] gives them all.
pub fn parse_worker(text: &str) -> Option<Worker> {
    parse_workers(text).into_iter().next()
}

/// Parses a ledger file into its workers: each `start` line begins one. A line cut short by
/// a kill -9 has no newline and is ignored, but a `start` appended to it (the next worker
/// with the same pid) still counts.
pub fn parse_workers(text: &str) -> Vec<Worker> {
    let mut workers: Vec<Worker> = Vec::new();
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let line = match line.find("start ") {
            Some(at) if at > 0 => &line[at..],
            _ => line,
        };
        let parts: Vec<&str> = line.split_whitespace().collect();
        match (parts.first().copied(), workers.last_mut()) {
            (Some("start"), _) if parts.len() == 5 => {
                let parsed = (|| {
                    Some(Worker {
                        start_ns: parts[1].parse().ok()?,
                        token: parts[2].parse().ok()?,
                        pid: parts[3].parse().ok()?,
                        supervisor: parts[4].parse().ok()?,
                        ..Worker::default()
                    })
                })();
                workers.extend(parsed);
            }
            (Some("beat"), Some(w)) if parts.len() == 3 => {
                if let Ok(at) = parts[1].parse() {
                    w.beats.push(at);
                }
            }
            (Some("stop"), Some(w)) if parts.len() == 2 => w.stop_ns = parts[1].parse().ok(),
            _ => {}
        }
    }
    workers
}

/// Parses the fence's log.
pub fn parse_fence(text: &str) -> Vec<FenceEntry> {
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() != 5 {
                return None;
            }
            Some(FenceEntry {
                accepted: parts[0] == "A",
                at_ns: parts[1].parse().ok()?,
                token: parts[2].parse().ok()?,
                pid: parts[3].parse().ok()?,
            })
        })
        .collect()
}

/// The history files of a run, in its directory (next to `ledger/` and `fence/`).
pub const FAULTS_FILE: &str = "faults.jsonl";
pub const DEATHS_FILE: &str = "deaths.jsonl";
pub const LEFTOVER_FILE: &str = "leftover-workers";

/// A run's whole history.
#[derive(Debug, Default)]
pub struct History {
    pub workers: Vec<Worker>,
    pub fence: Vec<FenceEntry>,
    pub faults: Vec<FaultRecord>,
    pub deaths: Vec<Death>,
    /// Workers found alive after every supervisor was gone, at the end of the run.
    pub leftover_workers: Vec<i32>,
    /// What the fault loop itself found wrong (a supervisor that ignored SIGTERM, no leader).
    pub errors: Vec<String>,
}

fn json_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Vec<T> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

impl History {
    /// Reads the history kept in `dir`: `ledger/`, `fence/`, the faults, the deaths.
    pub fn read(dir: &Path) -> std::io::Result<History> {
        let mut workers = Vec::new();
        for entry in std::fs::read_dir(dir.join("ledger"))? {
            let text = std::fs::read_to_string(entry?.path())?;
            workers.extend(parse_workers(&text));
        }
        workers.sort_by_key(|w| w.start_ns);
        let fence_log = dir.join("fence").join(FENCE_LOG);
        let fence = parse_fence(&std::fs::read_to_string(fence_log).unwrap_or_default());
        let leftover_workers = std::fs::read_to_string(dir.join(LEFTOVER_FILE))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .collect();
        Ok(History {
            workers,
            fence,
            faults: json_lines(&dir.join(FAULTS_FILE)),
            deaths: json_lines(&dir.join(DEATHS_FILE)),
            leftover_workers,
            errors: Vec::new(),
        })
    }
}

/// The figures for one fault type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub faults: usize,
    /// Overlapping terms not explained by a frozen supervisor: each fails the run.
    pub overlaps: usize,
    /// Overlaps while the old leader's supervisor was frozen: the fence's job.
    pub frozen_overlaps: usize,
    pub max_overlap_ms: f64,
    /// How long, at most, the old worker actually ran (beat) during an overlap.
    pub max_old_ran_ms: f64,
    /// Overlaps across a fault that made the store lose its data: the fence's job too.
    pub lost_data_overlaps: usize,
    /// Tokens not above the last term's, across a fault that made the store lose its data.
    pub lost_data_tokens: usize,
    pub stale_accepted: usize,
    pub stale_rejected: usize,
    pub token_violations: usize,
    pub orphans: usize,
    /// Time from the fault to the next leader's first instant, for faults that changed it.
    pub to_leader_ms: Vec<f64>,
    /// Faults after which the leader did not change.
    pub kept: usize,
    /// Faults after which one leader did not come back within the bound.
    pub late: usize,
    pub bound_ms: u64,
}

/// The verdict over one history.
#[derive(Debug, Default)]
pub struct Verdict {
    /// By fault type (`start` for what happened before the first fault).
    pub stats: BTreeMap<String, Stats>,
    /// Every violation, one line each.
    pub violations: Vec<String>,
    /// Overlaps under a frozen supervisor, one line each (not violations).
    pub notes: Vec<String>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The fault in force at `at_ns`: the last one injected at or before it.
fn fault_at(faults: &[FaultRecord], at_ns: u64) -> Option<&FaultRecord> {
    faults.iter().rev().find(|f| f.inject_ns <= at_ns)
}

fn kind_at(faults: &[FaultRecord], at_ns: u64) -> String {
    fault_at(faults, at_ns).map_or_else(|| "start".to_owned(), |f| f.kind.clone())
}

/// Judges `history`.
pub fn check(history: &History) -> Verdict {
    let mut verdict = Verdict {
        violations: history.errors.clone(),
        ..Verdict::default()
    };
    let faults = &history.faults;
    for fault in faults {
        let stats = verdict.stats.entry(fault.kind.clone()).or_default();
        stats.faults += 1;
        stats.bound_ms = stats.bound_ms.max(fault.bound_ms);
    }
    check_tokens(history, &mut verdict);
    check_overlaps(history, &mut verdict);
    check_fence(history, &mut verdict);
    check_orphans(history, &mut verdict);
    check_time_to_leader(history, &mut verdict);
    verdict
}

/// Tokens never shared between two workers and strictly growing in the order terms began,
/// across every fault, those that made the store lose its data included: a store that forgets
/// its counter must still hand out a greater token (seeded from the clock).
fn check_tokens(history: &History, verdict: &mut Verdict) {
    let mut owners: HashMap<u64, i32> = HashMap::new();
    let mut previous: Option<&Worker> = None;
    for worker in &history.workers {
        let kind = kind_at(&history.faults, worker.start_ns);
        let lost_data = history
            .faults
            .iter()
            .any(|f| f.store_lost_data && f.inject_ns <= worker.start_ns);
        let mut violation = |line: String| {
            let stats = verdict.stats.entry(kind.clone()).or_default();
            stats.token_violations += 1;
            if lost_data {
                stats.lost_data_tokens += 1;
            }
            verdict.violations.push(line);
        };
        if let Some(other) = owners.insert(worker.token, worker.pid) {
            violation(format!(
                "token {} shared by workers {other} and {} (after {kind})",
                worker.token, worker.pid
            ));
        }
        if let Some(prev) = previous
            && worker.token <= prev.token
        {
            violation(format!(
                "token went from {} (worker {}) to {} (worker {}) (after {kind})",
                prev.token, prev.pid, worker.token, worker.pid
            ));
        }
        previous = Some(worker);
    }
}

/// No two workers ran at once, unless the older one's supervisor was frozen.
fn check_overlaps(history: &History, verdict: &mut Verdict) {
    let workers = &history.workers;
    for (i, old) in workers.iter().enumerate() {
        for new in &workers[i + 1..] {
            let (from, to) = (new.start_ns, old.end_ns().min(new.end_ns()));
            if to <= from {
                continue;
            }
            let overlap = ms(to - from);
            // How long the old worker really ran inside the overlap: its beats, where they
            // are close enough together to say it ran in between.
            let ran: u64 = old
                .beats
                .windows(2)
                .filter(|w| w[1] > from && w[0] < to && w[1] - w[0] <= RUNNING_GAP_MS * 1_000_000)
                .map(|w| w[1].min(to) - w[0].max(from))
                .sum();
            let fault = fault_at(&history.faults, new.start_ns);
            let kind = kind_at(&history.faults, new.start_ns);
            let frozen = fault.is_some_and(|f| f.freezes_supervisor && f.worker == old.pid);
            // The store lost what was written before the fault healed, not only before it
            // began: a failover with replication lag loses a term granted on the old primary
            // while the link was cut, after the fault's start (seed 432: a term begun 261 ms
            // after the start, 26 ms before the primary's kill, overlapped its successor on
            // the promoted replica by 71.5 ms). Such an overlap is held to the same limit.
            let lost_data = fault.is_some_and(|f| f.store_lost_data && old.start_ns < f.heal_ns);
            let stats = verdict.stats.entry(kind.clone()).or_default();
            stats.max_overlap_ms = stats.max_overlap_ms.max(overlap);
            stats.max_old_ran_ms = stats.max_old_ran_ms.max(ms(ran));
            let line = format!(
                "{kind}: worker {} (token {}) ran until {:.1} ms after worker {} (token {}) \
                 started; it actually ran {:.1} ms of that",
                old.pid,
                old.token,
                overlap,
                new.pid,
                new.token,
                ms(ran)
            );
            if frozen {
                stats.frozen_overlaps += 1;
                verdict.notes.push(line);
            } else if lost_data {
                // The old leader learns of the loss at its next renewal: the overlap is
                // reported with its length, and past the renewal interval it is a violation.
                stats.lost_data_overlaps += 1;
                let limit = fault.map_or(0, |f| f.lost_data_overlap_ms);
                if overlap > limit as f64 {
                    stats.overlaps += 1;
                    verdict.violations.push(format!(
                        "overlapping terms after the store lost its data, longer than the \
                         renewal interval ({limit} ms): {line}"
                    ));
                } else {
                    verdict
                        .notes
                        .push(format!("the store lost its data: {line}"));
                }
            } else {
                stats.overlaps += 1;
                verdict
                    .violations
                    .push(format!("overlapping terms: {line}"));
            }
        }
    }
}

/// The fence accepted no write below a token it had accepted before, and no write of a
/// worker whose token another worker had taken over (two terms with one token, which a
/// store that lost its counter can hand out: the fence, comparing tokens, cannot tell them
/// apart, so a write of the first after the second's is stale).
fn check_fence(history: &History, verdict: &mut Verdict) {
    let mut highest = 0;
    // For the highest token: the workers that wrote with it, in order, the last one last.
    let mut writers: Vec<i32> = Vec::new();
    for entry in &history.fence {
        let kind = kind_at(&history.faults, entry.at_ns);
        let stats = verdict.stats.entry(kind.clone()).or_default();
        if entry.token < highest {
            if entry.accepted {
                stats.stale_accepted += 1;
                verdict.violations.push(format!(
                    "the fence accepted token {} from pid {} after token {highest} ({kind})",
                    entry.token, entry.pid
                ));
            } else {
                stats.stale_rejected += 1;
            }
        } else if entry.accepted && entry.token == highest && writers.last() != Some(&entry.pid) {
            if writers.contains(&entry.pid) {
                stats.stale_accepted += 1;
                verdict.violations.push(format!(
                    "the fence accepted token {} from pid {} after another worker wrote with \
                     the same token ({kind})",
                    entry.token, entry.pid
                ));
            }
            writers.push(entry.pid);
        }
        if entry.accepted && entry.token > highest {
            highest = entry.token;
            writers = vec![entry.pid];
        }
    }
}

/// No worker ran on after its supervisor died. Pids are reused in a long run: a worker is
/// matched with the first death of its supervisor's pid after the worker started.
fn check_orphans(history: &History, verdict: &mut Verdict) {
    for worker in &history.workers {
        let Some(death) = history
            .deaths
            .iter()
            .filter(|d| d.pid == worker.supervisor && d.at_ns >= worker.start_ns)
            .min_by_key(|d| d.at_ns)
        else {
            continue;
        };
        let limit = death.at_ns + ORPHAN_GRACE_MS * 1_000_000;
        if worker.end_ns() > limit {
            let kind = kind_at(&history.faults, death.at_ns);
            verdict.stats.entry(kind.clone()).or_default().orphans += 1;
            verdict.violations.push(format!(
                "orphan: worker {} ran {:.1} ms after its supervisor {} died ({kind})",
                worker.pid,
                ms(worker.end_ns() - death.at_ns),
                death.pid
            ));
        }
    }
    for pid in &history.leftover_workers {
        verdict.stats.entry("end".to_owned()).or_default().orphans += 1;
        verdict.violations.push(format!(
            "orphan: worker {pid} still ran after every supervisor was gone"
        ));
    }
}

/// After every fault, one leader again within the bound; the time to the next term.
fn check_time_to_leader(history: &History, verdict: &mut Verdict) {
    let faults = &history.faults;
    for (i, fault) in faults.iter().enumerate() {
        let next_fault = faults.get(i + 1).map_or(u64::MAX, |f| f.inject_ns);
        let stats = verdict.stats.entry(fault.kind.clone()).or_default();
        let next = history.workers.iter().find(|w| {
            w.start_ns >= fault.inject_ns
                && w.start_ns < next_fault
                && (w.token > fault.token || fault.store_lost_data)
        });
        match next {
            Some(worker) => {
                let took = ms(worker.start_ns - fault.inject_ns);
                stats.to_leader_ms.push(took);
                if took > fault.bound_ms as f64 {
                    stats.late += 1;
                    verdict.violations.push(format!(
                        "{}: the next leader (worker {}) came {took:.0} ms after the fault, \
                         over the bound of {} ms",
                        fault.kind, worker.pid, fault.bound_ms
                    ));
                    continue;
                }
            }
            None => stats.kept += 1,
        }
        if fault.settled_ns.is_none() {
            stats.late += 1;
            let then = match fault.late_settled_ns {
                None => "the loop stopped there".to_owned(),
                Some(None) => "none within a minute more".to_owned(),
                Some(Some(at)) => {
                    format!("one after {:.0} ms", ms(at.saturating_sub(fault.inject_ns)))
                }
            };
            verdict.violations.push(format!(
                "{}: not exactly one running leader within {} ms of the fault ({then})",
                fault.kind, fault.bound_ms
            ));
        }
    }
}

/// The most lines of each kind that [`lines`] shows.
const SHOWN: usize = 20;

/// The verdict's frozen-supervisor overlaps (`note: …`) and violations (`VIOLATION (label): …`),
/// at most [`SHOWN`] of each, one per line.
pub fn lines(label: &str, verdict: &Verdict) -> String {
    let mut out = String::new();
    let mut list = |prefix: &str, items: &[String]| {
        for item in items.iter().take(SHOWN) {
            let _ = writeln!(out, "{prefix}{item}");
        }
        if items.len() > SHOWN {
            let _ = writeln!(out, "{prefix}… and {} more", items.len() - SHOWN);
        }
    };
    list("note: ", &verdict.notes);
    list(&format!("VIOLATION ({label}): "), &verdict.violations);
    out
}

/// The value at quantile `q` of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The table's header, in Markdown.
pub const TABLE_HEADER: &str = "| backend | fault | faults | overlaps | frozen-supervisor overlaps (max ms; old worker ran max ms) | stale writes accepted / rejected | token violations | orphans | new leader: n, median / p99 / max ms | bound ms | late | store lost its data: overlaps / tokens back |\n|---|---|--:|--:|---|---|--:|--:|---|--:|--:|---|\n";

/// One row per fault type, in Markdown.
pub fn table_rows(backend: &str, verdict: &Verdict) -> String {
    let mut out = String::new();
    for (kind, stats) in &verdict.stats {
        if stats.faults == 0 && *stats == Stats::default() {
            continue;
        }
        let mut times = stats.to_leader_ms.clone();
        times.sort_by(f64::total_cmp);
        let leader = if times.is_empty() {
            format!("0 ({} kept)", stats.kept)
        } else {
            format!(
                "{}{}: {:.0} / {:.0} / {:.0}",
                times.len(),
                if stats.kept > 0 {
                    format!(" ({} kept)", stats.kept)
                } else {
                    String::new()
                },
                quantile(&times, 0.5),
                quantile(&times, 0.99),
                quantile(&times, 1.0)
            )
        };
        let frozen = if stats.frozen_overlaps == 0 {
            "0".to_owned()
        } else {
            format!(
                "{} ({:.0}; {:.0})",
                stats.frozen_overlaps, stats.max_overlap_ms, stats.max_old_ran_ms
            )
        };
        let _ = writeln!(
            out,
            "| {backend} | {kind} | {} | {} | {frozen} | {} / {} | {} | {} | {leader} | {} | {} | {} / {} |",
            stats.faults,
            stats.overlaps,
            stats.stale_accepted,
            stats.stale_rejected,
            stats.token_violations,
            stats.orphans,
            stats.bound_ms,
            stats.late,
            stats.lost_data_overlaps,
            stats.lost_data_tokens
        );
    }
    out
}
