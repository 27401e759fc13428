//! A service with a singleton worker: every replica runs this program, exactly one of them
//! runs the worker at a time, and each serves its own routes, the health routes and its
//! metrics on one port. The store comes from a URL in the configuration.
//!
//! ```sh
//! cargo run --example service --features axum                       # file: (one host)
//! INCUMBENT_BACKEND=etcd://127.0.0.1:2379 cargo run --example service --features axum,etcd
//! curl -s localhost:3000/leader; curl -si localhost:3000/readyz; curl -s localhost:3000/metrics
//! ```
//!
//! Run it twice (`LISTEN=127.0.0.1:3001` for the second) to watch one lead and the other
//! follow; stop the leader with Ctrl-C or SIGTERM and the follower takes over at once.

use std::time::Duration;

use axum::{Router, routing::get};
use incumbent::{AnyBackend, Election, http::Health};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::signal::unix::{SignalKind, signal};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("INCUMBENT_BACKEND").unwrap_or_else(|_| "file:".into());
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let prometheus = PrometheusBuilder::new().install_recorder()?; // before the campaign

    let election = Election::builder(AnyBackend::connect(&url).await?, "example/service")
        .candidate(format!("{listen}/{}", std::process::id()))
        .on_elected(|term| async move { println!("elected, token {}", term.fencing_token()) })
        .on_demoted(
            |end| async move { println!("demoted: {} ({})", end.reason, end.fencing_token) },
        )
        .build()?;
    // The worker runs only while this replica leads, and is stopped before another can.
    let runner = election.start(|term| async move {
        while !term.is_cancelled() {
            // Pass term.fencing_token() with every write, so a stale leader is refused.
            println!("working under token {}", term.fencing_token());
            tokio::select! {
                () = term.cancelled() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });

    let app = Router::new()
        .route("/", get(|| async { "the service's own routes" }))
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        )
        .merge(Health::new().election(runner.status()).router());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("serving on http://{listen} (/healthz, /readyz, /leader, /metrics)");
    let mut terminate = signal(SignalKind::terminate())?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        })
        .await?;
    runner.shutdown().await?; // stop the worker, then release the lock: the next one starts now
    Ok(())
}
