//! Deterministic simulation of the campaign engine (see SIMULATION.md).
//!
//! One seed fixes everything: the run's settings, every network fault, every operator
//! action, and the engine's own back-off jitter. Three candidates campaign through the real
//! engine (`Election::campaign`) against a simulated store ([`store`]), on a current-thread
//! tokio runtime with paused time: a run of tens of simulated seconds takes milliseconds,
//! and the same seed replays the same schedule exactly. The checker ([`world`]) watches
//! every grant, every event and every term, and a periodic step in between.

pub mod kv;
pub mod queue;
pub mod store;
pub mod world;

use std::sync::Arc;
use std::time::Duration;

use fastrand::Rng;
use incumbent::backend::Backend;
use incumbent::{Campaign, CampaignHandle, Election, LeadershipEvent, Term, TermGuard};
use tokio::time::{Instant, sleep, sleep_until};

pub use kv::KvBackend;
pub use store::{Link, SimBackend, World};
pub use world::{Bug, Params, Profile, State, Stats, StoreKind};

/// The number of candidates.
pub const CANDIDATES: usize = 3;
/// The election every candidate contends for.
const ELECTION: &str = "sim";
/// How often the checker's periodic step runs, in simulated time.
const TICK: Duration = Duration::from_millis(10);

/// How to run a seed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Plant a bug in the store or backend.
    pub bug: Option<Bug>,
    /// Keep the history of the run, to print it.
    pub verbose: bool,
    /// The store to simulate; by default Consul's, or the planted bug's store.
    pub store: Option<StoreKind>,
}

impl Options {
    /// The store this run simulates.
    pub fn store(&self) -> StoreKind {
        self.store
            .or(self.bug.map(Bug::store))
            .unwrap_or(StoreKind::Consul)
    }
}

/// What one seed's run found.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    /// The run's settings, in one line.
    pub settings: String,
    /// Every invariant broken (at most 20), with the simulated time.
    pub violations: Vec<String>,
    pub stats: Stats,
    /// From the end of faults to a leader in place, if one came.
    pub time_to_leader: Option<Duration>,
    /// The simulated time the run covered.
    pub simulated: Duration,
    /// A hash of the whole history: equal for two runs of one seed.
    pub history_hash: u64,
    /// The history, when asked for.
    pub trace: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Draws a run's settings from its seed.
fn params(rng: &mut Rng, bug: Option<Bug>, store: StoreKind) -> Params {
    let ttl = Duration::from_millis([500, 1000, 2000][rng.usize(..3)]);
    let lock_delay = match rng.u32(..3) {
        0 => None,
        1 => Some(Duration::ZERO),
        _ => Some(Duration::from_millis(
            rng.u64(1..=ttl.as_millis() as u64 / 2),
        )),
    };
    let mut params = Params {
        ttl,
        lock_delay,
        request_timeout: ttl,
        max_wait: Duration::from_secs(5),
        grace: ttl / 2,
        backoff: (Duration::from_millis(100), Duration::from_secs(2)),
        operator_faults: rng.u32(..100) < 30,
        intensity: 0.2 + 0.8 * rng.f32(),
        faults_for: Duration::from_millis(rng.u64(5_000..=20_000)),
        bug,
        store,
        poll: Duration::ZERO,
        restarts: false,
    };
    // The other stores draw more, after Consul's draws: Consul's seeds stay as they were.
    if store != StoreKind::Consul {
        // No lock-delay but Consul's.
        params.lock_delay = None;
    }
    if store.polled() {
        if store == StoreKind::NonAtomic && params.ttl < Duration::from_secs(1) {
            // memcached counts expiry in whole seconds.
            params.ttl = Duration::from_secs(1);
            params.grace = params.ttl / 2;
        }
        let ttl = params.ttl.as_millis() as u64;
        // A client of a polled store gives up sooner than a blocking query's: a quarter ttl.
        params.request_timeout = params.ttl / 4;
        params.poll = Duration::from_millis(rng.u64(ttl / 5..=ttl / 2));
        params.restarts = store == StoreKind::Forgetful || rng.u32(..100) < 30;
    }
    params
}

/// Runs one seed on a fresh current-thread runtime with paused time.
pub fn run_seed(seed: u64, options: Options) -> Report {
    // The engine's back-off jitter comes from fastrand's thread-local generator: seed it,
    // so that it too is a function of the seed (the whole run stays on this thread).
    fastrand::seed(seed ^ 0x5eed_5eed_5eed_5eed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(simulate(seed, options))
}

async fn simulate(seed: u64, options: Options) -> Report {
    let mut rng = Rng::with_seed(seed);
    let params = params(&mut rng, options.bug, options.store());
    let start = Instant::now();
    let world = World::new(
        State::new(rng, params.clone(), CANDIDATES, options.verbose),
        CANDIDATES,
    );
    let settings = world.lock().describe();
    tokio::spawn(world.clone().reap());

    let handles = if params.store.polled() {
        campaigns(&world, &params, |client| {
            KvBackend::new(world.clone(), client)
        })
    } else {
        campaigns(&world, &params, |client| {
            SimBackend::new(world.clone(), client)
        })
    };
    tokio::spawn(chaos(world.clone(), handles, start + params.faults_for));

    // The periodic step, and liveness: once the faults stop, a leader within the bound.
    let mut time_to_leader = None;
    let mut end = start + params.faults_for + params.ttl + params.liveness_bound();
    loop {
        sleep(TICK).await;
        let now = Instant::now();
        let (leader, calm_since) = {
            let mut state = world.lock();
            (state.tick(now), state.calm_since)
        };
        if let Some(calm) = calm_since
            && leader
            && time_to_leader.is_none()
        {
            time_to_leader = Some(now.duration_since(calm));
            // Go on a little: a late message could still break something.
            end = now + params.ttl * 2;
        }
        if now >= end {
            break;
        }
    }
    let now = Instant::now();
    let mut state = world.lock();
    if time_to_leader.is_none() {
        let bound = params.liveness_bound();
        let calm = state.calm_since.map(|at| state.ms(at));
        let message =
            format!("no leader within {bound:?} after the faults stopped (at {calm:?} ms)");
        state.push_violation(now, message);
    }
    state.finish(now);
    Report {
        seed,
        settings,
        violations: state.violations().to_vec(),
        stats: state.stats,
        time_to_leader,
        simulated: now.duration_since(start),
        history_hash: state.hash(),
        trace: state.take_trace(),
    }
}

/// Starts the three campaigns, each on its own client of the store.
fn campaigns<B: Backend>(
    world: &Arc<World>,
    params: &Params,
    backend: impl Fn(usize) -> B,
) -> Vec<CampaignHandle> {
    let mut handles = Vec::new();
    for client in 0..CANDIDATES {
        let mut builder = Election::builder(backend(client), ELECTION)
            .candidate(format!("c{client}"))
            .ttl(params.ttl)
            .backoff(params.backoff.0, params.backoff.1)
            .grace(params.grace)
            // The simulated stores model one election: a candidate's presence record or a
            // watch of the request lock would be the election's key itself. Hand-overs are
            // not simulated.
            .accept_hand_overs(false)
            .switchover_requests(false);
        if let Some(delay) = params.lock_delay {
            builder = builder.lock_delay(delay);
        }
        let election = builder.build().expect("valid simulated settings");
        let campaign = election.campaign();
        let mut state = world.lock();
        state.renew_deadline = election.config().renew_deadline;
        state.add_view(campaign.status());
        drop(state);
        handles.push(campaign.handle());
        tokio::spawn(collect(world.clone(), client, campaign));
    }
    handles
}

/// Reads one campaign's events into the checker, and runs a simulated worker per term.
async fn collect(world: Arc<World>, client: usize, mut campaign: Campaign) {
    while let Some(event) = campaign.recv().await {
        let now = Instant::now();
        match event {
            LeadershipEvent::Elected(term) => {
                world.lock().on_elected(client, &term, now);
                let guard = term.hold();
                tokio::spawn(work(world.clone(), client, term, guard));
            }
            LeadershipEvent::Demoted { fencing_token, .. } => {
                world.lock().on_demoted(client, fencing_token, now);
            }
            LeadershipEvent::LeaderChanged(_) => {}
        }
    }
}

/// A worker that honours its term: it notices the cancellation at once, takes a while
/// (drawn, at most half the grace) to wind down, but never past the term's `stop_by`.
async fn work(world: Arc<World>, client: usize, term: Term, guard: TermGuard) {
    let token = term.fencing_token();
    term.cancelled().await;
    let now = Instant::now();
    let wind_down = {
        let mut state = world.lock();
        state.on_cancelled(client, token, now);
        let most = state.params.grace.as_millis() as u64 / 2;
        Duration::from_millis(state.rng.u64(0..=most))
    };
    let until = match term.stop_by() {
        Some(at) => (now + wind_down).min(at),
        None => now + wind_down,
    };
    sleep_until(until).await;
    drop(guard);
    world
        .lock()
        .on_worker_stopped(client, token, Instant::now());
}

/// The fault schedule: until `calm_at`, every few hundred milliseconds, one of: a new
/// network profile for a client (losses, errors, latency spikes up to 1.5 ttl, slow replies), a partition
/// of a client (both directions, or only one), a heal of everything, a resignation of the leader, and (in some runs) an
/// operator invalidating the holder's session or deleting the key. Then the network heals
/// for good.
async fn chaos(world: Arc<World>, handles: Vec<CampaignHandle>, calm_at: Instant) {
    let clients = world.clients();
    loop {
        let (pause, action, client) = {
            let mut state = world.lock();
            let most = state.params.ttl.as_millis() as u64;
            (
                Duration::from_millis(state.rng.u64(10..=most)),
                state.rng.u32(..100),
                state.rng.usize(..clients),
            )
        };
        sleep(pause).await;
        let now = Instant::now();
        if now >= calm_at {
            break;
        }
        let mut state = world.lock();
        match action {
            0..=29 => {
                let (intensity, ttl) = (state.params.intensity, state.params.ttl);
                let rng = &mut state.rng;
                let profile = Profile {
                    drop: rng.f32() * 0.3 * intensity,
                    fail: rng.f32() * 0.2 * intensity,
                    spike: rng.f32() * 0.4 * intensity,
                    spike_max: Duration::from_millis(rng.u64(0..=ttl.as_millis() as u64 * 3 / 2)),
                    slow_replies: match rng.u32(..4) {
                        0 => Duration::from_millis(rng.u64(0..=ttl.as_millis() as u64 / 2)),
                        _ => Duration::ZERO,
                    },
                };
                state.record(now, || format!("c{client} network: {profile:?}"));
                state.profiles[client] = profile;
            }
            30..=49 => {
                let most = state.params.ttl.as_millis() as u64 * 3;
                let length = Duration::from_millis(state.rng.u64(50..=most));
                let link = match state.rng.u32(..100) {
                    0..=59 => Link {
                        outbound_cut: true,
                        inbound_cut: true,
                    },
                    60..=84 => Link {
                        outbound_cut: true,
                        inbound_cut: false,
                    },
                    _ => Link {
                        outbound_cut: false,
                        inbound_cut: true,
                    },
                };
                state.record(now, || {
                    format!("c{client} partitioned for {length:?}: {link:?}")
                });
                drop(state);
                world.set_link(client, link);
                let world = world.clone();
                tokio::spawn(async move {
                    sleep(length).await;
                    world
                        .lock()
                        .record(Instant::now(), || format!("c{client} link healed"));
                    world.set_link(client, Link::UP);
                });
            }
            50..=59 => {
                state.record(now, || "network healed".into());
                heal(&world, state);
            }
            60..=69 if handles[client].status().borrow().is_leader() => {
                state.record(now, || format!("c{client} resigns"));
                let handle = handles[client].clone();
                tokio::spawn(async move {
                    let _ = handle.resign().await;
                });
            }
            70..=74 if state.params.operator_faults => state.operator_invalidate(now),
            75..=77 if state.params.operator_faults => state.operator_delete(now),
            78..=84 if state.params.restarts => state.kv_restart(now),
            _ => {}
        }
    }
    let mut state = world.lock();
    let now = Instant::now();
    state.record(now, || "faults stop; network healed for good".into());
    state.calm_since = Some(now);
    heal(&world, state);
}

fn heal(world: &World, mut state: std::sync::MutexGuard<'_, State>) {
    for profile in &mut state.profiles {
        *profile = Profile::CALM;
    }
    drop(state);
    for client in 0..world.clients() {
        world.set_link(client, Link::UP);
    }
}
