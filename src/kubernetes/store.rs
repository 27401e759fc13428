//! The lock's steps on a Lease: a create or a `resourceVersion`-preconditioned update each,
//! expiry judged on this process's monotonic clock from when it saw the Lease change, and
//! one watch per backend that wakes followers and keeps those sightings fresh.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{HOLDER_ANNOTATION, NAME, TOKEN_ANNOTATION, from_kube, timed_out};
use crate::backend::polled::{
    Acquired, Claim, KeyState, MAX_TOKEN, Notifier, RECONNECT, Renewing, Store, Wakes,
    checked_token,
};
use crate::backend::{SessionOptions, lock, unix_ms_now};
use crate::{Error, Result};

/// How many times a step reads the Lease again after a `409 Conflict` (another writer got
/// in between its read and its write) before it gives up for this round.
const CONFLICT_TRIES: u32 = 3;

/// The Leases of one namespace, as the polled core's [`Store`]. Made by
/// [`KubernetesBuilder::connect`](super::KubernetesBuilder::connect).
pub struct LeaseStore {
    api: Api<Lease>,
    client: kube::Client,
    namespace: String,
    timeout: Duration,
    /// What this process saw of each Lease it deals with, and when it saw it change.
    sightings: Arc<Sightings>,
    notifier: Notifier,
    /// The acquisitions' writes still running (see [`LeaseStore::detached`]).
    writes: Arc<Writes>,
}

/// The acquisitions' writes still running, by Lease name. Each runs in a task of its own: an
/// acquire dropped with its write sent (a campaign shut down as it began) must not leave a
/// write that the API server applies later, unknown to the release that follows. Requests
/// go over HTTP/2 streams of their own, so the release's read can overtake the write on a
/// busy server; the release waits for the write's answer instead
/// ([`Store::writes_settled`]).
#[derive(Default)]
struct Writes {
    running: Mutex<HashMap<String, usize>>,
    ended: tokio::sync::Notify,
}

/// One running write of [`Writes`], counted until dropped (its task ended, or unwound).
struct Running {
    writes: Arc<Writes>,
    name: String,
}

impl Writes {
    fn start(self: &Arc<Self>, name: &str) -> Running {
        *lock(&self.running).entry(name.to_owned()).or_default() += 1;
        Running {
            writes: self.clone(),
            name: name.to_owned(),
        }
    }

    /// Until no write of `name` runs.
    async fn settled(&self, name: &str) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !lock(&self.running).contains_key(name) {
                return;
            }
            ended.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = lock(&self.writes.running);
        if let Some(count) = running.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.name);
            }
        }
        drop(running);
        self.writes.ended.notify_waiters();
    }
}

impl std::fmt::Debug for LeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseStore")
            .field("namespace", &self.namespace)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl crate::backend::polled::sealed::Sealed for LeaseStore {}

/// One Lease as this process last saw it.
#[derive(Clone)]
struct Sighting {
    lease: Lease,
    /// When its `resourceVersion` was first seen: the start of its holder's lease as this
    /// process judges it.
    changed_at: Instant,
    /// When it was last seen, changed or not (a read, a write's answer, a watch event).
    seen_at: Instant,
}

/// How recent a sighting must be for a read to use it instead of asking the API server. A
/// held Lease changes at every renewal (a third of its duration), and the watch brings each
/// change: while it does, reads cost nothing. A Lease seen longer ago (free, or its holder
/// gone quiet, or the watch stalled) is read again.
const FRESH: Duration = Duration::from_secs(5);

/// The Leases this process deals with, by name.
#[derive(Default)]
struct Sightings(Mutex<HashMap<String, Sighting>>);

impl Sightings {
    /// Records `lease`, a Lease this process deals with, as seen now (its version as
    /// changed now, unless it was seen before), and returns that sighting.
    fn tracked(&self, lease: &Lease) -> Sighting {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let now = Instant::now();
        let mut all = lock(&self.0);
        let known = all.entry(name).or_insert_with(|| Sighting {
            lease: lease.clone(),
            changed_at: now,
            seen_at: now,
        });
        known.saw(lease, now);
        known.clone()
    }

    /// Records `lease`, from the watch, if this process deals with it.
    fn followed(&self, lease: &Lease) {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        if let Some(known) = lock(&self.0).get_mut(name) {
            known.saw(lease, Instant::now());
        }
    }

    /// The sighting of `name`, if it was seen within [`FRESH`].
    fn fresh(&self, name: &str) -> Option<Sighting> {
        self.get(name).filter(|s| s.seen_at.elapsed() < FRESH)
    }

    /// Forgets a deleted (or absent) Lease, if followed: it counts as free.
    fn gone(&self, name: &str) {
        lock(&self.0).remove(name);
    }

    fn get(&self, name: &str) -> Option<Sighting> {
        lock(&self.0).get(name).cloned()
    }
}

/// Whether version `a` is older than `b`. Versions are opaque to clients, but the API
/// server's are etcd revisions, decimal integers that only grow (its own watch cache
/// compares them so): compared as numbers when both are, else never older.
fn older(a: Option<&str>, b: Option<&str>) -> bool {
    match (
        a.and_then(|a| a.parse::<u64>().ok()),
        b.and_then(|b| b.parse::<u64>().ok()),
    ) {
        (Some(a), Some(b)) => a < b,
        _ => false,
    }
}

/// Whether `name` is a valid object name (a DNS subdomain: lowercase letters, digits, '-'
/// and '.', starting and ending with a letter or digit, at most 253).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Whether `name` is a valid namespace name (a DNS label).
pub(crate) fn valid_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && valid_name(name)
}

/// The Lease that holds the election key `key` (the prefix and the election's name): `key`
/// itself when it is a valid object name, so that a client-go candidate names the same
/// Lease; otherwise its letters and digits, lowercased, with every run of other characters
/// as one `-`, then `-` and eight hex digits of a hash of the whole key (FNV-1a), so that
/// two keys never share a Lease (`jobs/a` → `jobs-a-` and the hash).
pub fn lease_name(key: &str) -> String {
    if valid_name(key) {
        return key.to_owned();
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let mut readable = String::new();
    for c in key.chars() {
        if c.is_ascii_alphanumeric() {
            readable.push(c.to_ascii_lowercase());
        } else if !readable.ends_with('-') {
            readable.push('-');
        }
    }
    let readable: String = readable.trim_matches('-').chars().take(200).collect();
    let readable = readable.trim_end_matches('-');
    let folded = (hash ^ (hash >> 32)) as u32;
    if readable.is_empty() {
        format!("x-{folded:08x}")
    } else {
        format!("{readable}-{folded:08x}")
    }
}

/// Now, as a MicroTime (always written with six digits).
fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// The candidate id in one of this crate's values.
fn id_of(value: &[u8]) -> String {
    crate::backend::Leader::from_bytes(value).candidate.id
}

/// The Lease's `holderIdentity`, if it names one.
fn holder_identity(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn transitions(lease: &Lease) -> i32 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
}

fn annotation<'a>(lease: &'a Lease, name: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map(String::as_str)
}

/// This crate's value in the Lease: the holder annotation, while `holderIdentity` names its
/// candidate and `leaseTransitions` is the one it was written with (a client-go candidate
/// that took the Lease since leaves the annotation behind, but changes those).
fn our_value(lease: &Lease) -> Option<&[u8]> {
    let value = annotation(lease, HOLDER_ANNOTATION)?;
    let (written, value) = value.split_once(' ')?;
    let holder = holder_identity(lease)?;
    (written.parse::<i32>().ok()? == transitions(lease) && id_of(value.as_bytes()) == holder)
        .then_some(value.as_bytes())
}

/// The holder annotation for `value`, written with `transitions`.
fn holder_annotation(transitions: i32, value: &[u8]) -> String {
    format!("{transitions} {}", String::from_utf8_lossy(value))
}

/// The fencing counter in the Lease's annotation (0 when absent), checked.
fn counter_of(lease: &Lease) -> Result<u64> {
    let Some(text) = annotation(lease, TOKEN_ANNOTATION) else {
        return Ok(0);
    };
    let token = text.trim().parse::<u64>().map_err(|_| Error::Store {
        backend: NAME,
        reason: format!(
            "the annotation {TOKEN_ANNOTATION} of Lease {} holds {text:?}, not a number: a \
             corrupt or hostile value, refused (remove the annotation)",
            lease.metadata.name.as_deref().unwrap_or("?")
        ),
    })?;
    checked_token(NAME, TOKEN_ANNOTATION, token)
}

impl Sighting {
    /// This Lease, seen at `now`: a new version starts its holder's lease as judged here; an
    /// older one (a watch event that our own write's answer overtook) changes nothing.
    fn saw(&mut self, lease: &Lease, now: Instant) {
        let (had, got) = (
            self.lease.metadata.resource_version.as_deref(),
            lease.metadata.resource_version.as_deref(),
        );
        if had != got {
            if older(got, had) {
                return;
            }
            self.lease = lease.clone();
            self.changed_at = now;
        }
        self.seen_at = now;
    }

    /// How long the holder's lease runs yet, as this process judges it; `None` when free.
    fn remaining(&self) -> Option<Duration> {
        holder_identity(&self.lease)?;
        let seconds = self
            .lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .unwrap_or(0)
            .max(0);
        let end = self.changed_at + Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
        end.checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
    }

    /// The holder's value while the lease runs: ours, or the id of a holder that is not
    /// this crate's (a client-go candidate) as a value of its own.
    fn holder(&self) -> Option<Vec<u8>> {
        self.remaining()?;
        if let Some(value) = our_value(&self.lease) {
            return Some(value.to_vec());
        }
        let id = holder_identity(&self.lease)?;
        Some(serde_json::json!({ "id": id }).to_string().into_bytes())
    }
}

impl LeaseStore {
    /// Checks that the namespace's Leases can be listed, and starts the watch.
    pub(super) async fn connect(
        client: kube::Client,
        namespace: String,
        timeout: Duration,
    ) -> Result<Self> {
        let api: Api<Lease> = Api::namespaced(client.clone(), &namespace);
        let listed = tokio::time::timeout(timeout, api.list(&ListParams::default().limit(1)))
            .await
            .map_err(|_| timed_out("listing the Leases", timeout))?
            .map_err(|e| from_kube(e, "listing the Leases"))?;
        let sightings = Arc::new(Sightings::default());
        let keys = Arc::new(Wakes::default());
        let stop = CancellationToken::new();
        let version = listed.metadata.resource_version.unwrap_or_default();
        tokio::spawn(stop.clone().run_until_cancelled_owned(follow(
            api.clone(),
            version,
            sightings.clone(),
            keys.clone(),
        )));
        Ok(LeaseStore {
            api,
            client,
            namespace,
            timeout,
            sightings,
            notifier: Notifier::new(keys, stop),
            writes: Arc::default(),
        })
    }

    pub(super) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Runs one request with the timeout.
    async fn request<T>(
        &self,
        what: &str,
        request: impl Future<Output = kube::Result<T>>,
    ) -> std::result::Result<T, Failure> {
        request_within(self.timeout, what, request).await
    }

    /// An acquisition's write of `lease` (a create, or an update preconditioned on its
    /// version), recorded as seen when it is answered: in a task of its own, counted in
    /// [`Writes`] until it ends, so that dropping the acquire does not drop the write.
    async fn detached(&self, lease: Lease, create: bool) -> std::result::Result<(), Failure> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let running = self.writes.start(&name);
        let (api, timeout, sightings) = (self.api.clone(), self.timeout, self.sightings.clone());
        let task = tokio::spawn(async move {
            let params = PostParams::default();
            let written = if create {
                request_within(timeout, "creating the Lease", api.create(&params, &lease)).await
            } else {
                request_within(
                    timeout,
                    "updating the Lease",
                    api.replace(&name, &params, &lease),
                )
                .await
            };
            let written = written.map(|lease| drop(sightings.tracked(&lease)));
            drop(running);
            written
        });
        match task.await {
            Ok(written) => written,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => Err(Failure::Other(Error::Store {
                backend: NAME,
                reason: format!("the Lease's write did not finish: {error}"),
            })),
        }
    }

    /// Reads the Lease `name` and records the sighting; `None` while it does not exist.
    async fn fetch(&self, name: &str) -> Result<Option<Sighting>> {
        match self.request("reading the Lease", self.api.get(name)).await {
            Ok(lease) => Ok(Some(self.sightings.tracked(&lease))),
            Err(Failure::Missing) => {
                self.sightings.gone(name);
                Ok(None)
            }
            Err(Failure::Conflict) => Err(Error::Store {
                backend: NAME,
                reason: "a read answered 409 Conflict".into(),
            }),
            Err(Failure::Other(error)) => Err(error),
        }
    }

    /// Writes `lease` (its version the precondition) and records what came back.
    async fn update(&self, lease: &Lease) -> std::result::Result<Sighting, Failure> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let written = self
            .request(
                "updating the Lease",
                self.api.replace(&name, &PostParams::default(), lease),
            )
            .await?;
        Ok(self.sightings.tracked(&written))
    }

    /// A sighting of `name` from within [`FRESH`] (the watch keeps a held Lease's fresh), or
    /// a read.
    async fn recent(&self, name: &str) -> Result<Option<Sighting>> {
        match self.sightings.fresh(name) {
            Some(sighting) => Ok(Some(sighting)),
            None => self.fetch(name).await,
        }
    }

    /// The sighting of `name` this process has, or a fresh read.
    async fn known(&self, name: &str) -> Result<Option<Sighting>> {
        match self.sightings.get(name) {
            Some(sighting) => Ok(Some(sighting)),
            None => self.fetch(name).await,
        }
    }

    /// Rewrites the Lease `name` while it holds `ours` (or `pending`), with `change` applied
    /// and `renewTime` now: the version of the last sighting as the precondition, read
    /// again after a conflict. What the Lease held.
    async fn rewrite(
        &self,
        name: &str,
        ours: &[u8],
        pending: Option<&[u8]>,
        change: impl Fn(&mut Lease),
    ) -> Result<KeyState> {
        let mut sighting = self.known(name).await?;
        for _ in 0..CONFLICT_TRIES {
            let Some(seen) = sighting else {
                return Ok(KeyState::Gone);
            };
            let state = match our_value(&seen.lease) {
                Some(value) if value == ours => KeyState::Renewed,
                Some(value) if Some(value) == pending => KeyState::RenewedPending,
                _ if holder_identity(&seen.lease).is_none() => return Ok(KeyState::Gone),
                _ => return Ok(KeyState::Other),
            };
            let mut lease = seen.lease.clone();
            change(&mut lease);
            match self.update(&lease).await {
                Ok(_) => return Ok(state),
                Err(Failure::Conflict) => sighting = self.fetch(name).await?,
                Err(Failure::Missing) => {
                    self.sightings.gone(name);
                    return Ok(KeyState::Gone);
                }
                Err(Failure::Other(error)) => return Err(error),
            }
        }
        Err(conflicts(name))
    }
}

/// Runs one request with `timeout`.
async fn request_within<T>(
    timeout: Duration,
    what: &str,
    request: impl Future<Output = kube::Result<T>>,
) -> std::result::Result<T, Failure> {
    match tokio::time::timeout(timeout, request).await {
        Err(_) => Err(Failure::Other(timed_out(what, timeout))),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(kube::Error::Api(status))) if status.code == 409 => Err(Failure::Conflict),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => Err(Failure::Missing),
        Ok(Err(error)) => Err(Failure::Other(from_kube(error, what))),
    }
}

/// How a request failed.
enum Failure {
    /// `409 Conflict`: the precondition failed, or the object exists.
    Conflict,
    /// `404 Not Found`.
    Missing,
    Other(Error),
}

fn conflicts(name: &str) -> Error {
    Error::Unavailable {
        backend: NAME,
        reason: format!(
            "the Lease {name} changed under each of {CONFLICT_TRIES} writes (409 Conflict); \
             trying again"
        ),
    }
}

/// What an acquire that did not take the Lease answers: its holder as `seen`, if any.
fn held(seen: Option<&Sighting>) -> Acquired {
    Acquired::Held {
        value: seen.and_then(Sighting::holder),
        expires_in: seen.and_then(Sighting::remaining),
    }
}

/// A Lease spec's duration for `ttl`, in whole seconds.
fn duration_seconds(ttl: Duration) -> i32 {
    i32::try_from(ttl.as_secs()).unwrap_or(i32::MAX).max(1)
}

impl Store for LeaseStore {
    const NAME: &'static str = NAME;
    const COUNTER_SUFFIX: &'static str = "";

    fn check(&self, options: &SessionOptions) -> Result<()> {
        if options.ttl.subsec_nanos() != 0 {
            return Err(Error::InvalidTiming {
                reason: format!(
                    "a Lease's duration is whole seconds: the ttl {:?} is not (e.g. 15s)",
                    options.ttl
                ),
            });
        }
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        self.request(
            "asking the API server's version",
            self.client.apiserver_version(),
        )
        .await
        .map(drop)
        .map_err(|failure| match failure {
            Failure::Other(error) => error,
            _ => Error::Unavailable {
                backend: NAME,
                reason: "the API server's version was not found".into(),
            },
        })
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .recent(&lease_name(key))
            .await?
            .and_then(|seen| seen.holder()))
    }

    async fn read_expiring(&self, key: &str) -> Result<Option<(Vec<u8>, Option<Duration>)>> {
        Ok(self
            .recent(&lease_name(key))
            .await?
            .and_then(|seen| Some((seen.holder()?, seen.remaining()))))
    }

    async fn counter(&self, counter: &str) -> Result<Option<u64>> {
        match self.fetch(&lease_name(counter)).await? {
            Some(seen) => Ok(Some(counter_of(&seen.lease)?).filter(|&t| t > 0)),
            None => Ok(None),
        }
    }

    async fn acquire(&self, claim: Claim<'_>) -> Result<Acquired> {
        let name = lease_name(claim.key);
        let floor = claim.floor.min(MAX_TOKEN - 1);
        // A Lease the watch shows held is held: no request. (Every write is preconditioned on
        // the version it was judged by, so a stale sighting can only make us wait, until the
        // lease runs out as judged from it, and then a read tells.) Without this, every
        // renewal of the holder, which the watch delivers, cost each follower a read.
        let mut cached = self
            .sightings
            .fresh(&name)
            .filter(|seen| seen.holder().is_some());
        for _ in 0..CONFLICT_TRIES {
            let seen = match cached.take() {
                Some(seen) => Some(seen),
                None => self.fetch(&name).await?,
            };
            if let Some(seen) = &seen
                && let Some(value) = seen.holder()
                && claim.escrow != Some(value.as_slice())
            {
                return Ok(held(Some(seen)));
            }
            // At most MAX_TOKEN (checked): the + 1 below cannot overflow.
            let previous = match &seen {
                Some(seen) => counter_of(&seen.lease)?,
                None => 0,
            };
            let token = (previous + 1).max(unix_ms_now()).max(floor + 1);
            let token = checked_token(NAME, TOKEN_ANNOTATION, token)?;
            let value = [claim.before, token.to_string().as_bytes(), claim.after].concat();
            let id = id_of(&value);
            let now = now_micro();
            let (mut lease, transitions) = match &seen {
                Some(seen) => {
                    let lease = seen.lease.clone();
                    let before = transitions(&lease);
                    let changed = holder_identity(&lease) != Some(id.as_str());
                    let after = if changed {
                        before.saturating_add(1).max(0)
                    } else {
                        before
                    };
                    (lease, after)
                }
                None => (
                    Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            namespace: Some(self.namespace.clone()),
                            ..ObjectMeta::default()
                        },
                        spec: None,
                    },
                    0,
                ),
            };
            let annotations = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
            annotations.insert(TOKEN_ANNOTATION.to_owned(), token.to_string());
            annotations.insert(
                HOLDER_ANNOTATION.to_owned(),
                holder_annotation(transitions, &value),
            );
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(id);
            spec.lease_duration_seconds = Some(duration_seconds(claim.ttl));
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            spec.lease_transitions = Some(transitions);
            let creating = seen.is_none();
            match self.detached(lease, creating).await {
                Ok(()) => {
                    return Ok(Acquired::Won {
                        token,
                        went_back: previous < claim.floor,
                    });
                }
                // A create answered 404: the namespace itself is missing.
                Err(Failure::Missing) if creating => {
                    return Err(Error::Store {
                        backend: NAME,
                        reason: format!(
                            "the namespace {:?} does not exist: create it, or name another \
                             (KubernetesBuilder::namespace, k8s://namespace)",
                            self.namespace
                        ),
                    });
                }
                Err(Failure::Conflict | Failure::Missing) => continue,
                Err(Failure::Other(error)) => return Err(error),
            }
        }
        // Others keep writing: report it held by whoever holds it now.
        Ok(held(self.fetch(&name).await?.as_ref()))
    }

    async fn renew(&self, held: &[Renewing], ttl: Duration) -> Result<Vec<KeyState>> {
        let seconds = duration_seconds(ttl);
        let mut states = Vec::with_capacity(held.len());
        // One request per Lease: the API has no multi-object update.
        for renewing in held {
            let state = self
                .rewrite(
                    &lease_name(&renewing.key),
                    &renewing.value,
                    renewing.pending.as_deref(),
                    |lease| {
                        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                        spec.renew_time = Some(now_micro());
                        spec.lease_duration_seconds = Some(seconds);
                    },
                )
                .await?;
            states.push(state);
        }
        Ok(states)
    }

    async fn replace(&self, key: &str, ours: &[u8], new: &[u8], ttl: Duration) -> Result<bool> {
        let seconds = duration_seconds(ttl);
        let id = id_of(new);
        let state = self
            .rewrite(&lease_name(key), ours, Some(new), |lease| {
                let written = transitions(lease);
                lease
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(
                        HOLDER_ANNOTATION.to_owned(),
                        holder_annotation(written, new),
                    );
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                spec.holder_identity = Some(id.clone());
                spec.renew_time = Some(now_micro());
                spec.lease_duration_seconds = Some(seconds);
            })
            .await?;
        Ok(matches!(
            state,
            KeyState::Renewed | KeyState::RenewedPending
        ))
    }

    async fn release(&self, key: &str, ours: &[u8]) -> Result<()> {
        self.rewrite(&lease_name(key), ours, None, |lease| {
            if let Some(annotations) = lease.metadata.annotations.as_mut() {
                annotations.remove(HOLDER_ANNOTATION);
            }
            // As client-go's ReleaseOnCancel: no holder, a one-second lease, the times now.
            let now = now_micro();
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
        })
        .await
        .map(drop)
    }

    fn subscribe(&self, key: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.notifier.subscribe(&lease_name(key)))
    }

    /// Waits for this process's acquisitions' writes of the Lease to be answered (each at
    /// most the request timeout).
    async fn writes_settled(&self, key: &str) {
        self.writes.settled(&lease_name(key)).await;
    }
}

/// Follows the namespace's Leases from `version` on: each change of a Lease this process
/// deals with is recorded as seen now, and wakes its followers. A watch that ends is made
/// again from the last version seen; one whose version expired (`410 Gone`), or that cannot
/// be made, lists the Leases again and wakes every follower (changes may have been missed).
async fn follow(api: Api<Lease>, mut version: String, sightings: Arc<Sightings>, keys: Arc<Wakes>) {
    let mut attempt = 0u32;
    loop {
        if version.is_empty() {
            match api.list(&ListParams::default()).await {
                Ok(list) => {
                    for lease in &list.items {
                        sightings.followed(lease);
                    }
                    version = list.metadata.resource_version.unwrap_or_default();
                    keys.bump_all();
                }
                Err(error) => {
                    tracing::debug!(%error, "kubernetes: listing the Leases failed");
                    tokio::time::sleep(RECONNECT.delay(attempt)).await;
                    attempt = attempt.saturating_add(1);
                    continue;
                }
            }
        }
        let params = WatchParams::default().timeout(290);
        let stream = match api.watch(&params, &version).await {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(%error, "kubernetes: the watch failed; listing again");
                version.clear();
                tokio::time::sleep(RECONNECT.delay(attempt)).await;
                attempt = attempt.saturating_add(1);
                continue;
            }
        };
        attempt = 0;
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(WatchEvent::Added(lease) | WatchEvent::Modified(lease)) => {
                    if let Some(v) = &lease.metadata.resource_version {
                        version.clone_from(v);
                    }
                    let name = lease.metadata.name.clone().unwrap_or_default();
                    sightings.followed(&lease);
                    keys.bump(&name);
                }
                Ok(WatchEvent::Deleted(lease)) => {
                    if let Some(v) = &lease.metadata.resource_version {
                        version.clone_from(v);
                    }
                    let name = lease.metadata.name.clone().unwrap_or_default();
                    sightings.gone(&name);
                    keys.bump(&name);
                }
                Ok(WatchEvent::Bookmark(bookmark)) => {
                    version = bookmark.metadata.resource_version;
                }
                Ok(WatchEvent::Error(status)) => {
                    tracing::debug!(code = status.code, message = %status.message, "kubernetes: the watch ended");
                    version.clear();
                    break;
                }
                Err(error) => {
                    tracing::debug!(%error, "kubernetes: the watch broke");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_and_distinct() {
        assert_eq!(lease_name("index-builder"), "index-builder");
        assert_eq!(lease_name("a.b-c"), "a.b-c");
        for key in [
            "jobs/a",
            "Jobs/A",
            "jobs_a",
            "g/.members/3",
            "/",
            "-a-",
            "ünï",
        ] {
            let name = lease_name(key);
            assert!(valid_name(&name), "{key:?} → {name:?}");
        }
        assert_ne!(lease_name("jobs/a"), lease_name("jobs_a"));
        assert_ne!(lease_name("Jobs/A"), lease_name("jobs/a"));
        assert!(lease_name("jobs/a").starts_with("jobs-a-"));
        let long = "x/".repeat(300);
        assert!(valid_name(&lease_name(&long)));
    }

    #[test]
    fn a_sighting_never_goes_back_to_an_older_version() {
        let sightings = Sightings::default();
        let lease = |version: &str, holder: &str| Lease {
            metadata: ObjectMeta {
                name: Some("l".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                ..LeaseSpec::default()
            }),
        };
        sightings.tracked(&lease("100", "ours"));
        // The watch delivers the version before our write, after our write's answer.
        let seen = sightings.tracked(&lease("99", "theirs"));
        assert_eq!(holder_identity(&seen.lease), Some("ours"));
        let seen = sightings.tracked(&lease("101", "next"));
        assert_eq!(holder_identity(&seen.lease), Some("next"));
        assert!(older(Some("9"), Some("10")));
        assert!(!older(Some("x"), Some("10")));
    }

    #[test]
    fn micro_time_has_six_digits() {
        let json = serde_json::to_string(&MicroTime(
            Timestamp::from_second(1_700_000_000).expect("a time"),
        ))
        .expect("json");
        assert_eq!(json, "\"2023-11-14T22:13:20.000000Z\"");
    }

    #[test]
    fn a_hostile_counter_is_refused() {
        let mut lease = Lease::default();
        lease.metadata.annotations = Some(BTreeMap::from([(
            TOKEN_ANNOTATION.to_owned(),
            "18446744073709551615".to_owned(),
        )]));
        assert!(counter_of(&lease).is_err());
        lease.metadata.annotations = Some(BTreeMap::from([(
            TOKEN_ANNOTATION.to_owned(),
            "twelve".to_owned(),
        )]));
        assert!(counter_of(&lease).is_err());
    }

    #[test]
    fn an_annotation_left_by_another_holder_is_not_ours() {
        let value = br#"{"fencing_token":5,"id":"a","owner":"o"}"#;
        let mut lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("a".into()),
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        lease.metadata.annotations = Some(BTreeMap::from([(
            HOLDER_ANNOTATION.to_owned(),
            holder_annotation(3, value),
        )]));
        assert_eq!(our_value(&lease), Some(&value[..]));
        // client-go took it: another holder, one more transition.
        let spec = lease.spec.as_mut().expect("spec");
        spec.holder_identity = Some("go-peer".into());
        spec.lease_transitions = Some(4);
        assert_eq!(our_value(&lease), None);
        // The same id, but a transition since.
        let spec = lease.spec.as_mut().expect("spec");
        spec.holder_identity = Some("a".into());
        assert_eq!(our_value(&lease), None);
    }
}
