//! `call` round trip and `cast` cost, each beside its peers, in one run.
//!
//! Peers: a raw crossbeam-channel request with a oneshot reply to a thread
//! (what the pool is made of, used naively), and two threads handing a
//! value back and forth through one atomic while both spin (the physical
//! limit of a cross-core round trip). After criterion's groups, a ratio
//! table is printed from side-by-side timings taken in this same process.

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{cpu_time, ns_per_op};
use criterion::{criterion_group, BenchmarkId, Criterion};
use crossbeam_channel::{unbounded, Sender};
use sidejob::{Pool, Worker};

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

fn echo_pool(capacity: usize, workers: usize) -> Pool<Echo> {
    Pool::builder()
        .name("bench")
        .capacity(capacity)
        .workers(workers)
        .build(|_| Echo)
        .unwrap()
}

/// A raw server: requests with a oneshot reply slot over crossbeam.
struct RawServer {
    requests: Option<Sender<(u64, oneshot::Sender<u64>)>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl RawServer {
    fn start() -> Self {
        let (requests, inbox) = unbounded::<(u64, oneshot::Sender<u64>)>();
        let thread = thread::spawn(move || {
            for (n, reply) in inbox {
                let _ = reply.send(n + 1);
            }
        });
        RawServer {
            requests: Some(requests),
            thread: Some(thread),
        }
    }

    fn call(&self, n: u64) -> u64 {
        let (reply, answer) = oneshot::channel();
        self.requests.as_ref().unwrap().send((n, reply)).unwrap();
        answer.recv().unwrap()
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.requests.take();
        let _ = self.thread.take().unwrap().join();
    }
}

/// The same raw channels, but both sides spin instead of parking: the best
/// the pool's building blocks can do with no admission and no stats.
struct SpinningRawServer {
    requests: Option<Sender<(u64, oneshot::Sender<u64>)>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl SpinningRawServer {
    fn start() -> Self {
        let (requests, inbox) = unbounded::<(u64, oneshot::Sender<u64>)>();
        let thread = thread::spawn(move || loop {
            match inbox.try_recv() {
                Ok((n, reply)) => {
                    let _ = reply.send(n + 1);
                }
                Err(crossbeam_channel::TryRecvError::Empty) => std::hint::spin_loop(),
                Err(crossbeam_channel::TryRecvError::Disconnected) => return,
            }
        });
        SpinningRawServer {
            requests: Some(requests),
            thread: Some(thread),
        }
    }

    fn call(&self, n: u64) -> u64 {
        let (reply, answer) = oneshot::channel();
        self.requests.as_ref().unwrap().send((n, reply)).unwrap();
        loop {
            match answer.try_recv() {
                Ok(value) => return value,
                Err(oneshot::TryRecvError::Empty) => std::hint::spin_loop(),
                Err(oneshot::TryRecvError::Disconnected) => panic!("server gone"),
            }
        }
    }
}

impl Drop for SpinningRawServer {
    fn drop(&mut self) {
        self.requests.take();
        let _ = self.thread.take().unwrap().join();
    }
}

/// Two threads passing a counter through one atomic, both spinning.
struct SpinServer {
    cell: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
}

const STOP: u64 = u64::MAX;

impl SpinServer {
    fn start() -> Self {
        let cell = Arc::new(AtomicU64::new(0));
        let server = cell.clone();
        let thread = thread::spawn(move || loop {
            let seen = server.load(Ordering::Acquire);
            if seen == STOP {
                return;
            }
            if seen % 2 == 1 {
                server.store(seen + 1, Ordering::Release);
            } else {
                std::hint::spin_loop();
            }
        });
        SpinServer {
            cell,
            thread: Some(thread),
        }
    }

    /// One round trip: post an odd value, spin until it comes back even.
    fn call(&self) {
        let base = self.cell.load(Ordering::Relaxed);
        self.cell.store(base + 1, Ordering::Release);
        while self.cell.load(Ordering::Acquire) != base + 2 {
            std::hint::spin_loop();
        }
    }
}

impl Drop for SpinServer {
    fn drop(&mut self) {
        self.cell.store(STOP, Ordering::Release);
        let _ = self.thread.take().unwrap().join();
    }
}

/// A raw consumer thread draining an unbounded channel.
struct RawConsumer {
    sender: Option<Sender<u64>>,
    done: Arc<AtomicUsize>,
    thread: Option<thread::JoinHandle<()>>,
}

impl RawConsumer {
    fn start() -> Self {
        let (sender, inbox) = unbounded::<u64>();
        let done = Arc::new(AtomicUsize::new(0));
        let counter = done.clone();
        let thread = thread::spawn(move || {
            for n in inbox {
                black_box(n);
                counter.fetch_add(1, Ordering::Release);
            }
        });
        RawConsumer {
            sender: Some(sender),
            done,
            thread: Some(thread),
        }
    }

    /// Sends `n` messages and waits until all are consumed.
    fn burst(&self, n: u64) {
        let target = self.done.load(Ordering::Acquire) + n as usize;
        let sender = self.sender.as_ref().unwrap();
        for i in 0..n {
            sender.send(i).unwrap();
        }
        while self.done.load(Ordering::Acquire) < target {
            std::hint::spin_loop();
        }
    }
}

impl Drop for RawConsumer {
    fn drop(&mut self) {
        self.sender.take();
        let _ = self.thread.take().unwrap().join();
    }
}

/// Casts `n` messages and waits until the pool has handled them all.
fn pool_burst(pool: &Pool<Echo>, n: u64) {
    for i in 0..n {
        pool.cast(i).unwrap();
    }
    // Every cast holds a unit until handled: usage 0 means all are done.
    while pool.usage() > 0 {
        std::hint::spin_loop();
    }
}

const BURST: u64 = 1024;

fn call_round_trip(c: &mut Criterion) {
    let mut group = c.benchmark_group("call_round_trip_1caller");
    let pool = echo_pool(1024, 1);
    group.bench_function(BenchmarkId::new("sidejob_call", 1), |b| {
        b.iter(|| pool.call(black_box(1)).unwrap())
    });
    drop(pool);
    let raw = RawServer::start();
    group.bench_function(BenchmarkId::new("raw_crossbeam_oneshot", 1), |b| {
        b.iter(|| raw.call(black_box(1)))
    });
    drop(raw);
    let raw = SpinningRawServer::start();
    group.bench_function(BenchmarkId::new("raw_crossbeam_oneshot_spinning", 1), |b| {
        b.iter(|| raw.call(black_box(1)))
    });
    drop(raw);
    let spin = SpinServer::start();
    group.bench_function(BenchmarkId::new("spin_handoff", 1), |b| {
        b.iter(|| spin.call())
    });
    drop(spin);
    group.finish();
}

fn cast_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("cast_per_message_while_draining");
    group.throughput(criterion::Throughput::Elements(BURST));
    let pool = echo_pool(1 << 20, 1);
    group.bench_function(BenchmarkId::new("sidejob_cast", BURST), |b| {
        b.iter(|| pool_burst(&pool, BURST))
    });
    drop(pool);
    let raw = RawConsumer::start();
    group.bench_function(BenchmarkId::new("raw_unbounded_send", BURST), |b| {
        b.iter(|| raw.burst(BURST))
    });
    drop(raw);
    group.finish();
}

/// Total calls per second from `callers` threads, each running `per` calls.
fn callers_throughput(callers: usize, per: u64, call: impl Fn(u64) + Sync) -> f64 {
    let start = Barrier::new(callers + 1);
    let end = Barrier::new(callers + 1);
    thread::scope(|scope| {
        for _ in 0..callers {
            scope.spawn(|| {
                start.wait();
                for i in 0..per {
                    call(i);
                }
                end.wait();
            });
        }
        start.wait();
        let began = Instant::now();
        end.wait();
        (callers as u64 * per) as f64 / began.elapsed().as_secs_f64()
    })
}

fn two_callers(c: &mut Criterion) {
    let mut group = c.benchmark_group("call_2callers_2workers");
    group.sample_size(10);
    let pool = echo_pool(1024, 2);
    group.bench_function(BenchmarkId::new("sidejob_call", 2), |b| {
        b.iter_custom(|iters| {
            let per = iters.div_ceil(2);
            let rate = callers_throughput(2, per, |i| {
                pool.call(i).unwrap();
            });
            Duration::from_secs_f64(iters as f64 / rate)
        })
    });
    drop(pool);
    let servers = [RawServer::start(), RawServer::start()];
    let next = AtomicUsize::new(0);
    group.bench_function(BenchmarkId::new("raw_crossbeam_oneshot", 2), |b| {
        b.iter_custom(|iters| {
            let per = iters.div_ceil(2);
            let rate = callers_throughput(2, per, |i| {
                // Each caller sticks to "its" server, as the pool's probe does.
                let k = (i as usize + next.load(Ordering::Relaxed)) % 2;
                servers[k].call(i);
            });
            Duration::from_secs_f64(iters as f64 / rate)
        })
    });
    group.finish();
}

fn ratio_table() {
    println!("\n== call / cast: ratios measured side by side in this run ==");
    let pool = echo_pool(1024, 1);
    let ours_call = ns_per_op(50_000, || {
        pool.call(black_box(1)).unwrap();
    });
    drop(pool);
    let raw = RawServer::start();
    let raw_call = ns_per_op(50_000, || {
        raw.call(black_box(1));
    });
    drop(raw);
    let raw = SpinningRawServer::start();
    let raw_spinning_call = ns_per_op(50_000, || {
        raw.call(black_box(1));
    });
    drop(raw);
    let spin = SpinServer::start();
    let spin_call = ns_per_op(200_000, || spin.call());
    drop(spin);

    let pool = echo_pool(1 << 20, 1);
    let ours_cast = ns_per_op(100, || pool_burst(&pool, BURST)) / BURST as f64;
    drop(pool);
    let raw = RawConsumer::start();
    let raw_cast = ns_per_op(100, || raw.burst(BURST)) / BURST as f64;
    drop(raw);

    let pool = echo_pool(1024, 2);
    let ours_2 = callers_throughput(2, 200_000, |i| {
        pool.call(i).unwrap();
    });
    drop(pool);
    let servers = [RawServer::start(), RawServer::start()];
    let turn = AtomicUsize::new(0);
    let raw_2 = callers_throughput(2, 200_000, |i| {
        let k = (i as usize + turn.load(Ordering::Relaxed)) % 2;
        servers[k].call(i);
    });
    drop(servers);

    println!(
        "call round trip, 1 caller: sidejob {ours_call:.0} ns | raw crossbeam+oneshot {raw_call:.0} ns (parks) | same, spinning {raw_spinning_call:.0} ns | spin handoff {spin_call:.0} ns"
    );
    println!(
        "  ratio sidejob/raw   = {:.2}  (target <= 1.2)",
        ours_call / raw_call
    );
    println!(
        "  ratio sidejob/raw spinning = {:.2}  (what admission, stats and the bounded spin add)",
        ours_call / raw_spinning_call
    );
    println!(
        "  ratio sidejob/spin  = {:.2}  (target <= 5)",
        ours_call / spin_call
    );
    println!(
        "  calls/s, 1 caller: sidejob {:.0}k vs Erlang sidejob:call ~520k",
        1e6 / ours_call
    );
    println!("cast per message while draining: sidejob {ours_cast:.1} ns | raw unbounded send {raw_cast:.1} ns");
    println!(
        "  ratio sidejob/raw   = {:.2}  (target <= 2)",
        ours_cast / raw_cast
    );
    println!(
        "calls/s, 2 callers + 2 workers: sidejob {:.0}k | raw channels {:.0}k | Erlang sidejob ~920k",
        ours_2 / 1e3,
        raw_2 / 1e3
    );
    println!("  ratio sidejob/raw   = {:.2}", ours_2 / raw_2);

    // An idle pool must cost no CPU: its workers park after a short spin.
    let pool = echo_pool(1024, 2);
    pool.call(1).unwrap();
    if let Some(before) = cpu_time() {
        thread::sleep(Duration::from_secs(1));
        if let Some(after) = cpu_time() {
            println!(
                "idle pool (2 workers) for 1 s: {} ms of CPU (resolution 10 ms)",
                (after - before).as_millis()
            );
        }
    }
    drop(pool);
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = call_round_trip, cast_cost, two_callers
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratio_table();
}
