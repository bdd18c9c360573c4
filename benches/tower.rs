//! Per-request overhead of `sidejob::tower::LimitLayer` beside tower's
//! `LoadShedLayer` + `ConcurrencyLimitLayer` around the same trivial inner
//! service, in-process, on 1 and 2 threads.
//!
//! One op = `poll_ready` + `call` + polling the response future to
//! completion, with a no-op waker (no runtime in the loop). The capacity
//! is never reached, so both sides admit every request: this is the
//! overhead a request pays to pass the limit. The 1-thread table also
//! times `LimitLayer::waiting` over a limiter with a waiting room, whose
//! requests find a unit free: the cost of the waiting mode when nobody
//! has to wait; and the weighed layer (requests of one unit) and the
//! classified layer (the default class, and the sheddable class under its
//! headroom), each beside tower's and the plain layer. After the criterion groups a
//! plain interleaved timing prints the ratios (as `benches/admission.rs`
//! does: on a small shared machine a ratio measured side by side is the
//! figure).

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};

mod common;
use common::best_of;
use sidejob::tower::LimitLayer;
use sidejob::{Class, Limiter};
use tower::{service_fn, Service, ServiceBuilder};

/// Never reached: every request is admitted.
const BIG: usize = 1 << 20;

type Inner = tower::util::ServiceFn<fn(u64) -> Ready<Result<u64, Infallible>>>;

fn inner() -> Inner {
    service_fn((|n| ready(Ok(n))) as fn(u64) -> Ready<Result<u64, Infallible>>)
}

fn ours() -> impl Service<u64, Response = u64, Error = tower::BoxError> + Clone + Send {
    ServiceBuilder::new()
        .layer(LimitLayer::new(Arc::new(Limiter::new(BIG).unwrap())))
        .service(inner())
}

/// The waiting mode over a limiter with a waiting room: with a unit free,
/// a request is admitted in `call` as in the fail-fast mode.
fn ours_waiting() -> impl Service<u64, Response = u64, Error = tower::BoxError> + Clone + Send {
    let limiter = Limiter::builder()
        .capacity(BIG)
        .max_waiters(64)
        .build()
        .unwrap();
    ServiceBuilder::new()
        .layer(LimitLayer::waiting(Arc::new(limiter)))
        .service(inner())
}

/// A weighed layer whose requests weigh one unit each: the weighed path's
/// cost (a take of `n` units, a guard holding a count).
fn ours_weighed() -> impl Service<u64, Response = u64, Error = tower::BoxError> + Clone + Send {
    ServiceBuilder::new()
        .layer(LimitLayer::new(Arc::new(Limiter::new(BIG).unwrap())).weigh(|_: &u64| 1))
        .service(inner())
}

/// A classified layer whose requests are all of `class` (the headroom
/// never reached): the classed path's cost, the class read by a closure.
fn ours_classified(
    class: Class,
) -> impl Service<u64, Response = u64, Error = tower::BoxError> + Clone + Send {
    ServiceBuilder::new()
        .layer(LimitLayer::new(Arc::new(Limiter::new(BIG).unwrap())).classify(move |_: &u64| class))
        .service(inner())
}

fn theirs() -> impl Service<u64, Response = u64, Error = tower::BoxError> + Clone + Send {
    ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(BIG)
        .service(inner())
}

/// One request through `service`, start to finish.
#[inline]
fn once<S: Service<u64, Response = u64>>(service: &mut S, cx: &mut Context<'_>) {
    match service.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("not ready"),
    }
    let future = pin!(service.call(black_box(7)));
    match future.poll(cx) {
        Poll::Ready(Ok(n)) => {
            black_box(n);
        }
        _ => panic!("no overload in this bench"),
    }
}

fn loop_ns<S: Service<u64, Response = u64>>(service: &mut S, iters: u64) -> f64 {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let began = Instant::now();
    for _ in 0..iters {
        once(service, &mut cx);
    }
    began.elapsed().as_nanos() as f64 / iters as f64
}

/// ns per request, total, with two threads each driving its own clone.
fn pair_ns<S>(service: &S, iters: u64) -> f64
where
    S: Service<u64, Response = u64> + Clone + Send,
{
    let start = Barrier::new(3);
    let end = Barrier::new(3);
    let elapsed = thread::scope(|scope| {
        for _ in 0..2 {
            let mut service = service.clone();
            let (start, end) = (&start, &end);
            scope.spawn(move || {
                let waker = noop_waker();
                let mut cx = Context::from_waker(&waker);
                start.wait();
                for _ in 0..iters {
                    once(&mut service, &mut cx);
                }
                end.wait();
            });
        }
        start.wait();
        let began = Instant::now();
        end.wait();
        began.elapsed()
    });
    elapsed.as_nanos() as f64 / (2 * iters) as f64
}

fn one_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("tower_request_1thread");
    group.throughput(Throughput::Elements(1));
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut s = ours();
    group.bench_function("sidejob_limit_layer", |b| b.iter(|| once(&mut s, &mut cx)));
    let mut s = theirs();
    group.bench_function("tower_load_shed+concurrency_limit", |b| {
        b.iter(|| once(&mut s, &mut cx))
    });
    group.finish();
}

fn ratio_table() {
    const ITERS: u64 = 1_000_000;
    const ROUNDS: usize = 7;
    println!();
    println!("== side-by-side ratios (min of {ROUNDS} interleaved runs, {ITERS} requests each) ==");
    let (mut a, mut b, mut w) = (ours(), theirs(), ours_waiting());
    let ns = best_of(
        ROUNDS,
        &mut [
            &mut || loop_ns(&mut a, ITERS),
            &mut || loop_ns(&mut b, ITERS),
            &mut || loop_ns(&mut w, ITERS),
        ],
    );
    println!(
        "1 thread, ns per request: sidejob LimitLayer {:.2}, tower LoadShed+ConcurrencyLimit {:.2}, sidejob LimitLayer::waiting (unit free) {:.2}",
        ns[0], ns[1], ns[2]
    );
    println!(
        "ratio 1thread ours/tower cost = {:.2}   (target <= 0.50)",
        ns[0] / ns[1]
    );
    println!(
        "ratio 1thread waiting/fail-fast cost, unit free = {:.2}",
        ns[2] / ns[0]
    );

    let (mut a, mut b, mut v) = (ours(), theirs(), ours_weighed());
    let ns = best_of(
        ROUNDS,
        &mut [
            &mut || loop_ns(&mut a, ITERS),
            &mut || loop_ns(&mut b, ITERS),
            &mut || loop_ns(&mut v, ITERS),
        ],
    );
    println!(
        "1 thread, ns per request: sidejob LimitLayer {:.2}, tower {:.2}, sidejob LimitLayer::weigh (1 unit) {:.2}",
        ns[0], ns[1], ns[2]
    );
    println!(
        "ratio 1thread weighed/tower cost = {:.2}, weighed/fail-fast = {:.2}",
        ns[2] / ns[1],
        ns[2] / ns[0]
    );

    let (mut a, mut b) = (ours(), theirs());
    let (mut c, mut d) = (
        ours_classified(Class::Critical),
        ours_classified(Class::Sheddable),
    );
    let ns = best_of(
        ROUNDS,
        &mut [
            &mut || loop_ns(&mut a, ITERS),
            &mut || loop_ns(&mut b, ITERS),
            &mut || loop_ns(&mut c, ITERS),
            &mut || loop_ns(&mut d, ITERS),
        ],
    );
    println!(
        "1 thread, ns per request: sidejob LimitLayer {:.2}, tower {:.2}, sidejob LimitLayer::classify (critical) {:.2}, (sheddable) {:.2}",
        ns[0], ns[1], ns[2], ns[3]
    );
    println!(
        "ratio 1thread classified/tower cost = {:.2} (critical), {:.2} (sheddable); classified/fail-fast = {:.2}, {:.2}",
        ns[2] / ns[1],
        ns[3] / ns[1],
        ns[2] / ns[0],
        ns[3] / ns[0]
    );

    let (a, b) = (ours(), theirs());
    let ns = best_of(
        ROUNDS,
        &mut [&mut || pair_ns(&a, ITERS), &mut || pair_ns(&b, ITERS)],
    );
    println!(
        "2 threads, total M requests/s: sidejob LimitLayer {:.1}, tower LoadShed+ConcurrencyLimit {:.1}",
        1e3 / ns[0],
        1e3 / ns[1]
    );
    println!(
        "ratio 2threads ours/tower throughput = {:.2}   (target >= 3)",
        ns[1] / ns[0]
    );
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(800))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = one_thread
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    if std::env::args().any(|arg| arg == "--bench") {
        ratio_table();
    }
}

/// A waker that does nothing (`Waker::noop` is newer than our MSRV).
fn noop_waker() -> Waker {
    struct Noop;
    impl std::task::Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    Waker::from(Arc::new(Noop))
}
