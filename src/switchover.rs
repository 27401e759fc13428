//! Planned switchover: the leader hands the next term to a named live candidate.
//!
//! [`CampaignHandle::hand_over`](crate::CampaignHandle::hand_over) (on any candidate),
//! [`Election::hand_over`](crate::Election::hand_over) (from a process that does not
//! campaign), `incumbent switchover --to ID` and the health router's guarded
//! `POST /switchover` all take one path:
//!
//! 1. **The target is checked first**: it must be a live candidate of the election. On
//!    etcd and ZooKeeper the store keeps the line of candidates, and the target must be in
//!    it; on the other stores every candidate keeps a presence record of its own
//!    (`<election>/.candidates/<hash of its id>`, held with its session, gone when it dies,
//!    yields or shuts down; [`ElectionBuilder::accept_hand_overs`](crate::ElectionBuilder::accept_hand_overs)
//!    turns it off). Otherwise the answer is [`HandOverError::NotACandidate`] and nothing
//!    moves.
//! 2. **The leader ends its term** as for a resign: the term is cancelled, its work is waited
//!    for (at most the grace, never past the lease's last safe instant), and the
//!    [`DemotionReason`](crate::DemotionReason) is [`HandedOver`](crate::DemotionReason::HandedOver),
//!    a planned end, not a loss.
//! 3. **Only the target can win the next term during the reservation window**
//!    ([`ElectionBuilder::hand_over_window`](crate::ElectionBuilder::hand_over_window),
//!    default: the ttl). How depends on the store ([`HandOverStyle`]):
//!    - *escrow* (memory, Consul, Redis, memcached, PostgreSQL): the leader keeps the lock
//!      after its work has stopped, with a value that names the target
//!      (the `incumbent.handing_over` metadata entry); the target takes it over in one
//!      conditional write that succeeds only while that value is there (Consul: a
//!      transaction that checks the index, unlocks the old session and locks its own). Every
//!      other candidate finds the lock held.
//!    - *line* (etcd, ZooKeeper): the store hands the lock to the next key in line. The leader
//!      names the target in its value while its term still runs; every other candidate that
//!      sees it leaves the line until the target leads (or the window ends); the leader
//!      releases only once the target is next in the line, read from the store.
//!    - *gate* (the file backend): the leader names the target in the leader file, then
//!      releases; a candidate that gets the lock reads the file under it and, unless it is the
//!      target, lets go and waits for the window to end.
//! 4. **If the target does not take office within the window** (it died, it is cut off) the
//!    reservation lapses and an open election follows: the leader releases the escrow (or the
//!    others return to the line). The worst case, a target that dies right after the check,
//!    leaves the election without a leader for the window (escrow, line: plus up to one ttl if
//!    the old leader dies too, as for any crash).
//! 5. **The target's token is greater than the old one's**: it is a new term of the
//!    election, taken through the store like any other.
//!
//! A candidate that does not lead asks through the store: it takes the election's request
//! lock (`<election>/.switchover`) with the target and the window in its value, and the
//! leader, which watches that lock, hands over. On a store that pushes changes the leader
//! follows the lock; on one whose observers poll (Redis without keyspace notifications,
//! memcached, PostgreSQL behind a pooler) it reads the lock once per renew interval, so
//! that an idle leader costs the store no request per poll for it: such a request is
//! served up to a renew interval later. The lock is the arbiter of concurrent
//! requests: a second request while one holds it is refused with
//! [`HandOverError::InProgress`], and a leader serves one hand-over at a time. So two
//! requests for different targets give one winner and one clear error, never two leaders
//! (the store's lock still admits one holder at a time). A request is addressed to the leader
//! it was made to: if leadership moves by other means first, it is not served, and the
//! requester gets [`HandOverError::Superseded`]. A leader that refuses a request says why in
//! its value (the `incumbent.refused` entry, naming the request), and the requester returns
//! [`HandOverError::Refused`] with that reason.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::{
    Backend, Candidate, Contender, FencingToken, Leader, Observer, Session, SessionOptions,
    unix_ms_now,
};
use crate::{Error, Result};

/// The metadata entry in which a leader names the candidate it hands the next term to.
pub const HANDING_OVER_KEY: &str = "incumbent.handing_over";

pub use crate::config::RESERVED_METADATA_PREFIX;

/// The metadata entry in which a leader says why it refused a request read from the store:
/// `{"request": <the requester's id>, "reason": <why>}`, until its value changes again.
pub const REFUSED_KEY: &str = "incumbent.refused";

/// The request metadata: the target.
const REQUEST_TO: &str = "incumbent.to";
/// The request metadata: the window in milliseconds.
const REQUEST_WINDOW_MS: &str = "incumbent.window_ms";
/// The request metadata: the leader it is addressed to (only that leader serves it).
const REQUEST_FROM: &str = "incumbent.from";

pub use crate::backend::HandOverStyle;

/// A hand-over in progress, as a leader's value shows it (the [`HANDING_OVER_KEY`] entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandingOver {
    /// The candidate the next term is kept for.
    pub to: String,
    /// How long it is kept, in milliseconds, from when the reservation was written.
    pub window_ms: u64,
    /// When the reservation was written, in milliseconds since the Unix epoch on the leader's
    /// clock. Only the file backend, whose candidates share one host's clock, compares it
    /// with a clock; elsewhere a candidate counts the window from when it saw the reservation.
    pub at_unix_ms: u64,
}

impl HandingOver {
    /// The window, as a duration.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }
}

impl Leader {
    /// The hand-over this leader's value announces, if any (a value that cannot be read as
    /// one counts as none).
    pub fn handing_over(&self) -> Option<HandingOver> {
        self.candidate
            .metadata
            .get(HANDING_OVER_KEY)
            .and_then(|text| serde_json::from_str(text).ok())
    }

    /// This leader, naming `to` as the candidate the next term is kept for.
    pub(crate) fn handing_over_to(&self, to: &str, window: Duration) -> Leader {
        let mut leader = self.clone();
        let reservation = HandingOver {
            to: to.to_owned(),
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            at_unix_ms: unix_ms_now(),
        };
        leader.candidate.metadata.insert(
            HANDING_OVER_KEY.to_owned(),
            serde_json::to_string(&reservation).unwrap_or_default(),
        );
        leader
    }
}

impl Leader {
    /// This leader, saying that it refused the request `request` for `reason`.
    pub(crate) fn refusing(&self, request: &str, reason: &str) -> Leader {
        let mut leader = self.clone();
        leader.candidate.metadata.insert(
            REFUSED_KEY.to_owned(),
            serde_json::json!({ "request": request, "reason": reason }).to_string(),
        );
        leader
    }

    /// Why this leader refused the request `request`, if it says so.
    fn refused(&self, request: &str) -> Option<String> {
        let text = self.candidate.metadata.get(REFUSED_KEY)?;
        let said: serde_json::Value = serde_json::from_str(text).ok()?;
        (said["request"] == request).then(|| said["reason"].as_str().unwrap_or("").to_owned())
    }
}

/// A hand-over that completed: the target leads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandedOver {
    /// The candidate that leads now.
    pub to: String,
    /// Its term's fencing token, where the store shows it to others.
    pub fencing_token: Option<FencingToken>,
}

/// Why a hand-over was refused, or did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandOverError {
    /// The target is not a live candidate of the election: it never campaigned, it died, it
    /// yields ([`resign_for`](crate::CampaignHandle::resign_for)) or it shut down. Nothing
    /// moved.
    #[error(
        "{to:?} is not a live candidate of the election{}; nothing moved: start it, or pick \
         a live one",
        live_list(live)
    )]
    NotACandidate {
        /// The target asked for.
        to: String,
        /// The live candidates, where the store keeps a line of them (etcd, ZooKeeper).
        live: Option<Vec<String>>,
    },
    /// Another hand-over is under way (to `to`); this one was not started. Try again once it
    /// is done.
    #[error("another hand-over, to {to:?}, is under way; this one was not started")]
    InProgress {
        /// The target of the hand-over under way (empty when the store did not say).
        to: String,
    },
    /// Leadership moved to `now` by other means (another hand-over, a resign, a crash)
    /// before this request was served; it was not.
    #[error("leadership moved to {now:?} before this request was served; it was not")]
    Superseded {
        /// Who leads now.
        now: String,
    },
    /// The leader refused the request it read from the store, for `reason` (the target was
    /// not live when it looked, or the line did not clear); nothing moved.
    #[error("the leader refused: {reason}")]
    Refused {
        /// Why, as the leader said.
        reason: String,
    },
    /// Nobody leads the election, so nobody can hand over.
    #[error("nobody leads the election, so nobody can hand it over")]
    NoLeader,
    /// The target did not take office within the window: the reservation lapsed and an open
    /// election followed.
    #[error(
        "{to:?} did not take office within the {window:?} window: the reservation lapsed and \
         the election is open{}",
        now.as_ref().map(|n| format!(" ({n} leads now)")).unwrap_or_default()
    )]
    Lapsed {
        /// The target.
        to: String,
        /// The window.
        window: Duration,
        /// Who leads now, if anyone was seen.
        now: Option<String>,
    },
    /// Candidates ahead of the target in the store's line (etcd, ZooKeeper) did not step out
    /// of it in time (an older version of this crate, or a process cut off from the store);
    /// the leader keeps its term.
    #[error(
        "the candidates ahead of {to:?} in the line ({}) did not step aside in time; the \
         leader keeps its term",
        ahead.join(", ")
    )]
    LineNotClear {
        /// The target.
        to: String,
        /// The candidates still ahead of it.
        ahead: Vec<String>,
    },
    /// The request was taken, but the hand-over was not seen to finish within the time given:
    /// `state` says what was seen last.
    #[error("the hand-over to {to:?} did not finish within {waited:?}: {state}")]
    NotFinished {
        /// The target.
        to: String,
        /// How long the request waited.
        waited: Duration,
        /// The last state seen, e.g. "`a` still leads" or "`a` is handing over to `b`".
        state: String,
    },
}

fn live_list(live: &Option<Vec<String>>) -> String {
    match live {
        Some(ids) if ids.is_empty() => " (it has no live candidate)".to_owned(),
        Some(ids) => format!(" (live: {})", ids.join(", ")),
        None => String::new(),
    }
}

/// The name of the presence record of candidate `id` in `election`: a hash of the id keeps
/// the name within every store's limits and free of characters they refuse.
pub(crate) fn presence_name(election: &str, id: &str) -> String {
    format!("{election}/.candidates/{:016x}", fnv1a(id.as_bytes()))
}

/// The name of `election`'s request lock.
pub(crate) fn request_name(election: &str) -> String {
    format!("{election}/.switchover")
}

/// FNV-1a, 64 bits: stable across versions and platforms (the names are shared by every
/// process of an election).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Whether `id` is a live candidate of `election`: in the store's line, where it keeps one,
/// or holding its presence record.
pub(crate) async fn check_live<B: Backend>(backend: &B, election: &str, id: &str) -> Result<()> {
    if let Some(line) = backend.participants(election).await? {
        let live: Vec<String> = line.into_iter().map(|l| l.candidate.id).collect();
        if live.iter().any(|l| l == id) {
            return Ok(());
        }
        return Err(HandOverError::NotACandidate {
            to: id.to_owned(),
            live: Some(live),
        }
        .into());
    }
    let mut presence = backend.observe(&presence_name(election, id)).await?;
    match presence.next().await? {
        Some(holder) if holder.candidate.id == id => Ok(()),
        _ => Err(HandOverError::NotACandidate {
            to: id.to_owned(),
            live: None,
        }
        .into()),
    }
}

/// A request read from an election's request lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// Unique per request: the requester's id in the lock.
    pub id: String,
    pub to: String,
    pub window: Option<Duration>,
    /// The leader the request is addressed to.
    pub from: String,
}

impl Request {
    pub(crate) fn parse(holder: &Leader) -> Option<Request> {
        let metadata = &holder.candidate.metadata;
        Some(Request {
            id: holder.candidate.id.clone(),
            to: metadata.get(REQUEST_TO)?.clone(),
            window: metadata
                .get(REQUEST_WINDOW_MS)
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis),
            from: metadata.get(REQUEST_FROM)?.clone(),
        })
    }

    /// Whether the leader `id` is the one this request is addressed to: a request made to
    /// an earlier leader is not served by a later one (the requester sees the hand-over it
    /// lost to, and says so).
    pub(crate) fn addressed_to(&self, id: &str) -> bool {
        self.from == id
    }
}

/// How [`request`] goes about it.
#[derive(Clone, Debug)]
pub struct RequestOptions {
    /// The session the request lock is held with.
    pub session: SessionOptions,
    /// The reservation window the leader should keep; `None`: the leader's own setting.
    pub window: Option<Duration>,
    /// How long to wait for the target to lead, from the call.
    pub timeout: Duration,
}

/// Asks the leader of `election` to hand over to `to`, through the store's request lock, and
/// waits until `to` leads. See the [module docs](self).
///
/// Errors: [`HandOverError::NotACandidate`] (checked before anything is written),
/// [`HandOverError::NoLeader`], [`HandOverError::InProgress`] when another request holds the
/// lock, [`HandOverError::Lapsed`] when another candidate took office instead,
/// [`HandOverError::NotFinished`] after `options.timeout`, and the store's errors.
pub async fn request<B: Backend>(
    backend: &B,
    election: &str,
    to: &str,
    options: &RequestOptions,
) -> Result<HandedOver> {
    let deadline = Instant::now() + options.timeout;
    let waited = options.timeout;
    let within = Within { deadline, waited };
    let mut observer = within.run(backend.observe(election)).await?;
    let current = within.run(observer.next()).await?;
    match &current {
        Some(leader) if took_office(leader, to) => {
            return Ok(HandedOver {
                to: to.to_owned(),
                fencing_token: leader.fencing_token,
            });
        }
        Some(leader) => {
            if let Some(h) = leader.handing_over() {
                return Err(HandOverError::InProgress { to: h.to }.into());
            }
        }
        None => return Err(HandOverError::NoLeader.into()),
    }
    // After the look at the leader: a candidate out of the line for a hand-over under way
    // is reported as that hand-over, not as not live.
    within.run(check_live(backend, election, to)).await?;
    let session = within.run(backend.open_session(&options.session)).await?;
    let outcome = request_with(
        &session,
        &mut observer,
        current,
        election,
        to,
        options.window,
        deadline,
        waited,
    )
    .await;
    let _ = tokio::time::timeout(options.session.renew_interval, session.close()).await;
    outcome
}

/// A deadline for each step of a request.
#[derive(Clone, Copy)]
struct Within {
    deadline: Instant,
    waited: Duration,
}

impl Within {
    async fn run<T>(self, work: impl Future<Output = Result<T>>) -> Result<T> {
        match timeout_at(self.deadline, work).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(self.waited)),
        }
    }
}

/// The request on an open session (a bystander's, or a campaign's own).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn request_with<S: Session, O: Observer>(
    session: &S,
    observer: &mut O,
    mut current: Option<Leader>,
    election: &str,
    to: &str,
    window: Option<Duration>,
    deadline: Instant,
    waited: Duration,
) -> Result<HandedOver> {
    let Some(from) = current.clone() else {
        return Err(HandOverError::NoLeader.into());
    };
    let mut metadata = BTreeMap::new();
    metadata.insert(REQUEST_TO.to_owned(), to.to_owned());
    metadata.insert(REQUEST_FROM.to_owned(), from.candidate.id.clone());
    if let Some(window) = window {
        metadata.insert(REQUEST_WINDOW_MS.to_owned(), window.as_millis().to_string());
    }
    let requester = Candidate {
        id: format!(
            "switchover:{}:{}:{:08x}",
            crate::config::hostname(),
            std::process::id(),
            fastrand::u32(..)
        ),
        metadata,
    };
    let name = request_name(election);
    let mut lock = match timeout_at(deadline, session.contend(&name, &requester)).await {
        Ok(lock) => lock?,
        Err(_) => return Err(Error::Timeout(waited)),
    };
    let taken = match timeout_at(deadline, lock.acquire()).await {
        Ok(taken) => taken?,
        Err(_) => return Err(Error::Timeout(waited)),
    };
    match taken {
        crate::backend::Attempt::Won { .. } => {}
        crate::backend::Attempt::Held { holder } => {
            let to = holder
                .as_ref()
                .and_then(Request::parse)
                .map(|r| r.to)
                .unwrap_or_default();
            return Err(HandOverError::InProgress { to }.into());
        }
        crate::backend::Attempt::Delayed { .. } => {
            return Err(HandOverError::InProgress { to: String::new() }.into());
        }
    }
    let outcome = follow_outcome(observer, &mut current, to, &requester.id, deadline, waited).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), lock.release()).await;
    outcome
}

/// Whether `leader` shows that `to` took office: its value, written by the winner (on etcd
/// and ZooKeeper, where a candidate's key leads once its predecessor goes, the winner writes
/// when its term began: a dead target's key can lead without it), hands nothing over.
pub(crate) fn took_office(leader: &Leader, to: &str) -> bool {
    leader.candidate.id == to && leader.handing_over().is_none() && leader.since_unix_ms.is_some()
}

/// Follows the election until `to` leads (done), another candidate takes office after a
/// hand-over was seen (lapsed), or the deadline.
async fn follow_outcome<O: Observer>(
    observer: &mut O,
    current: &mut Option<Leader>,
    to: &str,
    request: &str,
    deadline: Instant,
    waited: Duration,
) -> Result<HandedOver> {
    let from = current.as_ref().map(|l| l.candidate.id.clone());
    let mut handing_over = false;
    let mut window = Duration::ZERO;
    loop {
        if let Some(reason) = current.as_ref().and_then(|l| l.refused(request)) {
            return Err(HandOverError::Refused { reason }.into());
        }
        let reservation = current.as_ref().and_then(Leader::handing_over);
        if let Some(h) = &reservation {
            window = h.window();
        }
        match current {
            Some(_) if reservation.as_ref().is_some_and(|h| h.to != to) => {
                let other = reservation.map(|h| h.to).unwrap_or_default();
                return Err(HandOverError::InProgress { to: other }.into());
            }
            Some(_) if reservation.is_some() => handing_over = true,
            // The leader let go (a gate store shows no holder once the lock is released):
            // whoever leads next without being `to` took it after the hand-over.
            None => handing_over = true,
            Some(leader) if took_office(leader, to) => {
                return Ok(HandedOver {
                    to: to.to_owned(),
                    fencing_token: leader.fencing_token,
                });
            }
            Some(leader) if handing_over => {
                return Err(HandOverError::Lapsed {
                    to: to.to_owned(),
                    window,
                    now: Some(leader.candidate.id.clone()),
                }
                .into());
            }
            Some(leader) if from.as_ref() != Some(&leader.candidate.id) => {
                return Err(HandOverError::Superseded {
                    now: leader.candidate.id.clone(),
                }
                .into());
            }
            Some(_) => {}
        }
        tokio::select! {
            next = observer.next() => *current = next?,
            () = sleep_until(deadline) => {
                let state = match current {
                    Some(l) => match l.handing_over() {
                        Some(h) => format!("{} is handing over to {}", l.candidate.id, h.to),
                        None => format!("{} leads", l.candidate.id),
                    },
                    None => "nobody leads".to_owned(),
                };
                return Err(HandOverError::NotFinished { to: to.to_owned(), waited, state }.into());
            }
        }
    }
}

/// Waits until `to` is right behind the leader in the store's line (etcd, ZooKeeper), at
/// most until `deadline`. `Err`: the candidates still ahead of it.
pub(crate) async fn line_clear<B: Backend>(
    backend: &B,
    election: &str,
    to: &str,
    deadline: Instant,
) -> std::result::Result<(), Vec<String>> {
    let mut ahead = Vec::new();
    loop {
        if let Ok(Some(line)) = backend.participants(election).await {
            let ids: Vec<String> = line.into_iter().map(|l| l.candidate.id).collect();
            match ids.iter().position(|id| id == to) {
                // The leader first, then the target.
                Some(at) if at <= 1 => return Ok(()),
                Some(at) => ahead = ids[1..at].to_vec(),
                None => return Err(Vec::new()),
            }
        }
        if Instant::now() >= deadline {
            return Err(ahead);
        }
        tokio::time::sleep(LINE_POLL).await;
    }
}

/// How often [`line_clear`] reads the line while candidates step out of it: a bounded wait
/// of one hand-over, not a follower's poll.
const LINE_POLL: Duration = Duration::from_millis(2);

/// Presence: the take of a candidate's presence record, with its contender.
pub(crate) async fn take_presence<C: Contender>(presence: &mut C) -> bool {
    matches!(
        presence.acquire().await,
        Ok(crate::backend::Attempt::Won { .. })
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presence_name_is_a_valid_election_name_and_stable() {
        let name = presence_name("jobs/index", "host-a:8080 (ü)");
        crate::config::validate_name(&name).expect("valid");
        assert_eq!(name, presence_name("jobs/index", "host-a:8080 (ü)"));
        assert_ne!(name, presence_name("jobs/index", "host-b:8080"));
        crate::config::validate_name(&request_name("jobs/index")).expect("valid");
    }

    fn leader_a() -> Leader {
        Leader {
            candidate: Candidate {
                id: "a".into(),
                metadata: BTreeMap::new(),
            },
            fencing_token: Some(3),
            since_unix_ms: None,
        }
    }

    #[test]
    fn a_refusal_is_read_back_by_its_request_only() {
        let leader = leader_a();
        let refusing = leader.refusing("switchover:h:1:00ab", "\"c\" is not a live candidate");
        assert_eq!(
            refusing.refused("switchover:h:1:00ab").as_deref(),
            Some("\"c\" is not a live candidate")
        );
        assert_eq!(refusing.refused("switchover:h:2:00cd"), None);
        assert_eq!(leader.refused("switchover:h:1:00ab"), None);
    }

    #[test]
    fn a_reservation_is_read_back_and_a_hostile_one_is_none() {
        let leader = leader_a();
        let reserving = leader.handing_over_to("b", Duration::from_secs(2));
        let seen = reserving.handing_over().expect("a reservation");
        assert_eq!((seen.to.as_str(), seen.window_ms), ("b", 2_000));
        let mut hostile = leader.clone();
        hostile
            .candidate
            .metadata
            .insert(HANDING_OVER_KEY.into(), "{not json".into());
        assert_eq!(hostile.handing_over(), None);
        assert_eq!(leader.handing_over(), None);
    }
}
