//! Status lines on stderr, for people (`text`) or machines (`json`), and the times in them.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::ValueEnum;
use incumbent::Leader;
use serde_json::{Map, Value, json};

/// How status lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `2026-11-22T10:00:00.123Z incumbent[jobs/index] elected (fencing token 7) after 12ms`
    Text,
    /// One JSON object per line: `time`, `election`, `event`, `message`, and the event's fields.
    Json,
}

/// Writes status lines on stderr.
#[derive(Clone, Debug)]
pub struct Reporter {
    format: LogFormat,
    quiet: bool,
    election: Option<String>,
}

impl Reporter {
    pub fn new(format: LogFormat, quiet: bool) -> Self {
        Reporter {
            format,
            quiet,
            election: None,
        }
    }

    /// The same reporter, labelling its lines with `election`.
    pub fn for_election(&self, election: &str) -> Self {
        Reporter {
            election: Some(election.to_owned()),
            ..self.clone()
        }
    }

    /// Sends the library's own `tracing` events (warnings and errors, or what `RUST_LOG`
    /// asks for) to stderr in the same format.
    pub fn install_tracing(&self) {
        use tracing_subscriber::EnvFilter;
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new(if self.quiet { "error" } else { "warn" }));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        let _ = match self.format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().try_init(),
        };
    }

    /// A status line: one per transition. Suppressed by `--quiet`.
    pub fn event(&self, event: &str, message: &str, fields: Value) {
        if !self.quiet {
            self.write(event, message, fields);
        }
    }

    /// An error line, written even with `--quiet`.
    pub fn error(&self, message: &str) {
        self.write("error", message, Value::Null);
    }

    /// The error that ends the program.
    pub fn fatal(&self, message: &str) {
        match self.format {
            LogFormat::Text => {
                let _ = writeln!(std::io::stderr().lock(), "incumbent: {message}");
            }
            LogFormat::Json => self.error(message),
        }
    }

    fn write(&self, event: &str, message: &str, fields: Value) {
        let now = rfc3339(SystemTime::now());
        let line = match self.format {
            LogFormat::Text => match &self.election {
                Some(election) => format!("{now} incumbent[{election}] {message}"),
                None => format!("{now} incumbent {message}"),
            },
            LogFormat::Json => {
                let mut object = Map::new();
                object.insert("time".into(), now.into());
                if let Some(election) = &self.election {
                    object.insert("election".into(), election.clone().into());
                }
                object.insert("event".into(), event.into());
                object.insert("message".into(), message.into());
                if let Value::Object(fields) = fields {
                    object.extend(fields);
                }
                Value::Object(object).to_string()
            }
        };
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

/// A leader as JSON: id, metadata, fencing token, and since when (RFC 3339 and Unix ms).
pub fn leader_json(leader: &Leader) -> Value {
    json!({
        "id": leader.candidate.id,
        "metadata": leader.candidate.metadata,
        "fencing_token": leader.fencing_token,
        "since": leader.since().map(rfc3339),
        "since_unix_ms": leader.since_unix_ms,
    })
}

/// A leader in a few words: `host-a (fencing token 7)`.
pub fn leader_text(leader: &Leader) -> String {
    match leader.fencing_token {
        Some(token) => format!("{} (fencing token {token})", leader.candidate.id),
        None => leader.candidate.id.clone(),
    }
}

/// `2026-11-22T10:00:00.123Z`: RFC 3339, UTC, milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    let unix_ms = t
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let secs = unix_ms / 1000;
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(i64::try_from(secs / 86_400).unwrap_or(0));
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
        unix_ms % 1000
    )
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// `12ms`, `1.5s`, `2m3s`.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 && !ms.is_multiple_of(1000) {
        format!("{:.1}s", d.as_secs_f64())
    } else if ms < 60_000 {
        format!("{}s", d.as_secs())
    } else if ms < 3_600_000 {
        format!("{}m{}s", d.as_secs() / 60, d.as_secs() % 60)
    } else {
        format!("{}h{}m", d.as_secs() / 3600, d.as_secs() % 3600 / 60)
    }
}

/// Milliseconds, for JSON fields.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        let at = |ms| rfc3339(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_001), "2000-02-29T00:00:00.001Z");
        assert_eq!(at(1_795_341_600_123), "2026-11-22T10:00:00.123Z");
    }
}
