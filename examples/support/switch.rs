//! A TCP relay whose upstream can be switched: clients keep one address while the server
//! behind it changes, as behind a failover's virtual IP or a Sentinel-aware proxy. Used by
//! the chaos checker's `redis-failover` backend: after the replica is promoted, the relay
//! points at it and resets every connection to the old primary.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A relay from a fresh loopback port to a switchable upstream. Dropping it stops accepting
/// and closes every connection.
pub struct SwitchProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: Mutex<SocketAddr>,
    /// Cancelled when the relay is dropped; parent of every generation.
    stop: CancellationToken,
    /// Held by the connections accepted since the last switch.
    generation: Mutex<CancellationToken>,
}

impl SwitchProxy {
    /// Starts relaying a fresh `127.0.0.1` port to `upstream`. Must be called within a tokio
    /// runtime, which runs the relay.
    pub fn start(upstream: SocketAddr) -> SwitchProxy {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind relay");
        listener
            .set_nonblocking(true)
            .expect("non-blocking relay listener");
        let addr = listener.local_addr().expect("relay address");
        let listener = TcpListener::from_std(listener).expect("register relay listener");
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            generation: Mutex::new(stop.child_token()),
            stop,
        });
        tokio::spawn(accept_loop(listener, shared.clone()));
        SwitchProxy { addr, shared }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends new connections to `upstream`, and closes every current one with a reset, so
    /// that clients reconnect (to the new upstream).
    pub fn switch(&self, upstream: SocketAddr) {
        *self
            .shared
            .upstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = upstream;
        let mut generation = self
            .shared
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        generation.cancel();
        *generation = self.shared.stop.child_token();
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((client, _)) => {
                let (upstream, cancel) = {
                    // Both under the generation's lock: a connection accepted during a
                    // switch goes to the new upstream or is reset with the old ones.
                    let generation = shared
                        .generation
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    let upstream = *shared
                        .upstream
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    (upstream, generation.clone())
                };
                tokio::spawn(serve(client, upstream, cancel));
            }
            // E.g. out of file descriptors: back off rather than spin.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Relays one client to `upstream` until either side closes or the generation is cancelled;
/// then resets both.
async fn serve(mut client: TcpStream, upstream: SocketAddr, cancel: CancellationToken) {
    let connect = tokio::select! {
        _ = cancel.cancelled() => return reset(&client),
        connected = TcpStream::connect(upstream) => connected,
    };
    let Ok(mut server) = connect else {
        return reset(&client);
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let clean = tokio::select! {
        _ = cancel.cancelled() => false,
        copied = tokio::io::copy_bidirectional(&mut client, &mut server) => copied.is_ok(),
    };
    if !clean {
        reset(&client);
        reset(&server);
    }
}

/// Makes closing `stream` send a reset instead of a FIN.
fn reset(stream: &TcpStream) {
    // Deprecated because a non-zero linger blocks on drop; zero does not.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
}
