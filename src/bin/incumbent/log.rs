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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Mutex, OnceLock, PoisonError};
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
    /// Lines accepted into the queue, and lines written (or discarded) since.
    queued: AtomicU64,
    done: AtomicU64,
    /// Lines dropped because the queue was full, not yet reported.
    dropped: AtomicU64,
}

static SINK: OnceLock<Option<Sink>> = OnceLock::new();
static FORMAT: Mutex<NoticeFormat> = Mutex::new(NoticeFormat::Text);

/// Sets how the "lines dropped" notice is written (the status lines' format).
pub fn set_format(format: NoticeFormat) {
    *FORMAT.lock().unwrap_or_else(PoisonError::into_inner) = format;
}

fn sink() -> Option<&'static Sink> {
    SINK.get_or_init(|| {
        let (lines, queue) = sync_channel::<Vec<u8>>(CAPACITY);
        std::thread::Builder::new()
            .name("incumbent-log".into())
            .spawn(move || drain(queue))
            .ok()?;
        Some(Sink {
            lines,
            queued: AtomicU64::new(0),
            done: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    })
    .as_ref()
}

/// Queues `bytes` (one or more whole lines, each ending in `\n`) for stderr. Never blocks:
/// when the queue is full the line is dropped and counted.
pub fn line(bytes: Vec<u8>) {
    let Some(sink) = sink() else {
        return; // no writer thread could be started: stderr stays silent
    };
    // Counted before it is sent, so that `flush` never sees more done than queued.
    sink.queued.fetch_add(1, Ordering::SeqCst);
    match sink.lines.try_send(bytes) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            sink.queued.fetch_sub(1, Ordering::SeqCst);
            sink.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Waits until every queued line is written, at most `limit` (stderr may be stuck).
pub fn flush(limit: Duration) {
    let Some(sink) = SINK.get().and_then(Option::as_ref) else {
        return;
    };
    let deadline = Instant::now() + limit;
    while sink.done.load(Ordering::SeqCst) < sink.queued.load(Ordering::SeqCst)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The writer thread: writes each line; when the queue runs empty, reports dropped lines.
fn drain(queue: Receiver<Vec<u8>>) {
    let closed = AtomicBool::new(false);
    loop {
        let bytes = match queue.try_recv() {
            Ok(bytes) => bytes,
            Err(TryRecvError::Empty) => {
                report_dropped(&closed);
                match queue.recv() {
                    Ok(bytes) => bytes,
                    Err(_) => return,
                }
            }
            Err(TryRecvError::Disconnected) => return,
        };
        write(&bytes, &closed);
        if let Some(sink) = SINK.get().and_then(Option::as_ref) {
            sink.done.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn report_dropped(closed: &AtomicBool) {
    let Some(sink) = SINK.get().and_then(Option::as_ref) else {
        return;
    };
    let dropped = sink.dropped.swap(0, Ordering::Relaxed);
    if dropped == 0 {
        return;
    }
    let now = rfc3339(SystemTime::now());
    let message = format!("{dropped} log line(s) dropped: stderr was not read fast enough");
    let format = *FORMAT.lock().unwrap_or_else(PoisonError::into_inner);
    let text = match format {
        NoticeFormat::Text => format!("{now} incumbent {message}\n"),
        NoticeFormat::Json => format!(
            "{}\n",
            json!({ "time": now, "event": "log_lines_dropped", "message": message, "dropped": dropped })
        ),
    };
    write(text.as_bytes(), closed);
}

/// Writes to stderr, blocking this thread only. Errors (a closed pipe, a closed descriptor)
/// make it discard everything from then on, silently.
fn write(bytes: &[u8], closed: &AtomicBool) {
    if closed.load(Ordering::Relaxed) {
        return;
    }
    let mut stderr = io::stderr().lock();
    match stderr.write_all(bytes).and_then(|()| stderr.flush()) {
        // Someone made the shared descriptor non-blocking: this line is lost, not the rest.
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        // A closed pipe or descriptor: nobody will ever read us again.
        Err(_) => closed.store(true, Ordering::Relaxed),
        Ok(()) => {}
    }
}

/// A `tracing_subscriber` writer that queues each formatted event as one line.
#[derive(Clone, Copy, Debug, Default)]
pub struct Writer;

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // The fmt layer writes each event whole, in one call.
        line(buf.to_vec());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Writer {
    type Writer = Writer;

    fn make_writer(&'a self) -> Self::Writer {
        Writer
    }
}

/// Routes panic messages through the queue too: the default hook writes to stderr with a
/// blocking write, which would stall the thread that panicked.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        line(format!("incumbent: thread '{name}' panicked: {info}\n").into_bytes());
    }));
}
