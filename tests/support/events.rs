//! Waiting for a campaign's events, the same way in every test.

use std::future::Future;
use std::time::Duration;

use incumbent::{Campaign, DemotionReason, Events, LeadershipEvent, SetEvents, Term};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::timeout;

/// Anything that yields one campaign's events, in order.
pub trait EventSource {
    /// The next event; `None` once the campaign has stopped.
    fn next_event(&mut self) -> impl Future<Output = Option<LeadershipEvent>>;
    /// What to show when a wait times out (the campaign's status, where known).
    fn context(&self) -> String {
        String::new()
    }
}

impl EventSource for Campaign {
    async fn next_event(&mut self) -> Option<LeadershipEvent> {
        self.recv().await
    }

    fn context(&self) -> String {
        format!("; status: {:?}", self.status().borrow())
    }
}

impl EventSource for Events {
    async fn next_event(&mut self) -> Option<LeadershipEvent> {
        self.recv().await
    }
}

impl EventSource for UnboundedReceiver<LeadershipEvent> {
    async fn next_event(&mut self) -> Option<LeadershipEvent> {
        self.recv().await
    }
}

/// One election's events among an `ElectionSet`'s ([`member`]): the others' are skipped.
pub struct Member<'a> {
    events: &'a mut SetEvents,
    election: &'a str,
}

/// The events of the set's member `election`, as an [`EventSource`].
pub fn member<'a>(events: &'a mut SetEvents, election: &'a str) -> Member<'a> {
    Member { events, election }
}

impl EventSource for Member<'_> {
    async fn next_event(&mut self) -> Option<LeadershipEvent> {
        loop {
            let event = self.events.recv().await?;
            if &*event.election == self.election {
                return Some(event.event);
            }
        }
    }

    fn context(&self) -> String {
        format!("; election {}", self.election)
    }
}

/// The first event that `pick` accepts, skipping others; panics after `limit`, or if the
/// campaign stops first.
async fn first<S: EventSource, T>(
    source: &mut S,
    limit: Duration,
    what: &str,
    pick: impl Fn(LeadershipEvent) -> Option<T>,
) -> T {
    let found = timeout(limit, async {
        loop {
            match source.next_event().await {
                Some(event) => {
                    if let Some(found) = pick(event) {
                        return found;
                    }
                }
                None => panic!("the campaign stopped before it was {what}"),
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("not {what} within {limit:?}{}", source.context()))
}

/// The next `Elected` term.
pub async fn elected<S: EventSource>(source: &mut S, limit: Duration) -> Term {
    first(source, limit, "elected", |e| match e {
        LeadershipEvent::Elected(term) => Some(term),
        _ => None,
    })
    .await
}

/// The reason of the next `Demoted`.
pub async fn demoted<S: EventSource>(source: &mut S, limit: Duration) -> DemotionReason {
    first(source, limit, "demoted", |e| match e {
        LeadershipEvent::Demoted { reason, .. } => Some(reason),
        _ => None,
    })
    .await
}

/// The next `Demoted`: why, and by when the term's work must stop.
pub async fn demotion<S: EventSource>(
    source: &mut S,
    limit: Duration,
) -> (DemotionReason, Option<tokio::time::Instant>) {
    first(source, limit, "demoted", |e| match e {
        LeadershipEvent::Demoted {
            reason, stop_by, ..
        } => Some((reason, stop_by)),
        _ => None,
    })
    .await
}

/// Whether an `Elected` arrives within `limit`.
pub async fn elected_within<S: EventSource>(source: &mut S, limit: Duration) -> bool {
    timeout(limit, async {
        while let Some(event) = source.next_event().await {
            if let LeadershipEvent::Elected(_) = event {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false)
}

/// The message of the first problem the status reports, within `limit`.
pub async fn problem(
    status: &tokio::sync::watch::Receiver<incumbent::Status>,
    limit: Duration,
) -> String {
    let mut status = status.clone();
    let found = timeout(limit, async {
        loop {
            if let Some(problem) = status.borrow_and_update().problem.clone() {
                return problem.message;
            }
            status.changed().await.expect("the campaign lives");
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no problem reported within {limit:?}"))
}
