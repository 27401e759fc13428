//! Workers that ignore their term's cancellation and leave heartbeats, to check that the
//! runner stops them in time: `(fencing token, when)` every 10 ms until aborted.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use incumbent::Term;
use tokio::time::{Instant, sleep};

/// The heartbeats of every stubborn worker of a test.
pub type Beats = Arc<Mutex<Vec<(u64, Instant)>>>;

/// A worker for `Election::run` that ignores cancellation and beats every 10 ms.
pub fn stubborn(
    beats: Beats,
) -> impl FnMut(Term) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send {
    move |term: Term| {
        let beats = beats.clone();
        Box::pin(async move {
            loop {
                beats
                    .lock()
                    .unwrap()
                    .push((term.fencing_token(), Instant::now()));
                sleep(Duration::from_millis(10)).await;
            }
        })
    }
}

/// The token of the first worker that beat, once one has.
pub fn first_token(beats: &Beats) -> Option<u64> {
    beats.lock().unwrap().first().map(|(token, _)| *token)
}

/// The last beat of the worker with `token`.
pub fn last_beat(beats: &Beats, token: u64) -> Option<Instant> {
    let beats = beats.lock().unwrap();
    beats
        .iter()
        .filter(|(t, _)| *t == token)
        .map(|(_, at)| *at)
        .max()
}

/// The first beat of a worker with another token than `token`.
pub fn first_beat_of_another(beats: &Beats, token: u64) -> Option<Instant> {
    let beats = beats.lock().unwrap();
    beats.iter().find(|(t, _)| *t != token).map(|(_, at)| *at)
}
