//! A panic in a campaign's task (here: a `tracing` subscriber that panics) ends its term,
//! says stopped, and ends the event stream. In a file of its own: it installs the process's
//! global subscriber.

use std::sync::atomic::Ordering;
use std::time::Duration;

use incumbent::memory::MemoryBackend;
use incumbent::{Election, Error, Role};
use tokio::time::timeout;

mod support;
use support::events::elected;

const TTL: Duration = Duration::from_secs(3);

fn election(backend: &MemoryBackend, id: &str) -> Election<MemoryBackend> {
    Election::builder(backend.clone(), "jobs/index")
        .candidate(id)
        .ttl(TTL)
        .build()
        .expect("valid settings")
}

/// A `tracing` layer that panics on the first event whose message is `message`: a
/// misbehaving subscriber, or any bug, unwinding the campaign's task.
struct PanicOn(&'static str, std::sync::atomic::AtomicBool);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PanicOn {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0 == self.0 && !self.1.swap(true, Ordering::SeqCst) {
            panic!("a subscriber panics on {:?}", self.0);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_campaign_task_ends_the_term_and_the_stream() {
    use tracing_subscriber::layer::SubscriberExt;
    // The process's only subscriber (this file holds one test): the campaign's task logs
    // through it. A thread-local default would race with tracing's callsite interest cache.
    let subscriber = tracing_subscriber::registry().with(PanicOn(
        "leader changed",
        std::sync::atomic::AtomicBool::new(false),
    ));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let store = MemoryBackend::new();
    let mut a = election(&store.client(), "a").campaign();
    let status = a.status();
    // Elected is sent just before "leader changed" is logged, which panics.
    let term = elected(&mut a, TTL).await;
    let ended = timeout(TTL, async { while a.recv().await.is_some() {} }).await;
    assert!(ended.is_ok(), "the event stream ends with the campaign");
    assert!(
        term.is_cancelled(),
        "the term ends with the task that owned it"
    );
    assert!(term.stop_by().is_some(), "as an involuntary loss");
    assert_eq!(status.borrow().role, Role::Stopped);
    assert!(!status.borrow().is_leader());
    assert!(matches!(a.resign().await, Err(Error::Stopped)));
}
