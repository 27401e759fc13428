//! An election with health endpoints and Prometheus metrics on one port.
//!
//! ```sh
//! cargo run --example health_endpoint --features axum
//! # in another terminal:
//! curl -s localhost:3000/leader   # who leads, this process's term and lease, as JSON
//! curl -si localhost:3000/readyz  # 200 only while this process leads
//! curl -si localhost:3000/healthz # 200 while the campaign is healthy
//! curl -s localhost:3000/metrics  # incumbent_is_leader, incumbent_elections_won_total, ...
//! ```
//!
//! Run it twice (with `--listen 127.0.0.1:3001` for the second) to watch one lead and the
//! other follow; stop the leader with Ctrl-C and the follower takes over at once.
//!
//! Options: `--backend URL` (default `file:`, the default lock directory; see
//! `incumbent::url` for the forms), `--election NAME` (default `example/health`),
//! `--listen ADDR` (default `127.0.0.1:3000`).

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use incumbent::Election;
use incumbent::backend::Backend;
use incumbent::http::Health;
use incumbent::url::{BackendUrl, WithBackend};
use metrics_exporter_prometheus::PrometheusBuilder;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    backend: BackendUrl,
    election: String,
    listen: SocketAddr,
}

fn options() -> Result<Options, BoxError> {
    let mut options = Options {
        backend: BackendUrl::File { dir: None },
        election: "example/health".into(),
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--backend" => options.backend = value()?.parse()?,
            "--election" => options.election = value()?,
            "--listen" => options.listen = value()?.parse()?,
            other => {
                return Err(format!(
                    "unknown option {other:?}; use --backend URL, --election NAME, --listen ADDR"
                )
                .into());
            }
        }
    }
    Ok(options)
}

/// The program, for whichever backend the URL names.
struct Serve {
    election: String,
    listen: SocketAddr,
}

impl WithBackend for Serve {
    type Output = Result<(), BoxError>;

    async fn call<B: Backend>(self, backend: B) -> Self::Output {
        // Install the recorder before the campaign starts, so no metric is missed.
        let prometheus = PrometheusBuilder::new().install_recorder()?;
        let candidate = format!("{}-{}", self.listen, std::process::id());
        let election = Election::builder(backend, self.election)
            .candidate(candidate)
            .metadata("addr", self.listen.to_string())
            .build()?;
        let campaign = election.campaign();

        let app = Router::new()
            .route(
                "/metrics",
                get(move || std::future::ready(prometheus.render())),
            )
            .merge(Health::new().election(campaign.status()).router());
        let listener = tokio::net::TcpListener::bind(self.listen).await?;
        println!(
            "serving /healthz, /readyz, /leader and /metrics on http://{}",
            listener.local_addr()?
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        // Release the lock at once, so another process takes over without waiting for a ttl.
        campaign.shutdown().await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let Options {
        backend,
        election,
        listen,
    } = options()?;
    backend.connect(Serve { election, listen }).await?
}
