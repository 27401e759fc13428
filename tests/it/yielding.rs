//! `resign_for`: a candidate that resigns for a while does not campaign again until it has
//! passed, leader or follower, on the memory backend and on etcd (whose followers queue in
//! the store: one that yields must leave the line, or it would win when its predecessor
//! goes).

use std::time::Duration;

use crate::support::events::elected;
use incumbent::backend::Backend;
use incumbent::memory::MemoryBackend;
use incumbent::{Campaign, Election, Role};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);
const PATIENCE: Duration = Duration::from_secs(15);

fn campaign<B: Backend>(backend: B, id: &str) -> Campaign {
    Election::builder(backend, "jobs/yield")
        .candidate(id)
        .ttl(TTL)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .build()
        .expect("valid election")
        .campaign()
}

/// Waits until the campaign says follower.
async fn following(campaign: &Campaign) {
    let mut status = campaign.status();
    tokio::time::timeout(PATIENCE, status.wait_for(|s| s.role == Role::Follower))
        .await
        .expect("follows")
        .expect("the campaign lives");
}

/// `a` leads alone, resigns for `pause`: it does not lead again before `pause` has passed,
/// says so in its status meanwhile, and leads again after it with a greater token.
async fn a_lone_leader_that_resigns_for_a_while_leads_again_only_after_it<B: Backend>(backend: B) {
    let mut a = campaign(backend, "a");
    let first = elected(&mut a, PATIENCE).await;
    let pause = Duration::from_secs(2);
    let resigned = Instant::now();
    a.resign_for(pause).await.expect("resign for a while");
    assert!(first.is_cancelled());
    assert!(
        matches!(
            a.status().borrow().role,
            Role::CoolingDown { .. } | Role::SteppingDown
        ),
        "{:?}",
        a.status().borrow().role
    );
    let second = elected(&mut a, PATIENCE).await;
    let took = resigned.elapsed();
    assert!(
        took >= pause,
        "led again {took:?} after resigning for {pause:?}"
    );
    assert!(second.fencing_token() > first.fencing_token());
    a.shutdown().await.expect("shutdown");
}

/// `a` leads; `b` and then `c` follow (on etcd, in that order in the line). `b` resigns for
/// a while; `a` resigns: `c` leads, not `b`, and `b` campaigns again (following) once its
/// while has passed.
async fn a_follower_that_resigns_for_a_while_leaves_the_line<B: Backend>(connect: impl Fn() -> B) {
    let mut a = campaign(connect(), "a");
    elected(&mut a, PATIENCE).await;
    let b = campaign(connect(), "b");
    following(&b).await;
    let mut c = campaign(connect(), "c");
    following(&c).await;
    let pause = Duration::from_secs(3);
    b.resign_for(pause).await.expect("resign for a while");
    let resigned = Instant::now();
    a.resign().await.expect("resign");
    elected(&mut c, PATIENCE).await;
    assert!(!b.status().borrow().is_leader(), "b won while it yielded");
    following(&b).await;
    assert!(
        resigned.elapsed() >= pause - Duration::from_millis(100),
        "b campaigned again {:?} after resigning for {pause:?}",
        resigned.elapsed()
    );
    for campaign in [a, b, c] {
        campaign.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_lone_leader_that_resigns_for_a_while_leads_again_only_after_it() {
    a_lone_leader_that_resigns_for_a_while_leads_again_only_after_it(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_follower_that_resigns_for_a_while_leaves_the_line() {
    let store = MemoryBackend::new();
    a_follower_that_resigns_for_a_while_leaves_the_line(|| store.client()).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_lone_leader_that_resigns_for_a_while_leads_again_only_after_it() {
    let etcd = crate::support::EtcdServer::single().await;
    let backend = incumbent::etcd::EtcdBackend::connect(etcd.endpoints())
        .await
        .expect("connect to etcd");
    a_lone_leader_that_resigns_for_a_while_leads_again_only_after_it(backend).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_follower_that_resigns_for_a_while_leaves_the_line() {
    let etcd = crate::support::EtcdServer::single().await;
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(
            incumbent::etcd::EtcdBackend::connect(etcd.endpoints())
                .await
                .expect("connect to etcd"),
        );
    }
    let next = std::sync::Mutex::new(backends.into_iter());
    a_follower_that_resigns_for_a_while_leaves_the_line(|| {
        next.lock().unwrap().next().expect("three backends")
    })
    .await;
}
