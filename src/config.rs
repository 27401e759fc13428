//! Election settings, their defaults, and their validation.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::backend::{BackendInfo, Candidate, DeadlineRule, SessionOptions};
pub use crate::backend::{
    DEFAULT_RENEW_DEADLINE_FRACTION, DEFAULT_RENEW_INTERVAL_DIVISOR, MIN_DEADLINE_MARGIN_DIVISOR,
};
pub use crate::backoff::{Backoff, DEFAULT_BACKOFF_INITIAL, DEFAULT_BACKOFF_MAX};
use crate::{Error, Result};

/// Default session ttl: long enough to ride out a store's leader election or a GC pause,
/// short enough that a crashed leader is replaced within seconds.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Default time a cancelled worker gets to finish before the lock is released anyway.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// The longest duration any setting accepts (a year): a longer one is surely a mistake, and
/// would overflow the clock's arithmetic (`Instant + Duration`) somewhere down the line.
pub const MAX_DURATION_SETTING: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// The longest election name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// The longest candidate identity, in bytes.
pub const MAX_CANDIDATE_LEN: usize = 256;

/// The validated settings of one election.
#[derive(Clone, Debug)]
pub struct Config {
    /// The election's name, the key under which the store keeps it.
    pub name: String,
    /// This process's identity and metadata.
    pub candidate: Candidate,
    /// How long the store keeps our session without renewal.
    pub ttl: Duration,
    /// How often the session is renewed.
    pub renew_interval: Duration,
    /// A leader with no renewal confirmed within this long (from when that renewal was sent)
    /// cancels its term.
    pub renew_deadline: Duration,
    /// The store's lock-delay after our session is invalidated, where it has one.
    pub lock_delay: Option<Duration>,
    /// Retry and cool-down delays.
    pub backoff: Backoff,
    /// How long a cancelled term's holders get before the lock is released anyway.
    pub grace: Duration,
    /// Whether metrics carry a `candidate` label besides `election`.
    pub candidate_label: bool,
    /// How long a hand-over keeps the next term for its target.
    pub hand_over_window: Duration,
    /// Whether the leader watches the election's request lock for hand-over requests.
    pub switchover_requests: bool,
    /// Whether this candidate keeps a presence record (on stores without a line), so that a
    /// hand-over to it can check that it is live.
    pub accept_hand_overs: bool,
    /// This candidate's priority: a live candidate of a higher one asks for the lead.
    pub priority: Option<Priority>,
}

/// A candidate's priority (see [`ElectionBuilder::priority`](crate::ElectionBuilder::priority)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Priority {
    /// Higher leads: a candidate asks the leader to hand over when the leader's is lower.
    pub level: u32,
    /// How long the candidate must have followed, alive and seeing the same leader, before
    /// it asks; doubled after each request that did not make it lead.
    pub settle: Duration,
}

/// The prefix of metadata keys this crate writes itself (`incumbent.handing_over`,
/// `incumbent.priority`); a candidate's own metadata may not use it.
pub const RESERVED_METADATA_PREFIX: &str = "incumbent.";

/// The metadata key in which a candidate with a priority publishes it.
pub const PRIORITY_KEY: &str = "incumbent.priority";

/// Default settle time of a candidate with a priority: long enough that a node that comes
/// back and crashes again does not take leadership back and forth.
pub const DEFAULT_PRIORITY_SETTLE: Duration = Duration::from_secs(30);

impl Config {
    /// The labels of an election's metrics: `election`, `candidate` where the election
    /// asked for it (candidate ids often hold a pid: a series per restart), and `extra`, in
    /// one allocation of the right size. They are built at every transition (and dropped at
    /// once without a recorder), 100,000 times over when that many elections start or stop
    /// together.
    pub(crate) fn metric_labels(
        &self,
        election: &str,
        extra: Option<(&'static str, &'static str)>,
    ) -> Vec<::metrics::Label> {
        let size = 1 + usize::from(self.candidate_label) + usize::from(extra.is_some());
        let mut labels = Vec::with_capacity(size);
        labels.push(::metrics::Label::new("election", election.to_owned()));
        if self.candidate_label {
            labels.push(::metrics::Label::new(
                "candidate",
                self.candidate.id.clone(),
            ));
        }
        if let Some((key, value)) = extra {
            labels.push(::metrics::Label::new(key, value));
        }
        labels
    }

    pub(crate) fn session_options(&self) -> SessionOptions {
        SessionOptions {
            ttl: self.ttl,
            renew_interval: self.renew_interval,
            lock_delay: self.lock_delay,
            name: format!("incumbent:{}", self.candidate.id),
        }
    }
}

/// The settings as given to the builder, before validation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Draft {
    pub name: String,
    pub candidate_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub ttl: Option<Duration>,
    pub renew_interval: Option<Duration>,
    pub renew_deadline: Option<Duration>,
    pub lock_delay: Option<Duration>,
    pub backoff: Backoff,
    pub grace: Option<Duration>,
    pub candidate_label: bool,
    pub hand_over_window: Option<Duration>,
    pub switchover_requests: Option<bool>,
    pub accept_hand_overs: Option<bool>,
    pub priority: Option<Priority>,
}

impl Draft {
    pub(crate) fn validate(self, backend: &BackendInfo) -> Result<Config> {
        validate_name(&self.name)?;
        let id = match self.candidate_id {
            Some(id) => id,
            None => default_candidate_id(),
        };
        validate_candidate(&id, &self.metadata)?;
        let mut metadata = self.metadata;
        if let Some(priority) = self.priority {
            metadata.insert(PRIORITY_KEY.to_owned(), priority.level.to_string());
        }
        let ttl = self.ttl.unwrap_or(DEFAULT_TTL);
        if ttl < backend.min_ttl || ttl > backend.max_ttl {
            return Err(Error::timing(format!(
                "ttl {ttl:?} is outside what {} accepts ({:?} to {:?}); set .ttl() in that range",
                backend.name, backend.min_ttl, backend.max_ttl
            )));
        }
        let renew_interval = self
            .renew_interval
            .unwrap_or(ttl / backend.renew_divisor.max(2));
        let renew_deadline = self
            .renew_deadline
            .unwrap_or_else(|| backend.deadline.default_deadline(ttl, renew_interval));
        let max_deadline = backend.deadline.max_deadline(ttl, renew_interval);
        if renew_deadline.is_zero() || renew_deadline > max_deadline {
            let (rule, fix) = match backend.deadline {
                DeadlineRule::PreviousActivity => (
                    format!(
                        "17/20 of the ttl {ttl:?} minus the gap between two renewals, at most \
                         7/20 of it: {} may count the session's time from the activity before \
                         the last renewal",
                        backend.name
                    ),
                    "lower .renew_deadline(), renew more often (.renew_interval()) or raise .ttl()",
                ),
                _ => (
                    format!("ttl {ttl:?} minus 1/{MIN_DEADLINE_MARGIN_DIVISOR}"),
                    "lower .renew_deadline() or raise .ttl()",
                ),
            };
            return Err(Error::timing(format!(
                "renew_deadline {renew_deadline:?} must be above zero and at most {max_deadline:?} \
                 ({rule}) so the leader fences itself before the store can expire its lease; {fix}"
            )));
        }
        if renew_interval.is_zero() || renew_interval >= renew_deadline {
            return Err(Error::timing(format!(
                "renew_interval {renew_interval:?} must be above zero and below renew_deadline \
                 {renew_deadline:?}, so a renewal can be retried before the deadline; lower .renew_interval()"
            )));
        }
        let backoff = self.backoff;
        for (setting, value) in [
            ("backoff max", Some(backoff.max)),
            ("lock_delay", self.lock_delay),
            ("grace", self.grace),
            ("hand_over_window", self.hand_over_window),
            ("priority settle", self.priority.map(|p| p.settle)),
        ] {
            if let Some(value) = value.filter(|v| *v > MAX_DURATION_SETTING) {
                return Err(Error::timing(format!(
                    "{setting} {value:?} is longer than the longest setting accepted, \
                     {MAX_DURATION_SETTING:?} (a year); give a shorter one"
                )));
            }
        }
        if let Some(delay) = self.lock_delay.filter(|d| !d.is_zero()) {
            match backend.max_lock_delay {
                None => {
                    return Err(Error::timing(format!(
                        "lock_delay {delay:?}: {} has no lock-delay (Consul has one); remove \
                         .lock_delay(), or set it to zero",
                        backend.name
                    )));
                }
                Some(max) if delay > max => {
                    return Err(Error::timing(format!(
                        "lock_delay {delay:?} is longer than {} allows ({max:?}); set \
                         .lock_delay() to at most that",
                        backend.name
                    )));
                }
                Some(_) => {}
            }
        }
        if backoff.initial.is_zero() || backoff.max < backoff.initial {
            return Err(Error::timing(format!(
                "backoff initial {:?} must be above zero and at most max {:?}; fix .backoff()",
                backoff.initial, backoff.max
            )));
        }
        Ok(Config {
            name: self.name,
            candidate: Candidate { id, metadata },
            ttl,
            renew_interval,
            renew_deadline,
            lock_delay: self.lock_delay,
            backoff,
            grace: self.grace.unwrap_or(DEFAULT_GRACE),
            candidate_label: self.candidate_label,
            hand_over_window: match self.hand_over_window {
                Some(window) if window.is_zero() => {
                    return Err(Error::timing(
                        "hand_over_window is zero: the target could never take office; give \
                         it at least the time the target needs to see the reservation",
                    ));
                }
                Some(window) => window,
                None => ttl,
            },
            switchover_requests: self.switchover_requests.unwrap_or(true),
            accept_hand_overs: self.accept_hand_overs.unwrap_or(true),
            priority: self.priority,
        })
    }
}

/// Checks an election name: 1 to [`MAX_NAME_LEN`] bytes of `[A-Za-z0-9._-/]`, with no empty
/// path segment. Every store can hold such a name as a key or path.
pub fn validate_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("it is longer than 128 bytes")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
    {
        Some("it has a character outside [A-Za-z0-9._-/]")
    } else if name
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        Some("it has an empty, '.' or '..' path segment")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidElectionName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

fn validate_candidate(id: &str, metadata: &BTreeMap<String, String>) -> Result<()> {
    let bad = |reason: String| Err(Error::InvalidCandidate { reason });
    if id.is_empty() {
        return bad(
            "the candidate id is empty; pass a name such as \"host-a:8080\" to .candidate()".into(),
        );
    }
    if id.len() > MAX_CANDIDATE_LEN {
        return bad(format!(
            "the candidate id is longer than {MAX_CANDIDATE_LEN} bytes; shorten it"
        ));
    }
    if id.chars().any(char::is_control) {
        return bad("the candidate id has a control character; use printable text".into());
    }
    if let Some(key) = metadata
        .keys()
        .find(|k| k.starts_with(RESERVED_METADATA_PREFIX))
    {
        return bad(format!(
            "the metadata key {key:?} starts with {:?}, which incumbent keeps for its own \
             entries; rename it",
            RESERVED_METADATA_PREFIX
        ));
    }
    if let Some(key) = metadata.keys().find(|k| k.is_empty()) {
        return bad(format!(
            "a metadata key is empty ({key:?}); name every metadata entry"
        ));
    }
    Ok(())
}

/// `host-pid-xxxx`: unique enough among the candidates of one election, and readable.
fn default_candidate_id() -> String {
    format!(
        "{}-{}-{:04x}",
        hostname(),
        std::process::id(),
        fastrand::u16(..)
    )
}

/// This host's name, as the default candidate id and the `incumbent` CLI give it: the
/// kernel's host name (what `gethostname` returns), else `$HOSTNAME`, else `localhost`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_name_is_the_kernels() {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("Linux");
        assert_eq!(hostname(), kernel.trim());
        assert!(default_candidate_id().starts_with(&format!("{}-", kernel.trim())));
    }

    #[test]
    fn names_that_every_store_can_hold_are_accepted() {
        for name in ["a", "jobs/index-builder", "A.b_c-d/e"] {
            assert!(validate_name(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn bad_names_are_rejected_with_the_reason() {
        for (name, reason) in [
            ("", "empty"),
            ("/a", "segment"),
            ("a/", "segment"),
            ("a//b", "segment"),
            ("a/../b", "segment"),
            ("a b", "character"),
            ("ü", "character"),
        ] {
            let err = validate_name(name).unwrap_err().to_string();
            assert!(err.contains(reason), "{name:?}: {err}");
        }
        assert!(validate_name(&"x".repeat(129)).is_err());
    }

    /// ZooKeeper's rule: the deadline plus the gap between two requests of the session stays
    /// under 17/20 of the ttl (see the ZooKeeper backend's "Why renewals sync").
    #[test]
    fn a_store_that_counts_from_the_activity_before_a_renewal_gets_a_shorter_deadline() {
        let zookeeper = BackendInfo {
            deadline: DeadlineRule::PreviousActivity,
            ..BackendInfo::new("zookeeper", Duration::from_secs(1), Duration::from_secs(60))
        };
        let ttl = Duration::from_secs(12);
        let draft = |interval: Option<u64>, deadline: Option<u64>| Draft {
            name: "e".into(),
            candidate_id: Some("c".into()),
            ttl: Some(ttl),
            renew_interval: interval.map(Duration::from_millis),
            renew_deadline: deadline.map(Duration::from_millis),
            ..Draft::default()
        };
        // By default: a renewal every third of the ttl, the deadline at half of it, and the
        // two within 17/20 of the ttl with an eighth of it left for the half tick.
        let config = draft(None, None).validate(&zookeeper).unwrap();
        assert_eq!(config.renew_interval, Duration::from_secs(4));
        assert_eq!(config.renew_deadline, Duration::from_secs(6));
        assert!(config.renew_deadline + config.renew_interval + ttl / 8 < ttl);
        // The longest deadline: 17/20 × 12 s − 4 s = 6.2 s; beyond it, a typed error that
        // says what to change.
        assert!(draft(None, Some(6_200)).validate(&zookeeper).is_ok());
        match draft(None, Some(6_201)).validate(&zookeeper) {
            Err(Error::InvalidTiming { reason }) => assert!(
                reason.contains("6.2s")
                    && reason.contains("zookeeper")
                    && reason.contains(".renew_deadline()")
                    && reason.contains(".renew_interval()"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        // Renewing more often allows a longer deadline: 10.2 s − 2 s.
        assert!(draft(Some(2_000), Some(8_200)).validate(&zookeeper).is_ok());
        assert!(
            draft(Some(2_000), Some(8_201))
                .validate(&zookeeper)
                .is_err()
        );
        // A renew interval past 7/20 of the ttl: the client pings at 4.2 s, so the gap is
        // that, whatever the interval (10.2 s − 4.2 s).
        assert!(draft(Some(5_000), Some(6_000)).validate(&zookeeper).is_ok());
        assert!(
            draft(Some(5_000), Some(6_001))
                .validate(&zookeeper)
                .is_err()
        );
        // The other stores keep 2/3 of the ttl, up to 4/5.
        let etcd = BackendInfo::new("etcd", Duration::from_secs(1), Duration::from_secs(60));
        let config = draft(None, None).validate(&etcd).unwrap();
        assert_eq!(config.renew_deadline, Duration::from_secs(8));
        assert!(draft(None, Some(9_600)).validate(&etcd).is_ok());
        assert!(draft(None, Some(9_601)).validate(&etcd).is_err());
    }

    #[test]
    fn a_lock_delay_needs_a_store_that_has_one_and_fits_its_maximum() {
        let store = |max_lock_delay| BackendInfo {
            max_lock_delay,
            ..BackendInfo::new("store", Duration::from_secs(1), Duration::from_secs(60))
        };
        let draft = |delay: u64| Draft {
            name: "e".into(),
            candidate_id: Some("c".into()),
            lock_delay: Some(Duration::from_secs(delay)),
            backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(1),
            },
            ..Draft::default()
        };
        let refused = |delay, max| match draft(delay).validate(&store(max)) {
            Err(Error::InvalidTiming { reason }) => reason,
            other => panic!("{delay}s, max {max:?}: {other:?}"),
        };
        let without = refused(5, None);
        assert!(
            without.contains("store has no lock-delay") && without.contains(".lock_delay()"),
            "{without}"
        );
        let above = refused(61, Some(Duration::from_secs(60)));
        assert!(above.contains("60s"), "{above}");
        assert!(
            draft(60)
                .validate(&store(Some(Duration::from_secs(60))))
                .is_ok()
        );
        assert!(draft(0).validate(&store(None)).is_ok(), "zero is no delay");
    }
}
