//! Status lines on stderr, for people (`text`) or machines (`json`), and the times in them.
//!
//! Every line goes through [`crate::log`]: writing one never blocks, and never fails.

pub use incumbent::time::{human, rfc3339};
use std::time::{Duration, SystemTime};

use clap::ValueEnum;
use incumbent::Leader;
use serde_json::{Map, Value, json};

use crate::log;

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
    /// asks for) to stderr in the same format, through the same non-blocking queue as the
    /// status lines; panic messages too.
    pub fn install_tracing(&self) {
        use tracing_subscriber::EnvFilter;
        log::set_format(match self.format {
            LogFormat::Text => log::NoticeFormat::Text,
            LogFormat::Json => log::NoticeFormat::Json,
        });
        log::install_panic_hook();
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new(if self.quiet { "error" } else { "warn" }));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            // Never `eprint!` a failed write: that panics on a closed stderr.
            .log_internal_errors(false)
            .with_writer(log::Writer);
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
            LogFormat::Text => log::line(format!("incumbent: {message}\n").into_bytes()),
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
        log::line(format!("{line}\n").into_bytes());
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

/// Milliseconds, for JSON fields.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
