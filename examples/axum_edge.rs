//! An axum service's edge with no glue: built-in refusals, streaming
//! bodies inside the limit, and probes outside it.
//!
//! * `GET /work` waits in a waiting room (`LimitLayer::waiting`) and is
//!   refused by `HttpRefusal`: `429 Too Many Requests` past the room,
//!   `503 Service Unavailable` after `max_wait` or once shutting down,
//!   each with `Retry-After`.
//! * `GET /download` streams its body, and holds its unit until the body
//!   is sent (`hold_until_body_ends`): at most `--downloads` bodies are
//!   being sent at once, the rest get `503` at once.
//! * `GET /health` (liveness) and `GET /ready` (readiness) are outside
//!   every limit, so they answer while the service is full. `/ready`
//!   turns `503` when the service starts to drain (its limiters closed),
//!   and never because it is busy: a readiness probe that failed under
//!   load would pull every replica out of the balancer at once, while
//!   the limiter already sheds what one replica cannot take.
//!
//! ```text
//! cargo run --release --features http --example axum_edge -- \
//!     --addr 127.0.0.1:3000 --capacity 10 --max-waiters 20 --downloads 4
//! ```
//!
//! `tests/http_edge.rs` builds the same router with [`app`] and drives it
//! with real HTTP clients on 127.0.0.1.
#![allow(dead_code)] // `main` is unused when tests/http_edge.rs includes this file

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use http_body::Frame;
use http_body_util::StreamBody;
use sidejob::tower::{HttpRefusal, LimitLayer};
use sidejob::Limiter;

/// The service's limiters: one per limited route.
#[derive(Clone)]
pub struct Limits {
    /// `/work`: requests inside the handler, and a waiting room.
    pub work: Arc<Limiter>,
    /// `/download`: bodies being sent.
    pub downloads: Arc<Limiter>,
}

impl Limits {
    /// Starts draining: every limited route answers `503` from now on
    /// (requests waiting are answered too), `/ready` answers `503`; what
    /// is already inside finishes.
    pub fn close(&self) {
        self.work.close();
        self.downloads.close();
    }
}

/// The router. `work` answers `/work`; `download` makes `/download`'s
/// body (called once the request is admitted).
pub fn app<W, Fut, D>(limits: Limits, work: W, download: D) -> Router
where
    W: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send + 'static,
    D: Fn() -> Body + Clone + Send + Sync + 'static,
{
    let refusal = HttpRefusal::new(); // 429 past the room, else 503; Retry-After: 1
    let work_route =
        get(work).layer(LimitLayer::waiting(Arc::clone(&limits.work)).refuse_with(refusal));
    let download_route = get(move || {
        let body = download();
        async move { body }
    })
    .layer(
        LimitLayer::new(Arc::clone(&limits.downloads))
            .refuse_with(refusal)
            .hold_until_body_ends(),
    );
    Router::new()
        .route("/work", work_route)
        .route("/download", download_route)
        // No layer on these two: the probes bypass every limit.
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .with_state(limits)
}

/// Readiness: `200` while the limiters admit, `503` once they are closed.
async fn ready(State(limits): State<Limits>) -> (StatusCode, &'static str) {
    if limits.work.is_closed() || limits.downloads.is_closed() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

/// A body of `chunks` lines, each after `interval`: a slow download.
fn slow_body(chunks: usize, interval: Duration) -> Body {
    let lines = futures_util::stream::unfold(0, move |sent| async move {
        if sent == chunks {
            return None;
        }
        tokio::time::sleep(interval).await;
        let line = Frame::data(Bytes::from(format!("line {sent}\n")));
        Some((Ok::<_, Infallible>(line), sent + 1))
    });
    Body::new(StreamBody::new(lines))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut addr: SocketAddr = "127.0.0.1:3000".parse()?;
    let mut capacity = 10;
    let mut max_waiters = 20;
    let mut downloads = 4;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().ok_or("--addr needs a value")?.parse()?,
            "--capacity" => capacity = args.next().ok_or("--capacity needs a value")?.parse()?,
            "--max-waiters" => {
                max_waiters = args.next().ok_or("--max-waiters needs a value")?.parse()?
            }
            "--downloads" => downloads = args.next().ok_or("--downloads needs a value")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let limits = Limits {
        work: Arc::new(
            Limiter::builder()
                .capacity(capacity)
                .max_waiters(max_waiters)
                .max_wait(Duration::from_secs(2))
                .build()?,
        ),
        downloads: Arc::new(Limiter::new(downloads)?),
    };
    let work = || async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        "done\n".to_string()
    };
    let router = app(limits.clone(), work, || {
        slow_body(10, Duration::from_millis(100))
    });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "listening on http://{} (/work: {capacity} at once, {max_waiters} wait; /download: {downloads} bodies at once; /health, /ready unlimited)",
        listener.local_addr()?
    );
    let draining = limits.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            // Readiness fails and new requests get 503 while the
            // requests inside finish.
            draining.close();
        })
        .await?;
    Ok(())
}
