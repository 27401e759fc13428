//! The ordered queue of etcd and ZooKeeper, as a store model: each candidate's node (etcd: a
//! key under the election's prefix, ZooKeeper: a sequential ephemeral node) is created with
//! the store's next revision and lives as long as its session (lease); the oldest node leads,
//! with its creation revision as the fencing token, and every other candidate waits for the
//! nodes ahead of it to go. The network, the sessions and their renewals are those of the
//! Consul-like model ([`super::store::SimBackend`]); only the lock differs.
//!
//! Creating a node is idempotent per session (etcd's key names the lease, ZooKeeper's node
//! carries the session's guid): a retry after a lost answer finds the node it created.

use std::collections::BTreeMap;

use incumbent::backend::{Attempt, Candidate, Leader, LockLoss};
use tokio::time::Instant;

use super::world::{Bug, State};

/// One candidate's node.
#[derive(Clone, Debug)]
pub struct Node {
    pub session: u64,
    pub client: usize,
    /// The store's revision when the node was created: its place, and its token.
    pub revision: u64,
    pub leader: Leader,
}

/// The queue: nodes in the order of their creation.
#[derive(Debug, Default)]
pub struct QueueState {
    nodes: Vec<Node>,
    revision: u64,
    /// The node that heads the queue, as last granted.
    granted: Option<u64>,
    /// Per session, the session of the node just ahead of its own at its last acquisition
    /// (for [`Bug::PredecessorOnly`]).
    waits_for: BTreeMap<u64, u64>,
}

impl QueueState {
    /// The node that leads: the oldest.
    pub fn head(&self) -> Option<&Node> {
        self.nodes.first()
    }
}

impl State {
    /// One request: creates the session's node if it has none, then says whether it heads
    /// the queue (`Won`, its revision the token) or who does.
    pub(super) fn queue_acquire(
        &mut self,
        client: usize,
        session: u64,
        candidate: &Candidate,
        now: Instant,
    ) -> Attempt {
        if !self.queue.nodes.iter().any(|n| n.session == session) {
            self.queue.revision += 1;
            let revision = self.queue.revision;
            self.record(now, || {
                format!("c{client} (session {session}) creates its node at revision {revision}")
            });
            let since = now.duration_since(self.start).as_millis() as u64;
            self.queue.nodes.push(Node {
                session,
                client,
                revision,
                leader: Leader {
                    candidate: candidate.clone(),
                    fencing_token: Some(revision),
                    since_unix_ms: Some(since),
                },
            });
            self.queue_promote(now);
            self.bump();
        }
        let place = self.queue.nodes.iter().position(|n| n.session == session);
        if self.params.bug == Some(Bug::PredecessorOnly)
            && let Some(place) = place
            && let Some(waited) = self.queue.waits_for.get(&session)
            && !self.queue.nodes.iter().any(|n| n.session == *waited)
        {
            // The bug: the node we waited for is gone, so we take ourselves for the head
            // (the client's logic, evaluated here with the answer it reads).
            return Attempt::Won {
                fencing_token: self.queue.nodes[place].revision,
            };
        }
        match place {
            Some(place) if place > 0 => {
                let ahead = self.queue.nodes[place - 1].session;
                self.queue.waits_for.insert(session, ahead);
            }
            _ => {
                self.queue.waits_for.remove(&session);
            }
        }
        match self.queue.head() {
            Some(head) if head.session == session => Attempt::Won {
                fencing_token: head.revision,
            },
            head => Attempt::Held {
                holder: head.map(|n| n.leader.clone()),
            },
        }
    }

    /// The node at the head, if it has not been granted yet, is granted now: the checker's
    /// grant-time checks run at this instant.
    fn queue_promote(&mut self, now: Instant) {
        let Some(head) = self.queue.head() else {
            return;
        };
        if self.queue.granted == Some(head.revision) {
            return;
        }
        let (client, token, session) = (head.client, head.revision, head.session);
        self.queue.granted = Some(token);
        self.stats.grants += 1;
        self.record(now, || {
            format!("the node of c{client} (session {session}) heads the queue: token {token}")
        });
        self.check_grant(client, token, now);
    }

    fn queue_remove(&mut self, session: u64, now: Instant) -> bool {
        let before = self.queue.nodes.len();
        self.queue.nodes.retain(|n| n.session != session);
        if self.queue.nodes.len() == before {
            return false;
        }
        self.queue_promote(now);
        self.bump();
        true
    }

    /// A session ended (expired, closed, invalidated): its node goes with its lease.
    pub(super) fn queue_drop_session(&mut self, session: u64, now: Instant) {
        if self.queue_remove(session, now) {
            self.record(now, || format!("the node of session {session} is deleted"));
        }
    }

    /// The candidate deletes its node (a resignation, or a follower leaving the queue).
    pub(super) fn queue_release(&mut self, session: u64, now: Instant) {
        if self.queue_remove(session, now) {
            self.record(now, || format!("session {session} deletes its node"));
        }
    }

    /// Rewrites the leader in the node, if the session's node heads the queue.
    pub(super) fn queue_proclaim(&mut self, session: u64, leader: &Leader) -> bool {
        let Some(head) = self.queue.nodes.first_mut() else {
            return false;
        };
        if head.session != session {
            return false;
        }
        head.leader.candidate = leader.candidate.clone();
        self.bump();
        true
    }

    /// Whether `session` lost the lock: its node is gone (a node never loses its place).
    pub(super) fn queue_loss_of(&self, session: u64) -> Option<LockLoss> {
        if self.queue.nodes.iter().any(|n| n.session == session) {
            return None;
        }
        if self.sessions.contains_key(&session) {
            Some(LockLoss::Deleted)
        } else {
            Some(LockLoss::SessionLost)
        }
    }

    /// The operator deletes the head node.
    pub(super) fn queue_operator_delete(&mut self, now: Instant) {
        let Some(head) = self.queue.head().cloned() else {
            return;
        };
        self.stats.operator_faults += 1;
        self.exempt.insert(head.revision);
        let client = head.client;
        self.record(now, || format!("operator deletes the node of c{client}"));
        self.queue_remove(head.session, now);
    }

    /// The operator revokes the head node's lease.
    pub(super) fn queue_operator_invalidate(&mut self, now: Instant) {
        let Some(head) = self.queue.head().cloned() else {
            return;
        };
        self.stats.operator_faults += 1;
        self.exempt.insert(head.revision);
        self.invalidate(head.session, now, "revoked by the operator");
    }
}
