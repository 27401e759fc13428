//! Blocking reads of one key that outlive the futures waiting for them, shared by every
//! contender and observer of a backend that asks the same.
//!
//! The campaign selects on [`Contender::lost`](crate::backend::Contender::lost) (and on
//! `wait` and `Observer::next`) next to other events, and drops the future when another
//! branch wins, e.g. at every renewal. Consul keeps serving a blocking query whose client went
//! away until its wait ends, so restarting the query each time would leave one abandoned
//! query per renewal on the agent. Instead the query runs in a task of its own, and the next
//! call with the same index picks up its answer.
//!
//! A follower waits for the key to be free (its contender's `wait`) and reports who holds it
//! (the campaign's observer) at once: two readers of the same key, which ask the same
//! question (a read after the key's last index) almost always. They share one query: the
//! backend keeps the reads in flight by key, index and consistency ([`SharedReads`]), and a
//! reader that asks what another asks already joins it. So each follower holds one blocking
//! query on the agent, not two.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::BLOCKING_WAIT;
use super::client::{ConsulClient, ConsulError, KvResponse, QueryOptions};
use crate::backend::lock;

/// The blocking reads in flight of one backend, by what they ask.
#[derive(Debug, Default)]
pub(super) struct SharedReads(Arc<Mutex<HashMap<Query, Weak<Flight>>>>);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Query {
    key: String,
    index: u64,
    consistent: bool,
}

/// One read in flight; the read is cancelled when the last reader waiting for it lets go.
#[derive(Debug)]
struct Flight {
    query: Query,
    /// `None` until the read ends; then the answer, or `None` on an error (kept in `error`).
    answer: watch::Receiver<Option<Option<KvResponse>>>,
    /// The error of a failed read, for the first reader that collects it.
    error: Mutex<Option<ConsulError>>,
    task: JoinHandle<()>,
    reads: Weak<Mutex<HashMap<Query, Weak<Flight>>>>,
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(reads) = self.reads.upgrade() {
            let mut reads = lock(&reads);
            if reads
                .get(&self.query)
                .is_some_and(|w| w.strong_count() == 0)
            {
                reads.remove(&self.query);
            }
        }
    }
}

impl SharedReads {
    /// The read in flight that asks `query`, or a new one. A read that has ended is not
    /// joined: its answer may be old by now.
    fn join(&self, client: &ConsulClient, query: Query) -> Arc<Flight> {
        // Declared before the guard, so dropped after it: a flight's drop takes the lock.
        let ended: Option<Arc<Flight>>;
        let mut reads = lock(&self.0);
        match reads.get(&query).and_then(Weak::upgrade) {
            Some(flight) if flight.answer.borrow().is_none() => return flight,
            flight => ended = flight,
        }
        let blocking = query.index > 0;
        let options = QueryOptions {
            index: blocking.then_some(query.index),
            wait: blocking.then_some(BLOCKING_WAIT),
            consistent: query.consistent,
        };
        let (tx, answer) = watch::channel(None);
        let flight = Arc::new_cyclic(|me: &Weak<Flight>| {
            let me = me.clone();
            let (client, key) = (client.clone(), query.key.clone());
            let task = tokio::spawn(async move {
                let read = client.kv_get(&key, &options).await;
                let answer = match read {
                    Ok(read) => Some(read),
                    Err(error) => {
                        if let Some(flight) = me.upgrade() {
                            *lock(&flight.error) = Some(error);
                        }
                        None
                    }
                };
                tx.send_replace(Some(answer));
            });
            Flight {
                query: query.clone(),
                answer,
                error: Mutex::new(None),
                task,
                reads: Arc::downgrade(&self.0),
            }
        });
        reads.insert(query, Arc::downgrade(&flight));
        drop(reads);
        drop(ended);
        flight
    }
}

fn take_error(flight: &Flight) -> Option<ConsulError> {
    lock(&flight.error).take()
}

/// The blocking read one reader waits for, if any. Dropping it lets go of the read (cancelled
/// when no other reader waits for it).
#[derive(Debug, Default)]
pub(super) struct PendingRead {
    read: Option<Arc<Flight>>,
}

impl PendingRead {
    /// Reads `key` once its index passes `index` (or [`BLOCKING_WAIT`] passes); at once when
    /// `index` is 0. Joins the read already in flight, of this reader or another of `reads`,
    /// when it asks the same.
    pub async fn read_after(
        &mut self,
        reads: &SharedReads,
        client: &ConsulClient,
        key: &str,
        index: u64,
        consistent: bool,
    ) -> Result<KvResponse, ConsulError> {
        let query = Query {
            key: key.to_owned(),
            index,
            consistent,
        };
        if self.read.as_ref().is_some_and(|f| f.query != query) {
            self.cancel();
        }
        let flight = self
            .read
            .get_or_insert_with(|| reads.join(client, query))
            .clone();
        let mut answer = flight.answer.clone();
        let ended = answer.wait_for(Option::is_some).await.map(|a| a.clone());
        self.read = None;
        match ended {
            Ok(Some(Some(read))) => Ok(read),
            // The read failed: the first reader gets its error; another asks again on its own,
            // for an error of its own (reads fail rarely).
            _ => match take_error(&flight) {
                Some(error) => Err(error),
                None => {
                    let blocking = index > 0;
                    let options = QueryOptions {
                        index: blocking.then_some(index),
                        wait: blocking.then_some(BLOCKING_WAIT),
                        consistent,
                    };
                    client.kv_get(key, &options).await
                }
            },
        }
    }

    /// Lets go of the read in flight, if any.
    pub fn cancel(&mut self) {
        self.read = None;
    }
}
