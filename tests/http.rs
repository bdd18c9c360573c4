//! A real HTTP flood of the axum example on 127.0.0.1: the limit holds,
//! every refusal is a `503` with `Retry-After`, nothing is lost, and the
//! unlimited route answers while the limited one is full. With a waiting
//! room, a burst that fits in capacity + waiting room is all served, and
//! the next request is a `429`. Weighed by `Content-Length`, uploads hold
//! their bytes: `200` while they fit, `503` when too few are free, `413`
//! for one larger than the whole budget. Classified by `x-priority`, the
//! sheddable class is refused while the default class is still served,
//! and a value that names no class is the default class.

#[path = "../examples/axum_server.rs"]
mod axum_server;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use sidejob::Limiter;
use tokio::sync::Semaphore;

const CAPACITY: usize = 8;
const CLIENTS: usize = 32;
const PER_CLIENT: usize = 60;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// What the handler saw: how many are inside now, and the most ever.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// The limited route's handler: counts itself inside (and the most ever),
/// takes a ticket at `gate` and gives it back (closed gate, everyone waits;
/// open, many tickets, they pass), yields once more if `dwell`, and leaves.
async fn handler(inside: Arc<Inside>, gate: Arc<Semaphore>, dwell: bool) -> String {
    let now = inside.now.fetch_add(1, SeqCst) + 1;
    inside.peak.fetch_max(now, SeqCst);
    gate.acquire().await.unwrap().forget();
    gate.add_permits(1);
    if dwell {
        tokio::task::yield_now().await;
    }
    inside.now.fetch_sub(1, SeqCst);
    "done\n".to_string()
}

/// Serves `router` on a free port of 127.0.0.1: a client, the address,
/// and the server's task (to abort at the end).
async fn serve(
    router: axum::Router,
) -> (
    HttpClient,
    std::net::SocketAddr,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    (client, addr, server)
}

/// Until `n` requests are inside the handler (held at its gate).
#[cfg(feature = "http")]
async fn until_inside(inside: &Inside, n: usize) {
    while inside.now.load(SeqCst) < n {
        tokio::task::yield_now().await;
    }
}

async fn get(client: &HttpClient, url: &str) -> (StatusCode, Option<String>, String) {
    get_as(client, url, None).await
}

/// [`get`] with an `x-priority` header of `priority`, if any.
async fn get_as(
    client: &HttpClient,
    url: &str,
    priority: Option<&str>,
) -> (StatusCode, Option<String>, String) {
    let mut request = Request::get(url);
    if let Some(priority) = priority {
        request = request.header("x-priority", priority);
    }
    let request = request.body(Empty::new()).unwrap();
    let response = client.request(request).await.expect("loopback request");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_of_the_axum_example_on_loopback() {
    // The whole test is bounded: a hang fails it instead of stalling CI.
    tokio::time::timeout(Duration::from_secs(60), flood())
        .await
        .expect("the flood finishes within a minute");
}

async fn flood() {
    let limiter = Arc::new(Limiter::new(CAPACITY).unwrap());
    let inside = Arc::new(Inside::default());
    // Closed at first, so the first CAPACITY requests stay inside.
    let gate = Arc::new(Semaphore::new(0));
    let work = {
        let (inside, gate) = (Arc::clone(&inside), Arc::clone(&gate));
        move || handler(Arc::clone(&inside), Arc::clone(&gate), true)
    };
    let router = axum_server::app(Arc::clone(&limiter), work);
    let (client, addr, server) = serve(router).await;
    let work_url = format!("http://{addr}/work");
    let health_url = format!("http://{addr}/health");

    // Phase 1, deterministic: fill every unit with requests held at the
    // gate, then the next /work is refused and /health still answers.
    let held: Vec<_> = (0..CAPACITY)
        .map(|_| {
            let (client, url) = (client.clone(), work_url.clone());
            tokio::spawn(async move { get(&client, &url).await })
        })
        .collect();
    while inside.now.load(SeqCst) < CAPACITY {
        tokio::task::yield_now().await;
    }
    assert_eq!(limiter.usage(), CAPACITY);
    let (status, retry_after, _) = get(&client, &work_url).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("1"));
    let (status, _, body) = get(&client, &health_url).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the unlimited route answers while full"
    );
    assert_eq!(body, format!("ok usage={CAPACITY} capacity={CAPACITY}\n"));

    // Phase 2: open the gate and flood from many clients, probing /health
    // throughout.
    gate.add_permits(1);
    for h in held {
        let (status, _, body) = h.await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "done\n"));
    }
    let flood_done = Arc::new(AtomicUsize::new(0));
    let prober = {
        let (client, url, done) = (client.clone(), health_url.clone(), Arc::clone(&flood_done));
        tokio::spawn(async move {
            let mut probes = 0;
            while done.load(SeqCst) == 0 || probes == 0 {
                let (status, _, body) = get(&client, &url).await;
                assert_eq!(status, StatusCode::OK);
                assert!(body.starts_with("ok usage="), "{body}");
                probes += 1;
            }
            probes
        })
    };
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (client, url) = (client.clone(), work_url.clone());
            tokio::spawn(async move {
                let (mut ok, mut refused) = (0usize, 0usize);
                for _ in 0..PER_CLIENT {
                    match get(&client, &url).await {
                        (StatusCode::OK, _, body) => {
                            assert_eq!(body, "done\n");
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
    for c in clients {
        let (o, r) = c.await.unwrap();
        ok += o;
        refused += r;
    }
    flood_done.store(1, SeqCst);
    let probes = prober.await.unwrap();

    let sent = CAPACITY + 1 + CLIENTS * PER_CLIENT;
    assert_eq!(ok + refused, sent, "every request answered 200 or 503");
    assert!(
        inside.peak.load(SeqCst) <= CAPACITY,
        "peak inside {} > capacity",
        inside.peak.load(SeqCst)
    );
    assert_eq!(inside.peak.load(SeqCst), CAPACITY); // phase 1 filled it
    let stats = limiter.stats();
    assert_eq!(
        stats.accepted as usize, ok,
        "server and client agree on admissions"
    );
    assert_eq!(stats.rejected as usize, refused, "and on refusals");
    assert_eq!(stats.usage, 0);
    assert!(stats.peak_usage <= CAPACITY);
    assert!(probes >= 1);
    eprintln!("sent {sent}: {ok} ok, {refused} refused (503); {probes} health probes all 200");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_within_the_waiting_room_is_all_served_then_429() {
    tokio::time::timeout(Duration::from_secs(60), burst())
        .await
        .expect("the burst finishes within a minute");
}

async fn burst() {
    const WAITERS: usize = 8;
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(CAPACITY)
            .max_waiters(WAITERS)
            .max_wait(Duration::from_secs(3600))
            .build()
            .unwrap(),
    );
    let inside = Arc::new(Inside::default());
    // Closed until the burst is in: the first CAPACITY stay inside, the
    // next WAITERS stay queued.
    let gate = Arc::new(Semaphore::new(0));
    let work = {
        let (inside, gate) = (Arc::clone(&inside), Arc::clone(&gate));
        move || handler(Arc::clone(&inside), Arc::clone(&gate), false)
    };
    let router = axum_server::queued_app(Arc::clone(&limiter), work);
    let (client, addr, server) = serve(router).await;
    let work_url = format!("http://{addr}/work");

    // The burst: capacity + max_waiters requests at once.
    let burst: Vec<_> = (0..CAPACITY + WAITERS)
        .map(|_| {
            let (client, url) = (client.clone(), work_url.clone());
            tokio::spawn(async move { get(&client, &url).await })
        })
        .collect();
    // Inside the handlers, not only admitted: a request admitted but not
    // yet in its handler when the gate opens let the peak end at
    // CAPACITY - 1 (seen once in six runs).
    while inside.now.load(SeqCst) < CAPACITY || limiter.waiting() < WAITERS {
        tokio::task::yield_now().await;
    }
    // Past the waiting room: 429 at once, while the gate is still closed.
    let (status, retry_after, body) = get(&client, &work_url).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(body, "queue full, retry later\n");
    let (status, _, body) = get(&client, &format!("http://{addr}/health")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        format!("ok usage={CAPACITY} capacity={CAPACITY} waiting={WAITERS}\n")
    );

    // Open the gate: every request of the burst is served, none refused.
    gate.add_permits(1);
    for request in burst {
        let (status, _, body) = request.await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "done\n"));
    }
    assert_eq!(inside.peak.load(SeqCst), CAPACITY);
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.accepted,
            stats.waited,
            stats.rejected,
            stats.timed_out
        ),
        ((CAPACITY + WAITERS) as u64, WAITERS as u64, 1, 0)
    );
    assert_eq!(
        (stats.usage, stats.waiting, stats.peak_waiting),
        (0, 0, WAITERS)
    );
    server.abort();
}

// ---- Uploads weighed by `Content-Length` (`LimitLayer::weigh`) ----

/// The byte budget of the upload route: the limiter's capacity.
const BUDGET: usize = 1000;

type UploadClient = Client<HttpConnector, http_body_util::Full<Bytes>>;

/// The request's `Content-Length`, or 0 (which the layer counts as 1).
fn content_length(request: &axum::extract::Request) -> usize {
    request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

async fn post(
    client: &UploadClient,
    url: &str,
    bytes: usize,
) -> (StatusCode, Option<String>, String) {
    let request = Request::post(url)
        .header(header::CONTENT_LENGTH, bytes)
        .body(http_body_util::Full::new(Bytes::from(vec![b'x'; bytes])))
        .unwrap();
    let response = client.request(request).await.expect("loopback request");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_weighed_by_content_length_answer_200_503_and_413() {
    tokio::time::timeout(Duration::from_secs(60), uploads())
        .await
        .expect("the uploads finish within a minute");
}

async fn uploads() {
    use axum::routing::post as route_post;
    use sidejob::tower::{HttpRefusal, LimitLayer};

    let limiter = Arc::new(Limiter::new(BUDGET).unwrap());
    // Each upload that reaches its handler says so with its size, then
    // waits at the gate (closed until the test opens it).
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let gate = Arc::clone(&gate);
        move |body: String| {
            let (entered_tx, gate) = (entered_tx.clone(), Arc::clone(&gate));
            async move {
                entered_tx.send(body.len()).unwrap();
                gate.acquire().await.unwrap().forget();
                gate.add_permits(1);
                format!("stored {}\n", body.len())
            }
        }
    };
    let layer = LimitLayer::new(Arc::clone(&limiter))
        .refuse_with(HttpRefusal::new())
        .weigh(content_length);
    let router = axum::Router::new().route("/upload", route_post(handler).layer(layer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let client: UploadClient = Client::builder(TokioExecutor::new()).build_http();
    let url = format!("http://{addr}/upload");

    // 600 bytes, held in flight at the gate: 600 units taken.
    let first = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { post(&client, &url, 600).await })
    };
    assert_eq!(entered.recv().await, Some(600));
    assert_eq!(limiter.usage(), 600);

    // 500 more do not fit in the 400 left: 503, retry later.
    let (status, retry_after, _) = post(&client, &url, 500).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("1"));

    // 1500 never fit in 1000: 413, and no Retry-After.
    let (status, retry_after, _) = post(&client, &url, 1500).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(retry_after, None);

    // 400 fit exactly: admitted beside the first, held at the gate too.
    let second = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { post(&client, &url, 400).await })
    };
    assert_eq!(entered.recv().await, Some(400));
    assert_eq!(limiter.usage(), BUDGET);

    // Open the gate: both are stored, every unit goes back.
    gate.add_permits(1);
    let (status, _, body) = first.await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "stored 600\n"));
    let (status, _, body) = second.await.unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::OK, "stored 400\n"));
    let stats = limiter.stats();
    assert_eq!((stats.usage, stats.peak_usage), (0, BUDGET));
    // Units counted in bytes; the 503 is a counted refusal, the 413 not.
    assert_eq!(
        (stats.accepted, stats.completed, stats.rejected),
        (BUDGET as u64, BUDGET as u64, 1)
    );
    assert!(
        entered.try_recv().is_err(),
        "no refused upload reached its handler"
    );
    server.abort();
}

// ---- Priority classes by header (`LimitLayer::classify_by_header`) ----

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_requests_are_refused_while_the_default_class_is_served() {
    tokio::time::timeout(Duration::from_secs(60), classes())
        .await
        .expect("the scenario finishes within a minute");
}

#[cfg(feature = "http")]
async fn classes() {
    use sidejob::tower::{HttpRefusal, LimitLayer};
    use sidejob::Class;

    // Capacity 10 on one shard (each class's line exact in total), the
    // default headroom: SheddablePlus may fill 9, Sheddable 8.
    let limiter = Arc::new(Limiter::builder().capacity(10).shards(1).build().unwrap());
    let inside = Arc::new(Inside::default());
    let gate = Arc::new(Semaphore::new(0));
    let work = {
        let (inside, gate) = (Arc::clone(&inside), Arc::clone(&gate));
        move || handler(Arc::clone(&inside), Arc::clone(&gate), false)
    };
    let layer = LimitLayer::new(Arc::clone(&limiter))
        .refuse_with(HttpRefusal::new())
        .classify_by_header("x-priority");
    let router = axum::Router::new().route("/work", axum::routing::get(work).layer(layer));
    let (client, addr, server) = serve(router).await;
    let url = format!("http://{addr}/work");
    let spawn_get = |priority: Option<&'static str>| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { get_as(&client, &url, priority).await })
    };

    // Eight requests of the default class (no header) held at the gate:
    // the sheddable class's whole share is in use.
    let mut held: Vec<_> = (0..8).map(|_| spawn_get(None)).collect();
    until_inside(&inside, 8).await;

    // A burst of prefetches and one request of the default class, at
    // once: every prefetch is refused, the default request is served.
    let prefetches: Vec<_> = (0..16).map(|_| spawn_get(Some("sheddable"))).collect();
    held.push(spawn_get(None));
    for prefetch in prefetches {
        let (status, retry_after, _) = prefetch.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after.as_deref(), Some("1"));
    }
    until_inside(&inside, 9).await;

    // Nine held: SheddablePlus's line too.
    let (status, _, _) = get_as(&client, &url, Some("Sheddable-Plus")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    // A value that names no class is the default class: admitted to the
    // last unit, where a sheddable class would have been refused.
    held.push(spawn_get(Some("urgent!!")));
    until_inside(&inside, 10).await;
    assert_eq!(limiter.usage(), 10);

    // Full: no value gets past the capacity, an unknown one no more than
    // the default class or the top class itself.
    for priority in [None, Some("urgent!!"), Some("critical_plus")] {
        let (status, retry_after, _) = get_as(&client, &url, priority).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{priority:?}");
        assert_eq!(retry_after.as_deref(), Some("1"));
    }

    // Open the gate: every admitted request is answered.
    gate.add_permits(1);
    for request in held {
        let (status, _, body) = request.await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "done\n"));
    }
    assert_eq!(inside.peak.load(SeqCst), 10);

    // The server's figures, by class: the unknown value counted with the
    // default class (accepted once, refused once), never above it.
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.usage), (10, 20, 0));
    let by_class: Vec<(Class, u64, u64)> = stats
        .classes
        .iter()
        .map(|c| (c.class, c.accepted, c.rejected))
        .collect();
    assert_eq!(
        by_class,
        [
            (Class::CriticalPlus, 0, 1),
            (Class::Critical, 10, 2),
            (Class::SheddablePlus, 0, 1),
            (Class::Sheddable, 0, 16),
        ]
    );
    server.abort();
}

// ---- Tenants by header (`LimitLayer::key_by`) ----

/// [`get`] with a header `name: value`.
async fn get_with(client: &HttpClient, url: &str, name: &str, value: &str) -> StatusCode {
    let request = Request::get(url)
        .header(name, value)
        .body(Empty::new())
        .unwrap();
    let response = client.request(request).await.expect("loopback request");
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_stops_at_the_fair_line_and_a_capped_one_gets_429() {
    tokio::time::timeout(Duration::from_secs(60), tenants())
        .await
        .expect("the scenario finishes within a minute");
}

#[cfg(feature = "http")]
async fn tenants() {
    use sidejob::tower::{HttpRefusal, LimitLayer};

    // Capacity 10 on one shard, the fair line at 9; tenant "capped" may
    // hold one unit.
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(10)
            .shards(1)
            .key_cap("capped", 1)
            .build()
            .unwrap(),
    );
    let inside = Arc::new(Inside::default());
    let gate = Arc::new(Semaphore::new(0));
    let work = {
        let (inside, gate) = (Arc::clone(&inside), Arc::clone(&gate));
        move || handler(Arc::clone(&inside), Arc::clone(&gate), false)
    };
    let layer = LimitLayer::new(Arc::clone(&limiter))
        .refuse_with(HttpRefusal::new())
        .key_by(|request: &axum::extract::Request| {
            request
                .headers()
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        });
    let router = axum::Router::new().route("/work", axum::routing::get(work).layer(layer));
    let (client, addr, server) = serve(router).await;
    let url = format!("http://{addr}/work");
    let spawn_get = |tenant: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { get_with(&client, &url, "x-tenant", tenant).await })
    };

    // The flood alone: its share is everything, 8 held at the gate.
    let mut held: Vec<_> = (0..8).map(|_| spawn_get("flood")).collect();
    until_inside(&inside, 8).await;
    // A light tenant: within its share (5 of 10), admitted.
    held.push(spawn_get("light"));
    until_inside(&inside, 9).await;
    // The flood is over its share, and a ninth unit would pass the line.
    assert_eq!(
        get_with(&client, &url, "x-tenant", "flood").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(limiter.key_usage("flood"), 8);
    // The capped tenant gets the last unit; a second request of it is
    // refused by its cap: 429.
    held.push(spawn_get("capped"));
    until_inside(&inside, 10).await;
    assert_eq!(
        get_with(&client, &url, "x-tenant", "capped").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(limiter.active_keys(), 3);

    gate.add_permits(1);
    for request in held {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    assert_eq!((limiter.usage(), limiter.active_keys()), (0, 0));
    // The cap's rule stays; no other tenant is kept.
    assert_eq!(limiter.tracked_keys(), 1);
    server.abort();
}
