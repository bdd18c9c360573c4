//! The tower layer in-process: where the unit is taken, how long it is
//! held, and what a refusal looks like.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};

use sidejob::tower::{BoxError, LimitLayer};
use sidejob::{Class, Error, Limiter};
use tokio::sync::oneshot;
use tower::limit::ConcurrencyLimit;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};

mod common;
use common::poll_once;

/// An inner service that counts its calls and answers when told to.
fn gated() -> (
    BoxCloneService<oneshot::Receiver<u32>, u32, Infallible>,
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

/// The inner service of the concurrent tests: counts the requests inside
/// it (and the most at once), yields once, answers.
async fn crowd(inside: Arc<AtomicUsize>, peak: Arc<AtomicUsize>) -> Result<(), Infallible> {
    let now = inside.fetch_add(1, SeqCst) + 1;
    peak.fetch_max(now, SeqCst);
    tokio::task::yield_now().await;
    inside.fetch_sub(1, SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_never_exceed_capacity_and_all_are_counted() {
    const CAPACITY: usize = 4;
    let limiter = Arc::new(Limiter::new(CAPACITY).unwrap());
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let service = LimitLayer::new(Arc::clone(&limiter)).layer(service_fn({
        let (inside, peak) = (Arc::clone(&inside), Arc::clone(&peak));
        move |_: ()| crowd(Arc::clone(&inside), Arc::clone(&peak))
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

// ---- Waiting mode (`LimitLayer::waiting`) ----

/// A request of the recording service: its id, and when to answer.
type Job = (u32, oneshot::Receiver<u32>);

/// The ids the recording service was called with, in order.
type Log = std::sync::Mutex<Vec<u32>>;

/// An inner service that records the order it is called in (a call
/// happens at admission) and answers each job when its sender says.
fn recording() -> (BoxCloneService<Job, u32, Infallible>, Arc<Log>) {
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&order);
    let service = service_fn(move |(id, rx): Job| {
        seen.lock().unwrap().push(id);
        Box::pin(async move { Ok::<_, Infallible>(rx.await.unwrap_or(0)) })
    });
    (BoxCloneService::new(service), order)
}

/// A job of `id` for a [`recording`] service, and the sender that ends
/// it with its answer.
fn job(id: u32) -> (oneshot::Sender<u32>, Job) {
    let (tx, rx) = oneshot::channel();
    (tx, (id, rx))
}

/// A limiter with a waiting room.
fn with_room(capacity: usize, waiters: usize, max_wait: std::time::Duration) -> Arc<Limiter> {
    Arc::new(
        Limiter::builder()
            .capacity(capacity)
            .max_waiters(waiters)
            .max_wait(max_wait)
            .build()
            .unwrap(),
    )
}

const LONG: std::time::Duration = std::time::Duration::from_secs(3600);

#[test]
fn waiting_requests_are_served_in_fifo_order_as_units_free() {
    let limiter = with_room(2, 3, LONG);
    let (inner, order) = recording();
    let mut service = LimitLayer::waiting(Arc::clone(&limiter)).layer(inner);

    // Two admitted in `call`, three queued on their first poll.
    let (tx_a, a) = job(1);
    let (tx_b, b) = job(2);
    let mut a = service.call(a);
    let mut b = service.call(b);
    let mut waiting: Vec<_> = (3..=5)
        .map(|id| {
            let (tx, j) = job(id);
            let mut response = service.call(j);
            assert!(poll_once(&mut response).is_pending());
            (tx, response)
        })
        .collect();
    assert_eq!((limiter.usage(), limiter.waiting()), (2, 3));
    assert_eq!(*order.lock().unwrap(), [1, 2], "waiters are not called yet");

    // Polled newest first: polling order does not decide who goes next.
    for (_, response) in waiting.iter_mut().rev() {
        assert!(poll_once(response).is_pending());
    }

    // Each finished request hands its unit to the oldest waiter.
    tx_a.send(10).unwrap();
    assert!(matches!(poll_once(&mut a), Poll::Ready(Ok(10))));
    for (_, response) in waiting.iter_mut().rev() {
        let _ = poll_once(response);
    }
    assert_eq!(*order.lock().unwrap(), [1, 2, 3]);
    tx_b.send(20).unwrap();
    assert!(matches!(poll_once(&mut b), Poll::Ready(Ok(20))));
    for (_, response) in waiting.iter_mut().rev() {
        let _ = poll_once(response);
    }
    assert_eq!(*order.lock().unwrap(), [1, 2, 3, 4]);
    assert_eq!((limiter.usage(), limiter.waiting()), (2, 1));

    // Finish the waiters in order; the last one gets the first's unit.
    let mut answers = Vec::new();
    for (i, (tx, mut response)) in waiting.into_iter().enumerate() {
        tx.send(100 + i as u32).unwrap();
        match poll_once(&mut response) {
            Poll::Ready(Ok(n)) => answers.push(n),
            other => panic!(
                "waiter {i}: {:?}",
                other.map(|r| r.map_err(|e| e.to_string()))
            ),
        }
        drop(response);
    }
    assert_eq!(answers, [100, 101, 102]);
    assert_eq!(*order.lock().unwrap(), [1, 2, 3, 4, 5]);
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.accepted,
            stats.completed,
            stats.waited,
            stats.rejected
        ),
        (5, 5, 3, 0)
    );
    assert_eq!((stats.usage, stats.waiting, stats.timed_out), (0, 0, 0));
}

#[test]
fn the_request_past_the_waiting_room_is_refused_at_once() {
    const CAPACITY: usize = 2;
    const WAITERS: usize = 3;
    let limiter = with_room(CAPACITY, WAITERS, LONG);
    let (inner, order) = recording();
    let mut service = LimitLayer::waiting(Arc::clone(&limiter))
        .on_overload(|e: Error| match e {
            Error::Overload => 429,
            Error::Timeout => 503,
            _ => 500,
        })
        .layer(inner);
    let mut senders = Vec::new();
    let mut inside = Vec::new();
    for id in 0..(CAPACITY + WAITERS) as u32 {
        let (tx, rx) = oneshot::channel();
        senders.push(tx);
        let mut response = service.call((id, rx));
        assert!(poll_once(&mut response).is_pending());
        inside.push(response);
    }
    assert_eq!((limiter.usage(), limiter.waiting()), (CAPACITY, WAITERS));

    // The (capacity + max_waiters + 1)-th: answered on its first poll,
    // without calling the inner service.
    let (_tx, rx) = oneshot::channel();
    let mut refused = service.call((99, rx));
    assert!(matches!(poll_once(&mut refused), Poll::Ready(Ok(429))));
    assert_eq!(order.lock().unwrap().len(), CAPACITY);
    let stats = limiter.stats();
    assert_eq!((stats.rejected, stats.waiting), (1, WAITERS));

    // Everyone inside is still served.
    for (tx, mut response) in senders.into_iter().zip(inside) {
        tx.send(200).unwrap();
        assert!(matches!(poll_once(&mut response), Poll::Ready(Ok(200))));
    }
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.waited, stats.usage), (5, 3, 0));
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiting_request_times_out_with_the_configured_response() {
    // max_wait 20 ms: the waiter's own deadline ends its wait (the unit is
    // held throughout, so nothing else can). Nothing here is timed.
    let limiter = with_room(1, 4, std::time::Duration::from_millis(20));
    let (inner, order) = recording();
    let mut service = LimitLayer::waiting(Arc::clone(&limiter))
        .on_overload(|e: Error| match e {
            Error::Overload => 429,
            Error::Timeout => 503,
            _ => 500,
        })
        .layer(inner);
    let (tx, rx) = oneshot::channel();
    let mut held = service.call((1, rx));
    let (_tx2, rx2) = oneshot::channel();
    let answer = service.ready().await.unwrap().call((2, rx2)).await;
    assert_eq!(answer.unwrap(), 503);
    assert_eq!(
        *order.lock().unwrap(),
        [1],
        "the inner service never saw it"
    );
    let stats = limiter.stats();
    assert_eq!((stats.timed_out, stats.waiting, stats.usage), (1, 0, 1));
    assert_eq!((stats.rejected, stats.waited), (0, 0));

    // A refusal by default is the error itself, boxed.
    let mut plain = LimitLayer::waiting(Arc::clone(&limiter)).layer(recording().0);
    let (_tx3, rx3) = oneshot::channel();
    let err = plain
        .ready()
        .await
        .unwrap()
        .call((3, rx3))
        .await
        .unwrap_err();
    assert_eq!(err.downcast_ref::<Error>(), Some(&Error::Timeout));

    tx.send(1).unwrap();
    assert!(matches!(poll_once(&mut held), Poll::Ready(Ok(1))));
    assert_eq!(limiter.stats().timed_out, 2);
    assert_eq!(limiter.usage(), 0);
}

#[test]
fn a_dropped_waiting_response_future_leaves_the_queue_and_loses_no_unit() {
    let limiter = with_room(1, 2, LONG);
    let (inner, order) = recording();
    let mut service = LimitLayer::waiting(Arc::clone(&limiter)).layer(inner);
    let (tx, rx) = oneshot::channel();
    let mut held = service.call((1, rx));

    // Dropped while queued: leaves the queue at once.
    let (_tx2, rx2) = oneshot::channel();
    let mut gone = service.call((2, rx2));
    assert!(poll_once(&mut gone).is_pending());
    assert_eq!(limiter.waiting(), 1);
    drop(gone);
    assert_eq!(limiter.waiting(), 0);

    // Dropped after a unit was handed to it, before it was polled again:
    // the unit goes back, nobody called.
    let (_tx3, rx3) = oneshot::channel();
    let mut handed = service.call((3, rx3));
    assert!(poll_once(&mut handed).is_pending());
    tx.send(1).unwrap();
    assert!(matches!(poll_once(&mut held), Poll::Ready(Ok(1))));
    assert_eq!((limiter.usage(), limiter.waiting()), (1, 0), "handed over");
    drop(handed);
    assert_eq!((limiter.usage(), limiter.waiting()), (0, 0));
    assert_eq!(*order.lock().unwrap(), [1]);

    // The unit is there for the next request, at once.
    let (tx4, rx4) = oneshot::channel();
    let mut next = service.call((4, rx4));
    assert_eq!(limiter.usage(), 1, "admitted in call");
    tx4.send(4).unwrap();
    assert!(matches!(poll_once(&mut next), Poll::Ready(Ok(4))));
    assert_eq!(limiter.available(), 1);
    let stats = limiter.stats();
    assert_eq!((stats.usage, stats.waiting, stats.timed_out), (0, 0, 0));
}

#[test]
fn a_waiting_layer_over_a_limiter_without_a_room_fails_fast_and_counts_once() {
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let (inner, _) = recording();
    let mut service = LimitLayer::waiting(Arc::clone(&limiter)).layer(inner);
    let (_tx, rx) = oneshot::channel();
    let _held = service.call((1, rx));
    let (_tx2, rx2) = oneshot::channel();
    let mut refused = service.call((2, rx2));
    match poll_once(&mut refused) {
        Poll::Ready(Err(e)) => assert_eq!(e.downcast_ref::<Error>(), Some(&Error::Overload)),
        _ => panic!("expected Overload on the first poll"),
    }
    assert_eq!(limiter.stats().rejected, 1);
}

#[test]
fn waiting_futures_are_send_and_static() {
    fn send_static<T: Send + 'static>(_: &T) {}
    let limiter = with_room(1, 1, LONG);
    let (inner, _) = recording();
    let mut service = LimitLayer::waiting(limiter).layer(inner);
    let (_tx, rx) = oneshot::channel();
    let response = service.call((1, rx));
    send_static(&response);
    send_static(&service);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_room_for_everyone_nothing_is_refused_and_the_bound_holds() {
    const CAPACITY: usize = 4;
    const TASKS: usize = 16;
    // Room for every task: each has at most one request out.
    let limiter = with_room(CAPACITY, TASKS, LONG);
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let service = LimitLayer::waiting(Arc::clone(&limiter)).layer(service_fn({
        let (inside, peak) = (Arc::clone(&inside), Arc::clone(&peak));
        move |_: ()| crowd(Arc::clone(&inside), Arc::clone(&peak))
    }));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let mut service = service.clone();
            tokio::spawn(async move {
                for _ in 0..300 {
                    service.ready().await.unwrap().call(()).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(peak.load(SeqCst) <= CAPACITY);
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.accepted,
            stats.rejected,
            stats.timed_out,
            stats.usage,
            stats.waiting
        ),
        ((TASKS * 300) as u64, 0, 0, 0, 0)
    );
    assert!(stats.peak_waiting <= TASKS - CAPACITY);
}

// ---- Inner reservations (hardening round 2, item 10) ----
//
// tower's contract: an inner service polled ready has reserved (tower's
// `ConcurrencyLimit` holds a permit, `Buffer` a slot) until it is called
// or dropped. A request the layer does not send to the inner service must
// not keep that reservation, or another clone's `poll_ready` (another
// keep-alive connection) stays pending while the refused or waiting one
// lives. Each test fails on the code before the fix.

/// An inner service that reserves in `poll_ready`: tower's
/// `ConcurrencyLimit` with one permit, over a service answering at once.
type Reserving = ConcurrencyLimit<
    tower::util::ServiceFn<fn(u32) -> std::future::Ready<Result<u32, Infallible>>>,
>;

/// A [`Reserving`] service.
fn reserving() -> Reserving {
    ConcurrencyLimit::new(
        service_fn((|n| std::future::ready(Ok(n))) as fn(u32) -> _),
        1,
    )
}

/// Polls `service` ready once, with a no-op waker.
fn poll_ready_once<S: Service<Req>, Req>(service: &mut S) -> Poll<Result<(), S::Error>> {
    poll_once(&mut std::future::poll_fn(|cx| service.poll_ready(cx)))
}

/// Clone `a` of `layer`'s service is polled ready (reserving the inner
/// service's only permit) and its request refused in `call`: clone `b`
/// must get the permit while `a` lives, and `a` must reserve again later.
fn a_refused_clone_frees_the_inner_permit<L>(layer: L, limiter: &Arc<Limiter>)
where
    L: Layer<Reserving>,
    L::Service: Service<u32, Response = u32, Error = BoxError> + Clone,
    <L::Service as Service<u32>>::Future: Unpin,
{
    let service = layer.layer(reserving());
    let (mut a, mut b) = (service.clone(), service);
    // Every unit of ours out; the inner's permit free.
    let held = limiter.try_acquire().unwrap();
    assert!(matches!(poll_ready_once(&mut a), Poll::Ready(Ok(()))));
    match poll_once(&mut a.call(1)) {
        Poll::Ready(Err(e)) => assert_eq!(e.downcast_ref::<Error>(), Some(&Error::Overload)),
        _ => panic!("expected an immediate refusal"),
    }
    assert!(
        matches!(poll_ready_once(&mut b), Poll::Ready(Ok(()))),
        "the refused clone still holds the inner service's permit"
    );
    drop(held);
    assert!(matches!(poll_once(&mut b.call(2)), Poll::Ready(Ok(2))));
    // The refused clone reserves again on its next `poll_ready`.
    assert!(matches!(poll_ready_once(&mut a), Poll::Ready(Ok(()))));
    assert!(matches!(poll_once(&mut a.call(3)), Poll::Ready(Ok(3))));
    // Accepted: the held unit, b's request, a's second.
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.usage), (3, 1, 0));
}

#[test]
fn a_refused_request_gives_back_the_inner_reservation() {
    let limiter = Arc::new(Limiter::new(1).unwrap());
    a_refused_clone_frees_the_inner_permit(LimitLayer::new(Arc::clone(&limiter)), &limiter);
}

#[test]
fn a_request_refused_in_call_by_a_waiting_layer_gives_back_the_inner_reservation() {
    // No waiting room: refused in `call`, as in the fail-fast mode.
    let limiter = Arc::new(Limiter::new(1).unwrap());
    a_refused_clone_frees_the_inner_permit(LimitLayer::waiting(Arc::clone(&limiter)), &limiter);
}

#[test]
fn a_waiting_request_holds_no_inner_reservation() {
    let limiter = with_room(1, 1, LONG);
    let service = LimitLayer::waiting(Arc::clone(&limiter)).layer(reserving());
    let (mut a, mut b) = (service.clone(), service);
    let held = limiter.try_acquire_owned().unwrap();

    assert!(matches!(poll_ready_once(&mut a), Poll::Ready(Ok(()))));
    let mut waiting = a.call(1);
    assert!(poll_once(&mut waiting).is_pending());
    assert_eq!(limiter.waiting(), 1);
    // Another connection gets the inner's permit while a's request waits.
    assert!(
        matches!(poll_ready_once(&mut b), Poll::Ready(Ok(()))),
        "the waiting request (or its clone) holds the inner service's permit"
    );

    // The unit is handed to the waiter, which then polls its own clone of
    // the inner service ready: pending while b holds the permit, with the
    // unit held (the request is admitted, its handler not yet free).
    drop(held);
    assert!(poll_once(&mut waiting).is_pending());
    assert_eq!((limiter.usage(), limiter.waiting()), (1, 0));
    drop(b); // gives the permit back: the waiter's inner is ready
    assert!(matches!(poll_once(&mut waiting), Poll::Ready(Ok(1))));
    drop(waiting);
    let stats = limiter.stats();
    assert_eq!(
        (stats.accepted, stats.waited, stats.usage, stats.rejected),
        (2, 1, 0, 0),
        "the held unit and the waiter"
    );

    // a itself holds nothing either: a fresh clone reserves at once.
    let mut c = a.clone();
    assert!(matches!(poll_ready_once(&mut c), Poll::Ready(Ok(()))));
}

#[test]
fn a_handed_over_request_dropped_while_its_inner_is_not_ready_gives_the_unit_back() {
    let limiter = with_room(1, 1, LONG);
    let service = LimitLayer::waiting(Arc::clone(&limiter)).layer(reserving());
    let (mut a, mut b) = (service.clone(), service);
    let held = limiter.try_acquire_owned().unwrap();
    assert!(matches!(poll_ready_once(&mut a), Poll::Ready(Ok(()))));
    let mut waiting = a.call(1);
    assert!(poll_once(&mut waiting).is_pending());
    assert!(matches!(poll_ready_once(&mut b), Poll::Ready(Ok(()))));
    drop(held);
    assert!(poll_once(&mut waiting).is_pending(), "the inner is b's");
    assert_eq!(limiter.usage(), 1);
    drop(waiting); // a client that hung up
    assert_eq!((limiter.usage(), limiter.waiting()), (0, 0));
    // b still holds the inner's permit and is admitted at once.
    assert!(matches!(poll_once(&mut b.call(2)), Poll::Ready(Ok(2))));
    // The held unit, the dropped waiter's, b's.
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.completed, stats.usage), (3, 3, 0));
}

/// An inner service whose `poll_ready` fails once `broken` is set.
#[derive(Clone)]
struct Breakable {
    broken: Arc<std::sync::atomic::AtomicBool>,
}

impl Service<u32> for Breakable {
    type Response = u32;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u32, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(if self.broken.load(SeqCst) {
            Err(std::io::Error::other("inner broken"))
        } else {
            Ok(())
        })
    }

    fn call(&mut self, n: u32) -> Self::Future {
        std::future::ready(Ok(n))
    }
}

#[test]
fn a_handed_over_request_whose_inner_fails_to_get_ready_answers_its_error_and_gives_the_unit_back()
{
    let limiter = with_room(1, 1, LONG);
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut service = LimitLayer::waiting(Arc::clone(&limiter)).layer(Breakable {
        broken: Arc::clone(&broken),
    });
    let held = limiter.try_acquire_owned().unwrap();
    assert!(matches!(poll_ready_once(&mut service), Poll::Ready(Ok(()))));
    let mut waiting = service.call(1);
    assert!(poll_once(&mut waiting).is_pending());
    broken.store(true, SeqCst);
    drop(held);
    match poll_once(&mut waiting) {
        Poll::Ready(Err(e)) => {
            assert!(e.downcast_ref::<Error>().is_none());
            assert_eq!(e.to_string(), "inner broken");
        }
        _ => panic!("expected the inner service's error"),
    }
    assert_eq!((limiter.usage(), limiter.waiting()), (0, 0));
    let stats = limiter.stats();
    // The held unit and the waiter's.
    assert_eq!((stats.accepted, stats.waited, stats.completed), (2, 1, 2));
}

#[test]
fn a_panicking_inner_call_gives_the_unit_back() {
    // The unit is anchored before the inner service is called, so an
    // unwind out of `call` still releases it (in both modes).
    let limiter = with_room(1, 1, LONG);
    let inner = service_fn(|_: ()| -> std::future::Ready<Result<(), Infallible>> {
        panic!("the inner service panicked in call")
    });
    let mut fail_fast = LimitLayer::new(Arc::clone(&limiter)).layer(inner);
    let mut waiting = LimitLayer::waiting(Arc::clone(&limiter)).layer(inner);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fail_fast.call(())));
    assert!(unwound.is_err());
    assert_eq!(limiter.usage(), 0, "released by the unwind");
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waiting.call(())));
    assert!(unwound.is_err());
    assert_eq!(limiter.usage(), 0);
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.completed, stats.panicked), (2, 0, 2));
}

// ---- Weighed requests (`LimitLayer::weigh`) ----

/// A weighed request: its units, and when to answer.
type Weighty = (usize, oneshot::Receiver<u32>);

/// An inner service that counts its calls and answers each weighed
/// request when its sender says.
fn gated_weighty() -> (BoxCloneService<Weighty, u32, Infallible>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let service = service_fn(move |(_, rx): Weighty| {
        counted.fetch_add(1, SeqCst);
        Box::pin(async move { Ok::<_, Infallible>(rx.await.unwrap_or(0)) })
    });
    (BoxCloneService::new(service), calls)
}

/// A weighed request of `units`, and the sender that answers it.
fn weighty(units: usize) -> (oneshot::Sender<u32>, Weighty) {
    let (tx, rx) = oneshot::channel();
    (tx, (units, rx))
}

/// The weigher of [`Weighty`] requests: their first field.
fn by_units(request: &Weighty) -> usize {
    request.0
}

fn refusal_of<T: std::fmt::Debug>(answer: Poll<Result<T, BoxError>>) -> Error {
    match answer {
        Poll::Ready(Err(e)) => *e.downcast_ref::<Error>().expect("a sidejob::Error"),
        other => panic!("expected an immediate refusal, got {other:?}"),
    }
}

#[test]
fn a_weighed_request_holds_its_units_while_the_inner_service_runs() {
    let limiter = Arc::new(Limiter::builder().capacity(10).shards(2).build().unwrap());
    let (inner, calls) = gated_weighty();
    let mut service = LimitLayer::new(Arc::clone(&limiter))
        .weigh(by_units)
        .layer(inner);

    let (tx_a, a) = weighty(6);
    let mut a = service.call(a);
    assert_eq!(limiter.usage(), 6, "taken in call, all six");
    assert!(poll_once(&mut a).is_pending());
    assert_eq!(limiter.usage(), 6, "held while the inner future runs");

    // The last four (six were wider than either shard's 5: taken from both).
    let (tx_b, b) = weighty(4);
    let b = service.call(b);
    assert_eq!(limiter.usage(), 10);

    // Full: one more unit is refused with Overload, the inner service not called.
    let (_tx, c) = weighty(1);
    assert_eq!(refusal_of(poll_once(&mut service.call(c))), Error::Overload);
    assert_eq!(calls.load(SeqCst), 2);

    tx_a.send(1).unwrap();
    assert!(matches!(poll_once(&mut a), Poll::Ready(Ok(1))));
    assert_eq!(
        limiter.usage(),
        4,
        "all six back when the response is ready"
    );
    drop(b); // a cancelled request gives its four back too
    drop(tx_b);
    assert_eq!(limiter.usage(), 0);
    // The counters count units (a request of six is six), refusals requests.
    let stats = limiter.stats();
    assert_eq!(
        (stats.accepted, stats.rejected, stats.completed),
        (10, 1, 10)
    );
}

#[test]
fn a_weighed_request_finding_too_few_units_free_is_refused_with_overload() {
    let limiter = Arc::new(Limiter::new(8).unwrap());
    let (inner, calls) = gated_weighty();
    let mut service = LimitLayer::new(Arc::clone(&limiter))
        .weigh(by_units)
        .layer(inner);
    let (tx, big) = weighty(5);
    let mut big = service.call(big);
    // Three free: four are refused, three admitted.
    let (_tx4, four) = weighty(4);
    assert_eq!(
        refusal_of(poll_once(&mut service.call(four))),
        Error::Overload
    );
    assert_eq!(limiter.usage(), 5, "a refused request takes nothing");
    let (tx3, three) = weighty(3);
    let mut three = service.call(three);
    assert_eq!(limiter.usage(), 8);
    tx.send(5).unwrap();
    tx3.send(3).unwrap();
    assert!(matches!(poll_once(&mut big), Poll::Ready(Ok(5))));
    assert!(matches!(poll_once(&mut three), Poll::Ready(Ok(3))));
    assert_eq!(limiter.usage(), 0);
    assert_eq!(calls.load(SeqCst), 2);
    assert_eq!(limiter.stats().rejected, 1);
}

#[test]
fn a_weighed_request_above_the_capacity_is_too_large_at_once_and_not_counted() {
    let limiter = Arc::new(Limiter::new(8).unwrap());
    let (inner, calls) = gated_weighty();
    let mut service = LimitLayer::new(Arc::clone(&limiter))
        .weigh(by_units)
        .layer(inner);
    // Even with every unit free.
    let (_tx, huge) = weighty(9);
    assert_eq!(
        refusal_of(poll_once(&mut service.call(huge))),
        Error::TooLarge
    );
    // Exactly the capacity fits.
    let (tx, whole) = weighty(8);
    let mut whole = service.call(whole);
    assert_eq!(limiter.usage(), 8);
    tx.send(8).unwrap();
    assert!(matches!(poll_once(&mut whole), Poll::Ready(Ok(8))));
    // A grown limiter admits what was too large.
    limiter.set_capacity(9).unwrap();
    let (tx, huge) = weighty(9);
    let mut huge = service.call(huge);
    assert_eq!(limiter.usage(), 9);
    tx.send(9).unwrap();
    assert!(matches!(poll_once(&mut huge), Poll::Ready(Ok(9))));
    assert_eq!(calls.load(SeqCst), 2);
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.usage), (8 + 9, 0, 0));
}

#[test]
fn a_weight_of_zero_holds_one_unit() {
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let (inner, _) = gated_weighty();
    let mut service = LimitLayer::new(Arc::clone(&limiter))
        .weigh(by_units)
        .layer(inner);
    let (tx, free) = weighty(0);
    let mut first = service.call(free);
    assert_eq!(limiter.usage(), 1, "0 counts as 1");
    let (_tx, second) = weighty(0);
    assert_eq!(
        refusal_of(poll_once(&mut service.call(second))),
        Error::Overload
    );
    tx.send(0).unwrap();
    assert!(matches!(poll_once(&mut first), Poll::Ready(Ok(0))));
    assert_eq!(limiter.usage(), 0);
}

#[test]
fn a_weighed_waiting_request_waits_for_all_its_units_and_too_large_never_waits() {
    let limiter = with_room(4, 2, LONG);
    let (inner, calls) = gated_weighty();
    let mut service = LimitLayer::waiting(Arc::clone(&limiter))
        .weigh(by_units)
        .layer(inner);

    let (tx_a, a) = weighty(3);
    let mut a = service.call(a);
    assert_eq!(limiter.usage(), 3, "admitted in call");

    // Needs 3, 1 free: waits, holding nothing of the inner service's.
    let (tx_b, b) = weighty(3);
    let mut b = service.call(b);
    assert!(poll_once(&mut b).is_pending());
    assert_eq!((limiter.waiting(), calls.load(SeqCst)), (1, 1));

    // More than the capacity: refused at once, never queued, not counted.
    let (_tx, huge) = weighty(5);
    let mut huge = service.call(huge);
    assert_eq!(refusal_of(poll_once(&mut huge)), Error::TooLarge);
    assert_eq!(limiter.waiting(), 1);

    // The first answers: its three go to the waiter, which is called.
    tx_a.send(1).unwrap();
    assert!(matches!(poll_once(&mut a), Poll::Ready(Ok(1))));
    assert!(poll_once(&mut b).is_pending(), "called, its answer pending");
    assert_eq!((limiter.usage(), limiter.waiting()), (3, 0));
    assert_eq!(calls.load(SeqCst), 2);
    tx_b.send(2).unwrap();
    assert!(matches!(poll_once(&mut b), Poll::Ready(Ok(2))));
    assert_eq!(limiter.usage(), 0, "all three back at its response");
    let stats = limiter.stats();
    assert_eq!(
        (
            stats.accepted,
            stats.waited,
            stats.rejected,
            stats.completed
        ),
        (6, 1, 0, 6),
        "units admitted and completed, one request waited"
    );
}

#[test]
fn a_dropped_weighed_waiter_gives_back_what_it_collected() {
    let limiter = with_room(4, 2, LONG);
    let (inner, _) = gated_weighty();
    let mut service = LimitLayer::waiting(Arc::clone(&limiter))
        .weigh(by_units)
        .layer(inner);
    let (tx_a, a) = weighty(4);
    let mut a = service.call(a);
    let (_tx_b, b) = weighty(4);
    let mut b = service.call(b);
    assert!(poll_once(&mut b).is_pending());
    assert_eq!(limiter.waiting(), 1);
    tx_a.send(1).unwrap();
    assert!(matches!(poll_once(&mut a), Poll::Ready(Ok(1))));
    drop(b); // handed four, never polled again: a client that hung up
    assert_eq!((limiter.usage(), limiter.waiting()), (0, 0));
}

#[test]
fn a_weighed_waiter_the_capacity_shrinks_below_is_refused_too_large() {
    let limiter = with_room(4, 2, LONG);
    let (inner, calls) = gated_weighty();
    let mut service = LimitLayer::waiting(Arc::clone(&limiter))
        .weigh(by_units)
        .layer(inner);
    let (_tx_a, a) = weighty(2);
    let a = service.call(a);
    let (_tx_b, b) = weighty(4);
    let mut b = service.call(b);
    assert!(poll_once(&mut b).is_pending());
    assert_eq!(limiter.waiting(), 1);
    // Four can never be free in a limiter of three: the wait ends now.
    limiter.set_capacity(3).unwrap();
    assert_eq!(refusal_of(poll_once(&mut b)), Error::TooLarge);
    assert_eq!((limiter.waiting(), calls.load(SeqCst)), (0, 1));
    drop(a);
    assert_eq!(limiter.usage(), 0);
}

#[test]
fn weighed_futures_are_send_and_static() {
    fn send_static<T: Send + 'static>(_: &T) {}
    let (inner, _) = gated_weighty();
    let mut fail_fast = LimitLayer::new(Arc::new(Limiter::new(4).unwrap()))
        .weigh(by_units)
        .layer(inner.clone());
    let mut waiting = LimitLayer::waiting(with_room(4, 1, LONG))
        .weigh(|request: &Weighty| request.0)
        .layer(inner);
    send_static(&fail_fast);
    send_static(&fail_fast.call(weighty(1).1));
    send_static(&waiting.call(weighty(1).1));
}

/// `HttpRefusal`, `GrpcRefusal` and `hold_until_body_ends` in-process;
/// `tests/http_edge.rs` and `tests/grpc.rs` drive them over loopback.
#[cfg(feature = "http")]
mod http_edge {
    use super::*;
    use bytes::Bytes;
    use http::{header, Response, StatusCode};
    use http_body::{Body, Frame, SizeHint};
    use http_body_util::{BodyExt, Empty, Full};
    use sidejob::tower::{GrpcRefusal, HeldBody, HttpRefusal, UntilBodyEnd};
    use std::pin::Pin;
    use std::time::Duration;

    type Answer = Response<Empty<Bytes>>;

    /// A service answering an empty `200` once `rx` fires.
    fn answering() -> BoxCloneService<oneshot::Receiver<()>, Answer, Infallible> {
        BoxCloneService::new(service_fn(|rx: oneshot::Receiver<()>| async move {
            let _ = rx.await;
            Ok::<_, Infallible>(Response::new(Empty::new()))
        }))
    }

    fn status_and_retry(response: &Answer) -> (StatusCode, Option<&str>) {
        let retry = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap());
        (response.status(), retry)
    }

    #[test]
    fn http_refusal_maps_every_limiter_refusal_in_both_modes() {
        // Fail fast: 503 with Retry-After.
        let limiter = Arc::new(Limiter::new(1).unwrap());
        let mut service = LimitLayer::new(Arc::clone(&limiter))
            .refuse_with(HttpRefusal::new())
            .layer(answering());
        let (_tx, rx) = oneshot::channel();
        let _held = service.call(rx);
        let (_tx, rx) = oneshot::channel();
        let Poll::Ready(Ok(refused)) = poll_once(&mut service.call(rx)) else {
            panic!("refused at once")
        };
        assert_eq!(
            status_and_retry(&refused),
            (StatusCode::SERVICE_UNAVAILABLE, Some("1"))
        );
        assert!(refused.body().is_end_stream(), "an empty body");

        // Waiting, the room full: 429, or 503 if chosen; Retry-After 3
        // (2.5 s rounded up), or none.
        let limiter = with_room(1, 1, LONG);
        let refusals = [
            (HttpRefusal::new(), StatusCode::TOO_MANY_REQUESTS, Some("1")),
            (
                HttpRefusal::new().retry_after(Some(Duration::from_millis(2500))),
                StatusCode::TOO_MANY_REQUESTS,
                Some("3"),
            ),
            (
                HttpRefusal::new()
                    .room_full(StatusCode::SERVICE_UNAVAILABLE)
                    .retry_after(None),
                StatusCode::SERVICE_UNAVAILABLE,
                None,
            ),
        ];
        let (_tx1, rx1) = oneshot::channel();
        let (_tx2, rx2) = oneshot::channel();
        let mut base = LimitLayer::waiting(Arc::clone(&limiter))
            .refuse_with(HttpRefusal::new())
            .layer(answering());
        let _held = base.call(rx1);
        let mut waiter = base.call(rx2);
        assert!(poll_once(&mut waiter).is_pending());
        for (refusal, status, retry) in refusals {
            let mut service = LimitLayer::waiting(Arc::clone(&limiter))
                .refuse_with(refusal)
                .layer(answering());
            let (_tx, rx) = oneshot::channel();
            let Poll::Ready(Ok(refused)) = poll_once(&mut service.call(rx)) else {
                panic!("refused at once")
            };
            assert_eq!(status_and_retry(&refused), (status, retry));
        }

        // Shutdown, for the waiter and a newcomer: 503, never 429.
        limiter.close();
        let Poll::Ready(Ok(closed)) = poll_once(&mut waiter) else {
            panic!("the waiter is woken")
        };
        assert_eq!(
            status_and_retry(&closed),
            (StatusCode::SERVICE_UNAVAILABLE, Some("1"))
        );
        let (_tx, rx) = oneshot::channel();
        let Poll::Ready(Ok(late)) = poll_once(&mut base.call(rx)) else {
            panic!("refused at once")
        };
        assert_eq!(
            status_and_retry(&late),
            (StatusCode::SERVICE_UNAVAILABLE, Some("1"))
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn http_refusal_answers_a_timeout_with_503() {
        let limiter = with_room(1, 1, Duration::from_millis(1));
        let mut service = LimitLayer::waiting(Arc::clone(&limiter))
            .refuse_with(HttpRefusal::new())
            .layer(answering());
        let (_tx, rx) = oneshot::channel();
        let _held = service.call(rx); // never answers: the waiter can only time out
        let (_tx, rx) = oneshot::channel();
        let timed_out = service.call(rx).await.unwrap();
        assert_eq!(
            status_and_retry(&timed_out),
            (StatusCode::SERVICE_UNAVAILABLE, Some("1"))
        );
        assert_eq!(limiter.stats().timed_out, 1);
    }

    #[test]
    fn every_error_variant_has_a_documented_answer() {
        let http = HttpRefusal::new();
        let grpc = GrpcRefusal::new();
        let cases = [
            (Error::Overload, 503, 8, true),
            (Error::Timeout, 503, 14, true),
            (Error::Shutdown, 503, 14, true),
            (Error::Spawn(std::io::ErrorKind::WouldBlock), 503, 14, true),
            (Error::KeyBusy, 429, 8, true),
            (Error::WorkerPanicked, 500, 13, false),
            (Error::NoRuntime, 500, 13, false),
            (Error::CallingSelf, 500, 13, false),
        ];
        for (error, status, code, retry) in cases {
            let response: Response<Empty<Bytes>> = http.response(error);
            assert_eq!(response.status().as_u16(), status, "{error:?}");
            assert_eq!(response.headers().contains_key(header::RETRY_AFTER), retry);
            assert_eq!(grpc.code(error), code, "{error:?}");
            let response: Response<Empty<Bytes>> = grpc.response(error);
            assert_eq!(response.status(), StatusCode::OK, "gRPC answers 200");
            assert_eq!(response.headers()["content-type"], "application/grpc");
            assert_eq!(response.headers()["grpc-status"], code.to_string().as_str());
            assert_eq!(
                response.headers()["grpc-message"],
                error.to_string().as_str()
            );
            assert_eq!(
                response.headers().contains_key("grpc-retry-pushback-ms"),
                retry
            );
        }
        let quiet: Response<()> = GrpcRefusal::new()
            .retry_after(Some(Duration::from_micros(1500)))
            .response(Error::Timeout);
        assert_eq!(
            quiet.headers()["grpc-retry-pushback-ms"],
            "2",
            "ms, rounded up"
        );
        let quiet: Response<()> = GrpcRefusal::new()
            .retry_after(None)
            .response(Error::Overload);
        assert!(!quiet.headers().contains_key("grpc-retry-pushback-ms"));
    }

    /// A body of `frames` data frames, then an error if `fails`; its size
    /// hint is exact.
    struct Frames {
        left: usize,
        fails: bool,
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            if self.left > 0 {
                self.left -= 1;
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))));
            }
            if std::mem::take(&mut self.fails) {
                return Poll::Ready(Some(Err(std::io::Error::other("broken"))));
            }
            Poll::Ready(None)
        }

        fn size_hint(&self) -> SizeHint {
            SizeHint::with_exact(self.left as u64)
        }
    }

    type Held<B> = Response<HeldBody<B>>;

    /// A body-holding service over `make`, capacity 1.
    fn holding<B: Body + Send + 'static>(
        make: fn() -> B,
    ) -> (
        Arc<Limiter>,
        BoxCloneService<(), Held<B>, sidejob::tower::BoxError>,
    ) {
        let limiter = Arc::new(Limiter::new(1).unwrap());
        let service = LimitLayer::new(Arc::clone(&limiter))
            .hold_until_body_ends()
            .layer(service_fn(move |()| {
                std::future::ready(Ok::<_, Infallible>(Response::new(make())))
            }));
        (limiter, BoxCloneService::new(service))
    }

    #[test]
    fn the_body_holds_the_unit_until_its_last_frame() {
        let (limiter, mut service) = holding(|| Frames {
            left: 2,
            fails: false,
        });
        let Poll::Ready(Ok(response)) = poll_once(&mut service.call(())) else {
            panic!("answered at once")
        };
        let mut body = response.into_body();
        assert!(body.is_holding());
        assert_eq!(body.size_hint().exact(), Some(2), "the inner body's hint");
        assert_eq!(limiter.usage(), 1, "held past the response future");
        let refused = poll_once(&mut service.call(()));
        assert!(
            matches!(refused, Poll::Ready(Err(_))),
            "the body holds the only unit"
        );

        let mut frame = || {
            poll_once(&mut std::future::poll_fn(|cx| {
                Pin::new(&mut body).poll_frame(cx)
            }))
        };
        assert!(matches!(frame(), Poll::Ready(Some(Ok(_)))));
        assert_eq!(limiter.usage(), 1);
        assert!(matches!(frame(), Poll::Ready(Some(Ok(_)))));
        assert!(matches!(frame(), Poll::Ready(None)));
        assert!(!body.is_holding());
        assert_eq!(limiter.usage(), 0, "back at the end");
        let stats = limiter.stats();
        assert_eq!((stats.accepted, stats.rejected, stats.completed), (1, 1, 1));
    }

    #[test]
    fn a_failing_or_dropped_body_gives_the_unit_back_and_an_empty_one_holds_nothing() {
        let (limiter, mut service) = holding(|| Frames {
            left: 0,
            fails: true,
        });
        let Poll::Ready(Ok(response)) = poll_once(&mut service.call(())) else {
            panic!("answered at once")
        };
        let mut body = response.into_body();
        let error = poll_once(&mut std::future::poll_fn(|cx| {
            Pin::new(&mut body).poll_frame(cx)
        }));
        assert!(matches!(error, Poll::Ready(Some(Err(_)))));
        assert_eq!(limiter.usage(), 0, "back on the error");

        let (limiter, mut service) = holding(|| Full::new(Bytes::from_static(b"whole")));
        let Poll::Ready(Ok(response)) = poll_once(&mut service.call(())) else {
            panic!("answered at once")
        };
        assert_eq!(limiter.usage(), 1);
        drop(response); // a client that hung up
        assert_eq!(limiter.usage(), 0, "back on drop");

        let (limiter, mut service) = holding(Empty::<Bytes>::new);
        let Poll::Ready(Ok(response)) = poll_once(&mut service.call(())) else {
            panic!("answered at once")
        };
        assert!(!response.body().is_holding());
        assert_eq!(limiter.usage(), 0, "an empty body is over already");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_that_waited_holds_its_unit_in_the_body_too() {
        let limiter = with_room(1, 1, LONG);
        let mut service = LimitLayer::waiting(Arc::clone(&limiter))
            .refuse_with(HttpRefusal::new())
            .hold_until_body_ends()
            .layer(service_fn(|n: usize| async move {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(vec![b'x'; n]))))
            }));
        let first = service.ready().await.unwrap().call(1).await.unwrap();
        let second = tokio::spawn(service.ready().await.unwrap().call(2));
        while limiter.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        // The first body is the only unit's holder; sending it hands the
        // unit to the waiter, whose body then holds it.
        assert_eq!(first.into_body().collect().await.unwrap().to_bytes(), "x");
        let second = second.await.unwrap().unwrap();
        assert_eq!(limiter.usage(), 1, "held by the second body");
        assert_eq!(second.into_body().collect().await.unwrap().to_bytes(), "xx");
        assert_eq!(limiter.usage(), 0);
        assert_eq!(limiter.stats().waited, 1);
    }

    #[test]
    fn held_bodies_and_their_futures_are_send() {
        fn send_static<T: Send + 'static>(_: &T) {}
        let (_, mut service) = holding(|| Full::new(Bytes::from_static(b"x")));
        let future = service.call(());
        send_static(&future);
        let layer = LimitLayer::new(Arc::new(Limiter::new(1).unwrap())).hold_until_body_ends();
        let _: &LimitLayer<_, _, UntilBodyEnd> = &layer;
        send_static(&layer);
    }

    /// A service answering a body of as many bytes as the request asks.
    fn sized(n: usize) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>> {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from(vec![b'x'; n])))))
    }

    #[test]
    fn a_weighed_body_holds_all_its_units_until_it_ends_or_is_dropped() {
        let limiter = Arc::new(Limiter::new(10).unwrap());
        let mut service = LimitLayer::new(Arc::clone(&limiter))
            .refuse_with(HttpRefusal::new())
            .hold_until_body_ends()
            .weigh(|n: &usize| *n)
            .layer(service_fn(sized));
        let Poll::Ready(Ok(first)) = poll_once(&mut service.call(6)) else {
            panic!("answered at once")
        };
        let _: &HeldBody<Full<Bytes>, sidejob::units::Many> = first.body();
        assert!(first.body().is_holding());
        assert_eq!(limiter.usage(), 6, "held past the response future");
        let Poll::Ready(Ok(second)) = poll_once(&mut service.call(4)) else {
            panic!("answered at once")
        };
        assert_eq!(limiter.usage(), 10);
        let Poll::Ready(Ok(busy)) = poll_once(&mut service.call(1)) else {
            panic!("answered at once")
        };
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!busy.body().is_holding());

        let mut body = first.into_body();
        let frame = poll_once(&mut std::future::poll_fn(|cx| {
            Pin::new(&mut body).poll_frame(cx)
        }));
        assert!(matches!(frame, Poll::Ready(Some(Ok(_)))));
        assert!(!body.is_holding());
        assert_eq!(limiter.usage(), 4, "all six back at the last frame");
        drop(second); // a client that hung up: its four go back
        assert_eq!(limiter.usage(), 0);
    }

    #[test]
    fn a_weighed_request_too_large_is_413_or_out_of_range_without_retry_hints() {
        let limiter = Arc::new(Limiter::new(4).unwrap());
        let mut http = LimitLayer::new(Arc::clone(&limiter))
            .refuse_with(HttpRefusal::new())
            .weigh(|n: &usize| *n)
            .layer(service_fn(sized));
        let Poll::Ready(Ok(too_large)) = poll_once(&mut http.call(5)) else {
            panic!("refused at once")
        };
        assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(!too_large.headers().contains_key(header::RETRY_AFTER));
        // The waiting layer answers the same: it never waits for it.
        let mut waiting = LimitLayer::waiting(with_room(4, 4, LONG))
            .refuse_with(HttpRefusal::new())
            .weigh(|n: &usize| *n)
            .layer(service_fn(sized));
        let Poll::Ready(Ok(too_large)) = poll_once(&mut waiting.call(5)) else {
            panic!("refused at once")
        };
        assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);

        let mut grpc = LimitLayer::new(Arc::clone(&limiter))
            .refuse_with(GrpcRefusal::new())
            .weigh(|n: &usize| *n)
            .layer(service_fn(sized));
        let Poll::Ready(Ok(too_large)) = poll_once(&mut grpc.call(5)) else {
            panic!("refused at once")
        };
        assert_eq!(too_large.headers()["grpc-status"], "11"); // OUT_OF_RANGE
        assert!(!too_large.headers().contains_key("grpc-retry-pushback-ms"));
        let held = limiter.try_acquire_many(4).unwrap();
        let Poll::Ready(Ok(busy)) = poll_once(&mut grpc.call(1)) else {
            panic!("refused at once")
        };
        assert_eq!(busy.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
        assert_eq!(busy.headers()["grpc-retry-pushback-ms"], "1000");
        drop(held);
        assert_eq!((limiter.usage(), limiter.stats().rejected), (0, 1));
    }
}

/// `LimitLayer::adaptive`: every admitted request is a sample for the
/// controller, an inner error a drop; refused requests are not samples.
#[tokio::test]
async fn adaptive_layer_feeds_its_controller() {
    use sidejob::adaptive::{Algorithm, Controller, Window};
    use std::time::Duration;

    /// Keeps the limit; the test reads the windows.
    struct Keep;
    impl Algorithm for Keep {
        fn update(&mut self, window: &Window) -> usize {
            window.limit()
        }
    }

    let limiter = Arc::new(Limiter::new(1).unwrap());
    let controller = Arc::new(
        Controller::builder()
            .min_samples(1)
            .sample_every(1)
            .interval(Duration::from_secs(3600))
            .build(Arc::clone(&limiter), Keep)
            .unwrap(),
    );
    let mut service = LimitLayer::new(Arc::clone(&limiter))
        .adaptive(Arc::clone(&controller))
        .layer(service_fn(|fail: bool| async move {
            if fail {
                Err(BoxError::from("backend timed out"))
            } else {
                Ok(())
            }
        }));
    for fail in [false, false, true] {
        let _ = service.ready().await.unwrap().call(fail).await;
    }
    // A refusal: the first response future holds the only unit.
    let held = service.ready().await.unwrap().call(false);
    let refused = service
        .ready()
        .await
        .unwrap()
        .call(false)
        .await
        .unwrap_err();
    assert_eq!(refused.downcast_ref::<Error>(), Some(&Error::Overload));
    held.await.unwrap();

    let window = controller
        .tick_at(Duration::from_secs(7200))
        .expect("a window");
    assert_eq!((window.samples(), window.dropped()), (3, 1));
    assert_eq!(window.rejected(), 1);
}

// ---- Priority classes (`LimitLayer::classify`) ----

/// The class of a recorded [`Job`], by its id's hundreds: 1xx
/// `CriticalPlus`, 2xx `Critical`, 3xx `SheddablePlus`, 4xx `Sheddable`.
fn class_by_id(job: &Job) -> Class {
    Class::from_rank(job.0 as usize / 100 - 1).expect("an id from 100 to 499")
}

/// A waiting layer over `limiter` that classifies by id ([`class_by_id`])
/// over a [`recording`] service, and the ids that service was called with.
fn classified_waiting(
    limiter: &Arc<Limiter>,
) -> (
    impl Service<
        Job,
        Response = u32,
        Error = BoxError,
        Future = impl std::future::Future<Output = Result<u32, BoxError>> + Unpin,
    >,
    Arc<Log>,
) {
    let (inner, order) = recording();
    let service = LimitLayer::waiting(Arc::clone(limiter))
        .classify(class_by_id)
        .layer(inner);
    (service, order)
}

/// Each class's waiters now, in `Class::ALL` order.
fn waiting_by_class(limiter: &Limiter) -> Vec<usize> {
    limiter.stats().classes.iter().map(|c| c.waiting).collect()
}

#[test]
fn a_classified_waiting_layer_serves_the_most_important_class_first_within_its_headroom() {
    // One shard, so each class's line is exact in total: SheddablePlus
    // may fill 3 of the 4 units (90 %, rounded down).
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(4)
            .shards(1)
            .max_waiters(8)
            .max_wait(LONG)
            .build()
            .unwrap(),
    );
    let (mut service, order) = classified_waiting(&limiter);

    // Four requests of the default class hold every unit.
    let mut held: Vec<_> = (201..=204)
        .map(|id| {
            let (tx, j) = job(id);
            (tx, service.call(j))
        })
        .collect();
    assert_eq!(limiter.usage(), 4);
    // Three wait, the least important first: arrival is not the order.
    let mut waiting: Vec<_> = [301, 205, 101]
        .into_iter()
        .map(|id| {
            let (tx, j) = job(id);
            let mut response = service.call(j);
            assert!(poll_once(&mut response).is_pending());
            (tx, response)
        })
        .collect();
    assert_eq!(waiting_by_class(&limiter), [1, 1, 1, 0]);

    // Frees one held unit and polls every waiter: a waiter handed a unit
    // calls the inner service (which records its id).
    let mut free_one = |waiting: &mut Vec<(oneshot::Sender<u32>, _)>| {
        let (tx, mut response) = held.remove(0);
        tx.send(0).unwrap();
        assert!(matches!(poll_once(&mut response), Poll::Ready(Ok(0))));
        for (_, response) in waiting.iter_mut() {
            assert!(poll_once(response).is_pending());
        }
        order.lock().unwrap().clone()
    };
    assert_eq!(free_one(&mut waiting), [201, 202, 203, 204, 101]);
    assert_eq!(free_one(&mut waiting), [201, 202, 203, 204, 101, 205]);
    // Three held now (204, 101, 205): the SheddablePlus waiter would be a
    // fourth, over its line. It waits for the next unit, not this one.
    assert_eq!(free_one(&mut waiting), [201, 202, 203, 204, 101, 205]);
    assert_eq!(waiting_by_class(&limiter), [0, 0, 1, 0]);
    assert_eq!(limiter.usage(), 3, "the freed unit stays free");
    assert_eq!(free_one(&mut waiting), [201, 202, 203, 204, 101, 205, 301]);
    assert_eq!((limiter.usage(), limiter.waiting()), (3, 0));

    for (tx, mut response) in waiting {
        tx.send(1).unwrap();
        assert!(matches!(poll_once(&mut response), Poll::Ready(Ok(1))));
    }
    let stats = limiter.stats();
    assert_eq!((stats.usage, stats.waited, stats.rejected), (0, 3, 0));
    let accepted: Vec<u64> = stats.classes.iter().map(|c| c.accepted).collect();
    assert_eq!(accepted, [1, 5, 1, 0]);
}

#[test]
fn a_classified_waiting_layer_without_a_room_refuses_at_once_and_counts_the_class() {
    // The sheddable class may fill half of 2: one unit. No waiting room.
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(2)
            .shards(1)
            .headroom(Class::Sheddable, 0.5)
            .build()
            .unwrap(),
    );
    let (mut service, order) = classified_waiting(&limiter);
    let (tx_a, a) = job(401);
    let mut a = service.call(a);
    let (_tx_b, b) = job(402);
    assert_eq!(refusal_of(poll_once(&mut service.call(b))), Error::Overload);
    let (tx_c, c) = job(201);
    let mut c = service.call(c);
    assert_eq!(limiter.usage(), 2, "the default class has the other unit");
    assert_eq!(*order.lock().unwrap(), [401, 201]);
    tx_a.send(1).unwrap();
    tx_c.send(2).unwrap();
    assert!(matches!(poll_once(&mut a), Poll::Ready(Ok(1))));
    assert!(matches!(poll_once(&mut c), Poll::Ready(Ok(2))));

    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.usage), (2, 1, 0));
    let sheddable = &stats.classes[Class::Sheddable.rank()];
    assert_eq!((sheddable.accepted, sheddable.rejected), (1, 1));
    let critical = &stats.classes[Class::Critical.rank()];
    assert_eq!((critical.accepted, critical.rejected), (1, 0));
}

#[test]
fn weighed_and_classified_in_either_order_take_the_weight_under_the_class_line() {
    fn sheddable(_: &Weighty) -> Class {
        Class::Sheddable
    }
    for weighed_first in [true, false] {
        // The sheddable class may fill half of 10: 5 units.
        let limiter = Arc::new(
            Limiter::builder()
                .capacity(10)
                .shards(1)
                .headroom(Class::Sheddable, 0.5)
                .build()
                .unwrap(),
        );
        let (inner, calls) = gated_weighty();
        let layer = LimitLayer::new(Arc::clone(&limiter));
        let mut service = if weighed_first {
            layer.weigh(by_units).classify(sheddable).layer(inner)
        } else {
            layer.classify(sheddable).weigh(by_units).layer(inner)
        };
        // More than the class may ever fill, though 10 are free: shed at
        // once (a 503 at an HTTP edge, not a 413: the request fits the
        // capacity). More than the capacity is too large for any class.
        let (_tx, six) = weighty(6);
        assert_eq!(
            refusal_of(poll_once(&mut service.call(six))),
            Error::Overload
        );
        let (_tx, eleven) = weighty(11);
        assert_eq!(
            refusal_of(poll_once(&mut service.call(eleven))),
            Error::TooLarge
        );
        let (tx4, four) = weighty(4);
        let mut four = service.call(four);
        assert_eq!(limiter.usage(), 4);
        // 4 + 2 is over the line of 5, with 6 units free.
        let (_tx, two) = weighty(2);
        assert_eq!(
            refusal_of(poll_once(&mut service.call(two))),
            Error::Overload
        );
        let (tx1, one) = weighty(1);
        let mut one = service.call(one);
        assert_eq!(limiter.usage(), 5);
        tx4.send(4).unwrap();
        tx1.send(1).unwrap();
        assert!(matches!(poll_once(&mut four), Poll::Ready(Ok(4))));
        assert!(matches!(poll_once(&mut one), Poll::Ready(Ok(1))));
        assert_eq!(calls.load(SeqCst), 2);
        let stats = limiter.stats();
        let class = &stats.classes[Class::Sheddable.rank()];
        // Units accepted, requests refused; TooLarge is not a refusal.
        assert_eq!(
            (class.accepted, class.rejected, stats.rejected, stats.usage),
            (5, 2, 2, 0),
            "weighed first: {weighed_first}"
        );
    }
}
