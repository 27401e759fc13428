//! `incumbent status`, `observe` and `resign`: reading (and nudging) the leader.

use std::io::Write;
use std::time::{Duration, SystemTime};

use incumbent::Leader;
use incumbent::backend::{Backend, Observer};
use incumbent::url::WithBackend;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, timeout};

use crate::Failure;
use crate::report::{Reporter, human, leader_json, leader_text, rfc3339};
use crate::run::{RESIGN_KEY, RESIGN_SIGNAL, hostname};

/// How long `observe` waits before reconnecting after the store failed.
const OBSERVE_RETRY: Duration = Duration::from_secs(1);

/// The current leader, read once with `timeout`.
async fn current<B: Backend>(
    backend: &B,
    election: &str,
    limit: Duration,
) -> Result<(B::Observer, Option<Leader>), Failure> {
    let read = async {
        let mut observer = backend.observe(election).await?;
        let leader = observer.next().await?;
        Ok::<_, incumbent::Error>((observer, leader))
    };
    match timeout(limit, read).await {
        Ok(read) => Ok(read?),
        Err(_) => Err(Failure::Runtime(format!(
            "the store did not answer within {}",
            human(limit)
        ))),
    }
}

/// Writes one line on stdout; `false` once stdout is closed (e.g. `| head -1`).
fn print(line: &str) -> bool {
    writeln!(std::io::stdout().lock(), "{line}").is_ok()
}

/// `incumbent status`.
pub struct Status {
    pub election: String,
    pub json: bool,
    pub timeout: Duration,
}

impl WithBackend for Status {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let (_, leader) = current(&backend, &self.election, self.timeout).await?;
        if self.json {
            let leader = leader.as_ref().map(leader_json);
            print(&json!({ "election": self.election, "leader": leader }).to_string());
            return Ok(0);
        }
        let mut rows = vec![("election", self.election.clone())];
        match &leader {
            None => rows.push(("leader", "none".into())),
            Some(leader) => {
                rows.push(("leader", leader.candidate.id.clone()));
                if let Some(token) = leader.fencing_token {
                    rows.push(("fencing token", token.to_string()));
                }
                if let Some(since) = leader.since() {
                    let ago = SystemTime::now().duration_since(since).unwrap_or_default();
                    rows.push(("since", format!("{} ({} ago)", rfc3339(since), human(ago))));
                }
                let metadata: Vec<String> = leader
                    .candidate
                    .metadata
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                if !metadata.is_empty() {
                    rows.push(("metadata", metadata.join(" ")));
                }
            }
        }
        for (name, value) in rows {
            print(&format!("{name:<14} {value}"));
        }
        Ok(0)
    }
}

/// `incumbent observe`.
pub struct Observe {
    pub election: String,
    pub json: bool,
    pub out: Reporter,
}

impl Observe {
    fn show(&self, leader: Option<&Leader>) -> bool {
        let now = rfc3339(SystemTime::now());
        let line = if self.json {
            json!({ "time": now, "election": self.election, "leader": leader.map(leader_json) })
                .to_string()
        } else {
            let who = match leader {
                Some(l) => match l.since() {
                    Some(since) => format!("leader: {}, since {}", leader_text(l), rfc3339(since)),
                    None => format!("leader: {}", leader_text(l)),
                },
                None => "leader: none".into(),
            };
            format!("{now} {} {who}", self.election)
        };
        print(&line)
    }
}

impl WithBackend for Observe {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let mut interrupt = signal(SignalKind::interrupt())
            .map_err(|e| Failure::Runtime(format!("cannot handle signals: {e}")))?;
        let mut terminate = signal(SignalKind::terminate())
            .map_err(|e| Failure::Runtime(format!("cannot handle signals: {e}")))?;
        let out = self.out.for_election(&self.election);
        let follow = async {
            let mut last: Option<Option<Leader>> = None;
            loop {
                let mut observer = match backend.observe(&self.election).await {
                    Ok(observer) => observer,
                    Err(e) => {
                        out.error(&format!("{e}; retrying in {}", human(OBSERVE_RETRY)));
                        sleep(OBSERVE_RETRY).await;
                        continue;
                    }
                };
                loop {
                    match observer.next().await {
                        // After a reconnect the observer may repeat the leader: show changes only.
                        Ok(leader) if last.as_ref() == Some(&leader) => {}
                        Ok(leader) => {
                            if !self.show(leader.as_ref()) {
                                return;
                            }
                            last = Some(leader);
                        }
                        Err(e) => {
                            out.error(&format!("{e}; retrying in {}", human(OBSERVE_RETRY)));
                            sleep(OBSERVE_RETRY).await;
                            break;
                        }
                    }
                }
            }
        };
        tokio::select! {
            () = follow => {}
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        Ok(0)
    }
}

/// `incumbent resign`.
pub struct Resign {
    pub election: String,
    pub timeout: Duration,
}

impl WithBackend for Resign {
    type Output = Result<u8, Failure>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        let deadline = Instant::now() + self.timeout;
        let (mut observer, leader) = current(&backend, &self.election, self.timeout).await?;
        let Some(leader) = leader else {
            return Err(Failure::Runtime(format!(
                "nobody leads {}; there is nothing to resign",
                self.election
            )));
        };
        let id = &leader.candidate.id;
        let metadata = &leader.candidate.metadata;
        let (Some(host), Some(pid), Some(RESIGN_SIGNAL)) = (
            metadata.get("host"),
            metadata
                .get("pid")
                .and_then(|p| p.parse::<libc::pid_t>().ok()),
            metadata.get(RESIGN_KEY).map(String::as_str),
        ) else {
            return Err(Failure::Runtime(format!(
                "the leader {id} was not started by `incumbent run`, so it cannot be asked to resign; stop it by its own means"
            )));
        };
        let here = hostname();
        if *host != here {
            return Err(Failure::Runtime(format!(
                "the leader {id} runs on host {host}, not on {here}; run `incumbent resign` on {host}"
            )));
        }
        // SAFETY: kill has no memory-safety preconditions.
        if unsafe { libc::kill(pid, libc::SIGUSR1) } != 0 {
            let error = std::io::Error::last_os_error();
            return Err(Failure::Runtime(format!(
                "cannot signal the leader {id} (pid {pid}): {error}{}",
                if error.raw_os_error() == Some(libc::EPERM) {
                    "; run as the leader's user"
                } else {
                    ""
                }
            )));
        }
        print(&format!("asked {id} (pid {pid} on {host}) to resign"));
        let moved = timeout(deadline.saturating_duration_since(Instant::now()), async {
            loop {
                match observer.next().await {
                    Ok(now) if now.as_ref() == Some(&leader) => {}
                    Ok(now) => return Ok(now),
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        match moved {
            Ok(Ok(Some(next))) => {
                print(&format!("the leader is now {}", leader_text(&next)));
                Ok(0)
            }
            Ok(Ok(None)) => {
                print("nobody leads now");
                Ok(0)
            }
            Ok(Err(e)) => Err(Failure::Runtime(format!(
                "asked {id} to resign, but could not see the outcome: {e}"
            ))),
            Err(_) => Err(Failure::Runtime(format!(
                "asked {id} to resign, but it still leads after {}",
                human(self.timeout)
            ))),
        }
    }
}
