//! An in-process TCP proxy that can black-hole, delay and reset connections,
//! to put network faults between one client and one server.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

/// Most connections relayed at once; further clients wait in the backlog.
const MAX_CONNECTIONS: usize = 256;

/// Bytes read at a time in each direction.
const BUFFER_SIZE: usize = 16 * 1024;

/// A TCP proxy from a fresh loopback port to one upstream address. Dropping
/// it stops accepting and resets every connection.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: Mutex<SocketAddr>,
    blackhole: watch::Sender<bool>,
    latency_micros: AtomicU64,
    /// Cancelled when the proxy is dropped; parent of every generation.
    stop: CancellationToken,
    /// Held by the connections accepted since the last `reset_all`.
    generation: Mutex<CancellationToken>,
}

impl Proxy {
    /// Starts proxying a fresh `127.0.0.1` port to `upstream`. Must be called
    /// within a tokio runtime, which runs the proxy.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind proxy");
        listener
            .set_nonblocking(true)
            .expect("non-blocking proxy listener");
        let addr = listener.local_addr().expect("proxy address");
        let listener = TcpListener::from_std(listener).expect("register proxy listener");
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            blackhole: watch::Sender::new(false),
            latency_micros: AtomicU64::new(0),
            generation: Mutex::new(stop.child_token()),
            stop,
        });
        tokio::spawn(accept_loop(listener, shared.clone()));
        Proxy { addr, shared }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// While on, connections stay open but no byte passes in either
    /// direction, as in a network partition: bytes are withheld, not lost,
    /// and flow again once it is turned off. Connections accepted meanwhile
    /// reach the upstream only then.
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Delays every chunk of bytes by `latency`, in each direction (so a
    /// request-response round trip takes at least twice as long).
    pub fn set_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.shared.latency_micros.store(micros, Ordering::Relaxed);
    }

    /// Relays later connections to `upstream` instead (a failover to another
    /// server), and closes every current one with a TCP reset, so that clients
    /// reconnect there.
    pub fn switch(&self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = upstream;
        self.reset_all();
    }

    /// Closes every current connection with a TCP reset, on both sides.
    /// Later connections are relayed as usual.
    pub fn reset_all(&self) {
        let mut generation = self
            .shared
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        generation.cancel();
        *generation = self.shared.stop.child_token();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            accepted = async {
                let slot = slots.clone().acquire_owned().await.expect("never closed");
                (listener.accept().await, slot)
            } => accepted,
        };
        match accepted {
            (Ok((client, _)), slot) => {
                let cancel = shared
                    .generation
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                let shared = shared.clone();
                tokio::spawn(async move {
                    serve(client, &shared, cancel).await;
                    drop(slot);
                });
            }
            // E.g. out of file descriptors: back off rather than spin.
            (Err(_), _) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Relays one client until both sides have closed; resets both on cancel,
/// on an error, or (for the client) when the upstream refuses.
async fn serve(mut client: TcpStream, shared: &Shared, cancel: CancellationToken) {
    let mut open = shared.blackhole.subscribe();
    let connect = async {
        let _ = open.wait_for(|hole| !hole).await;
        let upstream = *shared
            .upstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        TcpStream::connect(upstream).await
    };
    let mut upstream = tokio::select! {
        _ = cancel.cancelled() => return reset(&client),
        connected = connect => match connected {
            Ok(upstream) => upstream,
            Err(_) => return reset(&client),
        },
    };
    let relayed = tokio::select! {
        _ = cancel.cancelled() => false,
        result = relay(&mut client, &mut upstream, shared) => result.is_ok(),
    };
    if !relayed {
        reset(&client);
        reset(&upstream);
    }
}

async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    shared: &Shared,
) -> io::Result<()> {
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    tokio::try_join!(
        pump(client_read, upstream_write, shared),
        pump(upstream_read, client_write, shared)
    )?;
    Ok(())
}

/// Copies one direction, honouring black-hole and latency, and passes the
/// end of stream on as a half-close.
async fn pump(mut from: ReadHalf<'_>, mut to: WriteHalf<'_>, shared: &Shared) -> io::Result<()> {
    let mut open = shared.blackhole.subscribe();
    let mut buffer = vec![0; BUFFER_SIZE];
    loop {
        let _ = open.wait_for(|hole| !hole).await;
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return to.shutdown().await;
        }
        let latency = Duration::from_micros(shared.latency_micros.load(Ordering::Relaxed));
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let _ = open.wait_for(|hole| !hole).await;
        to.write_all(&buffer[..read]).await?;
    }
}

/// Makes closing `stream` send a reset instead of a FIN.
fn reset(stream: &TcpStream) {
    // Deprecated because a non-zero linger blocks on drop; zero does not.
    // (`set_zero_linger` needs tokio 1.50, above Cargo.toml's minimum.)
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
}
