//! A follower whose observer fails keeps reporting leader changes: the campaign re-creates
//! the observer with back-off. On etcd, a follower waits only on its predecessor's key, so a
//! change of leader further up the queue reaches it only through its observer.
//!
//! The failure is injected at the backend boundary (an observer that errors once, in front of
//! a real etcd), since a real store fails the observer and the follower's own wait together.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::EtcdServer;
use crate::support::events::elected;
use incumbent::backend::{Backend, BackendInfo, Leader, Observer, SessionOptions};
use incumbent::etcd::EtcdBackend;
use incumbent::{Election, Error, Result, Role};
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(4);
const PATIENCE: Duration = Duration::from_secs(10);

/// An etcd backend whose observers fail once, on their second report.
#[derive(Clone)]
struct FlakyObservers {
    etcd: EtcdBackend,
    failures: Arc<AtomicU32>,
}

struct FlakyObserver {
    inner: <EtcdBackend as Backend>::Observer,
    reports: u32,
    failures: Arc<AtomicU32>,
}

impl Observer for FlakyObserver {
    async fn next(&mut self) -> Result<Option<Leader>> {
        self.reports += 1;
        if self.reports == 2 && self.failures.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(Error::Unavailable {
                backend: "etcd",
                reason: "injected: the observer's watch broke".into(),
            });
        }
        self.inner.next().await
    }
}

impl Backend for FlakyObservers {
    type Session = <EtcdBackend as Backend>::Session;
    type Observer = FlakyObserver;

    fn info(&self) -> BackendInfo {
        self.etcd.info()
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<Self::Session> {
        self.etcd.open_session(options).await
    }

    async fn observe(&self, election: &str) -> Result<FlakyObserver> {
        Ok(FlakyObserver {
            inner: self.etcd.observe(election).await?,
            reports: 0,
            failures: self.failures.clone(),
        })
    }
}

async fn connect(etcd: &EtcdServer) -> EtcdBackend {
    EtcdBackend::builder(etcd.endpoints())
        .connect()
        .await
        .expect("connect to etcd")
}

fn election<B: Backend>(backend: B, id: &str) -> Election<B> {
    Election::builder(backend, "observed")
        .candidate(id)
        .ttl(TTL)
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .build()
        .expect("valid settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_observer_failed_still_sees_the_next_leader() {
    let etcd = EtcdServer::single().await;
    let mut a = election(connect(&etcd).await, "a").campaign();
    elected(&mut a, PATIENCE).await;
    let mut b = election(connect(&etcd).await, "b").campaign();
    let mut b_status = b.status();
    timeout(PATIENCE, b_status.wait_for(|s| s.role == Role::Follower))
        .await
        .expect("b follows")
        .expect("b runs");
    let failures = Arc::new(AtomicU32::new(0));
    let c_backend = FlakyObservers {
        etcd: connect(&etcd).await,
        failures: failures.clone(),
    };
    let c = election(c_backend, "c").campaign();
    let mut c_status = c.status();
    timeout(
        PATIENCE,
        c_status.wait_for(|s| {
            s.role == Role::Follower && s.leader.as_ref().is_some_and(|l| l.candidate.id == "a")
        }),
    )
    .await
    .expect("c follows a")
    .expect("c runs");
    // c's observer fails once; c's own wait (on b's key, its predecessor) is untouched.
    timeout(PATIENCE, async {
        while failures.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the observer's failure was injected");

    // a steps down: b leads, and c, still waiting on b's key, learns it from its observer.
    a.resign().await.expect("resign");
    elected(&mut b, PATIENCE).await;
    timeout(
        PATIENCE,
        c_status.wait_for(|s| s.leader.as_ref().is_some_and(|l| l.candidate.id == "b")),
    )
    .await
    .expect("c reports b as the leader after its observer failed")
    .expect("c runs");
    assert_eq!(c_status.borrow().role, Role::Follower);
}
