//! The requests and answers of the Consul calls the client makes, and their JSON forms.

use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::error::ConsulError;

/// The parameters of [`ConsulClient::session_create`](super::ConsulClient::session_create).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionCreate {
    /// A human-readable name (may be empty).
    pub name: String,
    /// The session TTL; Consul requires `[10s, 24h]` and invalidates the
    /// session some time after `ttl` without a renewal (up to twice the TTL).
    /// `None`: no TTL, the session lives until its checks fail or it is
    /// destroyed.
    pub ttl: Option<Duration>,
    /// How long Consul refuses to let another session acquire a lock this
    /// session held when it is invalidated. `None` means Consul's default of
    /// 15 s; `Some(Duration::ZERO)` is sent as `"0s"` and disables the delay.
    pub lock_delay: Option<Duration>,
    /// Node health checks tied to the session. `None` means Consul's default
    /// (`["serfHealth"]`); `Some(vec![])` ties the session to no node check,
    /// leaving only the TTL.
    pub node_checks: Option<Vec<String>>,
}

/// A session as Consul reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// The session id (a UUID).
    pub id: String,
    /// The session name.
    pub name: String,
    /// The node the session belongs to.
    pub node: String,
    /// The lock delay (Consul reports it in nanoseconds).
    pub lock_delay: Duration,
    /// The TTL, `None` when the session has none.
    pub ttl: Option<Duration>,
    /// The node checks tied to the session.
    pub node_checks: Vec<String>,
    /// The Raft index that created the session.
    pub create_index: u64,
    /// The Raft index that last modified the session.
    pub modify_index: u64,
}

/// Read options for [`ConsulClient::kv_get`](super::ConsulClient::kv_get).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryOptions {
    /// Makes the read a blocking query: Consul answers when the key's index
    /// exceeds this one, or after `wait`. Pass the previous
    /// [`KvResponse::index`]; if an answer's index goes backwards (a snapshot
    /// restore), restart from 0. Do not pass 0 as a blocking index: it does
    /// not block.
    pub index: Option<u64>,
    /// The longest a blocking query waits (Consul's default is 5 min, its
    /// maximum 10 min; Consul adds up to `wait / 16` of jitter). Only
    /// meaningful with `index`.
    pub wait: Option<Duration>,
    /// Use the `consistent` read mode (the leader verifies it still leads
    /// before answering) instead of the default mode.
    pub consistent: bool,
}

/// Write options for [`ConsulClient::kv_put`](super::ConsulClient::kv_put).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// Acquire the key's lock for this session (`?acquire=`): succeeds when
    /// the key is unlocked (and no lock delay applies) or already held by
    /// this session.
    pub acquire: Option<String>,
    /// Release the key's lock held by this session (`?release=`).
    pub release: Option<String>,
    /// Check-and-set: write only if the key's `ModifyIndex` is this (0: only
    /// if the key does not exist).
    pub cas: Option<u64>,
}

/// A KV entry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvEntry {
    /// The full key.
    pub key: String,
    /// The value (Consul's base64 decoded; empty for a null value).
    pub value: Vec<u8>,
    /// The session holding the key's lock, if any.
    pub session: Option<String>,
    /// The Raft index that created the key.
    pub create_index: u64,
    /// The Raft index that last modified the key.
    pub modify_index: u64,
    /// How many times the lock has been acquired.
    pub lock_index: u64,
}

/// The answer to [`ConsulClient::kv_get`](super::ConsulClient::kv_get).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvResponse {
    /// The `X-Consul-Index` of the answer, also when the key does not exist;
    /// pass it as [`QueryOptions::index`] to wait for the next change.
    pub index: u64,
    /// The entry, `None` when the key does not exist.
    pub entry: Option<KvEntry>,
}

// Wire formats.

#[derive(Serialize)]
pub(super) struct SessionCreateBody<'a> {
    #[serde(rename = "Name")]
    name: &'a str,
    #[serde(rename = "TTL", skip_serializing_if = "Option::is_none")]
    ttl: Option<String>,
    #[serde(rename = "LockDelay", skip_serializing_if = "Option::is_none")]
    lock_delay: Option<String>,
    /// Always `release`: a session's end frees its locks and keeps the keys, whose values
    /// tell observers who led.
    #[serde(rename = "Behavior")]
    behavior: &'static str,
    #[serde(rename = "NodeChecks", skip_serializing_if = "Option::is_none")]
    node_checks: Option<&'a [String]>,
}

#[derive(Deserialize)]
pub(super) struct SessionCreated {
    #[serde(rename = "ID")]
    pub(super) id: String,
}

#[derive(Deserialize)]
pub(super) struct SessionWire {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Node", default)]
    node: String,
    #[serde(rename = "LockDelay", default)]
    lock_delay: Option<serde_json::Value>,
    #[serde(rename = "TTL", default)]
    ttl: Option<String>,
    #[serde(rename = "NodeChecks", default)]
    node_checks: Option<Vec<String>>,
    // Consul before 1.7 reports node checks as `Checks`.
    #[serde(rename = "Checks", default)]
    checks: Option<Vec<String>>,
    #[serde(rename = "CreateIndex", default)]
    create_index: u64,
    #[serde(rename = "ModifyIndex", default)]
    modify_index: u64,
}

#[derive(Deserialize)]
pub(super) struct KvWire {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Value", default)]
    value: Option<String>,
    #[serde(rename = "Session", default)]
    session: Option<String>,
    #[serde(rename = "CreateIndex", default)]
    create_index: u64,
    #[serde(rename = "ModifyIndex", default)]
    modify_index: u64,
    #[serde(rename = "LockIndex", default)]
    lock_index: u64,
}

impl SessionCreate {
    /// The body of `PUT /v1/session/create`.
    pub(super) fn body(&self) -> SessionCreateBody<'_> {
        SessionCreateBody {
            name: &self.name,
            ttl: self.ttl.map(format_go_duration),
            lock_delay: self.lock_delay.map(format_go_duration),
            behavior: "release",
            node_checks: self.node_checks.as_deref(),
        }
    }
}

impl SessionWire {
    pub(super) fn into_info(self, operation: &'static str) -> Result<SessionInfo, ConsulError> {
        let invalid = |reason: String| ConsulError::InvalidResponse { operation, reason };
        let lock_delay = match self.lock_delay {
            None | Some(serde_json::Value::Null) => Duration::ZERO,
            // Consul encodes a Go time.Duration: integer nanoseconds.
            Some(serde_json::Value::Number(n)) => n
                .as_u64()
                .map(Duration::from_nanos)
                .ok_or_else(|| invalid(format!("LockDelay {n} is not a non-negative integer")))?,
            Some(serde_json::Value::String(s)) => parse_go_duration(&s)
                .ok_or_else(|| invalid(format!("LockDelay {s:?} is not a duration")))?,
            Some(other) => return Err(invalid(format!("LockDelay {other} is not a duration"))),
        };
        let ttl = match self.ttl.as_deref() {
            None | Some("") => None,
            Some(s) => Some(
                parse_go_duration(s)
                    .ok_or_else(|| invalid(format!("TTL {s:?} is not a duration")))?,
            ),
        };
        Ok(SessionInfo {
            id: self.id,
            name: self.name,
            node: self.node,
            lock_delay,
            ttl,
            node_checks: self.node_checks.or(self.checks).unwrap_or_default(),
            create_index: self.create_index,
            modify_index: self.modify_index,
        })
    }
}

impl KvWire {
    pub(super) fn into_entry(self, operation: &'static str) -> Result<KvEntry, ConsulError> {
        let value = match self.value {
            None => Vec::new(),
            Some(encoded) => {
                decode_base64(&encoded).ok_or_else(|| ConsulError::InvalidResponse {
                    operation,
                    reason: format!("the value of key {:?} is not valid base64", self.key),
                })?
            }
        };
        Ok(KvEntry {
            key: self.key,
            value,
            session: self.session.filter(|s| !s.is_empty()),
            create_index: self.create_index,
            modify_index: self.modify_index,
            lock_index: self.lock_index,
        })
    }
}

/// Formats a duration the way Go's `time.ParseDuration` reads it: `"10s"`,
/// `"1500ms"`, `"0s"`.
pub(super) fn format_go_duration(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else if duration.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", duration.as_millis())
    } else {
        format!("{}ns", duration.as_nanos())
    }
}

/// Parses a non-negative Go duration string (`"10s"`, `"1m30s"`, `"1.5h"`,
/// `"250ms"`, `"0"`). Returns `None` for anything else.
pub(super) fn parse_go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        total = total.checked_add(whole.checked_mul(unit_nanos)?)?;
        if !fraction.is_empty() {
            // Keep at most 18 digits: enough below a nanosecond of an hour.
            let digits = &fraction[..fraction.len().min(18)];
            let numerator: u128 = digits.parse().ok()?;
            let denominator = 10u128.checked_pow(u32::try_from(digits.len()).ok()?)?;
            total = total.checked_add(numerator.checked_mul(unit_nanos)? / denominator)?;
        }
        rest = next;
    }
    let secs = u64::try_from(total / 1_000_000_000).ok()?;
    let nanos = u32::try_from(total % 1_000_000_000).ok()?;
    Some(Duration::new(secs, nanos))
}

/// Decodes standard base64 (RFC 4648 alphabet, padding optional), as Go's
/// `encoding/json` produces for `[]byte`. Returns `None` on invalid input.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    const STANDARD_PADDING_OPTIONAL: base64::engine::GeneralPurpose =
        base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
    STANDARD_PADDING_OPTIONAL.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_go_durations() {
        assert_eq!(format_go_duration(Duration::ZERO), "0s");
        assert_eq!(format_go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(
            format_go_duration(Duration::from_nanos(1_000_000_001)),
            "1000000001ns"
        );
    }

    #[test]
    fn parses_go_durations() {
        let ok = |s: &str| parse_go_duration(s);
        assert_eq!(ok("0"), Some(Duration::ZERO));
        assert_eq!(ok("0s"), Some(Duration::ZERO));
        assert_eq!(ok("10s"), Some(Duration::from_secs(10)));
        assert_eq!(ok("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(ok("1h0m0s"), Some(Duration::from_secs(3600)));
        assert_eq!(ok("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(ok(".5s"), Some(Duration::from_millis(500)));
        assert_eq!(ok("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(ok("3us"), Some(Duration::from_micros(3)));
        assert_eq!(ok("3µs"), Some(Duration::from_micros(3)));
        for bad in [
            "",
            "s",
            "10",
            "-1s",
            "1x",
            "1..5s",
            ".s",
            "99999999999999999999999999999999999999999h",
        ] {
            assert_eq!(ok(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decodes_base64() {
        assert_eq!(decode_base64("").as_deref(), Some(&b""[..]));
        assert_eq!(decode_base64("aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(decode_base64("aGVsbA==").as_deref(), Some(&b"hell"[..]));
        assert_eq!(decode_base64("aGVs").as_deref(), Some(&b"hel"[..]));
        assert_eq!(decode_base64("aGVsbG8").as_deref(), Some(&b"hello"[..]));
        assert_eq!(decode_base64("/+8=").as_deref(), Some(&[0xff, 0xef][..]));
        for bad in ["a", "aGVsbG8===", "a*Vs", "aGV=sbG8", "===="] {
            assert_eq!(decode_base64(bad), None, "{bad:?}");
        }
    }
}
