//! The tower layer in-process: where the unit is taken, how long it is
//! held, and what a refusal looks like.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use sidejob::tower::{BoxError, LimitLayer};
use sidejob::{Error, Limiter};
use tokio::sync::oneshot;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

/// Polls a future once with a no-op waker.
fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(&noop_waker()))
}

/// An inner service that counts its calls and answers when told to.
fn gated() -> (
    impl Service<oneshot::Receiver<u32>, Response = u32, Error = Infallible, Future: Unpin + Send>
        + Clone,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let service = service_fn(move |rx: oneshot::Receiver<u32>| {
        counted.fetch_add(1, SeqCst);
        Box::pin(async move { Ok::<_, Infallible>(rx.await.unwrap_or(0)) })
    });
    (BoxCloneService::new(service), calls)
}

#[test]
fn poll_ready_reserves_nothing_so_idle_clones_starve_no_one() {
    let limiter = Arc::new(Limiter::new(2).unwrap());
    let (inner, _) = gated();
    let layer = LimitLayer::new(Arc::clone(&limiter));
    // Ten clones polled ready and never called: hyper's idle keep-alive
    // connections. tower's ConcurrencyLimit would hold ten permits here.
    let mut idle: Vec<_> = (0..10).map(|_| layer.layer(inner.clone())).collect();
    for service in &mut idle {
        assert!(matches!(
            poll_once(&mut std::future::poll_fn(|cx| service.poll_ready(cx))),
            Poll::Ready(Ok(()))
        ));
    }
    assert_eq!(limiter.usage(), 0);

    // A fresh clone still gets both units.
    let mut busy = layer.layer(inner);
    let (_tx1, rx1) = oneshot::channel();
    let (_tx2, rx2) = oneshot::channel();
    let _a = busy.call(rx1);
    let _b = busy.call(rx2);
    assert_eq!(limiter.usage(), 2);
}

#[test]
fn the_unit_is_held_until_the_response_future_completes() {
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let (inner, calls) = gated();
    let mut service = LimitLayer::new(Arc::clone(&limiter)).layer(inner);

    let (tx, rx) = oneshot::channel();
    let mut first = service.call(rx);
    assert_eq!(limiter.usage(), 1, "taken in call");
    assert!(poll_once(&mut first).is_pending());
    assert_eq!(limiter.usage(), 1, "held while the inner future runs");

    // Refused while held: ready at once, the inner service is not called.
    let (_tx, rx2) = oneshot::channel();
    let mut refused = service.call(rx2);
    match poll_once(&mut refused) {
        Poll::Ready(Err(e)) => {
            let e: BoxError = e;
            assert_eq!(e.downcast_ref::<Error>(), Some(&Error::Overload));
            assert_eq!(e.to_string(), "overloaded: every shard is at its limit");
        }
        other => panic!(
            "expected an immediate refusal, got {:?}",
            other.map(|r| r.map_err(|e| e.to_string()))
        ),
    }
    assert_eq!(calls.load(SeqCst), 1);

    tx.send(7).unwrap();
    assert!(matches!(poll_once(&mut first), Poll::Ready(Ok(7))));
    assert_eq!(limiter.usage(), 0, "given back when the response is ready");
    drop(first);
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.completed), (1, 1, 1));
}

#[test]
fn a_dropped_response_future_gives_the_unit_back() {
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let (inner, _) = gated();
    let mut service = LimitLayer::new(Arc::clone(&limiter)).layer(inner);
    let (_tx, rx) = oneshot::channel();
    let cancelled = service.call(rx);
    assert_eq!(limiter.usage(), 1);
    drop(cancelled); // a client that hung up
    assert_eq!(limiter.usage(), 0);
    let (tx, rx) = oneshot::channel();
    let mut next = service.call(rx);
    tx.send(1).unwrap();
    assert!(matches!(poll_once(&mut next), Poll::Ready(Ok(1))));
}

#[test]
fn on_overload_answers_with_a_response_and_keeps_the_inner_error_type() {
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let (inner, calls) = gated();
    let inner = inner.map_response(|n| n as i64);
    let mut service = LimitLayer::new(Arc::clone(&limiter))
        .on_overload(|e: Error| if e.is_overload() { -503 } else { -500 })
        .layer(inner);
    let (tx, rx) = oneshot::channel();
    let mut held = service.call(rx);
    let (_tx2, rx2) = oneshot::channel();
    let mut refused = service.call(rx2);
    // The error type is still the inner one: Infallible.
    let answer: Poll<Result<i64, Infallible>> = poll_once(&mut refused);
    assert!(matches!(answer, Poll::Ready(Ok(-503))));
    assert_eq!(calls.load(SeqCst), 1);
    tx.send(5).unwrap();
    assert!(matches!(poll_once(&mut held), Poll::Ready(Ok(5))));
}

#[test]
fn inner_errors_pass_through_boxed() {
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let mut service = LimitLayer::new(Arc::clone(&limiter)).layer(service_fn(|_: ()| async {
        Err::<(), _>(std::io::Error::other("inner failed"))
    }));
    let mut call = Box::pin(service.call(()));
    match poll_once(&mut call) {
        Poll::Ready(Err(e)) => {
            assert!(e.downcast_ref::<Error>().is_none());
            assert_eq!(e.to_string(), "inner failed");
        }
        _ => panic!("expected the inner error"),
    }
    assert_eq!(limiter.usage(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_never_exceed_capacity_and_all_are_counted() {
    const CAPACITY: usize = 4;
    let limiter = Arc::new(Limiter::new(CAPACITY).unwrap());
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let service = LimitLayer::new(Arc::clone(&limiter)).layer(service_fn({
        let (inside, peak) = (Arc::clone(&inside), Arc::clone(&peak));
        move |_: ()| {
            let (inside, peak) = (Arc::clone(&inside), Arc::clone(&peak));
            async move {
                let now = inside.fetch_add(1, SeqCst) + 1;
                peak.fetch_max(now, SeqCst);
                tokio::task::yield_now().await;
                inside.fetch_sub(1, SeqCst);
                Ok::<_, Infallible>(())
            }
        }
    }));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let mut service = service.clone();
            tokio::spawn(async move {
                let (mut ok, mut refused) = (0u64, 0u64);
                for _ in 0..500 {
                    match service.ready().await.unwrap().call(()).await {
                        Ok(()) => ok += 1,
                        Err(e) => {
                            assert_eq!(e.downcast_ref::<Error>(), Some(&Error::Overload));
                            refused += 1;
                        }
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        let (o, r) = t.await.unwrap();
        ok += o;
        refused += r;
    }
    assert_eq!(ok + refused, 16 * 500);
    assert!(peak.load(SeqCst) <= CAPACITY);
    let stats = limiter.stats();
    assert_eq!(
        (stats.accepted, stats.rejected, stats.usage),
        (ok, refused, 0)
    );
}

/// A waker that does nothing (`Waker::noop` is newer than our MSRV).
fn noop_waker() -> Waker {
    struct Noop;
    impl std::task::Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    Waker::from(Arc::new(Noop))
}
