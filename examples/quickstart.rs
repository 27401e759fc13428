//! Three processes elect a leader on the embedded file backend; the leader is killed with
//! SIGKILL and another takes over; then the new leader resigns and hands off gracefully.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! No server is needed: the processes elect through a lock file in a temp directory. The
//! program prints a timeline and exits by itself in about ten seconds.
//!
//! Each candidate is this same program, started as `quickstart candidate NAME DIR`: it
//! campaigns, runs a worker while it leads, and prints its events as JSON lines, which the
//! parent turns into the timeline. It resigns when it reads `resign` on stdin and shuts down
//! gracefully when stdin closes.

use std::time::{Duration, Instant};

use incumbent::file::FileBackend;
use incumbent::{Election, LeadershipEvent, Term};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::{sleep, timeout};

#[path = "support/cluster.rs"]
mod cluster;

const ELECTION: &str = "quickstart";
const CANDIDATES: [&str; 3] = ["node-1", "node-2", "node-3"];
/// The whole demo stops by itself after this long, whatever happens.
const DEMO_LIMIT: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("candidate") if args.len() == 4 => candidate(&args[2], &args[3]).await,
        None => match timeout(DEMO_LIMIT, demo()).await {
            Ok(result) => result,
            Err(_) => Err("the demo did not finish in time".into()),
        },
        _ => Err("usage: quickstart [candidate NAME DIR]".into()),
    }
}

/// One candidate process: campaign, work while leading, report events on stdout.
async fn candidate(name: &str, dir: &str) -> Result<(), Box<dyn std::error::Error>> {
    let election = Election::builder(FileBackend::in_dir(dir), ELECTION)
        .candidate(name)
        .metadata("pid", std::process::id().to_string())
        .grace(Duration::from_secs(2))
        .build()?;
    let mut campaign = election.campaign();
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            event = campaign.recv() => match event {
                Some(LeadershipEvent::Elected(term)) => {
                    report(json!({"event": "elected", "token": term.fencing_token()}));
                    tokio::spawn(work(term));
                }
                Some(LeadershipEvent::Demoted { fencing_token, reason, .. }) => {
                    report(json!({"event": "demoted", "token": fencing_token, "reason": reason.as_str()}));
                }
                Some(LeadershipEvent::LeaderChanged(leader)) => {
                    report(json!({"event": "leader", "leader": leader.map(|l| l.candidate.id.clone())}));
                }
                None => return Ok(()),
            },
            line = stdin.next_line() => match line? {
                Some(command) if command.trim() == "resign" => campaign.resign().await?,
                Some(_) => {}
                None => return Ok(campaign.shutdown().await?),
            },
        }
    }
}

/// The singleton job: stamps every batch with the fencing token, stops when the term ends.
async fn work(term: Term) {
    let _guard = term.hold(); // the lock is released only after this returns
    for batch in 1.. {
        tokio::select! {
            () = term.cancelled() => return,
            () = sleep(Duration::from_millis(700)) => {
                report(json!({"event": "work", "token": term.fencing_token(), "batch": batch}));
            }
        }
    }
}

fn report(line: Value) {
    println!("{line}");
}

/// Where the demo stands.
enum Phase {
    /// Waiting for the first leader to get going, to kill it.
    FirstTerm,
    /// The leader was killed at this instant; waiting for the next one.
    AfterKill(Instant),
    /// Waiting for the second leader to get going, to make it resign.
    SecondTerm,
    /// The leader was asked to resign at this instant.
    AfterResign(Instant),
    /// Waiting for the third leader to work, then done.
    ThirdTerm,
}

/// Starts the candidates, then kills the leader, then makes the next one resign.
async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile_dir()?;
    let start = Instant::now();
    let (mut nodes, mut events) = cluster::spawn(&CANDIDATES, &[dir.clone().into()])?;
    println!(
        "three candidates elect through lock files in {}\n",
        dir.display()
    );

    let say = |what: String| println!("[{:>7.3}s] {what}", start.elapsed().as_secs_f64());
    let mut phase = Phase::FirstTerm;
    while let Some((name, event)) = events.recv().await {
        let token = event["token"].as_u64().unwrap_or(0);
        match event["event"].as_str() {
            Some("elected") => {
                say(format!("{name} is elected leader (fencing token {token})"));
                match phase {
                    Phase::AfterKill(at) => {
                        say(format!(
                            "failover after kill -9 took {} ms",
                            at.elapsed().as_millis()
                        ));
                        phase = Phase::SecondTerm;
                    }
                    Phase::AfterResign(at) => {
                        let ms = at.elapsed().as_secs_f64() * 1e3;
                        say(format!("graceful hand-off after resign took {ms:.2} ms"));
                        phase = Phase::ThirdTerm;
                    }
                    _ => {}
                }
            }
            Some("demoted") => say(format!(
                "{name} stepped down from term {token} ({})",
                event["reason"].as_str().unwrap_or("?")
            )),
            Some("work") => {
                say(format!(
                    "{name} works on batch {} with fencing token {token}",
                    event["batch"]
                ));
                if event["batch"] != 2 {
                    continue;
                }
                let index = nodes
                    .iter()
                    .position(|n| n.name == name)
                    .ok_or("unknown node")?;
                match phase {
                    Phase::FirstTerm => {
                        say(format!("kill -9 {name}, the leader"));
                        let mut node = nodes.remove(index);
                        node.child.start_kill()?;
                        phase = Phase::AfterKill(Instant::now());
                        node.child.wait().await?;
                    }
                    Phase::SecondTerm => {
                        say(format!("{name} is asked to resign"));
                        if let Some(stdin) = nodes[index].stdin.as_mut() {
                            stdin.write_all(b"resign\n").await?;
                        }
                        phase = Phase::AfterResign(Instant::now());
                    }
                    Phase::ThirdTerm => break,
                    Phase::AfterKill(_) | Phase::AfterResign(_) => {}
                }
            }
            _ => {}
        }
    }

    say("shutting down: every candidate releases and exits".into());
    for node in &mut nodes {
        node.stdin = None; // closing stdin asks for a graceful shutdown
    }
    for node in &mut nodes {
        let _ = timeout(Duration::from_secs(5), node.child.wait()).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    say("done".into());
    Ok(())
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("incumbent-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
