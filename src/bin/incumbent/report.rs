//! Status lines on stderr, for people (`text`) or machines (`json`), and the times in them.
//!
//! Every line goes through [`crate::log`]: writing one never blocks, and never fails.

pub use incumbent::time::{human, rfc3339};
use std::time::{Duration, SystemTime};

use clap::ValueEnum;
use incumbent::Leader;
use serde_json::{Map, Value, json};

use crate::log;
use crate::messages::tidy;

/// How status lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `2026-11-22T10:00:00.123Z incumbent[jobs/index] elected (fencing token 7); the election was without a leader for at most 10s (the lock was free for 12ms)`
    Text,
    /// One JSON object per line, the same schema for this program's lines and the library's:
    /// `time`, `level`, `election`, `event`, `message`, then the event's own fields.
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
    /// asks for) to stderr in the same format and schema as the status lines, through the
    /// same non-blocking queue; panic messages too. No ANSI colour, terminal or not.
    pub fn install_tracing(&self) {
        use tracing_subscriber::EnvFilter;
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        log::set_format(match self.format {
            LogFormat::Text => log::NoticeFormat::Text,
            LogFormat::Json => log::NoticeFormat::Json,
        });
        log::install_panic_hook();
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new(if self.quiet { "error" } else { "warn" }));
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(LibraryLines {
                format: self.format,
            })
            .try_init();
    }

    /// A status line: one per transition. Suppressed by `--quiet`.
    pub fn event(&self, event: &str, message: &str, fields: Value) {
        if !self.quiet {
            self.write("info", event, message, fields);
        }
    }

    /// A warning: something failed and is being retried. Suppressed by `--quiet`.
    pub fn warn(&self, event: &str, message: &str, fields: Value) {
        if !self.quiet {
            self.write("warn", event, message, fields);
        }
    }

    /// An error line, written even with `--quiet`.
    pub fn error(&self, message: &str) {
        self.write("error", "error", message, Value::Null);
    }

    /// The error that ends the program.
    pub fn fatal(&self, message: &str) {
        match self.format {
            LogFormat::Text => log::line(format!("incumbent: {}\n", tidy(message)).into_bytes()),
            LogFormat::Json => self.error(message),
        }
    }

    fn write(&self, level: &str, event: &str, message: &str, fields: Value) {
        let election = self.election.clone().or_else(log::election);
        let line = line(
            self.format,
            level,
            election.as_deref(),
            event,
            &tidy(message),
            fields,
        );
        log::line(line.into_bytes());
    }
}

/// One line of stderr, for people or machines. JSON: `time`, `level`, `election` (when known),
/// `event`, `message`, then `fields` (none of which overrides those).
pub fn line(
    format: LogFormat,
    level: &str,
    election: Option<&str>,
    event: &str,
    message: &str,
    fields: Value,
) -> String {
    let now = rfc3339(SystemTime::now());
    match format {
        LogFormat::Text => {
            let level = match level {
                "info" => String::new(),
                other => format!("{other}: "),
            };
            match election {
                Some(election) => format!("{now} incumbent[{election}] {level}{message}\n"),
                None => format!("{now} incumbent {level}{message}\n"),
            }
        }
        LogFormat::Json => {
            let mut object = Map::new();
            object.insert("time".into(), now.into());
            object.insert("level".into(), level.into());
            if let Some(election) = election {
                object.insert("election".into(), election.into());
            }
            object.insert("event".into(), event.into());
            object.insert("message".into(), message.into());
            if let Value::Object(fields) = fields {
                for (key, value) in fields {
                    object.entry(key).or_insert(value);
                }
            }
            format!("{}\n", Value::Object(object))
        }
    }
}

/// Writes the library's `tracing` events as [`line`]s: `event` is `log`, `target` the
/// library's module, the event's fields follow; strings are [`tidy`]'d.
struct LibraryLines {
    format: LogFormat,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LibraryLines {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut visitor = FieldVisitor::default();
        event.record(&mut visitor);
        let metadata = event.metadata();
        let level = metadata.level().as_str().to_ascii_lowercase();
        let election = log::election();
        let message = match self.format {
            LogFormat::Json => tidy(&visitor.message),
            LogFormat::Text => {
                // Fields after the message, as `key=value`.
                let mut text = tidy(&visitor.message);
                for (key, value) in &visitor.fields {
                    let value = match value {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    text.push_str(&format!(" {key}={value}"));
                }
                text
            }
        };
        let mut fields = Map::new();
        fields.insert("target".into(), metadata.target().into());
        fields.extend(visitor.fields);
        log::line(
            line(
                self.format,
                &level,
                election.as_deref(),
                "log",
                &message,
                Value::Object(fields),
            )
            .into_bytes(),
        );
    }
}

/// A `tracing` event's message and fields, as JSON values.
#[derive(Default)]
struct FieldVisitor {
    message: String,
    fields: Map<String, Value>,
}

impl FieldVisitor {
    fn put(&mut self, field: &tracing::field::Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.fields.insert(field.name().to_owned(), value);
        }
    }
}

impl tracing::field::Visit for FieldVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(tidy(&format!("{value:?}"))));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.put(field, Value::String(tidy(value)));
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.put(field, value.into());
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
