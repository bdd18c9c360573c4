//! An axum server with one limited route and one unlimited route.
//!
//! `GET /work` runs behind a `sidejob::tower::LimitLayer`: at most
//! `--capacity` requests are inside the handler at once, and the rest are
//! answered at once with `503 Service Unavailable` and `Retry-After: 1`,
//! without queueing. `GET /health` is outside the layer, so it answers
//! even while `/work` is full (with the limiter's usage, for a probe).
//!
//! With `--max-waiters N` it waits instead
//! (`LimitLayer::waiting`): past the capacity, up to `N` requests wait
//! (for at most `--max-wait-ms`, default 10 s) and are served in arrival
//! order as units free; past the waiting room, `429 Too Many Requests`;
//! a request that waited its whole `max_wait`, `503`.
//!
//! ```text
//! cargo run --release --features tower --example axum_server -- \
//!     --addr 127.0.0.1:3000 --capacity 10 --max-waiters 20 --work-ms 5
//! ```
//!
//! `--no-limit` serves `/work` without the layer (the baseline of
//! `scripts/load.sh`). `tests/http.rs` builds the same routers with
//! [`app`] and [`queued_app`] and floods them.
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
/// back off. (`429 Too Many Requests` is the other common answer; either
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

/// The answer of the waiting route: `429` when the waiting room is full
/// too, `503` when a request waited its
/// whole `max_wait` (or the limiter was closed).
pub fn queue_full(error: Error) -> Response {
    let (status, body) = match error {
        Error::Overload => (StatusCode::TOO_MANY_REQUESTS, "queue full, retry later\n"),
        Error::Timeout => (
            StatusCode::SERVICE_UNAVAILABLE,
            "waited too long, retry later\n",
        ),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
    };
    (status, [(header::RETRY_AFTER, "1")], body).into_response()
}

/// As [`app`], but `/work` waits in the limiter's waiting room (build the
/// limiter with `max_waiters`) and refuses with [`queue_full`].
pub fn queued_app<W, Fut>(limiter: Arc<Limiter>, work: W) -> Router
where
    W: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
{
    let limited =
        get(work).layer(LimitLayer::waiting(Arc::clone(&limiter)).on_overload(queue_full));
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

/// Always answers, with the limited route's usage (and, with a waiting
/// room, how many wait): `ok usage=3 capacity=64`.
async fn health(State(limiter): State<Arc<Limiter>>) -> String {
    let waiting = match limiter.waiting() {
        0 => String::new(),
        n => format!(" waiting={n}"),
    };
    format!(
        "ok usage={} capacity={}{waiting}\n",
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
    let mut max_waiters = 0;
    let mut max_wait_ms = 10_000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().ok_or("--addr needs a value")?.parse()?,
            "--capacity" => capacity = args.next().ok_or("--capacity needs a value")?.parse()?,
            "--work-ms" => work_ms = args.next().ok_or("--work-ms needs a value")?.parse()?,
            "--max-waiters" => {
                max_waiters = args.next().ok_or("--max-waiters needs a value")?.parse()?
            }
            "--max-wait-ms" => {
                max_wait_ms = args.next().ok_or("--max-wait-ms needs a value")?.parse()?
            }
            "--no-limit" => limited = false,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(capacity)
            .max_waiters(max_waiters)
            .max_wait(Duration::from_millis(max_wait_ms))
            .build()?,
    );
    let work = simulated_work(work_ms);
    let router = match (limited, max_waiters) {
        (false, _) => unlimited_app(Arc::clone(&limiter), work),
        (true, 0) => app(Arc::clone(&limiter), work),
        (true, _) => queued_app(Arc::clone(&limiter), work),
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "listening on http://{} (/work {}, {work_ms} ms of work; /health unlimited)",
        listener.local_addr()?,
        match (limited, max_waiters) {
            (false, _) => "unlimited".to_string(),
            (true, 0) => format!("limited to {capacity}, 503 past it"),
            (true, n) => format!(
                "limited to {capacity}, {n} more wait up to {max_wait_ms} ms, 429 past them"
            ),
        },
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    let stats = limiter.stats();
    println!(
        "accepted {} rejected {} completed {} waited {} timed out {}",
        stats.accepted, stats.rejected, stats.completed, stats.waited, stats.timed_out
    );
    Ok(())
}
