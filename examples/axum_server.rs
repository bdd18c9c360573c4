//! An axum server with one limited route and one unlimited route.
//!
//! `GET /work` runs behind a `sidejob::tower::LimitLayer`: at most
//! `--capacity` requests are inside the handler at once, and the rest are
//! answered at once with `503 Service Unavailable` and `Retry-After: 1`,
//! without queueing. `GET /health` is outside the layer, so it answers
//! even while `/work` is full (with the limiter's usage, for a probe).
//!
//! ```text
//! cargo run --release --features tower --example axum_server -- \
//!     --addr 127.0.0.1:3000 --capacity 64 --work-ms 5 [--no-limit]
//! ```
//!
//! `--no-limit` serves `/work` without the layer (the baseline of
//! `scripts/load.sh`). `tests/http.rs` builds the same router with
//! [`app`] and floods it.
#![allow(dead_code)] // `main` is unused when tests/http.rs includes this file

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sidejob::tower::LimitLayer;
use sidejob::{Error, Limiter};

/// The answer to a refused request: `503` with `Retry-After`, so clients
/// back off. (The Unisave worker answers `429 Too Many Requests`; either
/// is one line here.)
pub fn busy(_: Error) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        "busy, retry later\n",
    )
        .into_response()
}

/// The router: `/work` runs `work` behind the limit, `/health` is free.
pub fn app<W, Fut>(limiter: Arc<Limiter>, work: W) -> Router
where
    W: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let limited = get(work).layer(LimitLayer::new(Arc::clone(&limiter)).on_overload(busy));
    Router::new()
        .route("/work", limited)
        .route("/health", get(health))
        .with_state(limiter)
}

/// The same `/work` with no limit at all: the load run's baseline.
pub fn unlimited_app<W, Fut>(limiter: Arc<Limiter>, work: W) -> Router
where
    W: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    Router::new()
        .route("/work", get(work))
        .route("/health", get(health))
        .with_state(limiter)
}

/// Always answers, with the limited route's usage: `ok usage=3 capacity=64`.
async fn health(State(limiter): State<Arc<Limiter>>) -> String {
    format!(
        "ok usage={} capacity={}\n",
        limiter.usage(),
        limiter.capacity()
    )
}

/// Simulated work: a handler that waits on I/O for `ms` milliseconds.
fn simulated_work(
    ms: u64,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = String> + Send>> + Clone {
    move || {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            "done\n".to_string()
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut addr: SocketAddr = "127.0.0.1:3000".parse()?;
    let mut capacity = 64;
    let mut work_ms = 5;
    let mut limited = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().ok_or("--addr needs a value")?.parse()?,
            "--capacity" => capacity = args.next().ok_or("--capacity needs a value")?.parse()?,
            "--work-ms" => work_ms = args.next().ok_or("--work-ms needs a value")?.parse()?,
            "--no-limit" => limited = false,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let limiter = Arc::new(Limiter::new(capacity)?);
    let router = if limited {
        app(Arc::clone(&limiter), simulated_work(work_ms))
    } else {
        unlimited_app(Arc::clone(&limiter), simulated_work(work_ms))
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "listening on http://{} (/work {}, {work_ms} ms of work; /health unlimited)",
        listener.local_addr()?,
        if limited {
            format!("limited to {capacity}")
        } else {
            "unlimited".to_string()
        },
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    let stats = limiter.stats();
    println!(
        "accepted {} rejected {} completed {}",
        stats.accepted, stats.rejected, stats.completed
    );
    Ok(())
}
