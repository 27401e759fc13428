//! Watches: every watch of a backend multiplexed on one gRPC stream ([`Hub`]), a watch that
//! resumes where its owner's last read left off ([`Follow`]), and the back-off between
//! attempts to re-establish one.
//!
//! One stream per backend, not one per watch: a thousand elections on one backend cost a
//! thousand small entries in a map here and on the server, not a thousand HTTP/2 streams
//! with their buffers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Event, WatchClient, WatchFilterType, WatchOptions, WatchResponse, WatchStream};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::{Instant, timeout_at};

use super::{EtcdBackend, error};
use crate::Result;
use crate::backoff::{Backoff, Retries};
use crate::queue::{QueueReceiver, QueueSender, queue};

/// The first pause before re-establishing a broken watch.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// The longest pause between attempts: a store that stays down is tried this often.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// The one watch stream of an [`EtcdBackend`], shared by all its watches.
///
/// A task owns the stream: it is opened with the first watch, routes each response to its
/// watch by watch id (ids are chosen here, so a response can never be matched to the wrong
/// watch), and ends when the backend is dropped. When the stream breaks, every watch on it is
/// told, and the next watch opens a new stream.
#[derive(Debug, Default)]
pub(super) struct Hub {
    /// Requests to the task that owns the current stream; closed once that task ended.
    requests: Mutex<Option<UnboundedSender<Request>>>,
    /// The last watch id handed out. Ids are never reused, not even across streams.
    last_id: AtomicI64,
}

impl Hub {
    /// A channel to the stream's task, starting a new task if there is none or it ended.
    fn requests(&self, backend: &EtcdBackend) -> UnboundedSender<Request> {
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        match requests.as_ref() {
            Some(sender) if !sender.is_closed() => sender.clone(),
            _ => {
                let (sender, receiver) = unbounded_channel();
                let client = backend.inner.client.watch_client();
                tokio::spawn(run_stream(client, receiver, backend.request_timeout()));
                *requests = Some(sender.clone());
                sender
            }
        }
    }

    fn next_id(&self) -> i64 {
        self.last_id.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// What a watch asks of the stream's task.
enum Request {
    Create {
        id: i64,
        key: Vec<u8>,
        options: WatchOptions,
        route: QueueSender<Message>,
    },
    Cancel {
        id: i64,
    },
}

/// What the stream's task tells one watch.
#[derive(Debug)]
enum Message {
    /// The watch exists; it reports every change after `revision`, the store's revision when
    /// it was created.
    Created { revision: i64 },
    /// Events, in revision order (possibly none: a progress report).
    Events(Vec<Event>),
    /// The server cancelled this watch.
    Cancelled(String),
    /// The stream broke or could not be opened: every watch on it is gone.
    Broken(String),
}

/// Owns one watch stream until the backend is dropped or the stream breaks.
async fn run_stream(
    mut client: WatchClient,
    mut requests: UnboundedReceiver<Request>,
    limit: Duration,
) {
    let mut routes: HashMap<i64, QueueSender<Message>> = HashMap::new();
    // etcd opens a watch stream with its first watch.
    let mut stream: WatchStream = loop {
        let Some(request) = requests.recv().await else {
            return;
        };
        // A cancel before any stream is open has nothing to cancel.
        let Request::Create {
            id,
            key,
            options,
            route,
        } = request
        else {
            continue;
        };
        let opening = client.watch(key, Some(options.with_watch_id(id)));
        match error::within(limit, "opening the watch stream", opening).await {
            Ok(stream) => {
                routes.insert(id, route);
                break stream;
            }
            Err(e) => {
                // Watches queued behind this one see their channel close: the same news.
                let _ = route.send(Message::Broken(e.to_string()));
                return;
            }
        }
    };
    let broken = loop {
        tokio::select! {
            request = requests.recv() => match request {
                // The backend is gone: dropping the stream cancels it on the server.
                None => return,
                Some(Request::Create { id, key, options, route }) => {
                    routes.insert(id, route);
                    let adding = stream.watch(key, Some(options.with_watch_id(id)));
                    if let Err(e) = error::within(limit, "adding a watch", adding).await {
                        break e.to_string();
                    }
                }
                Some(Request::Cancel { id }) => {
                    if routes.remove(&id).is_some() {
                        let cancelling = stream.cancel(id);
                        if let Err(e) = error::within(limit, "cancelling a watch", cancelling).await {
                            break e.to_string();
                        }
                    }
                }
            },
            message = stream.message() => match message {
                Ok(Some(response)) => deliver(&mut routes, response),
                Ok(None) => break "the server closed the watch stream".to_owned(),
                Err(e) => break error::from_client(e).to_string(),
            },
        }
    };
    tracing::debug!(watches = routes.len(), reason = %broken, "the watch stream broke");
    for route in routes.into_values() {
        let _ = route.send(Message::Broken(broken.clone()));
    }
}

/// Passes one response to its watch.
fn deliver(routes: &mut HashMap<i64, QueueSender<Message>>, response: WatchResponse) {
    let id = response.watch_id();
    let message = if response.canceled() {
        let reason = match response.compact_revision() {
            0 => format!("the watch was cancelled: {}", response.cancel_reason()),
            compacted => format!(
                "the watch was cancelled: its start revision is compacted (up to {compacted})"
            ),
        };
        Message::Cancelled(reason)
    } else if response.created() {
        Message::Created {
            revision: response.header().map_or(0, |h| h.revision()),
        }
    } else {
        Message::Events(response.events().to_vec())
    };
    let cancelled = matches!(message, Message::Cancelled(_));
    let Some(route) = routes.get(&id) else {
        // Cancelled by its owner meanwhile, or a stream-wide progress report.
        return;
    };
    // A closed route is left alone: its owner's cancel is on its way, and must find it to
    // cancel the watch on the server too.
    let _ = route.send(message);
    if cancelled {
        routes.remove(&id);
    }
}

/// What a [`Follow`] watches.
#[derive(Clone, Debug)]
pub(super) enum Target {
    /// One key.
    Key(Vec<u8>),
    /// Every key that starts with these bytes.
    Prefix(Vec<u8>),
    /// Every key from the first to the second, both included.
    Between(Vec<u8>, Vec<u8>),
}

/// What [`Follow::next`] saw.
#[derive(Debug)]
pub(super) enum Seen {
    /// Events on the targets, in revision order.
    Events(Vec<Event>),
    /// The watch was just created: read the targets again and pass the read's revision to
    /// [`read_at`](Follow::read_at); until then, [`next`](Follow::next) says `Gap` again.
    /// Changes between the owner's earlier read and the watch's creation are in that read,
    /// not in the watch. The watch reports every change after its creation, so a change may
    /// be both in the read and reported afterwards.
    Gap,
}

/// Changes to some keys after the owner's last read of them, on the backend's one watch
/// stream. The watch is created when first needed, in one of two ways ([`Start`]):
///
/// - [`Start::Now`], for a wait whose latency matters (a follower's): the watch starts from
///   "now", and the owner reads again once the server confirms it ([`Seen::Gap`]). A watch
///   from just after the owner's read would see the same changes, but etcd serves a watch
///   that starts in the past from a catch-up loop that runs every 100 ms, so a change made
///   between the read and the watch's creation (a hand-off, typically) would reach the owner
///   up to 100 ms late. The header of etcd's answer cannot tell when that happened (etcd
///   reads the revision it reports before it registers the watch), so the read after the
///   creation is unconditional: one read per watch, off the critical path of a hand-off
///   unless the hand-off raced the watch.
/// - [`Start::After`], where a rare delay of up to 100 ms does not matter (a leader noticing
///   an operator's delete, an observer): the watch replays the changes since the owner's
///   read, and needs no second read. If etcd compacted that history meanwhile, the watch is
///   cancelled and the owner reads again.
///
/// Cancel-safe: dropping a `next` future loses nothing, and the watch stays open for the
/// next call. Dropping the `Follow` cancels its watches.
pub(super) struct Follow {
    backend: EtcdBackend,
    targets: Vec<Target>,
    deletes_only: bool,
    start: Start,
    open: Option<Open>,
    retry: Retries,
}

/// The watches of a [`Follow`] on the stream; cancelled when dropped.
struct Open {
    ids: Vec<i64>,
    messages: QueueReceiver<Message>,
    requests: UnboundedSender<Request>,
    /// Watches whose creation the server has not confirmed yet.
    unconfirmed: usize,
    /// When an unconfirmed creation counts as failed.
    deadline: Instant,
    /// The latest revision at which one of the watches was created.
    created: i64,
    /// The owner read the targets after every watch was created.
    read_since: bool,
}

/// Where a [`Follow`]'s watch starts.
#[derive(Clone, Copy, Debug)]
pub(super) enum Start {
    /// From the store's revision when the watch is created, followed by a read.
    Now,
    /// From this revision (the owner's last read's, plus one).
    After(i64),
}

impl Drop for Open {
    fn drop(&mut self) {
        for &id in &self.ids {
            let _ = self.requests.send(Request::Cancel { id });
        }
    }
}

impl Follow {
    /// Follows `targets` from `start`; only their deletes if `deletes_only`.
    pub fn new(
        backend: &EtcdBackend,
        targets: Vec<Target>,
        deletes_only: bool,
        start: Start,
    ) -> Follow {
        Follow {
            backend: backend.clone(),
            targets,
            deletes_only,
            start,
            open: None,
            retry: retries(),
        }
    }

    /// The next events, or a [`Seen::Gap`]. `Err` when the watch cannot be created, the
    /// stream breaks, or the server cancels the watch: [`pause`](Follow::pause), read again,
    /// and pass the read's revision to [`read_at`](Follow::read_at); the next call creates
    /// the watch again.
    pub async fn next(&mut self) -> Result<Seen> {
        let limit = self.backend.request_timeout();
        let open = match &mut self.open {
            Some(open) => open,
            None => self.open.insert(self.create()?),
        };
        loop {
            if open.unconfirmed == 0 && !open.read_since {
                return Ok(Seen::Gap);
            }
            let message = if open.unconfirmed > 0 {
                // Boxed: only until the watch is confirmed; the idle wait below is what
                // an election's future should hold room for.
                match Box::pin(timeout_at(open.deadline, open.messages.recv())).await {
                    Ok(message) => message,
                    Err(_) => {
                        self.open = None;
                        return Err(error::unavailable(format!(
                            "creating a watch: no answer within {limit:?}"
                        )));
                    }
                }
            } else {
                open.messages.recv().await
            };
            match message {
                Some(Message::Created { revision }) => {
                    open.unconfirmed = open.unconfirmed.saturating_sub(1);
                    open.created = open.created.max(revision);
                    if open.unconfirmed == 0 {
                        self.retry.reset();
                    }
                }
                Some(Message::Events(events)) if events.is_empty() => {}
                Some(Message::Events(events)) => {
                    if let (Start::After(next), Some(last)) = (
                        &mut self.start,
                        events
                            .iter()
                            .filter_map(|e| e.kv())
                            .map(|kv| kv.mod_revision())
                            .max(),
                    ) {
                        *next = (*next).max(last + 1);
                    }
                    return Ok(Seen::Events(events));
                }
                Some(Message::Cancelled(reason)) => {
                    self.open = None;
                    return Err(error::unavailable(reason));
                }
                Some(Message::Broken(reason)) => {
                    self.open = None;
                    return Err(error::unavailable(format!(
                        "the watch stream broke: {reason}"
                    )));
                }
                None => {
                    self.open = None;
                    return Err(error::unavailable("the watch stream closed"));
                }
            }
        }
    }

    /// Sleeps before the next attempt to re-establish the watch, longer after each failure.
    pub async fn pause(&mut self) {
        self.retry.pause().await;
    }

    /// Tells the watch that its owner read the targets at `revision`. Resolves a
    /// [`Seen::Gap`] when the read is at least as recent as the watch; a watch that starts
    /// [`After`](Start::After) a revision is created again from this read on.
    pub fn read_at(&mut self, revision: i64) {
        if let Start::After(next) = &mut self.start {
            *next = (*next).max(revision + 1);
        }
        if let Some(open) = self.open.as_mut()
            && open.unconfirmed == 0
            && revision >= open.created
        {
            open.read_since = true;
        }
    }

    /// Asks the stream's task for one watch per target, all routed to one channel.
    fn create(&self) -> Result<Open> {
        if self.targets.is_empty() {
            return Err(error::store("nothing to watch"));
        }
        let hub = &self.backend.inner.watches;
        let requests = hub.requests(&self.backend);
        let (route, messages) = queue();
        let mut open = Open {
            ids: Vec::with_capacity(self.targets.len()),
            messages,
            requests: requests.clone(),
            unconfirmed: self.targets.len(),
            deadline: Instant::now() + self.backend.request_timeout(),
            created: 0,
            // A replaying watch misses nothing since the owner's read.
            read_since: matches!(self.start, Start::After(_)),
        };
        for target in &self.targets {
            let (key, options) = match target {
                Target::Key(key) => (key.clone(), WatchOptions::new()),
                Target::Prefix(key) => (key.clone(), WatchOptions::new().with_prefix()),
                Target::Between(first, last) => {
                    let mut end = last.clone();
                    end.push(0);
                    (first.clone(), WatchOptions::new().with_range(end))
                }
            };
            let mut options = match self.start {
                Start::Now => options,
                Start::After(revision) => options.with_start_revision(revision),
            };
            if self.deletes_only {
                options = options.with_filters([WatchFilterType::NoPut]);
            }
            let id = hub.next_id();
            open.ids.push(id);
            let request = Request::Create {
                id,
                key,
                options,
                route: route.clone(),
            };
            if requests.send(request).is_err() {
                return Err(error::unavailable("the watch stream closed"));
            }
        }
        Ok(open)
    }
}

/// Back-off for re-establishing a watch: from [`RETRY_INITIAL`] up to [`RETRY_MAX`].
pub(super) fn retries() -> Retries {
    Retries::new(Backoff {
        initial: RETRY_INITIAL,
        max: RETRY_MAX,
    })
}
