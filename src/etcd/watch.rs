//! The backend's one watch of its key prefix ([`Hub`]), and the views of one election's range
//! that its contenders and observers take from it ([`Follow`]).
//!
//! One watch per backend, not one per election: ten thousand elections in a process cost
//! etcd one watcher, and cost this process a small view each, where a watch per election cost
//! etcd a watcher each and this process a watch's state each. The hub's task owns the watch.
//! It starts from the revision the backend read when it connected, and after a break resumes
//! from just after the last revision it delivered, so a break loses nothing and needs no read.
//! It routes each event to the views of the election whose range holds the key.
//!
//! A view is made *before* its owner's read of the range, so that every change after that
//! read reaches it: the hub delivers a change only after etcd committed it, so a change the
//! hub delivered before the view existed was committed before the read was sent, and the read
//! shows it. Changes at or before the read's revision are dropped from the view when the owner
//! tells it the revision ([`Follow::read_at`]).
//!
//! Only when etcd compacted the history the watch must resume from (a break longer than the
//! cluster keeps history) does the hub start afresh from a new read of the store's revision,
//! and every view tells its owner to read again ([`Seen::Gap`]).
//!
//! While no view follows a range, the hub holds no watch: it is paused, and resumes from just
//! after the last revision it delivered when a view comes, as after a break. So a process
//! whose elections have all stopped (a mass shutdown) neither decodes nor routes the changes
//! of the others still stopping, and costs etcd no watcher; a view made while the watch was
//! paused still gets every change after its owner's read, replayed by the resumed watch.
//!
//! Nor does it watch while every campaign of the backend was asked to shut down (each session
//! handle's [`ShutdownNotice`](crate::backend::ShutdownNotice) given, [`Hub::left`]) and
//! only their views are left. Such a campaign acts on no change (it takes no office, and
//! stops), and it drops its views as it stops; in a mass shutdown of several processes each
//! would otherwise decode and route every other process's deletes until its own last
//! campaign had stopped. A leader's view of its own key ([`Interest::Held`]) keeps the watch
//! whatever its campaign was asked: its term is on until the campaign ends it, and the loss
//! of its key must end it at once. So does an observer of its own.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;

use etcd_client::{
    Client, Event, EventType, GetOptions, KeyValue, KvClient, WatchClient, WatchOptions,
};
use tokio::sync::{oneshot, watch};

use super::{EtcdBackend, SEPARATOR, error, leader_in, leader_of};
use crate::backend::{Leader, lock};
use crate::backoff::{Backoff, Retries};

/// The first pause before re-establishing a broken watch.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// The longest pause between attempts: a store that stays down is tried this often.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// How many changes a view holds for an owner that does not take them; past that, they are
/// dropped, and the owner reads the range again ([`Seen::Gap`]).
const MAX_PENDING: usize = 1024;

/// The largest watch response accepted. etcd sends the events of one revision in one response,
/// and one revision can hold every key of the prefix: revoking a lease that 100,000 elections
/// share deletes their 100,000 keys at once.
const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// The one watch of an [`EtcdBackend`]: every key under its prefix.
pub(super) struct Hub {
    shared: Arc<Shared>,
    /// Dropped with the backend, which ends the task and its watch.
    stop: Mutex<Option<oneshot::Sender<()>>>,
}

struct Shared {
    prefix: Vec<u8>,
    /// The election ranges (`<prefix><election>@`) that views follow, and how many views
    /// keep the watch going.
    ranges: Mutex<Ranges>,
    /// The session handles of the backend whose campaign was not asked to shut down
    /// ([`Hub::joined`], [`Hub::left`]).
    unasked: AtomicIsize,
    /// Whether the watch is to run ([`Ranges::kept`]): it is paused while not. Set under the
    /// lock of `ranges` ([`Shared::settle`]).
    followed: watch::Sender<bool>,
}

/// The ranges followed (the map, through `Deref`), and the views counted by how they keep
/// the watch going: counted under the lock every view's owner takes anyway to make or drop
/// it, so that a view costs no shared counter of its own.
#[derive(Default)]
struct Ranges {
    map: HashMap<Arc<[u8]>, Range>,
    /// The views that keep the watch going whatever anyone was asked: an observer of its
    /// own, a leader's view of its own key.
    always: usize,
    /// The other views: of campaigns (their contenders' and their own observers'), which
    /// keep it going while a campaign of the backend was not asked to shut down.
    serving: usize,
    /// What the hub was last told ([`Shared::followed`]).
    running: bool,
}

impl Ranges {
    /// Whether a view keeps the watch going, given the handles not asked.
    fn kept(&self, unasked: isize) -> bool {
        self.always > 0 || (self.serving > 0 && unasked > 0)
    }
}

impl std::ops::Deref for Ranges {
    type Target = HashMap<Arc<[u8]>, Range>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl std::ops::DerefMut for Ranges {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

/// One election range that views follow.
#[derive(Default)]
struct Range {
    views: Vec<SharedView>,
    /// The revision of the newest change delivered in the range (since it was first
    /// followed).
    last: i64,
    /// Who holds the range as of `last`, when a read told and nothing since made it unknown.
    known: Holding,
}

/// What is known of who holds a range, as the map keeps it: the holder boxed (most ranges
/// have none), an empty range inline (a leader's request lock: an empty range for each
/// election a process leads, which a boxed [`Known`] cost 136 B each).
#[derive(Default)]
enum Holding {
    #[default]
    Unknown,
    /// Empty at this revision.
    Empty(i64),
    Held(Box<Known>),
}

impl Holding {
    fn known(&self) -> Option<Known> {
        match self {
            Holding::Unknown => None,
            Holding::Empty(at) => Some(Known {
                holder: None,
                at: *at,
                created: 0,
            }),
            Holding::Held(known) => Some(Known::clone(known)),
        }
    }

    /// The revision it is known at.
    fn at(&self) -> Option<i64> {
        match self {
            Holding::Unknown => None,
            Holding::Empty(at) => Some(*at),
            Holding::Held(known) => Some(known.at),
        }
    }

    /// What is known after `change`, as [`Known::after`] says.
    fn after(self, change: ChangeRef<'_>, value: &[u8]) -> Holding {
        let known = match self {
            Holding::Unknown => return Holding::Unknown,
            Holding::Empty(at) if change.mod_revision <= at => return self,
            Holding::Empty(_) if change.deleted => return Holding::Empty(change.mod_revision),
            Holding::Empty(at) => Box::new(Known {
                holder: None,
                at,
                created: 0,
            }),
            Holding::Held(known) => known,
        };
        match known.after(change, value) {
            Some(known) => Holding::Held(known),
            None => Holding::Unknown,
        }
    }
}

/// Who held an election range at a revision, as a read found it and the watch kept it since.
#[derive(Clone, Debug)]
pub(super) struct Known {
    /// The holder's key and what it says (with its create revision as the token); `None`: the
    /// range is empty.
    pub holder: Option<(Vec<u8>, Leader)>,
    /// The revision it is known at.
    pub at: i64,
    /// The holder's key's create revision.
    created: i64,
}

/// A view, shared by its owner's [`Follow`] and the hub.
type SharedView = Arc<Mutex<View>>;

/// What one owner (a contender, an observer) follows of its election's range.
struct View {
    interest: Interest,
    /// The revision of the owner's last read: changes at or before it are in the read.
    /// `None` until the first read.
    read: Option<i64>,
    /// Changes for the owner, in revision order.
    changes: Vec<Change>,
    /// Changes after this revision may be missing: the owner must read again, at this
    /// revision or later.
    gap: Option<i64>,
    waker: Option<Waker>,
}

/// What a [`Follow`] passes on to its owner.
#[derive(Clone, Debug)]
pub(super) enum Interest {
    /// Every change in the range.
    Everything,
    /// Only the deletes of these keys.
    Deletes(Vec<Vec<u8>>),
    /// Only the changes that can change who holds the range, given its holder's key (its
    /// [`digest`]) as the owner last learnt it: any change of that key (deleted, or written
    /// again), or, when the range was empty, a first key written. Another candidate joining
    /// or leaving the line is not news to an observer of who leads, and would wake it for
    /// nothing: in an election of ten candidates, nine times at each start or shutdown of
    /// them all. (By digest, not a copy of the key: a collision only wakes the owner for
    /// nothing, and the owner checks the key itself.)
    Holder(Option<u64>),
    /// Only what can end a leader's hold: the delete of its key (by its [`digest`], as for
    /// [`Holder`](Interest::Holder)), or a key written that was created before its own
    /// (`created`), which would be ahead of it in the line. The others joining and leaving
    /// the line behind it are not.
    Held {
        /// The [`digest`] of the leader's key.
        key: u64,
        /// The leader's key's create revision.
        created: i64,
    },
    /// Nothing: the view only keeps the range followed, for what is known of its holder.
    Nothing,
}

impl Interest {
    fn wants(&self, change: ChangeRef<'_>) -> bool {
        self.wants_with(change, &LazyDigest::of(change.key))
    }

    /// [`wants`](Self::wants), with the change's key's digest computed at most once for
    /// every view that looks at the change.
    fn wants_with(&self, change: ChangeRef<'_>, key_digest: &LazyDigest<'_>) -> bool {
        match self {
            Interest::Everything => true,
            Interest::Deletes(keys) => {
                change.deleted && keys.iter().any(|key| key.as_slice() == change.key)
            }
            Interest::Holder(None) => !change.deleted,
            Interest::Holder(Some(key)) => *key == key_digest.get(),
            Interest::Held { key, created } => match change.deleted {
                true => *key == key_digest.get(),
                false => change.create_revision < *created,
            },
            Interest::Nothing => false,
        }
    }
}

/// A key's [`digest`], computed when first asked for, then kept: the hub asks it once per
/// change for all the views of the change's range (two per election and process: a
/// contender's and its campaign's observer's), not once per view.
struct LazyDigest<'k> {
    key: &'k [u8],
    digest: std::cell::OnceCell<u64>,
}

impl<'k> LazyDigest<'k> {
    fn of(key: &'k [u8]) -> LazyDigest<'k> {
        LazyDigest {
            key,
            digest: std::cell::OnceCell::new(),
        }
    }

    fn get(&self) -> u64 {
        *self.digest.get_or_init(|| digest(self.key))
    }
}

/// A key's digest, for an [`Interest`] that names a key without holding a copy of it.
pub(super) fn digest(key: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(key);
    hasher.finish()
}

/// One change of a key, as the watch reported it.
#[derive(Clone, Debug)]
pub(super) struct Change {
    pub key: Vec<u8>,
    /// Deleted (else written).
    pub deleted: bool,
    /// The key's create revision (0 for a delete).
    pub create_revision: i64,
    /// The revision of this change.
    pub mod_revision: i64,
}

impl Change {
    fn as_ref(&self) -> ChangeRef<'_> {
        ChangeRef {
            key: &self.key,
            deleted: self.deleted,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
}

/// A [`Change`] borrowed: what the hub and a view look at, so that a watch event's key is
/// copied only for a view that takes it.
#[derive(Clone, Copy)]
struct ChangeRef<'k> {
    key: &'k [u8],
    deleted: bool,
    create_revision: i64,
    mod_revision: i64,
}

impl ChangeRef<'_> {
    fn to_owned(self) -> Change {
        Change {
            key: self.key.to_vec(),
            deleted: self.deleted,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
}

/// One event of a watch response, as borrowed from it.
struct Delivered<'e> {
    change: ChangeRef<'e>,
    /// The value written (empty for a delete).
    value: &'e [u8],
}

/// What [`Follow::next`] saw.
#[derive(Debug)]
pub(super) enum Seen {
    /// Changes after the owner's last read, in revision order. A change of one revision is
    /// never split between two `Changes`.
    Changes(Vec<Change>),
    /// The owner has not read the range since the view was made, or changes may have been
    /// missed: read the range, and pass the read's revision to [`read_at`](Follow::read_at);
    /// until then, [`next`](Follow::next) says `Gap` again.
    Gap,
}

impl Hub {
    pub fn new(prefix: &str) -> Hub {
        Hub {
            shared: Arc::new(Shared::new(prefix)),
            stop: Mutex::new(None),
        }
    }

    /// Starts the watch from just after `revision`, a revision read before any view was made
    /// (paused until a view comes).
    pub fn start(&self, client: &Client, revision: i64, limit: Duration) {
        let (stop, stopped) = oneshot::channel();
        let watches = client
            .watch_client()
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        let task = run(
            self.shared.clone(),
            watches,
            client.kv_client(),
            revision,
            limit,
            stopped,
        );
        tokio::spawn(task);
        *lock(&self.stop) = Some(stop);
    }
}

impl Hub {
    /// A session handle of the backend was made: its campaign's views keep the watch going
    /// until it is asked to shut down or closed ([`left`](Self::left)).
    pub fn joined(&self) {
        self.shared.count_unasked(1);
    }

    /// The campaign of a handle [`joined`](Self::joined) was asked to shut down (its
    /// [`ShutdownNotice`](crate::backend::ShutdownNotice) given), or the handle was closed
    /// unasked; called once per handle. Once every handle of the backend was, only the views
    /// that keep the watch whatever anyone was asked keep it going.
    pub fn left(&self) {
        self.shared.count_unasked(-1);
    }
}

impl Shared {
    fn new(prefix: &str) -> Shared {
        Shared {
            prefix: prefix.as_bytes().to_vec(),
            ranges: Mutex::new(Ranges::default()),
            unasked: AtomicIsize::new(0),
            followed: watch::Sender::new(false),
        }
    }

    /// Counts handles not asked. Whoever moves the count across zero settles whether the
    /// watch runs, under the lock of the ranges, from the count as it is then.
    fn count_unasked(&self, delta: isize) {
        let before = self.unasked.fetch_add(delta, Ordering::AcqRel);
        if (before > 0) != (before + delta > 0) {
            self.settle(&mut lock(&self.ranges));
        }
    }

    /// Says whether the watch runs, after a change of the counts, under the lock of the
    /// ranges. Paused, the holders of the ranges followed are forgotten: nothing keeps them
    /// up to date meanwhile.
    fn settle(&self, ranges: &mut Ranges) {
        let run = ranges.kept(self.unasked.load(Ordering::Acquire));
        if std::mem::replace(&mut ranges.running, run) == run {
            return;
        }
        self.followed.send_replace(run);
        if !run {
            for range in ranges.map.values_mut() {
                range.known = Holding::Unknown;
            }
        }
    }

    /// The election range that holds `key`, if any: `<prefix><election>@`.
    fn range_of<'k>(&self, key: &'k [u8]) -> Option<&'k [u8]> {
        let rest = key.strip_prefix(self.prefix.as_slice())?;
        let at = rest.iter().position(|&b| b == SEPARATOR as u8)?;
        Some(&key[..self.prefix.len() + at + 1])
    }

    /// Passes the events of one response to the views of their ranges, and keeps what is
    /// known of their holders. All under the lock of the ranges, so that a view made (or a
    /// holder learnt) meanwhile sees each response whole or not at all.
    fn deliver(&self, events: &[Event]) {
        self.deliver_changes(events.iter().filter_map(|event| {
            let kv = event.kv()?;
            Some(Delivered {
                change: ChangeRef {
                    key: kv.key(),
                    deleted: event.event_type() == EventType::Delete,
                    create_revision: kv.create_revision(),
                    mod_revision: kv.mod_revision(),
                },
                value: kv.value(),
            })
        }));
    }

    /// [`deliver`](Self::deliver), of the changes as the watch's events hold them.
    fn deliver_changes<'e>(&self, changes: impl Iterator<Item = Delivered<'e>>) {
        let mut ranges = lock(&self.ranges);
        // Each change for each view that takes it, in revision order: the key is copied
        // only for a view that takes it (most changes in a busy prefix are for nobody here).
        let mut staged: Vec<(SharedView, Change)> = Vec::new();
        for Delivered { change, value } in changes {
            let Some(range) = self
                .range_of(change.key)
                .and_then(|range| ranges.get_mut(range))
            else {
                continue;
            };
            range.last = range.last.max(change.mod_revision);
            range.known = std::mem::take(&mut range.known).after(change, value);
            let key_digest = LazyDigest::of(change.key);
            for view in &range.views {
                // Only to a view that takes it: a follower waits for one key's delete, and
                // every other change of its election (each candidate's write, each release)
                // would otherwise wake its campaign for nothing.
                if lock(view).takes_with(change, &key_digest) {
                    staged.push((view.clone(), change.to_owned()));
                }
            }
        }
        // Grouped by view, each view's changes still in revision order (the sort is
        // stable), and pushed under one lock of the view: its owner sees a response whole.
        staged.sort_by_key(|(view, _)| Arc::as_ptr(view));
        let mut staged = staged.into_iter().peekable();
        while let Some((shared, change)) = staged.next() {
            let mut view = lock(&shared);
            let mut pushed = view.push(change);
            while let Some((_, change)) = staged.next_if(|(next, _)| Arc::ptr_eq(next, &shared)) {
                pushed |= view.push(change);
            }
            if pushed {
                view.wake();
            }
        }
    }

    /// The watch lost changes after `revision` (its history was compacted): every owner
    /// reads again.
    fn gap(&self, revision: i64) {
        let mut ranges = lock(&self.ranges);
        for range in ranges.values_mut() {
            range.known = Holding::Unknown;
        }
        let views: Vec<SharedView> = ranges
            .values()
            .flat_map(|range| range.views.iter().cloned())
            .collect();
        drop(ranges);
        for view in views {
            let mut view = lock(&view);
            view.changes.clear();
            view.gap = Some(view.gap.map_or(revision, |gap| gap.max(revision)));
            view.wake();
        }
    }
}

impl Known {
    /// What is known after `change` (which wrote `value`): the holder's key written again, or
    /// a first key in an empty range, is the holder; the holder's delete makes it unknown (the
    /// next in line would need a read).
    fn after(mut self: Box<Self>, change: ChangeRef<'_>, value: &[u8]) -> Option<Box<Known>> {
        // The watch can lag a read: a change the read already showed changes nothing.
        if change.mod_revision <= self.at {
            return Some(self);
        }
        let holder = self.holder.as_ref().map(|(key, _)| key.as_slice());
        if change.deleted {
            if holder == Some(change.key) {
                return None;
            }
        } else if holder == Some(change.key)
            || holder.is_none()
            || change.create_revision < self.created
        {
            self.holder = Some((
                change.key.to_vec(),
                leader_in(value, change.create_revision),
            ));
            self.created = change.create_revision;
        }
        self.at = change.mod_revision;
        Some(self)
    }
}

impl View {
    /// Whether `change` is for the owner: after its last read, and of interest.
    fn takes(&self, change: ChangeRef<'_>) -> bool {
        self.takes_with(change, &LazyDigest::of(change.key))
    }

    /// [`takes`](Self::takes), with the change's key's digest as the hub keeps it.
    fn takes_with(&self, change: ChangeRef<'_>, key_digest: &LazyDigest<'_>) -> bool {
        self.read.is_none_or(|read| change.mod_revision > read)
            && self.interest.wants_with(change, key_digest)
    }

    /// Keeps `change` for the owner if it [`takes`](Self::takes) it (past [`MAX_PENDING`],
    /// the owner must read again instead); whether the owner has news.
    fn push(&mut self, change: Change) -> bool {
        if !self.takes(change.as_ref()) {
            return false;
        }
        if self.changes.len() >= MAX_PENDING {
            self.changes.clear();
            self.gap = Some(
                self.gap
                    .map_or(change.mod_revision, |gap| gap.max(change.mod_revision)),
            );
            return true;
        }
        self.changes.push(change);
        true
    }

    /// Drops the changes held that `unwanted` names; with none left, the room they took
    /// too. A contender's view fills before its first read (its own write comes back on the
    /// watch) and is emptied by that read; an idle leader then waits on it for as long as it
    /// leads, which kept that room (about 190 B) for every election.
    fn drop_changes(&mut self, unwanted: impl Fn(&Change) -> bool) {
        self.changes.retain(|change| !unwanted(change));
        if self.changes.is_empty() {
            self.changes = Vec::new();
        }
    }

    fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// Why the watch ended.
enum Ended {
    /// The stream broke, or etcd cancelled the watch: resume it.
    Broken(String),
    /// etcd no longer has the history the watch would resume from.
    Compacted(i64),
}

/// Owns the watch until the backend is dropped.
async fn run(
    shared: Arc<Shared>,
    mut watches: WatchClient,
    mut kv: KvClient,
    mut last: i64,
    limit: Duration,
    mut stop: oneshot::Receiver<()>,
) {
    let mut retry = retries();
    let mut followed = shared.followed.subscribe();
    loop {
        // Paused while no view follows a range: resumed from just after `last` when one does.
        tokio::select! {
            biased;
            _ = &mut stop => return,
            _ = followed.wait_for(|followed| *followed) => {}
        }
        let ended = tokio::select! {
            biased;
            _ = &mut stop => return,
            _ = followed.wait_for(|followed| !*followed) => {
                tracing::trace!(resume_at = last + 1, "no election follows a range; the watch pauses");
                continue;
            }
            ended = watch_from(&shared, &mut watches, &mut last, limit, &mut retry) => ended,
        };
        match ended {
            Ended::Broken(reason) => {
                tracing::debug!(%reason, resume_at = last + 1, "the watch broke; resuming it");
            }
            Ended::Compacted(compacted) => {
                let options = GetOptions::new().with_prefix().with_count_only();
                let reading = error::within(
                    limit,
                    "reading the key prefix",
                    kv.get(shared.prefix.clone(), Some(options)),
                );
                let read = tokio::select! {
                    biased;
                    _ = &mut stop => return,
                    read = reading => read,
                };
                match read {
                    Ok(response) => {
                        let revision = response.header().map_or(0, |h| h.revision());
                        tracing::debug!(
                            compacted,
                            last,
                            revision,
                            "etcd compacted the watch's history; every election reads again"
                        );
                        shared.gap(revision);
                        last = revision;
                        continue;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "cannot read the store's revision; retrying");
                    }
                }
            }
        }
        tokio::select! {
            biased;
            _ = &mut stop => return,
            () = retry.pause() => {}
        }
    }
}

/// Watches the prefix from just after `last`, delivering events and moving `last` on, until
/// the watch ends.
async fn watch_from(
    shared: &Shared,
    client: &mut WatchClient,
    last: &mut i64,
    limit: Duration,
    retry: &mut Retries,
) -> Ended {
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(*last + 1)
        .with_progress_notify();
    let opening = client.watch(shared.prefix.clone(), Some(options));
    let mut stream = match error::within(limit, "opening the watch", opening).await {
        Ok(stream) => stream,
        Err(e) => return Ended::Broken(e.to_string()),
    };
    let mut created = false;
    loop {
        let message = if created {
            stream.message().await
        } else {
            match tokio::time::timeout(limit, stream.message()).await {
                Ok(message) => message,
                Err(_) => {
                    return Ended::Broken(format!(
                        "creating the watch: no answer within {limit:?}"
                    ));
                }
            }
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => return Ended::Broken("the server closed the watch stream".to_owned()),
            Err(e) => return Ended::Broken(error::from_client(e).to_string()),
        };
        if response.canceled() {
            return match response.compact_revision() {
                0 => Ended::Broken(format!(
                    "the watch was cancelled: {}",
                    response.cancel_reason()
                )),
                compacted => Ended::Compacted(compacted),
            };
        }
        if response.created() {
            created = true;
            retry.reset();
            continue;
        }
        let events = response.events();
        let newest = events
            .iter()
            .filter_map(|e| e.kv())
            .map(|kv| kv.mod_revision())
            .max();
        match newest {
            Some(newest) => {
                shared.deliver(events);
                *last = (*last).max(newest);
            }
            // A progress report: every change up to its revision was sent.
            None => *last = (*last).max(response.header().map_or(0, |h| h.revision())),
        }
    }
}

/// A view of one election's range, on the backend's one watch. Made before the owner's first
/// read of the range; it hears of every change in the range until told what matters
/// ([`attend`](Follow::attend)).
///
/// Cancel-safe: dropping a `next` future loses nothing. Dropping the `Follow` removes the
/// view.
pub(super) struct Follow {
    shared: Arc<Shared>,
    /// The range's name, shared with the hub's entry for it.
    range: Arc<[u8]>,
    view: SharedView,
    retry: Retries,
    /// It serves a campaign: it keeps the watch going only while a campaign of the backend
    /// was not asked to shut down, or while `held`.
    serves: bool,
    /// It follows a leader's own key ([`Interest::Held`]): it keeps the watch going whatever
    /// anyone was asked.
    held: bool,
}

impl Follow {
    /// The range followed (made from a `&str`: never lossy).
    pub fn range(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.range)
    }

    /// Follows the changes in `range` (`<prefix><election>@`) from now on; `serves`: for a
    /// campaign (its contender, or its own observer), whose ask to shut down lets the watch
    /// stop (see [`Hub::left`]).
    pub fn new(backend: &EtcdBackend, range: &str, serves: bool) -> Follow {
        let shared = backend.inner.watches.shared.clone();
        let view = Arc::new(Mutex::new(View {
            interest: Interest::Everything,
            read: None,
            changes: Vec::new(),
            gap: None,
            waker: None,
        }));
        let range = {
            let mut ranges = lock(&shared.ranges);
            // One copy of the name per range, shared by the hub's entry and its views.
            let name: Arc<[u8]> = match ranges.get_key_value(range.as_bytes()) {
                Some((name, _)) => name.clone(),
                None => Arc::from(range.as_bytes()),
            };
            ranges
                .entry(name.clone())
                .or_default()
                .views
                .push(view.clone());
            *counted_in(&mut ranges, serves) += 1;
            shared.settle(&mut ranges);
            name
        };
        Follow {
            shared,
            range,
            view,
            retry: retries(),
            serves,
            held: false,
        }
    }

    /// Who holds the range now, if that is known (a read in this process found it, and the
    /// watch kept it since); the view is then as if its owner had read the range at that
    /// revision, and no read is needed.
    pub fn known(&mut self) -> Option<Known> {
        let known = {
            let ranges = lock(&self.shared.ranges);
            match ranges.running {
                true => ranges.get(&self.range).and_then(|r| r.known.known()),
                false => None, // paused: nothing keeps it up to date
            }
        }?;
        // A response delivered since is in the view too, with its changes after `at`.
        self.read_at(known.at);
        Some(known)
    }

    /// Tells what a read of the range at `revision` found it to hold (`holder`: its oldest
    /// key), for other views of the range to use (see [`known`](Self::known)). Kept only if
    /// nothing in the range changed since the read, as far as the watch delivered.
    pub fn learn(&self, revision: i64, holder: Option<&KeyValue>) {
        let mut ranges = lock(&self.shared.ranges);
        if !ranges.running {
            return; // paused: nothing would keep it up to date
        }
        let Some(range) = ranges.get_mut(&self.range) else {
            return;
        };
        if range.last > revision || range.known.at().is_some_and(|at| at > revision) {
            return;
        }
        range.known = match holder {
            None => Holding::Empty(revision),
            Some(kv) => Holding::Held(Box::new(Known {
                holder: Some((kv.key().to_vec(), leader_of(kv))),
                at: revision,
                created: kv.create_revision(),
            })),
        };
    }

    /// From now on passes on only what `interest` names (the changes held already too).
    pub fn attend(&mut self, interest: Interest) {
        // A leader's view of its own key keeps the watch going, whatever anyone was asked.
        // Moved from one count to the other under one lock: the watch never pauses between.
        let held = matches!(interest, Interest::Held { .. });
        if self.serves && held != self.held {
            let mut ranges = lock(&self.shared.ranges);
            let count = counted_in(&mut ranges, self.serves && !self.held);
            *count = count.saturating_sub(1);
            self.held = held;
            *counted_in(&mut ranges, self.serves && !self.held) += 1;
            self.shared.settle(&mut ranges);
        }
        let mut view = lock(&self.view);
        view.drop_changes(|change| !interest.wants(change.as_ref()));
        view.interest = interest;
    }

    /// Tells the view that its owner read the range at `revision`: changes up to it are
    /// dropped, and a [`Seen::Gap`] is resolved if the read is recent enough.
    pub fn read_at(&mut self, revision: i64) {
        let mut view = lock(&self.view);
        view.read = Some(view.read.map_or(revision, |read| read.max(revision)));
        if view.gap.is_some_and(|gap| revision >= gap) {
            view.gap = None;
        }
        view.drop_changes(|change| change.mod_revision <= revision);
        self.retry.reset();
    }

    /// The next changes, or a [`Seen::Gap`].
    pub async fn next(&mut self) -> Seen {
        poll_fn(|cx| {
            let mut view = lock(&self.view);
            if view.read.is_none() || view.gap.is_some() {
                return Poll::Ready(Seen::Gap);
            }
            if !view.changes.is_empty() {
                return Poll::Ready(Seen::Changes(std::mem::take(&mut view.changes)));
            }
            if !view.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                view.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    /// Whether another view follows the range too. Never waits: `false` while the hub holds
    /// its lock (delivering a large response), so that a caller on a leader's path to
    /// noticing a loss is never held up by it.
    pub fn shared(&self) -> bool {
        self.shared.ranges.try_lock().is_ok_and(|ranges| {
            ranges
                .get(&self.range)
                .is_some_and(|range| range.views.len() > 1)
        })
    }

    /// Sleeps before the owner's next read after a failed one, longer after each failure.
    pub async fn pause(&mut self) {
        self.retry.pause().await;
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let mut ranges = lock(&self.shared.ranges);
        if let Some(range) = ranges.get_mut(&self.range) {
            range.views.retain(|view| !Arc::ptr_eq(view, &self.view));
            if range.views.is_empty() {
                ranges.remove(&self.range);
            }
        }
        let count = counted_in(&mut ranges, self.serves && !self.held);
        *count = count.saturating_sub(1);
        self.shared.settle(&mut ranges);
    }
}

/// The count of the views that keep the watch going a view is in: `serving` for a view of a
/// campaign (not a leader's of its own key), else `always`.
fn counted_in(ranges: &mut Ranges, serving: bool) -> &mut usize {
    match serving {
        true => &mut ranges.serving,
        false => &mut ranges.always,
    }
}

/// Back-off for re-establishing a watch, or reading again: from [`RETRY_INITIAL`] up to
/// [`RETRY_MAX`].
pub(super) fn retries() -> Retries {
    Retries::new(Backoff {
        initial: RETRY_INITIAL,
        max: RETRY_MAX,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_belongs_to_the_range_up_to_its_first_separator() {
        let hub = Shared::new("app@1/");
        assert_eq!(
            hub.range_of(b"app@1/jobs@7f.1"),
            Some(&b"app@1/jobs@"[..]),
            "a separator in the prefix does not count"
        );
        assert_eq!(hub.range_of(b"app@1/jobs"), None);
        assert_eq!(hub.range_of(b"other/jobs@7f"), None);
        assert_eq!(Shared::new("").range_of(b"a/b@1"), Some(&b"a/b@"[..]));
    }

    fn change(key: &str, deleted: bool, revision: i64) -> Change {
        Change {
            key: key.as_bytes().to_vec(),
            deleted,
            create_revision: if deleted { 0 } else { revision },
            mod_revision: revision,
        }
    }

    fn view() -> View {
        View {
            interest: Interest::Everything,
            read: Some(10),
            changes: Vec::new(),
            gap: None,
            waker: None,
        }
    }

    #[test]
    fn a_view_keeps_what_its_owner_wants_after_its_read() {
        let mut view = view();
        // What the view does not keep is no news: the hub wakes its owner only for news.
        assert!(!view.push(change("e@a", false, 9)));
        assert!(!view.push(change("e@a", false, 10)));
        assert!(view.push(change("e@a", false, 11)));
        assert_eq!(
            view.changes.len(),
            1,
            "changes up to the read are in the read"
        );
        view.interest = Interest::Deletes(vec![b"e@b".to_vec()]);
        assert!(!view.takes(change("e@a", true, 12).as_ref()));
        assert!(!view.push(change("e@a", true, 12)));
        assert!(!view.push(change("e@b", false, 13)));
        assert!(view.takes(change("e@b", true, 14).as_ref()));
        assert!(view.push(change("e@b", true, 14)));
        let kept: Vec<i64> = view.changes.iter().map(|c| c.mod_revision).collect();
        assert_eq!(kept, [11, 14]);
        view.interest = Interest::Nothing;
        assert!(!view.push(change("e@b", true, 15)));
    }

    /// Counts its wakes.
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    impl Wakes {
        fn count(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// A view of `range` in `hub` with `interest`, read at 10, waiting on a waker that counts.
    fn waiting(hub: &Shared, range: &str, interest: Interest) -> (SharedView, Arc<Wakes>) {
        let wakes = Arc::new(Wakes(0.into()));
        let view = Arc::new(Mutex::new(View {
            interest,
            waker: Some(std::task::Waker::from(wakes.clone())),
            ..view()
        }));
        lock(&hub.ranges)
            .entry(range.as_bytes().into())
            .or_default()
            .views
            .push(view.clone());
        (view, wakes)
    }

    /// Lets `wakes` count the next wake of `view` too (a wake takes the waker).
    fn rearm(view: &SharedView, wakes: &Arc<Wakes>) {
        lock(view).waker = Some(std::task::Waker::from(wakes.clone()));
    }

    /// A watch event of `key`, at `revision`.
    fn delivered(key: &str, deleted: bool, revision: i64) -> Delivered<'_> {
        Delivered {
            change: ChangeRef {
                key: key.as_bytes(),
                deleted,
                create_revision: if deleted { 0 } else { revision },
                mod_revision: revision,
            },
            value: b"",
        }
    }

    #[test]
    fn only_a_view_with_news_wakes_its_owner() {
        let hub = Shared::new("");
        let (follower, follower_wakes) =
            waiting(&hub, "e@", Interest::Deletes(vec![b"e@b".to_vec()]));
        let (leader, leader_wakes) = waiting(&hub, "e@", Interest::Everything);
        hub.deliver_changes([delivered("e@c", false, 11)].into_iter());
        assert_eq!(
            leader_wakes.count(),
            1,
            "the leader's view takes every change"
        );
        assert_eq!(
            follower_wakes.count(),
            0,
            "a write of another key is no news to a follower waiting for its predecessor"
        );
        assert!(lock(&follower).changes.is_empty());
        for (view, wakes) in [(&follower, &follower_wakes), (&leader, &leader_wakes)] {
            rearm(view, wakes);
        }
        hub.deliver_changes([delivered("e@b", true, 12)].into_iter());
        assert_eq!(
            follower_wakes.count(),
            1,
            "its predecessor's delete wakes the follower"
        );
        assert_eq!(leader_wakes.count(), 2);
        assert_eq!(lock(&follower).changes.len(), 1);
    }

    #[test]
    fn an_observer_of_the_holder_wakes_only_for_what_can_change_the_holder() {
        let hub = Shared::new("");
        let (observer, wakes) = waiting(&hub, "e@", Interest::Holder(Some(digest(b"e@a"))));
        hub.deliver_changes([delivered("e@c", false, 11), delivered("e@b", true, 12)].into_iter());
        assert_eq!(
            wakes.count(),
            0,
            "another candidate joining or leaving the line is no news of the holder"
        );
        assert!(lock(&observer).changes.is_empty());
        hub.deliver_changes([delivered("e@a", false, 13)].into_iter());
        assert_eq!(
            wakes.count(),
            1,
            "the holder's key written again (a proclaim)"
        );
        rearm(&observer, &wakes);
        hub.deliver_changes([delivered("e@a", true, 14)].into_iter());
        assert_eq!(wakes.count(), 2, "the holder's delete");
        assert_eq!(lock(&observer).changes.len(), 2);

        let (empty, empty_wakes) = waiting(&hub, "f@", Interest::Holder(None));
        hub.deliver_changes([delivered("f@a", true, 15)].into_iter());
        assert_eq!(
            empty_wakes.count(),
            0,
            "a delete cannot give an empty range a holder"
        );
        hub.deliver_changes([delivered("f@a", false, 16)].into_iter());
        assert_eq!(
            empty_wakes.count(),
            1,
            "a first key in an empty range is its holder"
        );
        assert_eq!(lock(&empty).changes.len(), 1);
    }

    #[test]
    fn a_leaders_view_wakes_only_for_what_can_end_its_hold() {
        let hub = Shared::new("");
        let (leader, wakes) = waiting(
            &hub,
            "e@",
            Interest::Held {
                key: digest(b"e@a"),
                created: 10,
            },
        );
        let mut proclaim = delivered("e@a", false, 12);
        proclaim.change.create_revision = 10;
        hub.deliver_changes(
            [
                delivered("e@b", false, 11),
                proclaim,
                delivered("e@b", true, 13),
            ]
            .into_iter(),
        );
        assert_eq!(
            wakes.count(),
            0,
            "a candidate joining and leaving the line behind it, and its own proclaim, are no news to a leader"
        );
        let mut ahead = delivered("e@0", false, 14);
        ahead.change.create_revision = 9;
        hub.deliver_changes([ahead].into_iter());
        assert_eq!(
            wakes.count(),
            1,
            "a key created before its own is ahead of it"
        );
        rearm(&leader, &wakes);
        hub.deliver_changes([delivered("e@a", true, 15)].into_iter());
        assert_eq!(wakes.count(), 2, "its own key's delete");
        assert_eq!(lock(&leader).changes.len(), 2);
    }

    #[test]
    fn a_view_emptied_by_its_owners_read_keeps_no_room_for_changes() {
        let hub = Shared::new("");
        let (view, _) = waiting(&hub, "e@", Interest::Everything);
        hub.deliver_changes([delivered("e@a", false, 11), delivered("e@a", false, 12)].into_iter());
        lock(&view).drop_changes(|change| change.mod_revision <= 11);
        assert_eq!(
            lock(&view).changes.len(),
            1,
            "the change after the read stays"
        );
        lock(&view).drop_changes(|change| change.mod_revision <= 12);
        assert_eq!(
            lock(&view).changes.capacity(),
            0,
            "an idle leader's view holds no room for changes"
        );
    }

    #[test]
    fn every_view_of_a_range_gets_a_responses_changes_after_its_read_in_order() {
        let hub = Shared::new("");
        let (one, one_wakes) = waiting(&hub, "e@", Interest::Everything);
        let (two, two_wakes) = waiting(&hub, "f@", Interest::Everything);
        let (also_one, also_one_wakes) = waiting(&hub, "e@", Interest::Everything);
        // One response whose changes alternate between the two ranges (a revoke of a lease
        // that both elections' keys are bound to), past the view's read at 10 and before.
        hub.deliver_changes(
            [
                delivered("e@a", true, 9),
                delivered("e@a", false, 11),
                delivered("f@a", false, 11),
                delivered("e@b", false, 12),
                delivered("f@b", true, 12),
                delivered("e@a", true, 13),
            ]
            .into_iter(),
        );
        let seen = |view: &SharedView| {
            lock(view)
                .changes
                .iter()
                .map(|c| (String::from_utf8_lossy(&c.key).into_owned(), c.mod_revision))
                .collect::<Vec<_>>()
        };
        let e = vec![("e@a".into(), 11), ("e@b".into(), 12), ("e@a".into(), 13)];
        assert_eq!(
            seen(&one),
            e,
            "in revision order, none at or before the read"
        );
        assert_eq!(seen(&also_one), e);
        assert_eq!(seen(&two), vec![("f@a".into(), 11), ("f@b".into(), 12)]);
        for wakes in [&one_wakes, &two_wakes, &also_one_wakes] {
            assert_eq!(wakes.count(), 1, "each owner is woken");
        }
    }

    #[test]
    fn an_empty_range_is_known_inline_until_a_first_key_comes() {
        let empty = Holding::Empty(10);
        let late = empty.after(change("e@a", false, 9).as_ref(), b"");
        assert_eq!(
            late.at(),
            Some(10),
            "a change the read already showed changes nothing"
        );
        let still = late.after(change("e@a", true, 11).as_ref(), b"");
        assert!(
            matches!(still, Holding::Empty(11)),
            "a delete leaves it empty"
        );
        let held = still.after(change("e@b", false, 12).as_ref(), b"");
        let known = held.known().expect("known");
        assert_eq!(
            known.holder.map(|(key, _)| key),
            Some(b"e@b".to_vec()),
            "a first key in an empty range holds it"
        );
        assert_eq!(known.at, 12);
        let gone = held.after(change("e@b", true, 13).as_ref(), b"");
        assert!(
            gone.known().is_none(),
            "the holder's delete makes it unknown: the next in line needs a read"
        );
    }

    #[test]
    fn the_holder_is_kept_known_until_its_key_goes() {
        let value = |id: &str| {
            Leader {
                candidate: crate::backend::Candidate {
                    id: id.to_owned(),
                    metadata: Default::default(),
                },
                fencing_token: None,
                since_unix_ms: None,
            }
            .to_bytes()
        };
        let id = |known: &Option<Box<Known>>| {
            known.as_ref().map(|k| {
                k.holder
                    .as_ref()
                    .map(|(_, leader)| (leader.candidate.id.clone(), leader.fencing_token))
            })
        };
        let empty = Box::new(Known {
            holder: None,
            at: 10,
            created: 0,
        });
        let first = empty.after(change("e@a", false, 11).as_ref(), &value("a"));
        assert_eq!(
            id(&first),
            Some(Some(("a".into(), Some(11)))),
            "a first key leads"
        );
        let behind = first.and_then(|k| k.after(change("e@b", false, 12).as_ref(), &value("b")));
        assert_eq!(
            id(&behind),
            Some(Some(("a".into(), Some(11)))),
            "b queues behind a"
        );
        let follower_gone = behind.and_then(|k| k.after(change("e@b", true, 13).as_ref(), &[]));
        assert_eq!(follower_gone.as_ref().map(|k| k.at), Some(13));
        let proclaimed =
            follower_gone.and_then(|k| k.after(change_of("e@a", 11, 14).as_ref(), &value("a2")));
        assert_eq!(
            id(&proclaimed),
            Some(Some(("a2".into(), Some(11)))),
            "the holder's value is rewritten, its token stays"
        );
        let late = proclaimed.and_then(|k| k.after(change_of("e@z", 9, 9).as_ref(), &value("z")));
        assert_eq!(
            id(&late),
            Some(Some(("a2".into(), Some(11)))),
            "a change the knowledge already holds (the watch lagging a read) changes nothing"
        );
        let gone = late.and_then(|k| k.after(change("e@a", true, 15).as_ref(), &[]));
        assert!(gone.is_none(), "who is next needs a read");
    }

    /// A write of a key created at `created`, at `revision`.
    fn change_of(key: &str, created: i64, revision: i64) -> Change {
        Change {
            create_revision: created,
            ..change(key, false, revision)
        }
    }

    #[test]
    fn a_view_that_overflows_asks_for_a_read_after_the_newest_change() {
        let mut view = view();
        for revision in 11..11 + MAX_PENDING as i64 + 5 {
            view.push(change("e@a", false, revision));
        }
        assert_eq!(view.gap, Some(11 + MAX_PENDING as i64));
        assert_eq!(
            view.changes.len(),
            4,
            "later changes are kept for after the read"
        );
    }

    fn runs(hub: &Shared) -> bool {
        *hub.followed.borrow()
    }

    /// Counts a view in, or out (`-1`), as making or dropping one does.
    fn count_view(hub: &Shared, serving: bool, delta: isize) {
        let mut ranges = lock(&hub.ranges);
        let count = counted_in(&mut ranges, serving);
        *count = count.saturating_add_signed(delta);
        hub.settle(&mut ranges);
    }

    #[test]
    fn the_watch_pauses_once_every_campaign_was_asked_and_only_their_views_are_left() {
        let hub = Shared::new("/p/");
        // Two session handles, three views of their campaigns.
        hub.count_unasked(1);
        hub.count_unasked(1);
        for _ in 0..3 {
            count_view(&hub, true, 1);
        }
        assert!(runs(&hub));
        hub.count_unasked(-1);
        assert!(
            runs(&hub),
            "one campaign was not asked: the views keep the watch"
        );
        hub.count_unasked(-1);
        assert!(!runs(&hub), "every campaign was asked");
        // A leader's view of its own key, or an observer of its own, keeps it whatever.
        count_view(&hub, false, 1);
        assert!(runs(&hub));
        count_view(&hub, false, -1);
        assert!(!runs(&hub));
        // A campaign started afterwards keeps it again.
        hub.count_unasked(1);
        assert!(runs(&hub));
        // No view left: paused, whoever is unasked.
        for _ in 0..3 {
            count_view(&hub, true, -1);
        }
        assert!(!runs(&hub), "no view follows a range");
    }

    #[test]
    fn a_paused_watch_forgets_the_holders_it_no_longer_keeps_up_to_date() {
        let hub = Shared::new("/p/");
        hub.count_unasked(1);
        count_view(&hub, true, 1);
        lock(&hub.ranges)
            .entry(Arc::from(&b"/p/e@"[..]))
            .or_default()
            .known = Holding::Empty(5);
        hub.count_unasked(-1);
        assert!(!runs(&hub));
        let ranges = lock(&hub.ranges);
        assert!(
            ranges
                .get(&b"/p/e@"[..])
                .is_some_and(|r| r.known.at().is_none()),
            "a holder known while paused would be stale by the time the watch resumes"
        );
    }
}
