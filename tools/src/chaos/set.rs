//! The checker's set mode: member processes that each run one [`ElectionSet`](incumbent::ElectionSet) over the same
//! elections on a real store, a kill -9 and a SIGSTOP, and a check of every election's terms.
//!
//! Each member is this program again, `set-member URL ID ELECTIONS TTL_MS LEDGER FENCE`. For
//! each election it leads, it runs a worker that holds the term's guard, writes to
//! `<ledger>/s-<pid>-<election>-<token>.log` and beats through the election's fence, as the
//! sharded mode's workers do ([`sharded::work`]), and that is aborted at the term's
//! [`must_stop`](Term::must_stop): the hard stop a set leaves to its user. The ledger is
//! checked as the sharded mode's is ([`sharded::check`]): per election, tokens strictly grow
//! with the terms' starts, and a term ends before the next begins, unless its process was
//! frozen (SIGSTOP), and then the fence refused each of its writes after the next term's
//! first.
//!
//! The scenario: 3 members; every election held, then the member that leads most is killed
//! (kill -9), every election held by the other two, then the one of them that leads most is
//! frozen (SIGSTOP) past the ttl, every election held by the last, the frozen one resumes,
//! and all leave with SIGTERM. A term whose member left with SIGTERM must have
//! stopped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use incumbent::backend::Backend;
use incumbent::url::WithBackend;
use incumbent::{AnyBackend, Election, LeadershipEvent, Term};

use super::processes::Processes;
use super::sharded::{self, MemberArgs, Report, read_ledger};

/// The prefix of every election of the scenario: `chaos/set/<k>`.
pub const PREFIX: &str = "chaos/set";

/// Runs one member until SIGTERM; returns the exit code.
pub fn member(args: &[String]) -> i32 {
    let usage = "URL ID ELECTIONS TTL_MS LEDGER FENCE";
    let Some((url, args)) = MemberArgs::parse("chaos set-member", usage, args, false) else {
        return 2;
    };
    let member = Member {
        id: args.id,
        elections: args.count,
        ttl: args.ttl,
        ledger: args.ledger,
        fence: args.fence,
    };
    super::candidate::run_library("chaos set-member", &url, member)
}

struct Member {
    id: String,
    elections: u32,
    ttl: Duration,
    ledger: PathBuf,
    fence: PathBuf,
}

impl WithBackend for Member {
    type Output = Result<(), incumbent::Error>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let set = Election::builder(backend, PREFIX)
            .candidate(&self.id)
            .ttl(self.ttl)
            .grace(Duration::from_secs(1))
            .build()?
            .set();
        let mut events = set.events();
        for k in 0..self.elections {
            set.join(&format!("{PREFIX}/{k}"))?;
        }
        let (ledger, fence) = (Arc::new(self.ledger), Arc::new(self.fence));
        let mut stop =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(stop) => stop,
                Err(e) => return Err(incumbent::Error::Worker(format!("SIGTERM handler: {e}"))),
            };
        loop {
            tokio::select! {
                _ = stop.recv() => break,
                event = events.recv() => {
                    let Some(event) = event else { break };
                    let LeadershipEvent::Elected(term) = event.event else { continue };
                    let Some(k) = event
                        .election
                        .strip_prefix(PREFIX)
                        .and_then(|k| k.strip_prefix('/'))
                        .and_then(|k| k.parse::<u32>().ok())
                    else {
                        continue;
                    };
                    tokio::spawn(run_term(k, term, ledger.clone(), fence.clone()));
                }
            }
        }
        set.shutdown().await
    }
}

/// One term's worker: holds the term's guard (the set releases the lock once it is dropped,
/// at most the grace after the term ended), and is aborted at the term's `must_stop`.
async fn run_term(k: u32, term: Term, ledger: Arc<PathBuf>, fence: Arc<PathBuf>) {
    let _guard = term.hold();
    tokio::select! {
        () = sharded::work(k, term.clone(), &ledger, &fence) => {}
        () = term.must_stop() => {}
    }
}

/// Starts member `id` of a scenario: `set-member URL ID ELECTIONS TTL_MS LEDGER FENCE`.
fn spawn(
    members: &mut Processes,
    (url, elections, ttl, dir): (&str, u32, Duration, &Path),
    id: &str,
) -> Result<u32, String> {
    let args: [std::ffi::OsString; 7] = [
        "set-member".into(),
        url.into(),
        id.into(),
        elections.to_string().into(),
        ttl.as_millis().to_string().into(),
        dir.join("ledger").into(),
        dir.join("fence").into(),
    ];
    members.spawn(id, args)
}

/// Reads every election's holder until each is held by one of `live`; returns how long that
/// took, and how many each of them holds.
async fn wait_held(
    backend: &AnyBackend,
    elections: u32,
    live: &BTreeSet<&str>,
    limit: Duration,
) -> Result<(Duration, Vec<(String, usize)>), String> {
    let began = Instant::now();
    let readers: Vec<Election<AnyBackend>> = (0..elections)
        .map(|k| Election::builder(backend.clone(), format!("{PREFIX}/{k}")).build())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut last = String::new();
    while began.elapsed() < limit {
        let mut holders = Vec::new();
        for election in &readers {
            match election.leader().await {
                Ok(holder) => holders.push(holder.map(|l| l.candidate.id)),
                Err(e) => {
                    last = e.to_string();
                    holders.clear();
                    break;
                }
            }
        }
        if holders.len() == elections as usize
            && holders
                .iter()
                .all(|h| h.as_deref().is_some_and(|h| live.contains(h)))
        {
            let counts = live
                .iter()
                .map(|id| {
                    let n = holders.iter().filter(|h| h.as_deref() == Some(*id)).count();
                    ((*id).to_owned(), n)
                })
                .collect();
            return Ok((began.elapsed(), counts));
        }
        if !holders.is_empty() {
            last = format!("holders {holders:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "not every election held by one of {live:?} within {limit:?}; last read: {last}"
    ))
}

/// Runs the scenario on the store at `url`, with `this` (a program that runs [`member`] as
/// `set-member …`) as the members, keeping the ledger in `dir` (see the [module docs](self)).
pub async fn scenario(
    this: &Path,
    url: &str,
    elections: u32,
    ttl: Duration,
    dir: &Path,
) -> Result<Report, String> {
    std::fs::create_dir_all(dir.join("ledger")).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir.join("fence")).map_err(|e| e.to_string())?;
    let backend = AnyBackend::connect(url)
        .await
        .map_err(|e| format!("connect to {url}: {e}"))?;
    let mut members = Processes::new(this.to_path_buf(), dir.to_path_buf());
    let with = (url, elections, ttl, dir);
    let mut report = Report::default();
    let mut frozen = BTreeSet::new();
    let mut killed = BTreeSet::new();
    let limit = ttl * 4 + Duration::from_secs(10);
    let step =
        |report: &mut Report, what: &str, (took, counts): (Duration, Vec<(String, usize)>)| {
            report.steps.push(format!(
                "{what}: every election held in {:.0} ms, by {counts:?}",
                took.as_secs_f64() * 1e3
            ));
        };

    for id in ["m1", "m2", "m3"] {
        spawn(&mut members, with, id)?;
    }
    let all = BTreeSet::from(["m1", "m2", "m3"]);
    let held = wait_held(&backend, elections, &all, limit).await?;
    // The faults go to whoever leads most: that is where a hand-off is to be checked.
    let busiest = |counts: &[(String, usize)]| {
        let id = counts
            .iter()
            .max_by_key(|(_, n)| *n)
            .map(|(id, _)| id.clone());
        ["m1", "m2", "m3"]
            .into_iter()
            .find(|m| Some(*m) == id.as_deref())
            .unwrap_or("m1")
    };
    let killed_id = busiest(&held.1);
    step(&mut report, "3 members start", held);

    killed.insert(members.pid(killed_id));
    members.signal(killed_id, libc::SIGKILL);
    let mut live = all.clone();
    live.remove(killed_id);
    let held = wait_held(&backend, elections, &live, limit).await?;
    let frozen_id = busiest(&held.1);
    step(
        &mut report,
        &format!("{killed_id} is killed (kill -9)"),
        held,
    );

    frozen.insert(members.pid(frozen_id));
    members.signal(frozen_id, libc::SIGSTOP);
    let survivors = if url.starts_with("file:") {
        // The kernel keeps a frozen process's locks: on the file backend its elections stay
        // with it.
        live.clone()
    } else {
        live.iter().copied().filter(|m| *m != frozen_id).collect()
    };
    tokio::time::sleep(ttl).await;
    let held = wait_held(&backend, elections, &survivors, limit).await?;
    step(
        &mut report,
        &format!("{frozen_id} is frozen (SIGSTOP)"),
        held,
    );

    members.signal(frozen_id, libc::SIGCONT);
    // Long enough for it to see its terms lost, and to queue again.
    tokio::time::sleep(ttl * 2).await;
    let held = wait_held(&backend, elections, &live, limit).await?;
    step(&mut report, &format!("{frozen_id} resumes"), held);

    members.stop_all();
    let terms = read_ledger(&dir.join("ledger"));
    report.terms = terms.len();
    report.refused = terms
        .iter()
        .flat_map(|t| t.beats.iter())
        .filter(|b| !b.1)
        .count();
    report.violations.extend(sharded::check(&terms, &frozen));
    for t in &terms {
        if t.stop.is_none() && !killed.contains(&t.pid) {
            report.violations.push(format!(
                "election {}: token {} (pid {}) never stopped though its member left with SIGTERM",
                t.shard, t.token, t.pid
            ));
        }
    }
    if report.terms < elections as usize {
        report.violations.push(format!(
            "{} terms in the ledger for {elections} elections: a leader ran no worker",
            report.terms
        ));
    }
    Ok(report)
}
