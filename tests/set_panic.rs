//! A panic in an `ElectionSet`'s task (here: a `tracing` subscriber that panics) ends every
//! member's term at once, is reported (a `Demoted` event each, the set's problem), and the
//! set stops. In a file of its own: it installs the process's global subscriber.

use std::time::Duration;

use incumbent::memory::{MemoryBackend, Reachability};
use incumbent::{DemotionReason, Election, LeadershipEvent};
use tokio::time::timeout;

#[path = "support/panicking.rs"]
mod panicking;
use panicking::PanicOn;

const TTL: Duration = Duration::from_secs(3);

#[tokio::test(start_paused = true)]
async fn a_panic_in_the_sets_task_ends_every_term_and_is_reported() {
    use tracing_subscriber::layer::SubscriberExt;
    let subscriber = tracing_subscriber::registry().with(PanicOn::new("election set step failed"));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let store = MemoryBackend::new();
    let client = store.client();
    let set = Election::builder(client.clone(), "tenants")
        .candidate("a")
        .ttl(TTL)
        .build()
        .expect("valid settings")
        .set();
    let mut events = set.events();
    let names = ["tenants/acme", "tenants/globex"];
    let mut terms = Vec::new();
    for name in names {
        set.join(name).expect("valid");
    }
    while terms.len() < names.len() {
        let event = timeout(TTL, events.recv())
            .await
            .expect("elected")
            .expect("runs");
        if let LeadershipEvent::Elected(term) = event.event {
            terms.push(term);
        }
    }
    // The store fails every call: a new member's acquisition fails, the set's task logs it,
    // and the subscriber panics, while both terms are in force.
    client.set_reachability(Reachability::Failing);
    set.join("tenants/initech").expect("valid");
    let mut demotions = Vec::new();
    timeout(TTL, async {
        while let Some(event) = events.recv().await {
            if let LeadershipEvent::Demoted {
                reason, stop_by, ..
            } = event.event
            {
                assert!(
                    stop_by.is_some(),
                    "an involuntary end says when the work must stop"
                );
                demotions.push(reason);
            }
        }
    })
    .await
    .expect("the events end once the set has stopped");
    assert_eq!(
        demotions,
        [
            DemotionReason::CampaignPanicked,
            DemotionReason::CampaignPanicked
        ],
        "each term's end is reported as the panic"
    );
    for term in &terms {
        assert!(term.is_cancelled(), "the term ends with the panic");
        assert!(
            timeout(Duration::ZERO, term.must_stop()).await.is_ok(),
            "its work must stop now"
        );
    }
    let problem = set.problem().expect("the panic is reported");
    assert!(problem.contains("panicked"), "{problem}");
    for name in names {
        assert!(!set.is_leader(name));
    }
    assert!(
        set.join("tenants/umbrella").is_err(),
        "a stopped set takes no member"
    );
}
