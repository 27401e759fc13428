//! A small unbounded queue with one receiver: events to subscribers, commands to a campaign,
//! term guards, and etcd's watch responses. It depends on nothing of the crate but
//! `backend::lock`, so every floor above the backend contract may use it.

use std::fmt;
use std::sync::Arc;

use crate::backend::lock;

/// An unbounded queue with one receiver: what carries events to each subscriber, commands to
/// a campaign, and watch responses to each etcd watch.
///
/// tokio's `mpsc` channel costs about 1.3 to 1.9 KB each, allocated when it is made (its
/// shared state is cache-padded, and its first block of 32 slots comes with it); a campaign
/// had three and an etcd watch one, which was half of what an idle election held. This one
/// holds a `VecDeque` that grows only when something is queued, behind a mutex: the queues
/// here carry a few items per term, never a stream.
///
/// It closes (`recv` returns `None` once empty) when every sender is gone; `send` fails once
/// the receiver is gone.
pub(crate) fn queue<T>() -> (QueueSender<T>, QueueReceiver<T>) {
    let shared = Arc::new(std::sync::Mutex::new(QueueState {
        items: std::collections::VecDeque::new(),
        dropped: 0,
        senders: 1,
        receiver: true,
        waker: None,
    }));
    (
        QueueSender {
            shared: shared.clone(),
        },
        QueueReceiver { shared },
    )
}

struct QueueState<T> {
    items: std::collections::VecDeque<T>,
    /// Items dropped by [`QueueSender::send_bounded`].
    dropped: u64,
    /// How many senders are left: a `u32`, so that with `receiver` it packs into 8 bytes,
    /// and a queue's shared state fits a smaller size class (a campaign's event queues are
    /// one per election).
    senders: u32,
    receiver: bool,
    waker: Option<std::task::Waker>,
}

/// The sending half of a [`queue`]; cloning it adds a sender.
pub(crate) struct QueueSender<T> {
    shared: Arc<std::sync::Mutex<QueueState<T>>>,
}

/// The receiving half of a [`queue`].
pub(crate) struct QueueReceiver<T> {
    shared: Arc<std::sync::Mutex<QueueState<T>>>,
}

impl<T> fmt::Debug for QueueSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueSender").finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for QueueReceiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueReceiver").finish_non_exhaustive()
    }
}

impl<T> QueueSender<T> {
    /// Queues `item`; gives it back if the receiver is gone.
    pub(crate) fn send(&self, item: T) -> Result<(), T> {
        self.send_bounded(item, usize::MAX)
    }

    /// Queues `item`, dropping the oldest item first while `capacity` are queued (counted,
    /// see [`QueueReceiver::dropped`]); gives it back if the receiver is gone.
    pub(crate) fn send_bounded(&self, item: T, capacity: usize) -> Result<(), T> {
        let mut state = lock(&self.shared);
        if !state.receiver {
            return Err(item);
        }
        while state.items.len() >= capacity.max(1) {
            state.items.pop_front();
            state.dropped += 1;
        }
        state.items.push_back(item);
        let waker = state.waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Clone for QueueSender<T> {
    fn clone(&self) -> Self {
        lock(&self.shared).senders += 1;
        QueueSender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for QueueSender<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.senders -= 1;
        let waker = match state.senders {
            0 => state.waker.take(),
            _ => None,
        };
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> QueueReceiver<T> {
    /// How many items [`QueueSender::send_bounded`] dropped unread.
    pub(crate) fn dropped(&self) -> u64 {
        lock(&self.shared).dropped
    }

    /// The next item; `None` once the queue is empty and every sender is gone.
    pub(crate) fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        let mut state = lock(&self.shared);
        if let Some(item) = state.items.pop_front() {
            return std::task::Poll::Ready(Some(item));
        }
        if state.senders == 0 {
            return std::task::Poll::Ready(None);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        std::task::Poll::Pending
    }

    /// The next item; `None` once the queue is empty and every sender is gone. Cancel-safe:
    /// an item is taken only when it is returned.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl<T> Drop for QueueReceiver<T> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.receiver = false;
        let items = std::mem::take(&mut state.items);
        drop(state);
        drop(items);
    }
}

/// The subscribers of a stream of events: each has a queue of its own, which keeps at most
/// `capacity` unread items (a subscriber that reads none does not hold memory without end).
/// A subscriber whose queue is full or gone is dropped. Cheap to clone (an `Arc` inside).
pub(crate) struct Fanout<T> {
    subscribers: Arc<std::sync::Mutex<Vec<QueueSender<T>>>>,
    capacity: usize,
}

impl<T> Clone for Fanout<T> {
    fn clone(&self) -> Self {
        Fanout {
            subscribers: self.subscribers.clone(),
            capacity: self.capacity,
        }
    }
}

impl<T> fmt::Debug for Fanout<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fanout")
            .field("subscribers", &lock(&self.subscribers).len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl<T: Clone> Fanout<T> {
    /// No subscribers yet; each will keep at most `capacity` unread items.
    pub(crate) fn new(capacity: usize) -> Self {
        Fanout {
            subscribers: Arc::default(),
            capacity,
        }
    }

    /// A new subscriber, from now on.
    pub(crate) fn add(&self) -> QueueReceiver<T> {
        let (tx, rx) = queue();
        let mut subscribers = lock(&self.subscribers);
        // Room for exactly this one: most fanouts (a campaign's events) have one or two
        // subscribers for good, and there are as many fanouts as elections.
        subscribers.reserve_exact(1);
        subscribers.push(tx);
        rx
    }

    /// Queues `item` for every subscriber.
    pub(crate) fn send(&self, item: &T) {
        let capacity = self.capacity;
        lock(&self.subscribers).retain(|queue| queue.send_bounded(item.clone(), capacity).is_ok());
    }

    /// Ends every subscriber's stream (once it has read what is queued).
    pub(crate) fn close(&self) {
        lock(&self.subscribers).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::queue;

    #[tokio::test]
    async fn a_queue_delivers_in_order_and_closes_when_every_sender_is_gone() {
        let (tx, mut rx) = queue();
        let other = tx.clone();
        tx.send(1).unwrap();
        other.send(2).unwrap();
        drop(tx);
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        let waiting = tokio::spawn(async move { rx.recv().await });
        tokio::task::yield_now().await;
        drop(other);
        assert_eq!(waiting.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_bounded_queue_keeps_the_newest_and_counts_what_it_dropped() {
        let (tx, mut rx) = queue();
        for i in 0..10 {
            tx.send_bounded(i, 3).unwrap();
        }
        assert_eq!(rx.dropped(), 7);
        assert_eq!(rx.recv().await, Some(7));
        assert_eq!(rx.recv().await, Some(8));
        assert_eq!(rx.recv().await, Some(9));
    }

    #[test]
    fn sending_to_a_queue_whose_receiver_is_gone_gives_the_item_back() {
        let (tx, rx) = queue();
        drop(rx);
        assert_eq!(tx.send("event"), Err("event"));
    }
}
