//! Dispatch in the async pool: where a queued request runs. Each figure
//! beside its peers, in one run, on a 2-thread tokio runtime.
//!
//! * Head-of-line: 2 workers, capacity 64, a paced stream of 20 µs requests
//!   (CPU work) with one 50 ms request (an await: a slow reply from a
//!   server) in every 200; latency (queue + service) of the fast ones: the
//!   async pool without stealing, with stealing, and one shared tokio
//!   channel both worker tasks pull from (the ideal for latency: any free
//!   worker takes the next request).
//! * Plain `call_async` round trip with stealing off and on (2 workers,
//!   1 calling task, then 64), interleaved rounds, medians.
//!
//! Run: `cargo bench --no-run --all-features --bench async_dispatch`, then
//! `target/release/deps/async_dispatch-<hash> --bench`.

mod common;

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::head_of_line::{offer_stream, summarize, Job, Latency, GAP, REQUESTS};
use criterion::{BenchmarkId, Criterion};
use sidejob::{AsyncPool, AsyncWorker, Error, Pool};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

/// Runs a request: a slow one awaits (holding its worker, not a thread),
/// a fast one computes, then records its latency.
async fn run_job(job: Job, latencies: &Mutex<Vec<Duration>>) {
    let (sent, work) = job;
    if work >= Duration::from_millis(1) {
        tokio::time::sleep(work).await;
        return;
    }
    let began = Instant::now();
    while began.elapsed() < work {
        std::hint::spin_loop();
    }
    latencies.lock().unwrap().push(sent.elapsed());
}

struct Hol(Arc<Mutex<Vec<Duration>>>);

impl AsyncWorker for Hol {
    type Request = ();
    type Reply = ();
    type Message = Job;
    async fn handle_call(&mut self, _: ()) {}
    async fn handle_cast(&mut self, job: Job) {
        run_job(job, &self.0).await;
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn hol_pool(steal: bool) -> Latency {
    let rt = runtime();
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let pool = {
        let latencies = latencies.clone();
        Pool::builder()
            .name("hol")
            .capacity(64)
            .workers(2)
            .steal(steal)
            .build_async_on(rt.handle(), move |_| Hol(latencies.clone()))
            .unwrap()
    };
    let refused = offer_stream(|job| match pool.try_cast(job) {
        Ok(()) => true,
        Err(refused) if refused.is_overload() => false,
        Err(other) => panic!("unexpected {}", other.error()),
    });
    rt.block_on(pool.shutdown_async());
    summarize(&latencies, refused)
}

/// Two worker tasks taking turns at one tokio `mpsc` receiver (behind a
/// tokio `Mutex`, the usual way to share it): whichever is free takes the
/// next request. Bounded at 64, as the pool.
fn hol_shared_channel() -> Latency {
    let rt = runtime();
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let (sender, receiver) = mpsc::channel::<Job>(64);
    let receiver = Arc::new(tokio::sync::Mutex::new(receiver));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (receiver, latencies) = (receiver.clone(), latencies.clone());
            rt.spawn(async move {
                loop {
                    let job = receiver.lock().await.recv().await;
                    match job {
                        Some(job) => run_job(job, &latencies).await,
                        None => break,
                    }
                }
            })
        })
        .collect();
    let refused = offer_stream(|job| sender.try_send(job).is_ok());
    drop(sender);
    for worker in workers {
        rt.block_on(worker).unwrap();
    }
    summarize(&latencies, refused)
}

/// Answers at once.
struct Echo;

impl AsyncWorker for Echo {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    async fn handle_call(&mut self, n: u64) -> u64 {
        n
    }
    async fn handle_cast(&mut self, n: u64) {
        black_box(n);
    }
}

fn echo_pool(rt: &Runtime, steal: bool) -> AsyncPool<Echo> {
    Pool::builder()
        .capacity(64)
        .workers(2)
        .steal(steal)
        .build_async_on(rt.handle(), |_| Echo)
        .unwrap()
}

/// `calls` round trips spread over `tasks` tasks; the span.
fn fan_out(rt: &Runtime, pool: &AsyncPool<Echo>, tasks: u64, calls: u64) -> Duration {
    let pool = pool.clone();
    rt.block_on(async move {
        let per_task = calls.div_ceil(tasks);
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    for i in 0..per_task {
                        loop {
                            match pool.call_async(i).await {
                                Ok(reply) => {
                                    black_box(reply);
                                    break;
                                }
                                Err(Error::Overload) => tokio::task::yield_now().await,
                                Err(other) => panic!("{other}"),
                            }
                        }
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.unwrap();
        }
        start.elapsed()
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let mut criterion = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    let rt = runtime();
    let pools = [
        ("no_stealing", echo_pool(&rt, false)),
        ("stealing", echo_pool(&rt, true)),
    ];
    for tasks in [1u64, 64] {
        let mut group = criterion.benchmark_group(format!("async_call_{tasks}task"));
        for (name, pool) in &pools {
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| fan_out(&rt, pool, tasks, iters))
            });
        }
        group.finish();
    }
    criterion.final_summary();

    println!("\n== async dispatch: measured side by side in this run (2-thread runtime) ==");
    println!(
        "head-of-line: 2 workers, capacity 64, {REQUESTS} requests one every {} µs, 20 µs of CPU each, a 50 ms await every 200th; latency of the fast ones",
        GAP.as_micros()
    );
    let rows = [
        ("async pool, no stealing", hol_pool(false)),
        ("async pool, stealing", hol_pool(true)),
        ("shared tokio channel", hol_shared_channel()),
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

    // Round trips, stealing off and on interleaved, 7 rounds, medians.
    const ROUNDS: usize = 7;
    for (tasks, round) in [(1u64, 20_000u64), (64, 100_000)] {
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..ROUNDS {
            for (i, (_, pool)) in pools.iter().enumerate() {
                times[i].push(fan_out(&rt, pool, tasks, round).as_nanos() as f64 / round as f64);
            }
        }
        let [off, on] = times.map(median);
        println!(
            "call_async round trip, {tasks} task(s), 2 workers: no stealing {off:.0} ns | stealing {on:.0} ns | ratio stealing / no stealing = {:.3}  (target <= 1.05)",
            on / off
        );
    }
}
