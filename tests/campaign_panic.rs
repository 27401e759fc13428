//! A panic in a campaign's task (here: a `tracing` subscriber that panics) ends its term,
//! is reported (a `Demoted` event, the status's problem), and the campaign goes on: it never
//! dies silently. In a file of its own: it installs the process's global subscriber.

use std::time::Duration;

use incumbent::memory::MemoryBackend;
use incumbent::{DemotionReason, Election, Error, Role};

mod support;
use support::events::{demoted, elected};
#[path = "support/panicking.rs"]
mod panicking;
use panicking::PanicOn;

const TTL: Duration = Duration::from_secs(3);

fn election(backend: &MemoryBackend, id: &str) -> Election<MemoryBackend> {
    Election::builder(backend.clone(), "jobs/index")
        .candidate(id)
        .ttl(TTL)
        .build()
        .expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_campaign_task_ends_the_term_is_reported_and_the_campaign_goes_on() {
    use tracing_subscriber::layer::SubscriberExt;
    // The process's only subscriber (this file holds one test): the campaign's task logs
    // through it. A thread-local default would race with tracing's callsite interest cache.
    let subscriber = tracing_subscriber::registry().with(PanicOn::new("leader changed"));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let store = MemoryBackend::new();
    let mut a = election(&store.client(), "a").campaign();
    let status = a.status();
    // Elected is sent just before "leader changed" is logged, which panics.
    let term = elected(&mut a, TTL).await;
    assert_eq!(
        demoted(&mut a, TTL).await,
        DemotionReason::CampaignPanicked,
        "the panic is reported as the term's end"
    );
    assert!(term.is_cancelled(), "the term ends with the panic");
    assert!(term.stop_by().is_some(), "as an involuntary loss");
    assert!(!status.borrow().is_leader());
    let problem = status
        .borrow()
        .problem
        .clone()
        .expect("a problem is reported");
    assert!(
        problem.message.contains("panicked") && problem.message.contains("leader changed"),
        "the problem names the panic: {}",
        problem.message
    );
    // The campaign goes on: it leads again, with a greater token, and answers commands.
    let again = elected(&mut a, TTL * 4).await;
    assert!(again.fencing_token() > term.fencing_token());
    assert!(status.borrow().is_leader());
    a.resign().await.expect("resign");
    let handle = a.handle();
    a.shutdown().await.expect("shutdown");
    assert_eq!(status.borrow().role, Role::Stopped);
    assert!(matches!(handle.resign().await, Err(Error::Stopped)));
}
