//! A `tracing` layer that panics: a misbehaving subscriber, or any bug, unwinding the task
//! that logs (`tests/campaign_panic.rs`, `tests/set_panic.rs`).

use std::sync::atomic::{AtomicBool, Ordering};

/// Panics on the first event whose message is the one given.
pub struct PanicOn {
    message: &'static str,
    fired: AtomicBool,
}

impl PanicOn {
    /// A layer that panics on the first event whose message is `message`.
    pub fn new(message: &'static str) -> PanicOn {
        PanicOn {
            message,
            fired: AtomicBool::new(false),
        }
    }
}

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
        if message.0 == self.message && !self.fired.swap(true, Ordering::SeqCst) {
            panic!("a subscriber panics on {:?}", self.message);
        }
    }
}
