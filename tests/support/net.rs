//! Free loopback ports.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{Mutex, PoisonError};

/// Returns a loopback TCP port that is free now and has not been handed out
/// before in this test process (servers bind it a moment later).
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// Returns `127.0.0.1:port` for a fresh `free_port()`.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()))
}

/// A loopback address where every connection is refused, for as long as the returned guard
/// lives: its port is bound, so no server (of this test process or another) can take it
/// meanwhile, but not listening. A port merely found free can be taken by a server another
/// test starts a moment later, which then answers in the name of "nobody".
pub fn refused_addr() -> (SocketAddr, Refusing) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    socket
        .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .expect("bind 127.0.0.1:0");
    let addr = socket.local_addr().expect("local_addr");
    (addr, Refusing { _socket: socket })
}

/// Holds the port of [`refused_addr`]; dropping it frees the port.
pub struct Refusing {
    _socket: tokio::net::TcpSocket,
}
