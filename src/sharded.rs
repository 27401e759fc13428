//! Sharded elections: one leader per shard, the shards spread across the live processes.
//!
//! A [`ShardedElection`] splits a job into `S` shards (partitions of a queue, tenants, index
//! segments), each an election of its own named `<group>/<k>`, and spreads them across the
//! processes that run it. Each process:
//!
//! 1. **registers as a member** in the store: it holds one of the group's member slots
//!    (`<group>/.members/<i>`, an ordinary lock on its session), whose value carries its
//!    identity, weight, the shards it claims and the shards it leads. It follows every slot with the store's
//!    observer (a watch where the store has one), so it sees members come and go.
//! 2. **computes the same map as everyone else** from what the slots say, with [`assign`]:
//!    each member's quota is its share of `S` by weight (`⌊S/N⌋` or `⌈S/N⌉` with equal
//!    weights); a member keeps the shards it already claims up to its quota (of two members
//!    that claim one shard, the one that leads it keeps it, so a member whose view was stale
//!    for a moment takes nothing from others), and the shards
//!    left over go, in shard order, to the member that ranks highest by rendezvous hashing
//!    among those below their quota. So a join moves only the shards the newcomer gets, and a
//!    leave only the leaver's shards: at most `⌈S/N⌉` moves per change, with `N` the smaller
//!    member count. The map is a fixed point: once every member claims its part, nothing moves.
//! 3. **campaigns for exactly its part**: each shard it gets is a member of one
//!    [`ElectionSet`], a full term of its own election (its own fencing token and
//!    [`stop_by`](crate::Term::stop_by)), all on the process's one session and driven by one
//!    task, so renewals stay one per process whatever the number of shards, and a shard
//!    costs a set's member, not a campaign (BENCHMARKS.md, "Sharded elections"). Each term's
//!    worker runs in a task of its own, as a [`Runner`](crate::Runner)'s does: cancelled
//!    when the term ends, and dropped at its hard stop, the term's
//!    [`must_stop`](crate::Term::must_stop) (the end of the grace, or the term's `stop_by` or
//!    the lease's lapse if sooner). A shard that moves away ends its term at once, waits for
//!    its worker (at most the grace), and only then releases its lock; the new owner, already
//!    waiting in the store's line, takes it at the release (or at the expiry, if the old
//!    owner died). A worker that returns while its term lasts steps its shard down as
//!    [`OnWorkerExit`] says: under `Resign` (the default) it campaigns again after the
//!    back-off; under `Stop` it stays down while the shard is assigned here.
//!
//! Safety does not rest on the map: two members that see different maps both campaign for a
//! shard, and the shard's lock lets one of them lead. A shard never has two trusted owners;
//! its tokens strictly grow, as every election's do.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
//! use std::time::Duration;
//! use incumbent::{ShardedElection, memory::MemoryBackend};
//!
//! let backend = MemoryBackend::new();
//! let jobs = ShardedElection::builder(backend, "jobs", 8)
//!     .candidate("host-a")
//!     .ttl(Duration::from_secs(2))
//!     .build()?;
//! let shards = jobs.start(|shard, term| async move {
//!     println!("shard {shard}: leading with token {}", term.fencing_token());
//!     term.cancelled().await; // work on the shard until it moves or is lost
//! });
//! let mut status = shards.status();
//! // Alone, this process owns every shard.
//! status.wait_for(|s| s.owned().len() == 8).await.expect("the shards run");
//! shards.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! What the map does *not* promise: balance while members disagree (for a moment after a
//! change, before each has read the others' claims), and a particular owner for a shard. A
//! member sees a dead member leave when the store expires its slot: one ttl after its last
//! renewal.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, sleep_until};

use crate::backend::{
    Attempt, Backend, Candidate, Contender, Leader, Observer, Session, SessionHealth, unix_ms_now,
};
use crate::backoff::Backoff;
use crate::campaign::{CatchUnwind, panic_message};
use crate::config::{Config, validate_name};
use crate::election::{Election, ElectionBuilder};
use crate::event::{DemotionReason, LeadershipEvent};
use crate::queue::{Fanout, QueueReceiver};
use crate::runner::{OnWorkerExit, WorkerOutcome};
use crate::set::{ElectionSet, SetEvent, SetEvents};
use crate::term::Term;
use crate::{Error, FencingToken, Result};

/// How long after a change of the shards it leads a member writes them to its slot: one
/// write for the burst of changes a move brings.
const HELD_DEBOUNCE: Duration = Duration::from_millis(20);

/// The most shards a group may have.
pub const MAX_SHARDS: u32 = 65_536;
/// Default number of member slots: the most processes a group can spread over (raise it with
/// [`ShardedBuilder::max_members`]). Each process follows every slot, so keep it near the
/// number of processes you run.
pub const DEFAULT_MAX_MEMBERS: u32 = 32;
/// The most member slots a group may have.
pub const MAX_MEMBERS: u32 = 1_024;
/// The largest weight a member may have; a larger one read from the store counts as this.
pub const MAX_WEIGHT: u32 = 1_000;

/// Metadata key of a member's weight.
pub const WEIGHT_KEY: &str = "incumbent.weight";
/// Metadata key of the shards a member claims: a bitmap in hex, shard `k` at bit `k % 8` of
/// byte `k / 8`.
pub const CLAIMS_KEY: &str = "incumbent.shards";
/// Metadata key of the shards a member leads now (the same bitmap as [`CLAIMS_KEY`]): of
/// two members that claim one shard, the one that leads it keeps it, so a member whose view
/// was stale for a moment (a slot it missed, a claim it had not read) takes nothing from
/// the shards others hold.
pub const HELD_KEY: &str = "incumbent.held";
/// Metadata key of the number of shards the member was built with: members built with a
/// different number are left out of the map (and the status says so).
pub const SHARD_COUNT_KEY: &str = "incumbent.shard_count";

/// The election name of shard `shard` of `group`.
pub fn shard_name(group: &str, shard: u32) -> String {
    format!("{group}/{shard}")
}

/// The name of member slot `slot` of `group`.
pub fn slot_name(group: &str, slot: u32) -> String {
    format!("{group}/.members/{slot}")
}

/// A member of a sharded group, as its slot in the store says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMember {
    /// The member's candidate id.
    pub id: String,
    /// Its weight: its share of the shards is `weight / total weight`.
    pub weight: u32,
    /// The shards it claims (its part of the map as it last computed it).
    pub claims: BTreeSet<u32>,
    /// The shards it leads, as it last wrote them ([`HELD_KEY`]).
    pub held: BTreeSet<u32>,
    /// The member's metadata, without the keys this crate writes.
    pub metadata: BTreeMap<String, String>,
}

impl ShardMember {
    /// Reads a member from its slot's value. Nothing in it is trusted: a weight outside
    /// `1..=MAX_WEIGHT` counts as the nearest bound (an unreadable one as 1), claims of
    /// shards `>= shards` are dropped, and unreadable claims count as none. `None` when the
    /// member says it was built with another number of shards.
    pub fn from_leader(leader: &Leader, shards: u32) -> Option<ShardMember> {
        let meta = &leader.candidate.metadata;
        if let Some(count) = meta.get(SHARD_COUNT_KEY)
            && count.parse::<u32>().ok() != Some(shards)
        {
            return None;
        }
        let weight = meta
            .get(WEIGHT_KEY)
            .and_then(|w| w.parse::<u64>().ok())
            .map_or(1, |w| w.clamp(1, u64::from(MAX_WEIGHT)) as u32);
        let claims = meta
            .get(CLAIMS_KEY)
            .map(|c| decode_claims(c, shards))
            .unwrap_or_default();
        let held = meta
            .get(HELD_KEY)
            .map(|c| decode_claims(c, shards))
            .unwrap_or_default();
        let metadata = meta
            .iter()
            .filter(|(k, _)| !k.starts_with(crate::config::RESERVED_METADATA_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(ShardMember {
            id: leader.candidate.id.clone(),
            weight,
            claims,
            held,
            metadata,
        })
    }
}

/// Encodes claims as the hex bitmap of [`CLAIMS_KEY`].
pub fn encode_claims(claims: &BTreeSet<u32>) -> String {
    let Some(&last) = claims.last() else {
        return String::new();
    };
    let mut bytes = vec![0u8; last as usize / 8 + 1];
    for &k in claims {
        bytes[k as usize / 8] |= 1 << (k % 8);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes the hex bitmap of [`CLAIMS_KEY`], keeping shards below `shards`; anything that is
/// not such a bitmap (or longer than `shards` needs) gives no claims.
pub fn decode_claims(text: &str, shards: u32) -> BTreeSet<u32> {
    let mut claims = BTreeSet::new();
    if !text.len().is_multiple_of(2) || text.len() > (shards as usize).div_ceil(8) * 2 {
        return claims;
    }
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        let Some(byte) = std::str::from_utf8(pair)
            .ok()
            .and_then(|p| u8::from_str_radix(p, 16).ok())
        else {
            return BTreeSet::new();
        };
        for bit in 0..8 {
            let k = (i * 8 + bit) as u32;
            if byte & (1 << bit) != 0 && k < shards {
                claims.insert(k);
            }
        }
    }
    claims
}

/// FNV-1a, 64 bits, then a mixer: stable across versions and platforms, since every process
/// of a group must rank the same way.
fn hash64(bytes: &[u8]) -> u64 {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    mix(h)
}

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The rendezvous score of `shard` for the member whose id hashes to `member`.
fn score(member: u64, shard: u32) -> u64 {
    mix(member ^ mix(u64::from(shard).wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// The map: for each shard, the index in `members` of its owner (`None` only when there are
/// no members). Every process computes it from the same slots, so every process gets the
/// same map; see the [module docs](self) for the rule. Members with equal ids should not
/// happen (the ids are candidate ids); the first one counts and the others get nothing.
pub fn assign(shards: u32, members: &[ShardMember]) -> Vec<Option<usize>> {
    let mut owner = vec![None; shards as usize];
    let live: Vec<usize> = (0..members.len())
        .filter(|&i| !members[..i].iter().any(|m| m.id == members[i].id))
        .collect();
    if live.is_empty() || shards == 0 {
        return owner;
    }
    let hashes: Vec<u64> = members.iter().map(|m| hash64(m.id.as_bytes())).collect();
    let quota = quotas(shards, members, &live, &hashes);

    // The best claimant of each shard keeps it, up to its quota: the one that leads it, then
    // the highest score; a member over its quota gives up what it does not lead first, then
    // its lowest scores.
    let rank = |i: usize, k: u32| (members[i].held.contains(&k), score(hashes[i], k));
    let mut best: Vec<Option<usize>> = vec![None; shards as usize];
    for &i in &live {
        for &k in members[i].claims.range(..shards) {
            let slot = &mut best[k as usize];
            if slot.is_none_or(|b| rank(i, k) > rank(b, k)) {
                *slot = Some(i);
            }
        }
    }
    // Each member's best claims, in shard order: one pass over the shards, not one per member.
    let mut kept_by: Vec<Vec<u32>> = vec![Vec::new(); members.len()];
    for (k, b) in (0..shards).zip(&best) {
        if let Some(i) = *b {
            kept_by[i].push(k);
        }
    }
    let mut left = quota.clone();
    for &i in &live {
        let mut kept = std::mem::take(&mut kept_by[i]);
        // Each rank once (a lookup and a hash), not once per comparison.
        kept.sort_by_cached_key(|&k| std::cmp::Reverse(rank(i, k)));
        for k in kept.into_iter().take(quota[i] as usize) {
            owner[k as usize] = Some(i);
            left[i] -= 1;
        }
    }
    // The rest, in shard order, to the highest-ranked member below its quota.
    for k in 0..shards {
        if owner[k as usize].is_some() {
            continue;
        }
        let pick = live
            .iter()
            .copied()
            .filter(|&i| left[i] > 0)
            .max_by_key(|&i| (score(hashes[i], k), std::cmp::Reverse(i)));
        if let Some(i) = pick {
            owner[k as usize] = Some(i);
            left[i] -= 1;
        }
    }
    owner
}

/// Each live member's quota: its share of `shards` by weight, rounded down, and the shards
/// left over one each to the members with the largest remainders, then by hash: a function
/// of the member set alone. (Not of the claims: a member whose quota fell because another's
/// claims grew would give up a shard it held, a move nobody needed; a sharded run on
/// ZooKeeper moved 23 shards for a leave that needed 16.)
fn quotas(shards: u32, members: &[ShardMember], live: &[usize], hashes: &[u64]) -> Vec<u32> {
    let total: u64 = live.iter().map(|&i| u64::from(members[i].weight)).sum();
    let mut quota = vec![0u32; members.len()];
    let mut rest = u64::from(shards);
    for &i in live {
        let q = u64::from(shards) * u64::from(members[i].weight) / total;
        quota[i] = q as u32;
        rest -= q;
    }
    let mut order: Vec<usize> = live.to_vec();
    order.sort_by_key(|&i| {
        let remainder = u64::from(shards) * u64::from(members[i].weight) % total;
        std::cmp::Reverse((remainder, hashes[i]))
    });
    for &i in order.iter().take(rest as usize) {
        quota[i] += 1;
    }
    quota
}

/// What a process's shards do, as [`ShardedRunner::subscribe`] reports it.
#[derive(Clone, Debug)]
pub enum ShardEvent {
    /// This process now leads the shard: its worker runs with `term`.
    Elected {
        /// The shard.
        shard: u32,
        /// The shard's new term.
        term: Term,
    },
    /// This process no longer leads the shard (the term was cancelled already).
    Demoted {
        /// The shard.
        shard: u32,
        /// The token of the term that ended.
        fencing_token: FencingToken,
        /// Why: [`DemotionReason::Shutdown`] when the shard moved to another member.
        reason: DemotionReason,
        /// After an involuntary loss, when the shard's worker must have stopped.
        stop_by: Option<Instant>,
    },
}

/// A process's view of its group, as a [`watch`] value ([`ShardedRunner::status`]).
#[derive(Clone, Debug)]
pub struct ShardStatus {
    /// The group's name.
    pub group: String,
    /// The number of shards.
    pub shards: u32,
    /// This process's candidate id.
    pub candidate: String,
    /// Whether this process holds a member slot.
    pub registered: bool,
    /// The members as their slots say, in slot order (this process included once registered).
    pub members: Vec<ShardMember>,
    /// The shards the map gives this process: it campaigns for these.
    pub assigned: BTreeSet<u32>,
    /// What keeps the group from working as it should, if anything (no free member slot, the
    /// store unreachable, a member built with another number of shards).
    pub problem: Option<String>,
    terms: BTreeMap<u32, Term>,
}

impl ShardStatus {
    /// The shards this process leads now: those whose term is not cancelled. It reads each
    /// term's cancellation token, so it stops listing a shard the instant its term ends.
    pub fn owned(&self) -> BTreeSet<u32> {
        self.terms
            .iter()
            .filter(|(_, t)| !t.is_cancelled())
            .map(|(k, _)| *k)
            .collect()
    }

    /// Whether this process leads `shard` now.
    pub fn owns(&self, shard: u32) -> bool {
        self.term(shard).is_some()
    }

    /// The live term of `shard`, if this process leads it.
    pub fn term(&self, shard: u32) -> Option<&Term> {
        self.terms.get(&shard).filter(|t| !t.is_cancelled())
    }
}

/// Builds a [`ShardedElection`]; the settings are those of an [`ElectionBuilder`], for every
/// shard, plus the member's weight and the group's number of member slots.
pub struct ShardedBuilder<B: Backend> {
    inner: ElectionBuilder<B>,
    group: String,
    shards: u32,
    weight: u32,
    max_members: u32,
}

impl<B: Backend> fmt::Debug for ShardedBuilder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedBuilder")
            .field("inner", &self.inner)
            .field("shards", &self.shards)
            .field("weight", &self.weight)
            .field("max_members", &self.max_members)
            .finish()
    }
}

macro_rules! delegate {
    ($(#[$doc:meta] $name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            #[$doc]
            pub fn $name(mut self, $($arg: $ty),*) -> Self {
                self.inner = self.inner.$name($($arg),*);
                self
            }
        )*
    };
}

impl<B: Backend> ShardedBuilder<B> {
    delegate! {
        /// This process's identity, unique in the group (as [`ElectionBuilder::candidate`]).
        candidate(id: impl Into<String>);
        /// A metadata entry others read in this member's slot (as [`ElectionBuilder::metadata`]).
        metadata(key: impl Into<String>, value: impl Into<String>);
        /// The session ttl (as [`ElectionBuilder::ttl`]): a dead member's shards move about this long after it dies.
        ttl(ttl: Duration);
        /// The renew interval (as [`ElectionBuilder::renew_interval`]).
        renew_interval(interval: Duration);
        /// The renew deadline of every shard's term (as [`ElectionBuilder::renew_deadline`]).
        renew_deadline(deadline: Duration);
        /// The store's lock-delay (as [`ElectionBuilder::lock_delay`]).
        lock_delay(delay: Duration);
        /// The retry back-off (as [`ElectionBuilder::backoff`]).
        backoff(initial: Duration, max: Duration);
        /// How long a shard's worker gets to return when its term ends (as [`ElectionBuilder::grace`]).
        grace(grace: Duration);
        /// What a shard does when its worker returns (as [`ElectionBuilder::on_worker_exit`]).
        on_worker_exit(policy: OnWorkerExit);
    }

    /// This member's weight: its share of the shards is its weight over the members' total
    /// (default 1; `1..=`[`MAX_WEIGHT`]).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The number of member slots, the most processes the group spreads over (default
    /// [`DEFAULT_MAX_MEMBERS`]; `1..=`[`MAX_MEMBERS`]). Every member of a group must use the
    /// same number: a member follows only the slots it knows of.
    pub fn max_members(mut self, slots: u32) -> Self {
        self.max_members = slots;
        self
    }

    /// Checks every setting: those of an election (the group's name as its name, and the
    /// longest shard and slot names), and the shard count, weight and slot count, with
    /// [`Error::InvalidSharding`] for the latter.
    pub fn build(self) -> Result<ShardedElection<B>> {
        let bad = |reason: String| Err(Error::InvalidSharding { reason });
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return bad(format!("{} shards; use 1 to {MAX_SHARDS}", self.shards));
        }
        if !(1..=MAX_WEIGHT).contains(&self.weight) {
            return bad(format!("weight {}; use 1 to {MAX_WEIGHT}", self.weight));
        }
        if !(1..=MAX_MEMBERS).contains(&self.max_members) {
            return bad(format!(
                "{} member slots; use 1 to {MAX_MEMBERS}",
                self.max_members
            ));
        }
        validate_name(&shard_name(&self.group, self.shards - 1))?;
        validate_name(&slot_name(&self.group, self.max_members - 1))?;
        // A shard's term is handed on by moves, not by switchover: no presence record and no
        // request watch per shard.
        let template = self
            .inner
            .accept_hand_overs(false)
            .switchover_requests(false)
            .build()?;
        Ok(ShardedElection {
            template,
            shards: self.shards,
            weight: self.weight,
            max_members: self.max_members,
        })
    }
}

/// A group of `S` shard elections spread across the processes that run it. See the
/// [module docs](self). Cheap to clone.
pub struct ShardedElection<B: Backend> {
    template: Election<B>,
    shards: u32,
    weight: u32,
    max_members: u32,
}

impl<B: Backend> Clone for ShardedElection<B> {
    fn clone(&self) -> Self {
        ShardedElection {
            template: self.template.clone(),
            shards: self.shards,
            weight: self.weight,
            max_members: self.max_members,
        }
    }
}

impl<B: Backend> fmt::Debug for ShardedElection<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedElection")
            .field("group", &self.template.config().name)
            .field("shards", &self.shards)
            .field("weight", &self.weight)
            .field("max_members", &self.max_members)
            .finish()
    }
}

impl<B: Backend> ShardedElection<B> {
    /// Starts building a group named `group` of `shards` shards on `backend`.
    pub fn builder(backend: B, group: impl Into<String>, shards: u32) -> ShardedBuilder<B> {
        let group = group.into();
        ShardedBuilder {
            inner: Election::builder(backend, group.clone()),
            group,
            shards,
            weight: 1,
            max_members: DEFAULT_MAX_MEMBERS,
        }
    }

    /// The settings every shard's election uses (its `name` is the group's).
    pub fn config(&self) -> &Config {
        self.template.config()
    }

    /// The number of shards.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Reads the group from the store once, without joining it: the members their slots
    /// show, and the holder of each shard.
    pub async fn map(&self) -> Result<ShardMap> {
        read_map(
            self.template.backend(),
            &self.template.config().name,
            self.shards,
            self.max_members,
        )
        .await
    }

    /// Joins the group and runs `worker(shard, term)` for each shard this process leads,
    /// each as [`Election::start`] runs one: cancelled when the term ends (the shard moved,
    /// or was lost), stopped hard at the term's [`stop_by`](Term::stop_by) after an
    /// involuntary loss, before the store can hand the shard on. Returns at once.
    pub fn start<W, Fut>(&self, worker: W) -> ShardedRunner
    where
        W: Fn(u32, Term) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: WorkerOutcome,
    {
        let config = self.template.config();
        let (status_tx, status) = watch::channel(ShardStatus {
            group: config.name.clone(),
            shards: self.shards,
            candidate: config.candidate.id.clone(),
            registered: false,
            members: Vec::new(),
            assigned: BTreeSet::new(),
            problem: None,
            terms: BTreeMap::new(),
        });
        let subscribers = Subscribers::new(crate::EVENT_QUEUE_CAPACITY);
        let (stop, stopped) = oneshot::channel();
        let status_tx = Arc::new(status_tx);
        // Every shard is a member of one set: one task and one session for them all.
        let set = self.template.set();
        let (exited, exits) = mpsc::unbounded_channel();
        let workers = Workers {
            worker: Arc::new(move |k, term| {
                let work = worker(k, term);
                Box::pin(async move { work.await.into_result() }) as WorkerFuture
            }),
            exited,
        };
        let forwarding = tokio::spawn(forward(
            set.events(),
            status_tx.clone(),
            subscribers.clone(),
            config.name.clone(),
            workers,
        ));
        let coordinator = Coordinator {
            template: self.template.clone(),
            shards: self.shards,
            weight: self.weight,
            max_members: self.max_members,
            set,
            status: status_tx,
            subscribers: subscribers.clone(),
            running: BTreeSet::new(),
            exits,
            forwarding: Some(forwarding),
            view: BTreeMap::new(),
            published: None,
        };
        let task = tokio::spawn(coordinator.run(stopped));
        ShardedRunner {
            status,
            subscribers,
            stop: Some(stop),
            task: Some(task),
        }
    }
}

/// A group as read from the store ([`ShardedElection::map`], `incumbent observe --shards`).
#[derive(Clone, Debug)]
pub struct ShardMap {
    /// The members, in slot order.
    pub members: Vec<ShardMember>,
    /// The holder of each shard, as the store says (`None`: nobody leads it).
    pub holders: Vec<Option<Leader>>,
}

impl ShardMap {
    /// How many shards each member holds, by member id (members that hold none included).
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> =
            self.members.iter().map(|m| (m.id.clone(), 0)).collect();
        for holder in self.holders.iter().flatten() {
            *counts.entry(holder.candidate.id.clone()).or_default() += 1;
        }
        counts
    }
}

/// Reads `group`'s member slots and shard holders once, on any backend.
pub async fn read_map<B: Backend>(
    backend: &B,
    group: &str,
    shards: u32,
    max_members: u32,
) -> Result<ShardMap> {
    let mut members = Vec::new();
    for slot in 0..max_members {
        let mut observer = backend.observe(&slot_name(group, slot)).await?;
        if let Some(leader) = observer.next().await?
            && let Some(member) = ShardMember::from_leader(&leader, shards)
        {
            members.push(member);
        }
    }
    let mut holders = Vec::with_capacity(shards as usize);
    for shard in 0..shards {
        let mut observer = backend.observe(&shard_name(group, shard)).await?;
        holders.push(observer.next().await?);
    }
    Ok(ShardMap { members, holders })
}

/// A process's part of a sharded group, running: what [`ShardedElection::start`] returns.
/// Dropping it leaves the group in the background (each shard's worker is stopped, its lock
/// released, then the member slot); [`shutdown`](Self::shutdown) does the same and waits.
#[must_use = "dropping a ShardedRunner leaves the group: keep it for as long as the service runs"]
#[derive(Debug)]
pub struct ShardedRunner {
    status: watch::Receiver<ShardStatus>,
    subscribers: Subscribers,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ShardedRunner {
    /// The group as this process sees it, and the shards it owns
    /// ([`ShardStatus::owned`]).
    pub fn status(&self) -> watch::Receiver<ShardStatus> {
        self.status.clone()
    }

    /// A new stream of this process's shard events, from now on.
    pub fn subscribe(&self) -> ShardEvents {
        ShardEvents {
            rx: self.subscribers.add(),
        }
    }

    /// Leaves the group: every shard's worker is stopped (at most the grace, never past its
    /// term's hard stop) and its lock released, then the member slot; waits for all of it.
    /// The leave starts when this is called, not when the future is first polled, as
    /// [`Campaign::shutdown`](crate::Campaign::shutdown)'s does.
    pub fn shutdown(mut self) -> impl Future<Output = Result<()>> + Send + 'static {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take();
        async move {
            match task {
                Some(task) => task
                    .await
                    .map_err(|e| Error::Worker(format!("the sharded runner's task failed: {e}"))),
                None => Ok(()),
            }
        }
    }
}

impl Drop for ShardedRunner {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A stream of [`ShardEvent`]s ([`ShardedRunner::subscribe`]). It ends when the runner does.
#[derive(Debug)]
pub struct ShardEvents {
    rx: QueueReceiver<ShardEvent>,
}

impl ShardEvents {
    /// The next event; `None` once the runner has ended.
    pub async fn recv(&mut self) -> Option<ShardEvent> {
        self.rx.recv().await
    }
}

type Subscribers = Fanout<ShardEvent>;

type Worker = Arc<dyn Fn(u32, Term) -> WorkerFuture + Send + Sync>;
type WorkerFuture = std::pin::Pin<Box<dyn Future<Output = std::result::Result<(), String>> + Send>>;

/// What runs the shards' workers: the user's worker, and where a worker that returns while
/// its term lasts is told.
struct Workers {
    worker: Worker,
    exited: mpsc::UnboundedSender<Exit>,
}

/// A shard's worker returned (or failed, or panicked) while its term lasted.
struct Exit {
    shard: u32,
    fencing_token: FencingToken,
    outcome: std::result::Result<(), String>,
}

/// A member's hold on its slot.
struct Registration<B: Backend> {
    session: B::Session,
    contender: <B::Session as Session>::Contender,
    health: watch::Receiver<SessionHealth>,
    slot: u32,
    token: FencingToken,
}

struct Coordinator<B: Backend> {
    template: Election<B>,
    shards: u32,
    weight: u32,
    max_members: u32,
    /// The shards' elections, each a member of this set while this process campaigns for
    /// the shard.
    set: ElectionSet,
    status: Arc<watch::Sender<ShardStatus>>,
    subscribers: Subscribers,
    /// The shards this process campaigns for: members of the set (or, under
    /// [`OnWorkerExit::Stop`], left after their worker returned, until they move away).
    running: BTreeSet<u32>,
    /// Workers that returned while their term lasted, from their tasks.
    exits: mpsc::UnboundedReceiver<Exit>,
    /// The forwarding task ([`forward`]): it runs the workers and tells the set's events;
    /// awaited at the end, once every shard stopped.
    forwarding: Option<tokio::task::JoinHandle<()>>,
    /// What each slot's observer last said, and the member it names, read once per change
    /// of the slot (`None`: a member built with another number of shards).
    view: BTreeMap<u32, (Leader, Option<ShardMember>)>,
    /// The claims and the shards led, as last written to our slot (`None`: not yet).
    published: Option<(BTreeSet<u32>, BTreeSet<u32>)>,
}

impl<B: Backend> Coordinator<B> {
    fn group(&self) -> &str {
        &self.template.config().name
    }

    fn me(&self) -> &str {
        &self.template.config().candidate.id
    }

    fn set_problem(&self, problem: Option<String>) {
        self.status.send_if_modified(|s| {
            let changed = s.problem != problem;
            s.problem = problem.clone();
            changed
        });
    }

    async fn run(mut self, mut stopped: oneshot::Receiver<()>) {
        let (updates_tx, mut updates) = mpsc::unbounded_channel();
        let mut observers = JoinSet::new();
        for slot in 0..self.max_members {
            let backend = self.template.backend().clone();
            let name = slot_name(self.group(), slot);
            let tx = updates_tx.clone();
            let backoff = self.template.config().backoff;
            observers.spawn(follow_slot(backend, name, slot, tx, backoff));
        }
        drop(updates_tx);
        let backoff = self.template.config().backoff;
        let mut attempt = 0u32;
        let mut registration: Option<Registration<B>> = None;
        let mut retry_at = Instant::now();
        // The shards this process leads change with its terms: written to its slot a moment
        // after a change (one write for a burst of them), so that the others' maps prefer
        // the holder of a shard.
        let mut own_status = self.status.subscribe();
        let mut held_due: Option<Instant> = None;
        // What the last wake-up asks for: the map computed again (not after a change of
        // this member's own terms, or a stopped shard's end: the map does not depend on
        // them), and the shards led written even if the claims did not change.
        let mut recompute = true;
        let mut flush_held = false;
        loop {
            if registration.is_none() && Instant::now() >= retry_at {
                match self.register().await {
                    Ok(r) => {
                        attempt = 0;
                        self.published = None;
                        self.set_problem(None);
                        registration = Some(r);
                        recompute = true;
                    }
                    Err(e) => {
                        self.set_problem(Some(e.to_string()));
                        retry_at = Instant::now() + backoff.delay(attempt);
                        attempt = attempt.saturating_add(1);
                    }
                }
            }
            const CLAIMS_PROBLEM: &str = "could not write this member's claims";
            let rebalanced = if recompute || flush_held {
                self.rebalance(registration.as_mut(), flush_held).await
            } else {
                Ok(())
            };
            (recompute, flush_held) = (true, false);
            if let Err(e) = rebalanced {
                self.set_problem(Some(format!("{CLAIMS_PROBLEM}: {e}")));
                // Written again after the back-off (the timer below), not only at the next
                // change the slots show: the others map from these claims.
                self.published = None;
                retry_at = Instant::now() + backoff.delay(attempt);
                attempt = attempt.saturating_add(1);
            } else if self.published.is_some() {
                self.status.send_if_modified(|s| {
                    let stale = s
                        .problem
                        .as_deref()
                        .is_some_and(|p| p.starts_with(CLAIMS_PROBLEM));
                    if stale {
                        s.problem = None;
                    }
                    stale
                });
            }
            let registered = registration.is_some();
            let lost = async {
                match registration.as_mut() {
                    Some(r) => {
                        tokio::select! {
                            _ = r.contender.lost() => {}
                            _ = r.health.wait_for(|h| h.lost.is_some()) => {}
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stopped => break,
                update = updates.recv() => {
                    let Some((slot, leader)) = update else { break };
                    self.saw(slot, leader);
                    while let Ok((slot, leader)) = updates.try_recv() {
                        self.saw(slot, leader);
                    }
                }
                () = lost => {
                    if let Some(r) = registration.take() {
                        let _ = r.session.close().await;
                    }
                    self.published = None;
                    retry_at = Instant::now() + backoff.delay(0);
                }
                () = sleep_until(retry_at), if !registered || self.published.is_none() => {}
                Ok(()) = own_status.changed(), if held_due.is_none() => {
                    held_due = Some(Instant::now() + HELD_DEBOUNCE);
                    recompute = false;
                }
                () = sleep_until(held_due.unwrap_or(retry_at)), if held_due.is_some() => {
                    held_due = None;
                    flush_held = true;
                }
                Some(exit) = self.exits.recv() => {
                    self.worker_exited(exit);
                    recompute = false;
                }
            }
        }
        // Leave: the shards first (their workers stop, their locks are released), then the slot.
        // The registration's session is leaving too: once every shard of it is releasing, a
        // store that can ends the session once for all (etcd: one revoke of the lease deletes
        // the shards' keys and the slot at one revision), and the releases are not needed.
        if let Some(r) = &registration {
            r.session.leaving();
        }
        // The set ends every term at once, waits for the workers (up to the grace, never past
        // a term's hard stop) and releases every shard's lock.
        let _ = self.set.shutdown().await;
        if let Some(mut r) = registration.take() {
            let _ = r.contender.release().await;
            let _ = r.session.close().await;
        }
        observers.abort_all();
        // Every shard stopped: the forwarding task passes on what the set said last, and ends
        // with the set's events.
        if let Some(forwarding) = self.forwarding.take() {
            let _ = forwarding.await;
        }
        self.status.send_modify(|s| {
            s.registered = false;
            s.assigned.clear();
            s.terms.clear();
        });
        self.subscribers.close();
    }

    /// A shard's worker returned while its term lasted: the shard steps down, and under
    /// [`OnWorkerExit::Resign`] campaigns again after the back-off, as a [`Runner`](crate::Runner)'s would.
    /// Under [`OnWorkerExit::Stop`] it is left, and taken up again only once it has moved
    /// away and back.
    fn worker_exited(&mut self, exit: Exit) {
        let name = shard_name(self.group(), exit.shard);
        let current = self
            .set
            .term(&name)
            .is_some_and(|t| t.fencing_token() == exit.fencing_token && !t.is_cancelled());
        if !current {
            return;
        }
        let reason = match &exit.outcome {
            Ok(()) => {
                tracing::info!(
                    shard = exit.shard,
                    "the shard's worker returned while leader"
                );
                DemotionReason::WorkerExited
            }
            Err(error) => {
                tracing::error!(shard = exit.shard, %error, "the shard's worker failed while leader");
                DemotionReason::WorkerFailed
            }
        };
        let rejoin = self.template.on_worker_exit() == OnWorkerExit::Resign;
        // The step down starts at the call; nothing waits for it here.
        drop(self.set.leave_because(&name, reason, rejoin));
    }

    fn saw(&mut self, slot: u32, leader: Option<Leader>) {
        match leader {
            Some(leader) => {
                let member = ShardMember::from_leader(&leader, self.shards);
                self.view.insert(slot, (leader, member));
            }
            None => {
                self.view.remove(&slot);
            }
        }
    }

    /// Takes the first free member slot.
    async fn register(&self) -> Result<Registration<B>> {
        let config = self.template.config();
        let session = self
            .template
            .backend()
            .open_session(&config.session_options())
            .await?;
        let health = session.health();
        let candidate = self.candidate(&BTreeSet::new(), &BTreeSet::new());
        // Slots the view shows free first, then the others (the view may be stale).
        let (free, held): (Vec<u32>, Vec<u32>) =
            (0..self.max_members).partition(|s| !self.view.contains_key(s));
        for slot in free.into_iter().chain(held) {
            let mut contender = session
                .contend(&slot_name(self.group(), slot), &candidate)
                .await?;
            match contender.acquire().await? {
                Attempt::Won { fencing_token } => {
                    return Ok(Registration {
                        session,
                        contender,
                        health,
                        slot,
                        token: fencing_token,
                    });
                }
                Attempt::Held { .. } | Attempt::Delayed { .. } => {
                    contender.release().await?;
                }
            }
        }
        let _ = session.close().await;
        Err(Error::InvalidSharding {
            reason: format!(
                "all {} member slots of {:?} are taken; raise max_members on every member",
                self.max_members,
                self.group()
            ),
        })
    }

    fn candidate(&self, claims: &BTreeSet<u32>, held: &BTreeSet<u32>) -> Candidate {
        let mut candidate = self.template.config().candidate.clone();
        candidate
            .metadata
            .insert(WEIGHT_KEY.into(), self.weight.to_string());
        candidate
            .metadata
            .insert(SHARD_COUNT_KEY.into(), self.shards.to_string());
        candidate
            .metadata
            .insert(CLAIMS_KEY.into(), encode_claims(claims));
        candidate
            .metadata
            .insert(HELD_KEY.into(), encode_claims(held));
        candidate
    }

    /// Computes the map from the view, and makes this process's part of it so: starts the
    /// shards it gets, stops those it no longer has, and writes its claims when they change.
    /// The shards it leads are written with them, and otherwise only when `flush_held` (at
    /// most once per [`HELD_DEBOUNCE`]): every write makes every member compute the map
    /// again, and a move changes the shards led once per shard.
    async fn rebalance(
        &mut self,
        registration: Option<&mut Registration<B>>,
        flush_held: bool,
    ) -> Result<()> {
        let me = self.me().to_owned();
        let mine = registration.as_ref().map(|r| r.slot);
        let mut members = Vec::new();
        let mut foreign = Vec::new();
        for (slot, (leader, member)) in &self.view {
            // A slot under this member's id other than the one it holds now is its own
            // earlier registration, still in a stale view (after its session was lost, a
            // freeze): its claims are history, and counting them would take back shards the
            // others took meanwhile.
            if leader.candidate.id == me && Some(*slot) != mine {
                continue;
            }
            match member {
                Some(m) => members.push(m.clone()),
                None => foreign.push(leader.candidate.id.clone()),
            }
        }
        let registered = mine.is_some_and(|slot| {
            self.view
                .get(&slot)
                .is_some_and(|(l, _)| l.candidate.id == me)
        });
        let target: BTreeSet<u32> = if registered {
            let map = assign(self.shards, &members);
            let index = members.iter().position(|m| m.id == me);
            (0..self.shards)
                .filter(|&k| index.is_some() && map[k as usize] == index)
                .collect()
        } else {
            BTreeSet::new()
        };
        // Stop first: a shard that moves ends its term at once, and is released as soon as
        // its worker has stopped (the set waits for it, up to the grace).
        let leaving: Vec<u32> = self
            .running
            .iter()
            .filter(|k| !target.contains(k))
            .copied()
            .collect();
        for k in leaving {
            self.running.remove(&k);
            drop(self.set.leave(&shard_name(self.group(), k)));
        }
        let mut stopped = None;
        for &k in &target {
            if !self.running.contains(&k) {
                match self.set.join(&shard_name(self.group(), k)) {
                    Ok(()) => {
                        self.running.insert(k);
                    }
                    Err(e) => stopped = Some(e),
                }
            }
        }
        let problem = match stopped {
            // The set's task ended (a bug: it panicked), and with it every term.
            Some(e) => Some(format!(
                "the shards' elections stopped ({e}): {}; start the group again",
                self.set.problem().unwrap_or_default()
            )),
            None => (!foreign.is_empty()).then(|| {
                format!(
                    "members {foreign:?} were built with another number of shards than {}; they are left out of the map",
                    self.shards
                )
            }),
        };
        let member_count = members.len();
        // What changed is replaced; the rest is left as it is (every member's claims and
        // the map are thousands of shards each, computed again at every slot's change).
        self.status.send_if_modified(|s| {
            let mut changed = false;
            if s.members != members {
                s.members = members;
                changed = true;
            }
            if s.assigned != target {
                s.assigned = target.clone();
                changed = true;
            }
            if s.registered != registered {
                s.registered = registered;
                changed = true;
            }
            if problem.is_some() && s.problem != problem {
                s.problem = problem;
                changed = true;
            }
            changed
        });
        crate::metrics::shard_members(self.group(), member_count);
        let published = (target, self.status.borrow().owned());
        let stale = match &self.published {
            None => true,
            Some((claims, held)) => *claims != published.0 || (flush_held && *held != published.1),
        };
        if let Some(r) = registration
            && stale
        {
            let leader = Leader {
                candidate: self.candidate(&published.0, &published.1),
                fencing_token: Some(r.token),
                since_unix_ms: Some(unix_ms_now()),
            };
            r.contender.proclaim(&leader).await?;
            self.published = Some(published);
        }
        Ok(())
    }
}

/// The most shard events [`forward`] takes in one batch.
const FORWARD_BATCH: usize = 1024;

/// Passes the shards' term changes on to the status and the subscribers, in the order the
/// set sent them, and starts each new term's worker; ends once the set has stopped.
async fn forward(
    mut events: SetEvents,
    status: Arc<watch::Sender<ShardStatus>>,
    subscribers: Subscribers,
    group: String,
    workers: Workers,
) {
    // The events queued when it wakes are taken as one batch: the status changes once for
    // them all. The gauge counts the terms the events left in the status, as its docs say
    // ("as its shard events say"): counting the live ones (`owned`) is a pass over every
    // shard's term, and once per event it made a move of thousands of shards quadratic.
    let mut batch = Vec::new();
    let mut told = Vec::new();
    while let Some(first) = events.recv().await {
        batch.push(first);
        while batch.len() < FORWARD_BATCH {
            match events.recv().now_or_never() {
                Some(Some(event)) => batch.push(event),
                _ => break,
            }
        }
        status.send_if_modified(|s| {
            for SetEvent { election, event } in batch.drain(..) {
                // The set holds this group's shards only, named `<group>/<k>`.
                let Some(shard) = election
                    .rsplit_once('/')
                    .and_then(|(_, k)| k.parse::<u32>().ok())
                else {
                    continue;
                };
                if let Some(event) = record(s, shard, event) {
                    told.push(event);
                }
            }
            // A leader changed elsewhere is no change of this member's shards.
            !told.is_empty()
        });
        crate::metrics::shards_owned(&group, status.borrow().terms.len());
        for event in told.drain(..) {
            if let ShardEvent::Elected { shard, term } = &event {
                workers.start(*shard, term.clone());
            }
            subscribers.send(&event);
        }
    }
}

impl Workers {
    /// Runs the worker of `shard`'s new term in a task of its own, holding the term (the
    /// set's release waits for it, up to the grace). It is dropped at the term's
    /// [`must_stop`](Term::must_stop), which the set fires at the hard stop: at the end of
    /// the grace if the worker still holds the term after a leave, a move or a resign (or
    /// sooner, when renewals stop and the lease could lapse first), and at `stop_by` after
    /// an involuntary loss. So a shard's worker costs its task and its own future, and no
    /// timer. A worker that returns while its term lasts is told to the coordinator.
    fn start(&self, shard: u32, term: Term) {
        let guard = term.hold();
        // Taken before the term ended, the guard holds the release until the worker has
        // stopped; a term that ended before runs no worker.
        if term.is_cancelled() {
            return;
        }
        let exited = self.exited.clone();
        // The worker's own code runs here, in the task that passes every shard's events on:
        // a panic in it (before its future) is that worker's failure, not the group's.
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            (self.worker)(shard, term.clone())
        }));
        let work = match made {
            Ok(work) => work,
            Err(panic) => {
                let message = panic_message(&*panic);
                Box::pin(async move { Err(format!("panicked: {message}")) })
            }
        };
        tokio::spawn(async move {
            let _guard = guard;
            // `must_stop`'s token is made only once the term has ended.
            let hard_stop = async {
                term.cancelled().await;
                term.must_stop().await;
            };
            tokio::select! {
                biased;
                () = hard_stop => tracing::warn!(
                    shard,
                    "the shard's worker did not stop after its term ended; aborted it"
                ),
                outcome = CatchUnwind(work) => {
                    if term.is_cancelled() {
                        return;
                    }
                    let outcome = outcome.unwrap_or_else(|panic| {
                        Err(format!("panicked: {}", panic_message(&*panic)))
                    });
                    let _ = exited.send(Exit {
                        shard,
                        fencing_token: term.fencing_token(),
                        outcome,
                    });
                }
            }
        });
    }
}

/// Records a shard's event in the status; the event to tell, if any.
fn record(s: &mut ShardStatus, shard: u32, event: LeadershipEvent) -> Option<ShardEvent> {
    match event {
        // The set sends a shard's events in order; still, an event of an older term (a
        // lower token) never overwrites or removes the newer one.
        LeadershipEvent::Elected(term) => {
            let newer = s
                .terms
                .get(&shard)
                .is_some_and(|t| t.fencing_token() > term.fencing_token());
            if !newer {
                s.terms.insert(shard, term.clone());
            }
            Some(ShardEvent::Elected { shard, term })
        }
        LeadershipEvent::Demoted {
            fencing_token,
            reason,
            stop_by,
        } => {
            if s.terms
                .get(&shard)
                .is_some_and(|t| t.fencing_token() <= fencing_token)
            {
                s.terms.remove(&shard);
            }
            Some(ShardEvent::Demoted {
                shard,
                fencing_token,
                reason,
                stop_by,
            })
        }
        LeadershipEvent::LeaderChanged(_) => None,
    }
}

/// Follows one member slot, sending what it says to the coordinator; retries with back-off.
async fn follow_slot<B: Backend>(
    backend: B,
    name: String,
    slot: u32,
    tx: mpsc::UnboundedSender<(u32, Option<Leader>)>,
    backoff: Backoff,
) {
    let mut attempt = 0;
    loop {
        let observer = backend.observe(&name).await;
        if let Ok(mut observer) = observer {
            while let Ok(leader) = observer.next().await {
                attempt = 0;
                if tx.send((slot, leader)).is_err() {
                    return;
                }
            }
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(backoff.delay(attempt)).await;
        attempt = attempt.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, claims: impl IntoIterator<Item = u32>) -> ShardMember {
        ShardMember {
            id: id.into(),
            weight: 1,
            held: BTreeSet::new(),
            claims: claims.into_iter().collect(),
            metadata: BTreeMap::new(),
        }
    }

    fn parts(shards: u32, members: &[ShardMember]) -> Vec<BTreeSet<u32>> {
        let map = assign(shards, members);
        (0..members.len())
            .map(|i| {
                (0..shards)
                    .filter(|&k| map[k as usize] == Some(i))
                    .collect()
            })
            .collect()
    }

    /// Every member recomputes from the others' claims until nothing changes, in a
    /// random order: what the processes do through the store.
    fn settle(shards: u32, members: &mut [ShardMember], seed: u64) -> usize {
        let mut rng = seed;
        for round in 0..100 {
            let mut changed = false;
            for _ in 0..members.len() {
                rng = mix(rng.wrapping_add(1));
                let i = (rng % members.len() as u64) as usize;
                let mine = parts(shards, members).swap_remove(i);
                if members[i].claims != mine {
                    members[i].claims = mine;
                    changed = true;
                }
            }
            let all = parts(shards, members);
            if !changed && members.iter().zip(&all).all(|(m, p)| &m.claims == p) {
                return round;
            }
        }
        panic!("the map did not settle in 100 rounds");
    }

    fn owners(members: &[ShardMember]) -> BTreeMap<u32, String> {
        members
            .iter()
            .flat_map(|m| m.claims.iter().map(|k| (*k, m.id.clone())))
            .collect()
    }

    #[test]
    fn claims_round_trip_and_hostile_claims_count_as_none() {
        let claims: BTreeSet<u32> = [0, 3, 8, 63].into();
        let text = encode_claims(&claims);
        assert_eq!(decode_claims(&text, 64), claims);
        assert!(
            decode_claims(&text, 10).is_empty(),
            "longer than 10 shards need"
        );
        assert!(decode_claims("zz", 64).is_empty());
        assert!(decode_claims("0", 64).is_empty());
        assert!(decode_claims(&"ff".repeat(1000), 64).is_empty());
        assert_eq!(encode_claims(&BTreeSet::new()), "");
    }

    #[test]
    fn a_hostile_member_value_is_bounded() {
        let mut leader = Leader::from_bytes(b"x");
        leader
            .candidate
            .metadata
            .insert(WEIGHT_KEY.into(), "99999999999".into());
        leader
            .candidate
            .metadata
            .insert(CLAIMS_KEY.into(), "ffff".into());
        let m = ShardMember::from_leader(&leader, 4).expect("a member");
        assert_eq!(m.weight, MAX_WEIGHT);
        assert!(m.claims.is_empty(), "claims longer than 4 shards need");
        leader
            .candidate
            .metadata
            .insert(SHARD_COUNT_KEY.into(), "8".into());
        assert!(ShardMember::from_leader(&leader, 4).is_none());
    }

    #[test]
    fn a_fresh_map_is_balanced_to_one_shard() {
        for n in 1..=9 {
            let members: Vec<_> = (0..n).map(|i| member(&format!("m{i}"), [])).collect();
            for shards in [1, 7, 64, 1024] {
                let sizes: Vec<usize> = parts(shards, &members).iter().map(|p| p.len()).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "{shards} shards over {n}: {sizes:?}");
                assert_eq!(sizes.iter().sum::<usize>(), shards as usize);
            }
        }
    }

    #[test]
    fn a_settled_map_is_a_fixed_point() {
        let mut members: Vec<_> = (0..4).map(|i| member(&format!("m{i}"), [])).collect();
        settle(64, &mut members, 1);
        let before = owners(&members);
        let again = parts(64, &members);
        for (m, p) in members.iter().zip(&again) {
            assert_eq!(&m.claims, p);
        }
        assert_eq!(before.len(), 64);
    }

    #[test]
    fn weights_share_the_shards() {
        let mut members = vec![member("a", []), member("b", []), member("c", [])];
        members[0].weight = 2;
        let sizes: Vec<usize> = parts(64, &members).iter().map(|p| p.len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 64);
        assert!((31..=33).contains(&sizes[0]), "{sizes:?}");
        assert!((15..=17).contains(&sizes[1]), "{sizes:?}");
    }

    #[test]
    fn joins_and_leaves_move_at_most_s_over_n_and_stay_balanced() {
        let pool: Vec<String> = (0..10)
            .map(|i| format!("host-{}", mix(i) % 10_000))
            .collect();
        let mut seed = 7u64;
        for shards in [64u32, 100, 1024] {
            let mut members: Vec<ShardMember> = pool[..3].iter().map(|id| member(id, [])).collect();
            settle(shards, &mut members, seed);
            for step in 0..12 {
                seed = mix(seed + step);
                let before = owners(&members);
                let n0 = members.len();
                if (seed.is_multiple_of(2) && members.len() < 8) || members.len() == 1 {
                    let next = pool.iter().find(|id| !members.iter().any(|m| &m.id == *id));
                    members.push(member(next.expect("a free id"), []));
                } else {
                    members.remove((seed % members.len() as u64) as usize);
                }
                settle(shards, &mut members, seed);
                let after = owners(&members);
                assert_eq!(after.len(), shards as usize, "every shard has an owner");
                let moves = (0..shards)
                    .filter(|k| before.get(k) != after.get(k))
                    .count();
                let n = n0.min(members.len()) as u32;
                assert!(
                    moves <= shards.div_ceil(n) as usize,
                    "{shards} shards, {n0} -> {} members: {moves} moves",
                    members.len()
                );
                let sizes: Vec<usize> = members.iter().map(|m| m.claims.len()).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "balanced: {sizes:?}");
            }
        }
    }

    #[test]
    fn of_two_claimants_the_one_that_leads_the_shard_keeps_it() {
        // b's view was stale: it claims all four, two of which a leads.
        let mut a = member("a", [0, 1]);
        a.held = [0, 1].into();
        let b = member("b", [0, 1, 2, 3]);
        for _ in 0..2 {
            let map = assign(4, &[a.clone(), b.clone()]);
            assert_eq!(map, [Some(0), Some(0), Some(1), Some(1)]);
        }
        // Whatever the scores: swap the names, same outcome.
        let mut b2 = member("b", [0, 1]);
        b2.held = [0, 1].into();
        let a2 = member("a", [0, 1, 2, 3]);
        assert_eq!(assign(4, &[a2, b2]), [Some(1), Some(1), Some(0), Some(0)]);
    }

    #[test]
    fn a_claim_two_members_make_goes_to_one() {
        let members = vec![member("a", [0, 1]), member("b", [1, 2])];
        let map = assign(4, &members);
        assert!(map.iter().all(Option::is_some));
        assert_eq!(map[0], Some(0));
        assert_eq!(map[2], Some(1));
    }
}
