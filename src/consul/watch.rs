//! Blocking reads of one key that outlive the futures waiting for them.
//!
//! The campaign selects on [`Contender::lost`](crate::backend::Contender::lost) (and on
//! `wait` and `Observer::next`) next to other events, and drops the future when another
//! branch wins, e.g. at every renewal. Consul keeps serving a blocking query whose client went
//! away until its wait ends, so restarting the query each time would leave one abandoned
//! query per renewal on the agent. Instead the query runs in a task of its own, and the next
//! call with the same index picks up its answer.

use tokio::task::JoinHandle;

use super::BLOCKING_WAIT;
use super::client::{ConsulClient, ConsulError, KvResponse, QueryOptions};

/// The blocking read in flight for one key, if any. Dropping it cancels the read.
#[derive(Debug, Default)]
pub(super) struct PendingRead {
    read: Option<(Query, JoinHandle<Result<KvResponse, ConsulError>>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Query {
    index: u64,
    consistent: bool,
}

impl PendingRead {
    /// Reads `key` once its index passes `index` (or [`BLOCKING_WAIT`] passes); at once when
    /// `index` is 0. Joins the read already in flight when it asks the same.
    pub async fn read_after(
        &mut self,
        client: &ConsulClient,
        key: &str,
        index: u64,
        consistent: bool,
    ) -> Result<KvResponse, ConsulError> {
        let query = Query { index, consistent };
        if self.read.as_ref().is_some_and(|(q, _)| *q != query) {
            self.cancel();
        }
        let (_, task) = self.read.get_or_insert_with(|| {
            let blocking = index > 0;
            let options = QueryOptions {
                index: blocking.then_some(index),
                wait: blocking.then_some(BLOCKING_WAIT),
                consistent,
            };
            let (client, key) = (client.clone(), key.to_owned());
            (
                query,
                tokio::spawn(async move { client.kv_get(&key, &options).await }),
            )
        });
        let joined = task.await;
        self.read = None;
        joined.unwrap_or_else(|e| {
            Err(ConsulError::Unreachable {
                operation: "kv get",
                address: client.address().to_owned(),
                reason: format!("the read task ended: {e}"),
            })
        })
    }

    /// Cancels the read in flight, if any.
    pub fn cancel(&mut self) {
        if let Some((_, task)) = self.read.take() {
            task.abort();
        }
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        self.cancel();
    }
}
