//! Health endpoints for axum: `/healthz`, `/readyz` and `/leader`, for one election or many.
//!
//! Build a [`Health`] from the [`status`](crate::Campaign::status) receivers of the campaigns
//! this process runs, and merge its [`router`](Health::router) into your application:
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use incumbent::{Election, file::FileBackend, http::Health};
//!
//! let index = Election::builder(FileBackend::new(), "jobs/index").build()?.campaign();
//! let mail = Election::builder(FileBackend::new(), "jobs/mail").build()?.campaign();
//!
//! let app = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "hello" }))
//!     .merge(Health::new().election(index.status()).election(mail.status()).router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! The router's state is already provided, so it is a plain [`axum::Router`]: merge it into an
//! application with state after that application's own `with_state(..)`, or
//! [`nest`](axum::Router::nest) it under a prefix.
//!
//! # Endpoints
//!
//! Every endpoint takes an optional `?election=NAME` query parameter (repeatable; URL-encode
//! the name, e.g. `jobs%2Findex`, or write the `/` as is) that restricts it to those elections.
//! Naming an election that was not added answers `404`. Without it, an endpoint covers every
//! election added. Bodies are JSON, and every response carries `Cache-Control: no-store`.
//!
//! | endpoint | `200` | `503` |
//! |---|---|---|
//! | `GET /healthz` | every campaign is healthy | one is not; `reason` says why |
//! | `GET /readyz` | this process leads every election asked about | it does not lead one of them |
//! | `GET /leader` | always: who leads, as this process sees it | never |
//! | `POST /switchover?to=ID` | opt-in ([`Health::switchover`]): see below | |
//!
//! **`/healthz`** is for liveness checks, and so says only what a restart could mend, as
//! client-go's leader-election health adaptor does. A campaign is unhealthy when
//! - it has stopped;
//! - it still says it leads more than [`stuck_after`](Health::stuck_after) (default
//!   [`DEFAULT_STUCK_AFTER`]) past its renew deadline: it should have fenced itself at the
//!   deadline, so its task is stuck.
//!
//! Store trouble is *not* a reason to restart: a store outage would fail every replica at
//! once, and restarting them cannot help. A leader that fenced itself, followers and
//! candidates that cannot reach the store, and campaigns cooling down are healthy: they are
//! doing their job. Store trouble shows in `/readyz` and `/leader` (`problem`), and in the
//! [`Status`].
//!
//! **`/readyz`** is for load balancers that should route only to the leader: `200` only while
//! this process leads (and its renew deadline has not passed). With several elections, ask
//! about one with `/readyz?election=NAME`; without the parameter it answers `200` only if this
//! process leads *every* election added.
//!
//! **`/leader`** reports, for each election: this candidate, its role, the current leader's
//! identity, metadata and fencing token and since when it leads, this process's term while it
//! leads, the last confirmed renewal, the renew deadline, the problem being worked around and
//! the last demotion, and how followers learn that the lock is free (`"wakeup"`: `"push"`, or
//! `"poll"` with `"poll_interval_ms"`). Times are given twice: as RFC 3339 in UTC with milliseconds
//! (`"2026-11-22T10:00:00.123Z"`) and as milliseconds since the Unix epoch (`*_unix_ms`).
//! Monotonic instants are converted to the wall clock at the time of the request.
//!
//! ```json
//! {
//!   "elections": [
//!     {
//!       "election": "jobs/index",
//!       "candidate": { "id": "host-a:8080", "metadata": { "zone": "a" } },
//!       "role": "leader",
//!       "is_leader": true,
//!       "healthy": true,
//!       "leader": {
//!         "id": "host-a:8080", "metadata": { "zone": "a" }, "fencing_token": 7,
//!         "since": "2026-11-22T10:00:00.123Z", "since_unix_ms": 1795341600123
//!       },
//!       "term": {
//!         "fencing_token": 7,
//!         "started_at": "2026-11-22T10:00:00.123Z", "started_at_unix_ms": 1795341600123
//!       },
//!       "last_renewal": "2026-11-22T10:00:03.456Z", "last_renewal_unix_ms": 1795341603456,
//!       "renew_deadline_at": "2026-11-22T10:00:10.123Z", "renew_deadline_at_unix_ms": 1795341610123,
//!       "problem": null,
//!       "last_demotion": null,
//!       "wakeup": "push"
//!     }
//!   ]
//! }
//! ```
//!
//! `/healthz` and `/readyz` answer
//! `{"healthy": bool, "elections": [{"election", "role", "healthy", "reason"?}]}` and
//! `{"ready": bool, "elections": [{"election", "role", "ready", "problem"?}]}`.
//!
//! Every endpoint reports leadership as [`Status::is_leader`] does: it ends the instant the
//! term's token is cancelled, and a campaign that is stopping its term's work and releasing
//! the lock shows the role `stepping_down`.

use crate::time::human;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::CampaignHandle;
use crate::backend::Wakeup;
use crate::event::{DemotionReason, Role, Status};
use crate::secret::Secret;
use crate::sharded::ShardStatus;
use crate::switchover::HandOverError;

/// How long past its renew deadline a campaign may go on saying it leads before `/healthz`
/// reports it stuck, by default. The campaign fences itself at the deadline within
/// milliseconds; seconds without it mean its task no longer runs (a starved or blocked
/// runtime), which a restart mends.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(5);

/// Health endpoints for the campaigns of this process. See the [module docs](self).
///
/// Cheap to clone; build it once, then call [`router`](Health::router).
#[derive(Clone, Debug)]
pub struct Health {
    elections: Vec<watch::Receiver<Status>>,
    stuck_after: Duration,
    switchover: Vec<CampaignHandle>,
    shards: Vec<watch::Receiver<ShardStatus>>,
    /// The bearer token `POST /switchover` requires.
    token: Option<Secret>,
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

/// A router for these campaigns' statuses, with the default settings: shorthand for
/// `Health::new().election(a).election(b)….router()`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> incumbent::Result<()> {
/// use incumbent::{Election, memory::MemoryBackend};
///
/// let campaign = Election::builder(MemoryBackend::new(), "scheduler").build()?.campaign();
/// let app: axum::Router = incumbent::http::router([campaign.status()]);
/// # Ok(()) }
/// ```
pub fn router(statuses: impl IntoIterator<Item = watch::Receiver<Status>>) -> Router {
    statuses
        .into_iter()
        .fold(Health::new(), Health::election)
        .router()
}

impl Health {
    /// No elections yet, and the default settings.
    pub fn new() -> Self {
        Health {
            elections: Vec::new(),
            stuck_after: DEFAULT_STUCK_AFTER,
            switchover: Vec::new(),
            shards: Vec::new(),
            token: None,
        }
    }

    /// Adds a sharded group, by its [`ShardedRunner::status`](crate::ShardedRunner::status)
    /// receiver, served at `GET /shards`: for each group, the members this process sees, the
    /// shards the map gives it (`assigned`) and the shards it leads (`owned`, read from each
    /// shard's term at the request, so a shard whose term has ended is not listed), and a
    /// `problem` if any. Every shard is an election too: add a shard's campaign with
    /// [`election`](Self::election) to see it in `/leader`.
    pub fn sharded(mut self, status: watch::Receiver<ShardStatus>) -> Self {
        self.shards.push(status);
        self
    }

    /// Adds a campaign, by its [`status`](crate::CampaignHandle::status) receiver. It is
    /// reported under its election's name ([`Status::election`]). Two campaigns of the same
    /// election are both reported, and `?election=NAME` selects both.
    pub fn election(mut self, status: watch::Receiver<Status>) -> Self {
        self.elections.push(status);
        self
    }

    /// How long past its renew deadline a campaign may go on saying it leads before
    /// `/healthz` reports it stuck (default [`DEFAULT_STUCK_AFTER`]).
    pub fn stuck_after(mut self, threshold: Duration) -> Self {
        self.stuck_after = threshold;
        self
    }

    /// Serves `POST /switchover?to=ID[&election=NAME]` for this campaign (it is added to the
    /// reported elections too), guarded by `bearer_token`: a request without
    /// `Authorization: Bearer <bearer_token>` gets `401` and moves nothing. Opt-in: without
    /// this call there is no such route. The token is kept out of `Debug` and logs.
    ///
    /// The request is [`CampaignHandle::hand_over`] on this candidate, leader or not (a
    /// follower asks the leader through the store), and the answer waits for the outcome:
    /// `200` `{"to", "fencing_token"}` once the target leads; `409` `{"error", "reason"}`
    /// when refused, nothing moved (`reason`: `not_a_candidate`, `in_progress`,
    /// `superseded`, `no_leader`, `line_not_clear`, `refused`); `504` when it did not finish (`lapsed`:
    /// the target did not take office within the window and an open election followed;
    /// `not_finished`); `400` for a missing `to`; `404` for an election not served here;
    /// `503` when the campaign has stopped.
    pub fn switchover(mut self, campaign: CampaignHandle, bearer_token: impl Into<String>) -> Self {
        self.elections.push(campaign.status());
        self.switchover.push(campaign);
        self.token = Some(Secret(bearer_token.into()));
        self
    }

    /// The router serving `GET /healthz`, `GET /readyz` and `GET /leader` (and `HEAD`),
    /// `POST /switchover` when [`switchover`](Self::switchover) was called, and `GET /shards`
    /// when [`sharded`](Self::sharded) was.
    pub fn router(self) -> Router {
        let guarded = !self.switchover.is_empty();
        let mut router = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/leader", get(leader));
        if !self.shards.is_empty() {
            router = router.route("/shards", get(shards));
        }
        let router = match guarded {
            true => router.route("/switchover", axum::routing::post(switchover)),
            false => router,
        };
        router.with_state(Arc::new(self))
    }

    /// Snapshots of the campaigns the query selects, or why the query cannot be answered.
    fn select(&self, query: Option<&str>) -> Result<Vec<Status>, Rejection> {
        let wanted = match query {
            Some(query) => elections_in(query).ok_or_else(|| Rejection {
                code: StatusCode::BAD_REQUEST,
                message: "the query is not valid URL encoding; write ?election=NAME".into(),
            })?,
            None => Vec::new(),
        };
        let statuses: Vec<Status> = self.elections.iter().map(|s| s.borrow().clone()).collect();
        if wanted.is_empty() {
            return Ok(statuses);
        }
        if let Some(missing) = wanted
            .iter()
            .find(|name| !statuses.iter().any(|s| &s.election == *name))
        {
            let mut known: Vec<&str> = statuses.iter().map(|s| s.election.as_str()).collect();
            known.dedup();
            return Err(Rejection {
                code: StatusCode::NOT_FOUND,
                message: format!(
                    "no election named {missing:?} is served here; known: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            });
        }
        Ok(statuses
            .into_iter()
            .filter(|s| wanted.contains(&s.election))
            .collect())
    }

    /// Why a campaign is unhealthy, or `None` when it is healthy: only what a restart mends.
    fn diagnose(&self, status: &Status, now: Instant) -> Option<String> {
        if status.role == Role::Stopped {
            return Some("the campaign has stopped".into());
        }
        if status.role == Role::Leader
            && let Some(deadline) = status.renew_deadline_at()
            && now.saturating_duration_since(deadline) > self.stuck_after
        {
            return Some(format!(
                "the campaign still says it leads {} after its renew deadline, when it should \
                 have fenced itself; its task is stuck",
                human(now - deadline)
            ));
        }
        None
    }
}

async fn healthz(State(health): State<Arc<Health>>, RawQuery(query): RawQuery) -> Response {
    let statuses = match health.select(query.as_deref()) {
        Ok(s) => s,
        Err(rejection) => return rejection.into_response(),
    };
    let now = Instant::now();
    let elections: Vec<HealthReport> = statuses
        .iter()
        .map(|s| {
            let reason = health.diagnose(s, now);
            HealthReport {
                election: &s.election,
                role: s.current_role().as_str(),
                healthy: reason.is_none(),
                reason,
            }
        })
        .collect();
    let healthy = elections.iter().all(|e| e.healthy);
    json(verdict(healthy), &HealthBody { healthy, elections })
}

async fn readyz(State(health): State<Arc<Health>>, RawQuery(query): RawQuery) -> Response {
    let statuses = match health.select(query.as_deref()) {
        Ok(s) => s,
        Err(rejection) => return rejection.into_response(),
    };
    let now = Instant::now();
    let elections: Vec<ReadyReport> = statuses
        .iter()
        .map(|s| ReadyReport {
            election: &s.election,
            role: s.current_role().as_str(),
            ready: s.is_leader() && s.renew_deadline_at().is_none_or(|d| d > now),
            problem: s.problem.as_ref().map(|p| p.message.as_str()),
        })
        .collect();
    let ready = !elections.is_empty() && elections.iter().all(|e| e.ready);
    json(verdict(ready), &ReadyBody { ready, elections })
}

async fn leader(State(health): State<Arc<Health>>, RawQuery(query): RawQuery) -> Response {
    let statuses = match health.select(query.as_deref()) {
        Ok(s) => s,
        Err(rejection) => return rejection.into_response(),
    };
    let clock = Clock::now();
    let elections: Vec<LeaderReport> = statuses
        .iter()
        .map(|s| LeaderReport::new(s, &clock, health.diagnose(s, clock.instant).is_none()))
        .collect();
    json(StatusCode::OK, &LeaderBody { elections })
}

/// `GET /shards`: one entry per sharded group.
async fn shards(State(health): State<Arc<Health>>) -> Response {
    #[derive(Serialize)]
    struct Member {
        id: String,
        weight: u32,
        claimed: usize,
    }
    #[derive(Serialize)]
    struct Group {
        group: String,
        shards: u32,
        candidate: String,
        registered: bool,
        members: Vec<Member>,
        assigned: Vec<u32>,
        owned: Vec<u32>,
        problem: Option<String>,
    }
    let groups: Vec<Group> = health
        .shards
        .iter()
        .map(|status| {
            let s = status.borrow().clone();
            Group {
                owned: s.owned().into_iter().collect(),
                group: s.group,
                shards: s.shards,
                candidate: s.candidate,
                registered: s.registered,
                members: s
                    .members
                    .iter()
                    .map(|m| Member {
                        id: m.id.clone(),
                        weight: m.weight,
                        claimed: m.claims.len(),
                    })
                    .collect(),
                assigned: s.assigned.into_iter().collect(),
                problem: s.problem,
            }
        })
        .collect();
    json(StatusCode::OK, &serde_json::json!({ "groups": groups }))
}

fn verdict(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

fn json<T: Serialize>(code: StatusCode, body: &T) -> Response {
    let mut response = match serde_json::to_vec(body) {
        Ok(bytes) => (code, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A request that cannot be answered: a bad query, or an unknown election.
struct Rejection {
    code: StatusCode,
    message: String,
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        json(
            self.code,
            &ErrorBody {
                error: &self.message,
            },
        )
    }
}

/// The values of every `election` parameter in a query string; `None` if one is not valid
/// percent-encoded UTF-8.
fn elections_in(query: &str) -> Option<Vec<String>> {
    values_in(query, "election")
}

/// The values of every `name` parameter in a query string; `None` if one is not valid
/// percent-encoded UTF-8.
fn values_in(query: &str, name: &str) -> Option<Vec<String>> {
    let mut values = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if decode(key)? == name {
            values.push(decode(value)?);
        }
    }
    Some(values)
}

/// Whether the request carries `Authorization: Bearer <token>`, compared in constant time.
fn authorized(headers: &axum::http::HeaderMap, token: &Secret) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
    else {
        return false;
    };
    let want = token.0.as_bytes();
    given.len() == want.len()
        && given
            .iter()
            .zip(want)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

/// `POST /switchover`: see [`Health::switchover`].
async fn switchover(
    State(health): State<Arc<Health>>,
    headers: axum::http::HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let reject = |code, message: String| Rejection { code, message }.into_response();
    if !health
        .token
        .as_ref()
        .is_some_and(|t| authorized(&headers, t))
    {
        return reject(
            StatusCode::UNAUTHORIZED,
            "POST /switchover needs the header `Authorization: Bearer <token>` with the token \
             the service was given"
                .into(),
        );
    }
    let query = query.unwrap_or_default();
    let (Some(targets), Some(elections)) = (values_in(&query, "to"), elections_in(&query)) else {
        return reject(
            StatusCode::BAD_REQUEST,
            "the query is not valid URL encoding; write ?to=ID".into(),
        );
    };
    let [to] = targets.as_slice() else {
        return reject(
            StatusCode::BAD_REQUEST,
            "name the candidate to hand over to, once: ?to=ID".into(),
        );
    };
    let handles: Vec<&CampaignHandle> = health
        .switchover
        .iter()
        .filter(|h| elections.is_empty() || elections.contains(&h.status().borrow().election))
        .collect();
    let handle = match handles.as_slice() {
        [one] => *one,
        [] => {
            return reject(
                StatusCode::NOT_FOUND,
                "no election with switchover is served here by that name".into(),
            );
        }
        _ => {
            return reject(
                StatusCode::BAD_REQUEST,
                "several elections are served here: name one with ?election=NAME".into(),
            );
        }
    };
    #[derive(Serialize)]
    struct Done<'a> {
        to: &'a str,
        fencing_token: Option<u64>,
    }
    #[derive(Serialize)]
    struct Refusal<'a> {
        error: String,
        reason: &'a str,
    }
    match handle.hand_over(to.clone()).await {
        Ok(done) => json(
            StatusCode::OK,
            &Done {
                to: &done.to,
                fencing_token: done.fencing_token,
            },
        ),
        Err(crate::Error::HandOver(refusal)) => {
            let (code, reason) = match &refusal {
                HandOverError::NotACandidate { .. } => (StatusCode::CONFLICT, "not_a_candidate"),
                HandOverError::InProgress { .. } => (StatusCode::CONFLICT, "in_progress"),
                HandOverError::Superseded { .. } => (StatusCode::CONFLICT, "superseded"),
                HandOverError::NoLeader => (StatusCode::CONFLICT, "no_leader"),
                HandOverError::LineNotClear { .. } => (StatusCode::CONFLICT, "line_not_clear"),
                HandOverError::Refused { .. } => (StatusCode::CONFLICT, "refused"),
                HandOverError::Lapsed { .. } => (StatusCode::GATEWAY_TIMEOUT, "lapsed"),
                _ => (StatusCode::GATEWAY_TIMEOUT, "not_finished"),
            };
            json(
                code,
                &Refusal {
                    error: refusal.to_string(),
                    reason,
                },
            )
        }
        Err(crate::Error::Stopped) => reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "the campaign has stopped".into(),
        ),
        Err(error) => json(
            StatusCode::GATEWAY_TIMEOUT,
            &Refusal {
                error: error.to_string(),
                reason: "not_finished",
            },
        ),
    }
}

/// Decodes `application/x-www-form-urlencoded` text: `+` is a space, `%XX` a byte.
fn decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.bytes();
    while let Some(b) = rest.next() {
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hi = char::from(rest.next()?).to_digit(16)?;
                let lo = char::from(rest.next()?).to_digit(16)?;
                bytes.push(u8::try_from(hi * 16 + lo).ok()?);
            }
            b => bytes.push(b),
        }
    }
    String::from_utf8(bytes).ok()
}

/// Both clocks, read once per request, to turn monotonic instants into wall-clock times.
struct Clock {
    instant: Instant,
    wall: SystemTime,
}

impl Clock {
    fn now() -> Self {
        Clock {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    fn wall(&self, at: Instant) -> SystemTime {
        let moved = if at <= self.instant {
            self.wall.checked_sub(self.instant - at)
        } else {
            self.wall.checked_add(at - self.instant)
        };
        moved.unwrap_or(UNIX_EPOCH)
    }
}

/// A wall-clock time as JSON gives it: RFC 3339 text, and milliseconds since the Unix epoch.
struct Time {
    text: String,
    unix_ms: u64,
}

impl Time {
    fn new(t: SystemTime) -> Self {
        Time {
            text: crate::time::rfc3339(t),
            unix_ms: crate::time::unix_ms(t),
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

#[derive(Serialize)]
struct HealthBody<'a> {
    healthy: bool,
    elections: Vec<HealthReport<'a>>,
}

#[derive(Serialize)]
struct HealthReport<'a> {
    election: &'a str,
    role: &'static str,
    healthy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

#[derive(Serialize)]
struct ReadyBody<'a> {
    ready: bool,
    elections: Vec<ReadyReport<'a>>,
}

#[derive(Serialize)]
struct ReadyReport<'a> {
    election: &'a str,
    role: &'static str,
    ready: bool,
    /// The store trouble the campaign is working around, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<&'a str>,
}

#[derive(Serialize)]
struct LeaderBody<'a> {
    elections: Vec<LeaderReport<'a>>,
}

#[derive(Serialize)]
struct CandidateReport<'a> {
    id: &'a str,
    metadata: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
struct LeaderReport<'a> {
    election: &'a str,
    candidate: CandidateReport<'a>,
    role: &'static str,
    is_leader: bool,
    healthy: bool,
    leader: Option<LeaderInfo<'a>>,
    term: Option<TermInfo>,
    last_renewal: Option<String>,
    last_renewal_unix_ms: Option<u64>,
    renew_deadline_at: Option<String>,
    renew_deadline_at_unix_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cooling_down_until: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cooling_down_until_unix_ms: Option<u64>,
    problem: Option<ProblemInfo<'a>>,
    last_demotion: Option<&'static str>,
    wakeup: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    poll_interval_ms: Option<u64>,
}

#[derive(Serialize)]
struct LeaderInfo<'a> {
    id: &'a str,
    metadata: &'a BTreeMap<String, String>,
    fencing_token: Option<u64>,
    since: Option<String>,
    since_unix_ms: Option<u64>,
}

#[derive(Serialize)]
struct TermInfo {
    fencing_token: u64,
    started_at: String,
    started_at_unix_ms: u64,
}

#[derive(Serialize)]
struct ProblemInfo<'a> {
    message: &'a str,
    since: String,
    since_unix_ms: u64,
}

/// An optional time as its two JSON fields: RFC 3339 text and Unix milliseconds.
fn split(time: Option<Time>) -> (Option<String>, Option<u64>) {
    match time {
        Some(Time { text, unix_ms }) => (Some(text), Some(unix_ms)),
        None => (None, None),
    }
}

impl<'a> LeaderReport<'a> {
    fn new(s: &'a Status, clock: &Clock, healthy: bool) -> Self {
        let (last_renewal, last_renewal_unix_ms) =
            split(s.last_renewal().map(|at| Time::new(clock.wall(at))));
        let (renew_deadline_at, renew_deadline_at_unix_ms) =
            split(s.renew_deadline_at().map(|at| Time::new(clock.wall(at))));
        let (cooling_down_until, cooling_down_until_unix_ms) = split(match s.role {
            Role::CoolingDown { until } => Some(Time::new(clock.wall(until))),
            _ => None,
        });
        LeaderReport {
            election: &s.election,
            candidate: CandidateReport {
                id: &s.candidate.id,
                metadata: &s.candidate.metadata,
            },
            role: s.current_role().as_str(),
            is_leader: s.is_leader(),
            healthy,
            leader: s.leader.as_ref().map(|l| {
                let (since, since_unix_ms) = split(l.since().map(Time::new));
                LeaderInfo {
                    id: &l.candidate.id,
                    metadata: &l.candidate.metadata,
                    fencing_token: l.fencing_token,
                    since,
                    since_unix_ms,
                }
            }),
            term: s.term.as_ref().filter(|t| !t.is_cancelled()).map(|t| {
                let started = Time::new(t.started_at());
                TermInfo {
                    fencing_token: t.fencing_token(),
                    started_at: started.text,
                    started_at_unix_ms: started.unix_ms,
                }
            }),
            last_renewal,
            last_renewal_unix_ms,
            renew_deadline_at,
            renew_deadline_at_unix_ms,
            cooling_down_until,
            cooling_down_until_unix_ms,
            problem: s.problem.as_ref().map(|p| {
                let since = Time::new(p.since_wall);
                ProblemInfo {
                    message: &p.message,
                    since: since.text,
                    since_unix_ms: since.unix_ms,
                }
            }),
            last_demotion: s.last_demotion.map(DemotionReason::as_str),
            wakeup: match s.wakeup {
                Wakeup::Push => "push",
                Wakeup::Poll(_) => "poll",
            },
            poll_interval_ms: match s.wakeup {
                Wakeup::Push => None,
                Wakeup::Poll(every) => Some(u64::try_from(every.as_millis()).unwrap_or(u64::MAX)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn election_parameters_are_decoded() {
        assert_eq!(
            elections_in("election=jobs%2Findex&x=1&election=a/b+c"),
            Some(vec!["jobs/index".to_owned(), "a/b c".to_owned()])
        );
        assert_eq!(elections_in(""), Some(vec![]));
        assert_eq!(elections_in("election=%zz"), None);
        assert_eq!(elections_in("election=%ff"), None);
    }

    fn status(role: Role, renew_deadline_at: Option<Instant>) -> Status {
        let renew_deadline = Duration::from_secs(2);
        // A session whose last confirmed renewal puts the deadline where asked.
        let session = renew_deadline_at.map(|at| {
            tokio::sync::watch::channel(crate::backend::SessionHealth {
                confirmed_sent_at: at - renew_deadline,
                lost: None,
                last_error: None,
            })
            .1
        });
        Status {
            election: "jobs/index".into(),
            candidate: crate::Candidate {
                id: "a".into(),
                metadata: BTreeMap::new(),
            },
            role,
            leader: None,
            term: None,
            session,
            renew_deadline,
            problem: Some(crate::Problem {
                message: "the store is unreachable".into(),
                since: Instant::now(),
                since_wall: SystemTime::now(),
            }),
            last_demotion: Some(DemotionReason::RenewDeadlineExceeded),
            wakeup: Wakeup::Poll(Duration::from_millis(200)),
        }
    }

    #[test]
    fn leader_says_how_followers_wake() {
        let clock = Clock::now();
        let mut s = status(Role::Follower, None);
        let polled = serde_json::to_value(LeaderReport::new(&s, &clock, true)).expect("json");
        assert_eq!(polled["wakeup"], "poll");
        assert_eq!(polled["poll_interval_ms"], 200);
        s.wakeup = Wakeup::Push;
        let pushed = serde_json::to_value(LeaderReport::new(&s, &clock, true)).expect("json");
        assert_eq!(pushed["wakeup"], "push");
        assert!(pushed.get("poll_interval_ms").is_none(), "{pushed}");
    }

    #[test]
    fn only_a_stuck_or_stopped_campaign_is_unhealthy() {
        let health = Health::new().stuck_after(Duration::from_secs(5));
        let now = Instant::now() + Duration::from_secs(60);
        let stuck = status(Role::Leader, Some(now - Duration::from_secs(6)));
        let reason = health.diagnose(&stuck, now).expect("stuck");
        assert!(reason.contains("stuck"), "{reason}");
        assert!(health.diagnose(&status(Role::Stopped, None), now).is_some());
        // About to fence itself, fenced, or unable to reach the store: healthy.
        let fencing = status(Role::Leader, Some(now - Duration::from_secs(4)));
        assert_eq!(health.diagnose(&fencing, now), None);
        for role in [
            Role::Follower,
            Role::Candidate,
            Role::Connecting,
            Role::SteppingDown,
        ] {
            assert_eq!(health.diagnose(&status(role, None), now), None, "{role:?}");
        }
        let cooling = Role::CoolingDown { until: now };
        assert_eq!(health.diagnose(&status(cooling, None), now), None);
    }
}
