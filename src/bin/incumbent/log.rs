//! The one way this program writes to stderr once it runs: a bounded queue drained by a
//! thread of its own, so that no caller ever waits on stderr.
//!
//! Supervising a command must never depend on whoever reads our stderr: a stalled pipe (a
//! hung log shipper, `| tee` on a full disk, a chatty command sharing the pipe) would
//! otherwise block the thread that signals the command and renews the lease. So every line
//! (status lines, errors, the library's `tracing` events, panic messages) is handed to
//! [`line`], which never blocks: when the queue is full the line is dropped and counted, and
//! once the queue drains, the writer reports how many were dropped. A closed stderr (EPIPE,
//! EBADF) is ignored: lines are discarded, nothing panics.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use incumbent::time::rfc3339;
use serde_json::json;

/// How many lines may wait for stderr; more are dropped (and counted).
const CAPACITY: usize = 1024;

/// How a "lines dropped" notice is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeFormat {
    /// A line of text.
    Text,
    /// A JSON object, like the status lines of `--log-format json`.
    Json,
}

struct Sink {
    lines: SyncSender<Vec<u8>>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Lines accepted into the queue, and lines written (or discarded) since.
    queued: AtomicU64,
    done: AtomicU64,
    /// Lines dropped because the queue was full, not yet reported.
    dropped: AtomicU64,
}

static SINK: OnceLock<Option<Sink>> = OnceLock::new();
static FORMAT: Mutex<NoticeFormat> = Mutex::new(NoticeFormat::Text);
static ELECTION: OnceLock<String> = OnceLock::new();

/// Sets the election every line is about (once: one election per process).
pub fn set_election(election: &str) {
    let _ = ELECTION.set(election.to_owned());
}

/// The election every line is about, once known.
pub fn election() -> Option<String> {
    ELECTION.get().cloned()
}

/// Sets how the "lines dropped" notice is written (the status lines' format).
pub fn set_format(format: NoticeFormat) {
    *FORMAT.lock().unwrap_or_else(PoisonError::into_inner) = format;
}

fn format() -> NoticeFormat {
    *FORMAT.lock().unwrap_or_else(PoisonError::into_inner)
}

fn sink() -> Option<&'static Sink> {
    SINK.get_or_init(|| Sink::start(io::stderr, CAPACITY))
        .as_ref()
}

impl Sink {
    /// A queue of `capacity` lines, written to `output()` by a thread of its own; `None` if
    /// the thread cannot be started.
    fn start<W: Write + 'static>(output: fn() -> W, capacity: usize) -> Option<Sink> {
        let (lines, queue) = sync_channel::<Vec<u8>>(capacity);
        let counts = Arc::new(Counts::default());
        let drained = counts.clone();
        std::thread::Builder::new()
            .name("incumbent-log".into())
            .spawn(move || drain(&queue, &drained, output))
            .ok()?;
        Some(Sink { lines, counts })
    }

    fn send(&self, bytes: Vec<u8>) {
        // Counted before it is sent, so that `flush` never sees more done than queued.
        self.counts.queued.fetch_add(1, Ordering::SeqCst);
        if self.lines.try_send(bytes).is_err() {
            self.counts.queued.fetch_sub(1, Ordering::SeqCst);
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn flush(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.counts.done.load(Ordering::SeqCst) < self.counts.queued.load(Ordering::SeqCst)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Queues `bytes` (one or more whole lines, each ending in `\n`) for stderr. Never blocks:
/// when the queue is full the line is dropped and counted.
pub fn line(bytes: Vec<u8>) {
    // Without a writer thread, stderr stays silent.
    if let Some(sink) = sink() {
        sink.send(bytes);
    }
}

/// Waits until every queued line is written, at most `limit` (stderr may be stuck).
pub fn flush(limit: Duration) {
    if let Some(sink) = SINK.get().and_then(Option::as_ref) {
        sink.flush(limit);
    }
}

/// The writer thread: writes each line; when the queue runs empty, reports dropped lines.
fn drain<W: Write>(queue: &Receiver<Vec<u8>>, counts: &Counts, output: fn() -> W) {
    let mut closed = false;
    loop {
        let bytes = match queue.try_recv() {
            Ok(bytes) => bytes,
            Err(TryRecvError::Empty) => {
                let dropped = counts.dropped.swap(0, Ordering::Relaxed);
                if dropped > 0 {
                    write(&mut output(), &notice(dropped), &mut closed);
                }
                match queue.recv() {
                    Ok(bytes) => bytes,
                    Err(_) => return,
                }
            }
            Err(TryRecvError::Disconnected) => return,
        };
        write(&mut output(), &bytes, &mut closed);
        counts.done.fetch_add(1, Ordering::SeqCst);
    }
}

/// The line that says how many lines were dropped.
fn notice(dropped: u64) -> Vec<u8> {
    let now = rfc3339(SystemTime::now());
    let message = format!("{dropped} log line(s) dropped: stderr was not read fast enough");
    match format() {
        NoticeFormat::Text => format!("{now} incumbent {message}\n"),
        NoticeFormat::Json => {
            let mut line = json!({ "time": now, "level": "warn" });
            if let Some(election) = election() {
                line["election"] = election.into();
            }
            line["event"] = "log_lines_dropped".into();
            line["message"] = message.into();
            line["dropped"] = dropped.into();
            format!("{line}\n")
        }
    }
    .into_bytes()
}

/// Writes, blocking this thread only. A closed pipe or descriptor makes it discard
/// everything from then on, silently.
fn write(output: &mut impl Write, bytes: &[u8], closed: &mut bool) {
    if *closed {
        return;
    }
    match output.write_all(bytes).and_then(|()| output.flush()) {
        // Someone made the shared descriptor non-blocking: this line is lost, not the rest.
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(_) => *closed = true,
        Ok(()) => {}
    }
}

/// Routes panic messages through the queue too: the default hook writes to stderr with a
/// blocking write, which would stall the thread that panicked.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let message = format!("thread '{name}' panicked: {info}");
        match format() {
            NoticeFormat::Text => line(format!("incumbent: {message}\n").into_bytes()),
            NoticeFormat::Json => {
                let mut object = json!({ "time": rfc3339(SystemTime::now()), "level": "error" });
                if let Some(election) = election() {
                    object["election"] = election.into();
                }
                object["event"] = "panic".into();
                object["message"] = message.into();
                line(format!("{object}\n").into_bytes());
            }
        }
    }));
}

#[cfg(test)]
mod tests {
    use std::sync::Condvar;

    use super::*;

    /// What the test writer has written, and whether it is blocked (like a full pipe).
    static WRITTEN: Mutex<Vec<u8>> = Mutex::new(Vec::new());
    static BLOCKED: Mutex<bool> = Mutex::new(true);
    static UNBLOCKED: Condvar = Condvar::new();

    struct Stuck;

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut blocked = BLOCKED.lock().unwrap_or_else(PoisonError::into_inner);
            while *blocked {
                blocked = UNBLOCKED
                    .wait(blocked)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            WRITTEN
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_writer_never_blocks_the_caller_and_dropped_lines_are_reported() {
        let sink = Sink::start(|| Stuck, 4).expect("writer thread");
        let began = Instant::now();
        for n in 0..100 {
            sink.send(format!("line {n}\n").into_bytes());
        }
        assert!(began.elapsed() < Duration::from_secs(1), "sending blocked");
        sink.flush(Duration::from_millis(50)); // bounded, though nothing can be written

        *BLOCKED.lock().unwrap_or_else(PoisonError::into_inner) = false;
        UNBLOCKED.notify_all();
        sink.flush(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(5);
        let text = loop {
            let text =
                String::from_utf8_lossy(&WRITTEN.lock().unwrap_or_else(PoisonError::into_inner))
                    .into_owned();
            if text.contains("dropped") || Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // The queue holds four lines (the writer maybe one more): the rest were dropped,
        // counted, and reported once the queue drained.
        let written = text.lines().filter(|l| l.starts_with("line ")).count();
        let dropped: usize = text
            .split_once(" log line(s) dropped")
            .and_then(|(head, _)| head.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no notice: {text}"));
        assert!(text.starts_with("line 0\n"), "{text}");
        assert!((4..=5).contains(&written), "{text}");
        assert_eq!(written + dropped, 100, "{text}");
    }

    #[test]
    fn a_closed_output_is_ignored() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::start(|| Closed, 4).expect("writer thread");
        for n in 0..10 {
            sink.send(format!("line {n}\n").into_bytes());
        }
        sink.flush(Duration::from_secs(5));
        assert_eq!(
            sink.counts.done.load(Ordering::SeqCst),
            sink.counts.queued.load(Ordering::SeqCst)
        );
    }
}
