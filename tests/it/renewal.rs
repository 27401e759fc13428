//! A renewal slower than the renew interval, but confirmed well within the renew deadline,
//! must not cost a healthy leader its term (issue 10, point 4).
//!
//! Each test slows every request of the leader's connection by more than the renew interval
//! and checks that the leader keeps its term: no `Demoted` event, the same fencing token, and
//! renewals still confirmed. On the memory backend with paused time, then against a real etcd
//! and a real Consul agent through a TCP proxy that delays every chunk of bytes. A missing
//! server binary fails the test with the install hint (`scripts/install-test-deps`).

use std::time::Duration;

use crate::support::events::{demoted, elected};
use crate::support::{ConsulDev, EtcdServer, Proxy};
use incumbent::backend::Backend;
use incumbent::consul::{ConsulBackend, ConsulConfig};
use incumbent::etcd::EtcdBackend;
use incumbent::memory::MemoryBackend;
use incumbent::{Campaign, Election, LeadershipEvent, Term};
use tokio::time::Instant;

/// How long any expected event may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

fn election<B: Backend>(
    backend: B,
    name: &str,
    ttl: Duration,
    renew_interval: Option<Duration>,
) -> Election<B> {
    let mut builder = Election::builder(backend, name)
        .candidate("a")
        .ttl(ttl)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .grace(Duration::from_millis(100));
    if let Some(interval) = renew_interval {
        builder = builder.renew_interval(interval);
    }
    builder.build().expect("valid election")
}

/// Fails if the campaign is demoted (or stops) within `period`, or its term ends; checks
/// that renewals were still confirmed during the period.
async fn keeps_its_term(campaign: &mut Campaign, term: &Term, period: Duration) {
    let start = Instant::now();
    let until = start + period;
    while let Ok(event) = tokio::time::timeout_at(until, campaign.recv()).await {
        match event {
            Some(LeadershipEvent::LeaderChanged(_)) => {}
            other => panic!(
                "expected to keep the term, got {other:?} after {:?}; status: {:?}",
                start.elapsed(),
                campaign.status().borrow()
            ),
        }
    }
    let status = campaign.status().borrow().clone();
    assert!(status.is_leader(), "no longer leads: {status:?}");
    assert!(!term.is_cancelled(), "the term was cancelled");
    assert_eq!(
        status.term.as_ref().map(Term::fencing_token),
        Some(term.fencing_token()),
        "a different term"
    );
    let last = status.last_renewal().expect("a confirmed renewal");
    assert!(
        last > start,
        "no renewal confirmed during the slow period: {status:?}"
    );
}

/// Memory backend, paused time: ttl 3 s, renew deadline 2 s (the default 2/3), renew
/// interval 0.5 s. Every call of the leader's client takes 1.3 s: longer than the renew
/// interval, well within the deadline. Renewals are pipelined: confirmations keep coming.
#[tokio::test(start_paused = true)]
async fn memory_leader_keeps_its_term_when_renewals_take_longer_than_the_renew_interval() {
    let store = MemoryBackend::new();
    let client = store.client();
    let ttl = Duration::from_secs(3);
    let interval = Some(Duration::from_millis(500));
    let mut campaign = election(client.clone(), "slow", ttl, interval).campaign();
    let term = elected(&mut campaign, ttl).await;
    client.set_latency(Duration::from_millis(1300));
    keeps_its_term(&mut campaign, &term, ttl * 10).await;
    client.set_latency(Duration::ZERO);
    keeps_its_term(&mut campaign, &term, ttl * 2).await;
    assert_eq!(
        store.holder("slow").and_then(|l| l.fencing_token),
        Some(term.fencing_token())
    );
}

/// Memory backend, paused time, default timing (ttl 3 s, renew interval 1 s, renew deadline
/// 2 s): one renewal hangs for longer than the ttl, the calls after it are fast. The leader
/// keeps its term, confirmed by a later attempt well before the deadline.
#[tokio::test(start_paused = true)]
async fn memory_leader_keeps_its_term_when_one_renewal_hangs() {
    let store = MemoryBackend::new();
    let client = store.client();
    let ttl = Duration::from_secs(3);
    let interval = ttl / 3;
    let mut campaign = election(client.clone(), "one-slow", ttl, None).campaign();
    let term = elected(&mut campaign, ttl).await;
    let mut renewals = campaign.status().borrow().renewals().expect("a session");
    // Line up with the renewal cadence: right after a confirmation, the next renewal is
    // sent one renew interval after that confirmation's send.
    renewals.changed().await.expect("session open");
    let confirmed = renewals.borrow_and_update().confirmed_sent_at;
    tokio::time::sleep_until(confirmed + interval - Duration::from_millis(10)).await;
    client.set_latency(ttl * 2);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The renewal sent meanwhile hangs for 6 s; everything sent from now on is fast.
    client.set_latency(Duration::ZERO);
    keeps_its_term(&mut campaign, &term, ttl * 3).await;
    let last = campaign
        .status()
        .borrow()
        .last_renewal()
        .expect("a renewal");
    assert!(last > confirmed + interval, "no later renewal confirmed");
}

/// Memory backend, paused time: renewals cost the leaders of a session nothing. 200 leaders
/// on one session, across ten renewals: none of their statuses changes (a status written at
/// each renewal woke every election of the session at every renewal: 5,000 wake-ups a second
/// for 10,000 leaders at ttl 6 s), while each reads the last renewal live, and all fence
/// themselves at the deadline once renewals stop.
#[tokio::test(start_paused = true)]
async fn memory_renewals_wake_no_leader_and_the_deadline_still_fences_them_all() {
    let store = MemoryBackend::new();
    let client = store.client();
    let ttl = Duration::from_secs(3);
    let mut campaigns = Vec::new();
    for n in 0..200 {
        campaigns.push(election(client.clone(), &format!("quiet-{n}"), ttl, None).campaign());
    }
    let mut terms = Vec::new();
    for campaign in &mut campaigns {
        terms.push(elected(campaign, ttl).await);
    }
    let mut statuses: Vec<_> = campaigns.iter().map(Campaign::status).collect();
    let before = statuses[0]
        .borrow_and_update()
        .last_renewal()
        .expect("a renewal");
    for status in &mut statuses {
        status.mark_unchanged();
    }
    tokio::time::sleep(ttl * 10 / 3).await;
    let changed = statuses
        .iter()
        .filter(|s| s.has_changed().unwrap_or(true))
        .count();
    assert_eq!(changed, 0, "statuses changed by renewals alone");
    for status in &statuses {
        let s = status.borrow();
        assert!(s.is_leader(), "{s:?}");
        let last = s.last_renewal().expect("a renewal");
        assert!(
            last >= before + ttl * 2,
            "the last renewal is not read live: {s:?}"
        );
        assert_eq!(s.renew_deadline_at(), Some(last + ttl * 2 / 3));
    }
    // The session stops being renewed: every leader fences itself at the deadline.
    let last = statuses[0].borrow().last_renewal().expect("a renewal");
    client.set_reachability(incumbent::memory::Reachability::Hanging);
    for campaign in &mut campaigns {
        demoted(campaign, ttl).await;
    }
    let fenced = Instant::now();
    assert!(terms.iter().all(Term::is_cancelled));
    assert!(
        fenced <= last + ttl * 2 / 3 + Duration::from_millis(1),
        "fenced {:?} after the last confirmed renewal",
        fenced - last
    );
}

/// Memory backend, paused time: a store that stops answering still costs the term at the
/// renew deadline, as before (retrying inside the deadline does not stretch it).
#[tokio::test(start_paused = true)]
async fn memory_leader_still_fences_itself_at_the_deadline_when_renewals_never_return() {
    let store = MemoryBackend::new();
    let client = store.client();
    let ttl = Duration::from_secs(3);
    let mut campaign = election(client.clone(), "hung", ttl, None).campaign();
    let term = elected(&mut campaign, ttl).await;
    let last = campaign
        .status()
        .borrow()
        .last_renewal()
        .expect("a renewal");
    client.set_reachability(incumbent::memory::Reachability::Hanging);
    demoted(&mut campaign, ttl).await;
    let fenced = Instant::now();
    assert!(term.is_cancelled());
    // The deadline is 2/3 ttl after the last confirmed send.
    assert!(
        fenced <= last + ttl * 2 / 3 + Duration::from_millis(1),
        "fenced {:?} after the last confirmed renewal",
        fenced - last
    );
}

/// Real etcd through a proxy: ttl 6 s, renew deadline 4 s (the default 2/3), renew interval
/// 1 s. The proxy delays each chunk by 600 ms each way, so a renewal's round trip takes 1.2 s
/// or more: longer than the renew interval, well within the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_keeps_its_term_when_renewals_take_longer_than_the_renew_interval() {
    let etcd = EtcdServer::single().await;
    let proxy = Proxy::start(etcd.client_addr());
    let backend = EtcdBackend::builder([format!("http://{}", proxy.addr())])
        .connect_timeout(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect to etcd through the proxy");
    let ttl = Duration::from_secs(6);
    let mut campaign = election(backend, "slow", ttl, Some(Duration::from_secs(1))).campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    proxy.set_latency(Duration::from_millis(600));
    keeps_its_term(&mut campaign, &term, ttl * 3).await;
    proxy.set_latency(Duration::ZERO);
    keeps_its_term(&mut campaign, &term, Duration::from_secs(2)).await;
}

/// Real Consul through a proxy: ttl 10 s (Consul's minimum), renew deadline 8 s (the
/// default 4/5), renew interval 2 s. The proxy delays each chunk by 1.2 s each way, so a
/// renewal's round trip takes 2.4 s or more: longer than the renew interval, well within the
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_leader_keeps_its_term_when_renewals_take_longer_than_the_renew_interval() {
    let consul = ConsulDev::start().await;
    let proxy = Proxy::start(consul.http_addr());
    let backend = ConsulBackend::new(
        ConsulConfig::new(format!("http://{}", proxy.addr()))
            .request_timeout(Duration::from_secs(15)),
    )
    .expect("valid backend");
    let ttl = Duration::from_secs(10);
    let mut campaign = election(backend, "slow", ttl, Some(Duration::from_secs(2))).campaign();
    let term = elected(&mut campaign, PATIENCE).await;
    proxy.set_latency(Duration::from_millis(1200));
    keeps_its_term(&mut campaign, &term, ttl * 2).await;
    proxy.set_latency(Duration::ZERO);
    keeps_its_term(&mut campaign, &term, Duration::from_secs(3)).await;
}
