//! Dispatch: where a queued request runs. Each figure beside its peers, in
//! one run.
//!
//! * Head-of-line: 2 workers, capacity 64, a paced stream of 20 µs requests
//!   with one 50 ms request in every 200; latency (queue + service) of the
//!   fast ones: the pool without stealing, with stealing, and one shared
//!   crossbeam channel both workers pull from (the ideal for latency).
//! * Plain `call` round trip with stealing off and on (2 workers), in this
//!   process and again in fresh ones (see `common::in_fresh_processes`).
//! * The worker loop: one producer casting to one worker with a trivial
//!   handler, against a `crossbeam_channel::bounded` of the same capacity
//!   with a trivial consumer; both producers retry when full.

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::head_of_line::{offer_stream, summarize, Job, Latency, GAP, REQUESTS};
use common::{
    best_of, child_task, in_fresh_processes, print_figures, print_spread, ratios, time_loop,
    FRESH_RUNS,
};
use criterion::{criterion_group, BenchmarkId, Criterion};
use sidejob::{Error, Pool, Worker};

/// Busy-works for the request's time and records the latency of the fast
/// ones (a 50 ms request sleeps: it blocks its worker as a slow I/O would).
fn run_job(job: Job, latencies: &Mutex<Vec<Duration>>) {
    let (sent, work) = job;
    if work >= Duration::from_millis(1) {
        thread::sleep(work);
        return;
    }
    let began = Instant::now();
    while began.elapsed() < work {
        std::hint::spin_loop();
    }
    latencies.lock().unwrap().push(sent.elapsed());
}

struct Hol(Arc<Mutex<Vec<Duration>>>);

impl Worker for Hol {
    type Request = ();
    type Reply = ();
    type Message = Job;
    fn handle_call(&mut self, _: ()) {}
    fn handle_cast(&mut self, job: Job) {
        run_job(job, &self.0);
    }
}

fn hol_pool(steal: bool) -> Latency {
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let pool = {
        let latencies = latencies.clone();
        Pool::builder()
            .name("hol")
            .capacity(64)
            .workers(2)
            .steal(steal)
            .build(move |_| Hol(latencies.clone()))
            .unwrap()
    };
    let refused = offer_stream(|job| match pool.cast(job) {
        Ok(()) => true,
        Err(Error::Overload) => false,
        Err(other) => panic!("unexpected {other}"),
    });
    pool.shutdown();
    summarize(&latencies, refused)
}

fn hol_shared_channel() -> Latency {
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let (sender, receiver) = crossbeam_channel::bounded::<Job>(64);
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (receiver, latencies) = (receiver.clone(), latencies.clone());
            thread::spawn(move || {
                for job in receiver {
                    run_job(job, &latencies);
                }
            })
        })
        .collect();
    let refused = offer_stream(|job| sender.try_send(job).is_ok());
    drop(sender);
    for worker in workers {
        worker.join().unwrap();
    }
    summarize(&latencies, refused)
}

/// Answers at once.
struct Echo;

impl Worker for Echo {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    fn handle_call(&mut self, n: u64) -> u64 {
        n + 1
    }
    fn handle_cast(&mut self, n: u64) {
        black_box(n);
    }
}

fn echo_pool(capacity: usize, workers: usize, steal: bool) -> Pool<Echo> {
    Pool::builder()
        .name("bench")
        .capacity(capacity)
        .workers(workers)
        .steal(steal)
        .build(|_| Echo)
        .unwrap()
}

/// Capacity of the worker-loop benches (pool and bounded channel alike).
const LOOP_CAPACITY: usize = 1024;
/// Messages per worker-loop measurement.
const LOOP_MESSAGES: u64 = 200_000;

/// ns per cast: one producer casting `n` messages (retrying on Overload),
/// then waiting until the worker has handled them all.
fn pool_cast_loop(pool: &Pool<Echo>, n: u64) -> Duration {
    let began = Instant::now();
    for i in 0..n {
        let mut message = i;
        loop {
            match pool.try_cast(message) {
                Ok(()) => break,
                Err(refused) => {
                    message = refused.into_inner();
                    std::hint::spin_loop();
                }
            }
        }
    }
    while pool.usage() > 0 {
        std::hint::spin_loop();
    }
    began.elapsed()
}

/// A trivial consumer draining a bounded channel, counting what it took.
struct BoundedConsumer {
    sender: Option<crossbeam_channel::Sender<u64>>,
    done: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

impl BoundedConsumer {
    fn start() -> Self {
        let (sender, receiver) = crossbeam_channel::bounded::<u64>(LOOP_CAPACITY);
        let done = Arc::new(AtomicU64::new(0));
        let thread = {
            let done = done.clone();
            thread::spawn(move || {
                for n in receiver {
                    black_box(n);
                    done.fetch_add(1, Ordering::Release);
                }
            })
        };
        BoundedConsumer {
            sender: Some(sender),
            done,
            thread: Some(thread),
        }
    }

    /// Sends `n` messages (`send` waits when full) and waits until all are
    /// consumed.
    fn run(&self, n: u64) -> Duration {
        let began = Instant::now();
        let target = self.done.load(Ordering::Acquire) + n;
        let sender = self.sender.as_ref().unwrap();
        for i in 0..n {
            sender.send(i).unwrap();
        }
        while self.done.load(Ordering::Acquire) < target {
            std::hint::spin_loop();
        }
        began.elapsed()
    }
}

impl Drop for BoundedConsumer {
    fn drop(&mut self) {
        self.sender.take();
        let _ = self.thread.take().unwrap().join();
    }
}

fn call_round_trip(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch_call_round_trip_2workers");
    for steal in [false, true] {
        let pool = echo_pool(64, 2, steal);
        group.bench_function(BenchmarkId::new("sidejob_call_steal", steal), |b| {
            b.iter(|| pool.call(black_box(1)).unwrap())
        });
    }
    group.finish();
}

fn worker_loop(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch_cast_one_producer_one_worker");
    group.throughput(criterion::Throughput::Elements(1));
    for steal in [false, true] {
        let pool = echo_pool(LOOP_CAPACITY, 1, steal);
        group.bench_function(BenchmarkId::new("sidejob_cast_steal", steal), |b| {
            b.iter_custom(|iters| pool_cast_loop(&pool, iters))
        });
    }
    let consumer = BoundedConsumer::start();
    group.bench_function(
        BenchmarkId::new("crossbeam_bounded_send", LOOP_CAPACITY),
        |b| b.iter_custom(|iters| consumer.run(iters)),
    );
    group.finish();
}

/// The best of several runs of `run`, in ns per message.
fn best_per_message(n: u64, mut run: impl FnMut() -> Duration) -> f64 {
    (0..5)
        .map(|_| run().as_nanos() as f64 / n as f64)
        .fold(f64::INFINITY, f64::min)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The child task that times the two round trips alone.
const ROUND_TRIPS: &str = "round_trips";

/// ns per plain `call`, 1 caller, 2 workers, without and with stealing:
/// both pools alive and timed in turns (best of 7 runs of 50k calls), so
/// a drift of the machine (the cross-core figures move by half within
/// minutes) falls on both.
fn round_trips() -> Vec<f64> {
    let (plain, stealing) = (echo_pool(64, 2, false), echo_pool(64, 2, true));
    best_of(
        7,
        &mut [
            &mut || {
                time_loop(50_000, || {
                    black_box(plain.call(black_box(1)).unwrap());
                })
            },
            &mut || {
                time_loop(50_000, || {
                    black_box(stealing.call(black_box(1)).unwrap());
                })
            },
        ],
    )
}

fn ratio_table() {
    println!("\n== dispatch: measured side by side in this run ==");
    println!(
        "head-of-line: 2 workers, capacity 64, {REQUESTS} requests one every {} µs, 20 µs each, 50 ms every 200th; latency of the fast ones",
        GAP.as_micros()
    );
    let rows = [
        ("pool, no stealing", hol_pool(false)),
        ("pool, stealing", hol_pool(true)),
        ("shared crossbeam channel", hol_shared_channel()),
    ];
    println!(
        "{:<26} {:>10} {:>10} {:>10} {:>8}",
        "", "p50", "p99", "max", "refused"
    );
    for (name, row) in &rows {
        println!(
            "{:<26} {:>10} {:>10} {:>10} {:>8}",
            name,
            ms(row.p50),
            ms(row.p99),
            ms(row.max),
            row.refused
        );
    }
    let shared = rows[2].1.p99.as_secs_f64();
    println!(
        "  p99 ratio: no stealing / shared = {:.2}, stealing / shared = {:.2}  (target <= 1.2)",
        rows[0].1.p99.as_secs_f64() / shared,
        rows[1].1.p99.as_secs_f64() / shared
    );

    let calls = round_trips();
    println!(
        "call round trip, 1 caller, 2 workers (best of 7 interleaved runs): no stealing {:.0} ns | stealing {:.0} ns",
        calls[0], calls[1]
    );
    println!(
        "  ratio stealing / no stealing = {:.3}  (target <= 1.05)",
        calls[1] / calls[0]
    );
    let runs = in_fresh_processes(ROUND_TRIPS, FRESH_RUNS);
    print_spread("ratio stealing / no stealing", &ratios(&runs, 1, 0));

    let casts: Vec<f64> = [false, true]
        .into_iter()
        .map(|steal| {
            let pool = echo_pool(LOOP_CAPACITY, 1, steal);
            best_per_message(LOOP_MESSAGES, || pool_cast_loop(&pool, LOOP_MESSAGES))
        })
        .collect();
    let consumer = BoundedConsumer::start();
    let bounded = best_per_message(LOOP_MESSAGES, || consumer.run(LOOP_MESSAGES));
    drop(consumer);
    println!(
        "worker loop, 1 producer -> 1 worker, capacity {LOOP_CAPACITY}, retry when full: pool {:.1} ns/msg (stealing {:.1}) | crossbeam bounded {:.1} ns/msg",
        casts[0], casts[1], bounded
    );
    println!(
        "  ratio pool / bounded = {:.2} (stealing {:.2})  (target <= 2)",
        casts[0] / bounded,
        casts[1] / bounded
    );
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = call_round_trip, worker_loop
}

fn main() {
    if child_task().as_deref() == Some(ROUND_TRIPS) {
        print_figures(&round_trips());
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratio_table();
}
