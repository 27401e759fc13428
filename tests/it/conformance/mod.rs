//! The conformance suite: the same behavioural tests against every backend, on real stores.
//!
//! Each test body in `bodies` is generic over a [`Store`] fixture; the `conformance!` lines
//! at the bottom instantiate the bodies that apply to each backend. A new backend adds a
//! fixture in `stores` and one line here.

mod bodies;
mod stores;

/// Instantiates test bodies for one store fixture.
macro_rules! conformance {
    ($module:ident, $store:ty, [$($test:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    crate::conformance::bodies::$test::<$store>().await;
                }
            )*
        }
    };
}

conformance!(
    memory,
    crate::conformance::stores::Memory,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        a_partitioned_leader_fences_itself_and_terms_never_overlap,
        a_session_expired_while_waiting_never_leads,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_worker_ignoring_cancellation_is_stopped_before_another_leads,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);

conformance!(
    file,
    crate::conformance::stores::File,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);

#[cfg(feature = "etcd")]
conformance!(
    etcd,
    crate::conformance::stores::Etcd,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        a_partitioned_leader_fences_itself_and_terms_never_overlap,
        a_session_expired_while_waiting_never_leads,
        re_election_after_the_store_restarts,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_loss_ends_the_term_before_the_store_is_asked_why,
        a_worker_ignoring_cancellation_is_stopped_before_another_leads,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);

// No `re_election_after_the_store_restarts` for Consul: a restarted dev agent comes back
// empty, its indexes (and so fencing tokens) start over. tests/it/consul.rs checks re-election
// after an agent restart; a real Consul server keeps its Raft log and its indexes.
#[cfg(feature = "consul")]
conformance!(
    consul,
    crate::conformance::stores::Consul,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        a_partitioned_leader_fences_itself_and_terms_never_overlap,
        a_session_expired_while_waiting_never_leads,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_loss_ends_the_term_before_the_store_is_asked_why,
        a_worker_ignoring_cancellation_is_stopped_before_another_leads,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);

#[cfg(feature = "zookeeper")]
conformance!(
    zookeeper,
    crate::conformance::stores::Zookeeper,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        a_partitioned_leader_fences_itself_and_terms_never_overlap,
        a_session_expired_while_waiting_never_leads,
        re_election_after_the_store_restarts,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_loss_ends_the_term_before_the_store_is_asked_why,
        a_worker_ignoring_cancellation_is_stopped_before_another_leads,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);

// Redis restarted without persistence loses the key and the fencing counter: the restart
// body checks that exactly one candidate leads again with a greater token (the acquisition
// raises the counter to the highest token the candidate saw). No
// `a_session_expired_while_waiting_never_leads`: a Redis session is the renewal of the keys it
// holds, and one that waits holds none, so there is nothing in Redis to expire. No
// `a_loss_ends_the_term_before_the_store_is_asked_why`: a loss is seen by the renewal itself.
#[cfg(feature = "redis")]
conformance!(
    redis,
    crate::conformance::stores::RedisNotified,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        a_partitioned_leader_fences_itself_and_terms_never_overlap,
        re_election_after_the_store_restarts,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_released_lock_goes_to_another_campaign_not_back,
        a_worker_ignoring_cancellation_is_stopped_before_another_leads,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);

// Redis without keyspace notifications: followers poll, and a released key is held back
// from the campaign that released it for a while (followers elsewhere need a poll to notice).
#[cfg(feature = "redis")]
conformance!(
    redis_polled,
    crate::conformance::stores::RedisPolled,
    [
        one_leader_among_many,
        hand_off_on_resign,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_released_lock_goes_to_another_campaign_not_back,
        hand_over_to_a_named_candidate,
    ]
);

// memcached: like Redis, a session is the renewal of the keys it holds (nothing to expire
// while waiting), and a restart loses every key and counter (the counter that went back is
// raised past the last token the candidates saw, and the next term starts a ttl later).
#[cfg(feature = "memcached")]
conformance!(
    memcached,
    crate::conformance::stores::Memcached,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        a_partitioned_leader_fences_itself_and_terms_never_overlap,
        re_election_after_the_store_restarts,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_released_lock_goes_to_another_campaign_not_back,
        a_worker_ignoring_cancellation_is_stopped_before_another_leads,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);

// PostgreSQL keeps its rows across a restart (the restart body checks one leader again
// with a greater token). Like Redis, a session is the renewal of the leases it holds: no
// `a_session_expired_while_waiting_never_leads`, no `a_loss_ends_the_term_before_the_store_is_asked_why`.
#[cfg(feature = "postgres")]
conformance!(
    postgres,
    crate::conformance::stores::PostgresListening,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        a_partitioned_leader_fences_itself_and_terms_never_overlap,
        re_election_after_the_store_restarts,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_released_lock_goes_to_another_campaign_not_back,
        a_worker_ignoring_cancellation_is_stopped_before_another_leads,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);

// PostgreSQL whose followers poll, as behind PgBouncer in transaction mode.
#[cfg(feature = "postgres")]
conformance!(
    postgres_polled,
    crate::conformance::stores::PostgresPolled,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_released_lock_goes_to_another_campaign_not_back,
        hand_over_to_a_named_candidate,
    ]
);

// Kubernetes: no `a_session_expired_while_waiting_never_leads` (a session is the renewal of
// the Leases it holds, as on Redis), nor `a_loss_ends_the_term_before_the_store_is_asked_why`.
#[cfg(feature = "kubernetes")]
conformance!(
    kubernetes,
    crate::conformance::stores::Kubernetes,
    [
        one_leader_among_many,
        hand_off_on_resign,
        failover_after_the_leader_crashes,
        a_partitioned_leader_fences_itself_and_terms_never_overlap,
        re_election_after_the_store_restarts,
        observe_reports_every_leader_change,
        two_campaigns_of_one_election_never_both_lead,
        a_released_lock_goes_to_another_campaign_not_back,
        a_worker_ignoring_cancellation_is_stopped_before_another_leads,
        the_status_stops_saying_leader_with_the_term,
        the_leader_proclaims_metadata_that_everyone_reads,
        a_campaign_stopped_as_it_begins_leaves_nothing_behind,
        a_release_after_a_cancelled_acquire_leaves_nothing,
        hand_over_to_a_named_candidate,
        a_hand_over_to_a_candidate_that_is_not_live_is_refused,
        a_hand_over_to_a_target_that_died_lapses_into_an_open_election,
        two_concurrent_hand_overs_give_one_winner_and_one_error,
        a_preferred_candidate_gets_the_lead,
    ]
);
