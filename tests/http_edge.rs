//! The axum edge example on 127.0.0.1, driven by real HTTP clients:
//!
//! * with `hold_until_body_ends`, the bodies being streamed never exceed
//!   the capacity under a flood (a counter in the body itself), a body
//!   still streaming refuses the next request though every handler has
//!   returned, and a client that hangs up mid-body gives its unit back;
//!   without it, the same bodies run outside the limit;
//! * `/health` and `/ready` answer while the limited routes are full,
//!   `/ready` and the limited routes turn `503` once the limiters close;
//! * `HttpRefusal`'s statuses: `503` when full, `429` past the waiting
//!   room, `503` on shutdown (also for a request that was waiting), each
//!   with `Retry-After`.

#[path = "../examples/axum_edge.rs"]
mod axum_edge;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use sidejob::tower::LimitLayer;
use sidejob::Limiter;
use tokio::sync::Semaphore;

const CAPACITY: usize = 4;
const CHUNKS: usize = 3;
const CLIENTS: usize = 16;
const PER_CLIENT: usize = 15;

/// Bounds every scenario: a hang fails the test instead of stalling CI.
const HUNG: Duration = Duration::from_secs(60);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Bodies alive on the server: made (in the handler, so after admission)
/// and not yet finished or dropped; and the most at once.
#[derive(Default)]
struct Live {
    now: AtomicUsize,
    peak: AtomicUsize,
    made: AtomicUsize,
}

/// One body's place in [`Live`], given up when the body ends or drops.
struct LiveGuard(Arc<Live>);

impl LiveGuard {
    fn new(live: &Arc<Live>) -> Self {
        let now = live.now.fetch_add(1, SeqCst) + 1;
        live.peak.fetch_max(now, SeqCst);
        live.made.fetch_add(1, SeqCst);
        LiveGuard(Arc::clone(live))
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, SeqCst);
    }
}

/// A body of `CHUNKS` lines, each sent only once it passes `gate` (closed:
/// the body stalls; open: it flows). It leaves [`Live`] before it reports
/// its end, or when it is dropped.
fn gated_body(live: &Arc<Live>, gate: &Arc<Semaphore>) -> Body {
    let state = (0, Arc::clone(gate), LiveGuard::new(live));
    let lines = futures_util::stream::unfold(Some(state), |state| async move {
        let (sent, gate, guard) = state?;
        if sent == CHUNKS {
            drop(guard);
            return None;
        }
        gate.acquire().await.unwrap().forget();
        gate.add_permits(1);
        tokio::task::yield_now().await;
        let line = Frame::data(Bytes::from(format!("line {sent}\n")));
        Some((Ok::<_, Infallible>(line), Some((sent + 1, gate, guard))))
    });
    Body::new(StreamBody::new(lines))
}

fn expected_body() -> String {
    (0..CHUNKS).map(|i| format!("line {i}\n")).collect()
}

/// A running edge: its limits, the body counter and gate, its address.
struct Edge {
    limits: axum_edge::Limits,
    live: Arc<Live>,
    gate: Arc<Semaphore>,
    base: String,
    client: HttpClient,
    server: tokio::task::JoinHandle<()>,
}

async fn serve(router: Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (format!("http://{addr}"), server)
}

/// The example's router: `/download` bodies gated, `/work` gated too
/// (it takes a ticket at the gate and gives it back).
async fn edge(work_room: usize) -> Edge {
    let limits = axum_edge::Limits {
        work: Arc::new(
            Limiter::builder()
                .capacity(CAPACITY)
                .max_waiters(work_room)
                .max_wait(Duration::from_secs(3600))
                .build()
                .unwrap(),
        ),
        downloads: Arc::new(Limiter::new(CAPACITY).unwrap()),
    };
    let live = Arc::new(Live::default());
    let gate = Arc::new(Semaphore::new(0));
    let work = {
        let gate = Arc::clone(&gate);
        move || {
            let gate = Arc::clone(&gate);
            async move {
                gate.acquire().await.unwrap().forget();
                gate.add_permits(1);
                "done\n".to_string()
            }
        }
    };
    let download = {
        let (live, gate) = (Arc::clone(&live), Arc::clone(&gate));
        move || gated_body(&live, &gate)
    };
    let (base, server) = serve(axum_edge::app(limits.clone(), work, download)).await;
    Edge {
        limits,
        live,
        gate,
        base,
        client: Client::builder(TokioExecutor::new()).build_http(),
        server,
    }
}

async fn head(client: &HttpClient, url: &str) -> hyper::Response<Incoming> {
    let request = Request::get(url).body(Empty::new()).unwrap();
    client.request(request).await.expect("loopback request")
}

/// Status, `Retry-After`, and the whole body.
async fn get(client: &HttpClient, url: &str) -> (StatusCode, Option<String>, String) {
    let response = head(client, url).await;
    let status = response.status();
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_string());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry_after,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// Waits (yielding, bounded by the test's timeout) until `done` holds.
async fn until(mut done: impl FnMut() -> bool) {
    while !done() {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_bodies_never_exceed_the_capacity_under_load() {
    tokio::time::timeout(HUNG, async {
        let e = edge(0).await;
        let url = format!("{}/download", e.base);

        // Phase 1, deterministic: CAPACITY bodies stalled at the closed
        // gate. Every handler has returned; the units are in the bodies.
        let mut stalled = Vec::new();
        for _ in 0..CAPACITY {
            let response = head(&e.client, &url).await;
            assert_eq!(response.status(), StatusCode::OK);
            stalled.push(response);
        }
        assert_eq!(e.live.now.load(SeqCst), CAPACITY);
        assert_eq!(e.limits.downloads.usage(), CAPACITY);
        let (status, retry_after, body) = get(&e.client, &url).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!((retry_after.as_deref(), body.as_str()), (Some("1"), ""));
        assert_eq!(
            e.live.made.load(SeqCst),
            CAPACITY,
            "the refused handler never ran"
        );

        // Open the gate: the stalled bodies finish, and their units are
        // back by the time their clients have read the last byte.
        e.gate.add_permits(1);
        for response in stalled {
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, expected_body().as_bytes());
        }
        assert_eq!(e.limits.downloads.usage(), 0);

        // Phase 2: a flood of clients, each reading every body it gets.
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (client, url) = (e.client.clone(), url.clone());
                tokio::spawn(async move {
                    let (mut ok, mut refused) = (0usize, 0usize);
                    for _ in 0..PER_CLIENT {
                        match get(&client, &url).await {
                            (StatusCode::OK, _, body) => {
                                assert_eq!(body, expected_body());
                                ok += 1;
                            }
                            (StatusCode::SERVICE_UNAVAILABLE, retry_after, _) => {
                                assert_eq!(retry_after.as_deref(), Some("1"));
                                refused += 1;
                            }
                            (other, _, body) => panic!("unexpected {other}: {body}"),
                        }
                    }
                    (ok, refused)
                })
            })
            .collect();
        let (mut ok, mut refused) = (CAPACITY, 1); // phase 1
        for client in clients {
            let (o, r) = client.await.unwrap();
            ok += o;
            refused += r;
        }

        let peak = e.live.peak.load(SeqCst);
        assert!(
            peak <= CAPACITY,
            "{peak} bodies streamed at once, capacity {CAPACITY}"
        );
        assert_eq!(ok + refused, CAPACITY + 1 + CLIENTS * PER_CLIENT);
        assert_eq!(
            e.live.made.load(SeqCst),
            ok,
            "a body for each admitted request"
        );
        let stats = e.limits.downloads.stats();
        assert_eq!(
            (stats.accepted as usize, stats.rejected as usize),
            (ok, refused)
        );
        assert_eq!((stats.usage, e.live.now.load(SeqCst)), (0, 0));
        eprintln!("{ok} bodies streamed, {refused} refused, at most {peak} at once");
        e.server.abort();
    })
    .await
    .expect("the flood finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_hold_a_streaming_body_runs_outside_the_limit() {
    tokio::time::timeout(HUNG, async {
        // The same gated bodies behind the default layer: the unit goes
        // back with the response head.
        let limiter = Arc::new(Limiter::new(CAPACITY).unwrap());
        let live = Arc::new(Live::default());
        let gate = Arc::new(Semaphore::new(0));
        let route = {
            let (live, gate) = (Arc::clone(&live), Arc::clone(&gate));
            axum::routing::get(move || {
                let body = gated_body(&live, &gate);
                async move { body }
            })
            .layer(
                LimitLayer::new(Arc::clone(&limiter))
                    .refuse_with(sidejob::tower::HttpRefusal::new()),
            )
        };
        let (base, server) = serve(Router::new().route("/download", route)).await;
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let url = format!("{base}/download");

        let mut stalled = Vec::new();
        for _ in 0..CAPACITY + 1 {
            let response = head(&client, &url).await;
            assert_eq!(
                response.status(),
                StatusCode::OK,
                "admitted: the units are back"
            );
            stalled.push(response);
        }
        assert_eq!(limiter.usage(), 0);
        assert_eq!(
            live.now.load(SeqCst),
            CAPACITY + 1,
            "more bodies than the capacity"
        );
        gate.add_permits(1);
        for response in stalled {
            response.into_body().collect().await.unwrap();
        }
        server.abort();
    })
    .await
    .expect("the scenario finishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_body_gives_the_unit_back() {
    tokio::time::timeout(HUNG, async {
        let e = edge(0).await;
        let url = format!("{}/download", e.base);
        let response = head(&e.client, &url).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(e.limits.downloads.usage(), 1);

        // Hang up with the body stalled: hyper sees the connection close,
        // drops the body, and the unit goes back. No gate is opened.
        drop(response);
        until(|| e.limits.downloads.usage() == 0).await;
        until(|| e.live.now.load(SeqCst) == 0).await;
        assert_eq!(e.limits.downloads.stats().completed, 1);
        e.server.abort();
    })
    .await
    .expect("the unit comes back once the client hangs up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_bypass_the_limits_and_refusals_map_to_statuses() {
    tokio::time::timeout(HUNG, async {
        const ROOM: usize = 2;
        let e = edge(ROOM).await;
        let work = format!("{}/work", e.base);
        let health = format!("{}/health", e.base);
        let ready = format!("{}/ready", e.base);

        // Fill /work: CAPACITY inside at the closed gate, ROOM waiting.
        let inside: Vec<_> = (0..CAPACITY + ROOM)
            .map(|_| {
                let (client, url) = (e.client.clone(), work.clone());
                tokio::spawn(async move { get(&client, &url).await })
            })
            .collect();
        until(|| e.limits.work.usage() == CAPACITY && e.limits.work.waiting() == ROOM).await;

        // Past the room: 429 at once. The probes answer meanwhile.
        let (status, retry_after, _) = get(&e.client, &work).await;
        assert_eq!(
            (status, retry_after.as_deref()),
            (StatusCode::TOO_MANY_REQUESTS, Some("1"))
        );
        assert_eq!(get(&e.client, &health).await.0, StatusCode::OK);
        assert_eq!(get(&e.client, &ready).await.0, StatusCode::OK);

        // Draining: the waiters and newcomers get 503, /ready turns 503,
        // /health stays 200, and the requests inside finish.
        e.limits.close();
        let (status, retry_after, _) = get(&e.client, &work).await;
        assert_eq!(
            (status, retry_after.as_deref()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("1"))
        );
        let (status, _, body) = get(&e.client, &ready).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
        );
        assert_eq!(get(&e.client, &health).await.0, StatusCode::OK);
        let (status, _, _) = get(&e.client, &format!("{}/download", e.base)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

        e.gate.add_permits(1);
        let mut statuses = Vec::new();
        for request in inside {
            statuses.push(request.await.unwrap().0);
        }
        statuses.sort();
        let mut expected = vec![StatusCode::OK; CAPACITY];
        expected.extend([StatusCode::SERVICE_UNAVAILABLE; ROOM]);
        assert_eq!(
            statuses, expected,
            "the inside finish, the waiters are refused"
        );
        let stats = e.limits.work.stats();
        assert_eq!(
            (stats.accepted as usize, stats.usage, stats.waiting),
            (CAPACITY, 0, 0)
        );
        e.server.abort();
    })
    .await
    .expect("the scenario finishes");
}
