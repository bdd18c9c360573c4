//! The async pool against the tokio actor idiom and the thread pool,
//! measured side by side in one run.
//!
//! | group          | ours                                         | peers |
//! |----------------|----------------------------------------------|-------|
//! | `call_1task`   | `AsyncPool::call_async` round trip, 1 task   | actor (one task per worker, bounded `mpsc` + `oneshot`); thread `Pool::call_async` |
//! | `call_64tasks` | the same from 64 tasks at once               | the same |
//! | `cast`         | `AsyncPool::try_cast` stream, 1 producer     | actor `try_send` at the same bound |
//! | `io_load`      | 256 callers, each request awaits a 1 ms timer, capacity 256, default workers | thread `Pool` (default workers, handler sleeps 1 ms) |
//!
//! Every case runs on a 2-thread multi-thread runtime; the pools and the
//! actors have 2 workers (the thread pool's default here), capacity 64
//! (32 per actor mailbox), except `io_load`. Criterion times each case;
//! then a ratio table ours/peer is printed, measured again with ours and
//! the peers interleaved (median of several rounds), and the `io_load`
//! table (requests/s and p99 latency over 2 s each).
//!
//! Run: `cargo bench --no-run --all-features --bench async_pool`, then
//! `target/release/deps/async_pool-<hash> --bench`.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::median;
use criterion::{BenchmarkId, Criterion};
use sidejob::{AsyncPool, AsyncWorker, Error, Pool, Worker};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

/// A case in `iter_custom` form: run `iters` operations, return the time.
type Routine = Box<dyn FnMut(u64) -> Duration>;

const WORKERS: usize = 2;
const CAPACITY: usize = 64;

/// The trivial handler every case but `io_load` uses.
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

impl Worker for Echo {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    fn handle_call(&mut self, n: u64) -> u64 {
        n
    }
    fn handle_cast(&mut self, n: u64) {
        black_box(n);
    }
}

/// What an actor's mailbox carries.
enum ActorMsg {
    Call(u64, oneshot::Sender<u64>),
    Cast(u64),
}

/// The tokio actor idiom: one task per worker owning its state, fed by a
/// bounded `mpsc`, answering through a `oneshot`.
#[derive(Clone)]
struct Actors {
    senders: Arc<[mpsc::Sender<ActorMsg>]>,
}

impl Actors {
    fn start(rt: &Runtime, workers: usize, bound: usize) -> Self {
        let senders: Vec<_> = (0..workers)
            .map(|_| {
                let (tx, mut rx) = mpsc::channel::<ActorMsg>(bound);
                rt.spawn(async move {
                    let mut state = Echo;
                    while let Some(msg) = rx.recv().await {
                        match msg {
                            ActorMsg::Call(n, reply) => {
                                let _ = reply.send(AsyncWorker::handle_call(&mut state, n).await);
                            }
                            ActorMsg::Cast(n) => AsyncWorker::handle_cast(&mut state, n).await,
                        }
                    }
                });
                tx
            })
            .collect();
        Actors {
            senders: senders.into(),
        }
    }

    async fn call(&self, which: usize, n: u64) -> u64 {
        let (tx, rx) = oneshot::channel();
        let sender = &self.senders[which % self.senders.len()];
        if sender.send(ActorMsg::Call(n, tx)).await.is_err() {
            panic!("actor gone");
        }
        rx.await.unwrap()
    }
}

fn runtime() -> Arc<Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    )
}

/// Runs `calls` round trips spread over `tasks` tasks; the span.
fn fan_out<F, Fut>(rt: &Runtime, tasks: u64, calls: u64, call: F) -> Duration
where
    F: Fn(u64, u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    rt.block_on(async move {
        let per_task = calls.div_ceil(tasks);
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let call = call.clone();
                tokio::spawn(async move {
                    for i in 0..per_task {
                        call(t, i).await;
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

/// Calls until admitted (a pool of capacity 64 under 64 tasks admits
/// every call but, rarely, one whose probe saw every shard full).
async fn call_async_pool(pool: &AsyncPool<Echo>, n: u64) {
    loop {
        match pool.call_async(n).await {
            Ok(reply) => {
                black_box(reply);
                return;
            }
            Err(Error::Overload) => tokio::task::yield_now().await,
            Err(other) => panic!("{other}"),
        }
    }
}

async fn call_thread_pool(pool: &Pool<Echo>, n: u64) {
    loop {
        match pool.call_async(n).await {
            Ok(reply) => {
                black_box(reply);
                return;
            }
            Err(Error::Overload) => tokio::task::yield_now().await,
            Err(other) => panic!("{other}"),
        }
    }
}

struct Case {
    group: &'static str,
    ours: (&'static str, Routine),
    peers: Vec<(&'static str, Routine)>,
    round: u64,
}

fn call_case(group: &'static str, tasks: u64) -> Case {
    let rt = runtime();
    let async_pool = {
        let _guard = rt.enter();
        Pool::builder()
            .capacity(CAPACITY)
            .workers(WORKERS)
            .build_async(|_| Echo)
            .unwrap()
    };
    let async_default = {
        let _guard = rt.enter();
        Pool::builder()
            .capacity(CAPACITY)
            .build_async(|_| Echo)
            .unwrap()
    };
    let actors = Actors::start(&rt, WORKERS, CAPACITY / WORKERS);
    let thread_pool = Pool::builder()
        .capacity(CAPACITY)
        .workers(WORKERS)
        .build(|_| Echo)
        .unwrap();
    let (rt1, rt2, rt3, rt4) = (rt.clone(), rt.clone(), rt.clone(), rt);
    Case {
        group,
        ours: (
            "async_pool",
            Box::new(move |iters| {
                let pool = async_pool.clone();
                fan_out(&rt1, tasks, iters, move |_, i| {
                    let pool = pool.clone();
                    async move { call_async_pool(&pool, i).await }
                })
            }),
        ),
        peers: vec![
            (
                "tokio_actor",
                Box::new(move |iters| {
                    let actors = actors.clone();
                    fan_out(&rt2, tasks, iters, move |t, i| {
                        let actors = actors.clone();
                        async move {
                            // Each task keeps to one actor (the most
                            // favourable choice for the actor: its
                            // wake-ups stay on one task pair).
                            black_box(actors.call(t as usize, i).await);
                        }
                    })
                }),
            ),
            (
                "thread_pool",
                Box::new(move |iters| {
                    let pool = thread_pool.clone();
                    fan_out(&rt3, tasks, iters, move |_, i| {
                        let pool = pool.clone();
                        async move { call_thread_pool(&pool, i).await }
                    })
                }),
            ),
            (
                "async_pool_default_workers",
                Box::new(move |iters| {
                    let pool = async_default.clone();
                    fan_out(&rt4, tasks, iters, move |_, i| {
                        let pool = pool.clone();
                        async move { call_async_pool(&pool, i).await }
                    })
                }),
            ),
        ],
        round: if tasks == 1 { 20_000 } else { 100_000 },
    }
}

fn cast_case() -> Case {
    let rt = runtime();
    // One worker, one mailbox, the same bound on both sides.
    let pool = {
        let _guard = rt.enter();
        Pool::builder()
            .capacity(CAPACITY)
            .workers(1)
            .build_async(|_| Echo)
            .unwrap()
    };
    let actors = Actors::start(&rt, 1, CAPACITY);
    let (rt1, rt2) = (rt.clone(), rt);
    Case {
        group: "cast",
        ours: (
            "async_pool_try_cast",
            Box::new(move |iters| {
                let pool = pool.clone();
                // The producer is a task of the runtime, as the worker is.
                let producer = rt1.spawn(async move {
                    let start = Instant::now();
                    for i in 0..iters {
                        let mut message = i;
                        // Full: retry at the consumer's pace.
                        while let Err(refused) = pool.try_cast(message) {
                            message = refused.into_inner();
                            tokio::task::yield_now().await;
                        }
                    }
                    // The worker handles in order: this call comes last.
                    call_async_pool(&pool, 0).await;
                    start.elapsed()
                });
                rt1.block_on(producer).unwrap()
            }),
        ),
        peers: vec![(
            "tokio_actor_try_send",
            Box::new(move |iters| {
                let actors = actors.clone();
                let producer = rt2.spawn(async move {
                    let sender = &actors.senders[0];
                    let start = Instant::now();
                    for i in 0..iters {
                        let mut message = ActorMsg::Cast(i);
                        while let Err(err) = sender.try_send(message) {
                            message = match err {
                                mpsc::error::TrySendError::Full(m) => m,
                                mpsc::error::TrySendError::Closed(_) => panic!("actor gone"),
                            };
                            tokio::task::yield_now().await;
                        }
                    }
                    actors.call(0, 0).await;
                    start.elapsed()
                });
                rt2.block_on(producer).unwrap()
            }),
        )],
        round: 200_000,
    }
}

/// The I/O-bound handler: each request awaits a 1 ms timer.
struct Io;

impl AsyncWorker for Io {
    type Request = ();
    type Reply = ();
    type Message = ();
    async fn handle_call(&mut self, _: ()) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    async fn handle_cast(&mut self, _: ()) {}
}

/// Its blocking twin for the thread pool.
struct BlockingIo;

impl Worker for BlockingIo {
    type Request = ();
    type Reply = ();
    type Message = ();
    fn handle_call(&mut self, _: ()) {
        std::thread::sleep(Duration::from_millis(1));
    }
    fn handle_cast(&mut self, _: ()) {}
}

const IO_CAPACITY: usize = 256;
const IO_CALLERS: usize = 256;
const IO_SPAN: Duration = Duration::from_secs(2);

/// Requests/s, p50 and p99 of the admitted calls, and how many were refused.
type Load = (f64, Duration, Duration, u64);

/// 256 callers call in a loop for `IO_SPAN`; what they saw.
fn io_load<F, Fut>(rt: &Runtime, call: F) -> Load
where
    F: Fn() -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<(), Error>> + Send,
{
    rt.block_on(async move {
        let start = Instant::now();
        let handles: Vec<_> = (0..IO_CALLERS)
            .map(|_| {
                let call = call.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut refused = 0u64;
                    while start.elapsed() < IO_SPAN {
                        let began = Instant::now();
                        match call().await {
                            Ok(()) => latencies.push(began.elapsed()),
                            Err(Error::Overload) => {
                                refused += 1;
                                tokio::task::yield_now().await;
                            }
                            Err(other) => panic!("{other}"),
                        }
                    }
                    (latencies, refused)
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut refused = 0;
        for handle in handles {
            let (latencies, r) = handle.await.unwrap();
            all.extend(latencies);
            refused += r;
        }
        let span = start.elapsed();
        all.sort_unstable();
        let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
        (
            all.len() as f64 / span.as_secs_f64(),
            at(0.5),
            at(0.99),
            refused,
        )
    })
}

fn main() {
    let mut criterion = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    let mut cases = vec![
        call_case("call_1task", 1),
        call_case("call_64tasks", 64),
        cast_case(),
    ];

    for case in &mut cases {
        let mut group = criterion.benchmark_group(case.group);
        let Case { ours, peers, .. } = case;
        for (name, routine) in std::iter::once(ours).chain(peers.iter_mut()) {
            group.bench_function(BenchmarkId::from_parameter(*name), |b| {
                b.iter_custom(&mut *routine)
            });
        }
        group.finish();
    }

    // The ratio table: ours and each peer interleaved, 7 rounds, medians.
    const ROUNDS: usize = 7;
    println!();
    println!("async_pool: ours / peer, measured side by side in this run (2-thread runtime)");
    println!(
        "{:<14} {:<20} {:<28} {:>11} {:>11} {:>8}",
        "group", "ours", "peer", "ours ns/op", "peer ns/op", "ratio"
    );
    for case in &mut cases {
        let round = case.round;
        let mut ours = Vec::new();
        let mut peers: Vec<Vec<f64>> = vec![Vec::new(); case.peers.len()];
        for _ in 0..ROUNDS {
            ours.push((case.ours.1)(round).as_nanos() as f64 / round as f64);
            for (i, (_, routine)) in case.peers.iter_mut().enumerate() {
                peers[i].push(routine(round).as_nanos() as f64 / round as f64);
            }
        }
        let ours = median(ours);
        for ((name, _), times) in case.peers.iter().zip(peers) {
            let peer = median(times);
            println!(
                "{:<14} {:<20} {:<28} {:>11.1} {:>11.1} {:>7.2}x",
                case.group,
                case.ours.0,
                name,
                ours,
                peer,
                ours / peer,
            );
        }
    }

    // I/O-bound load.
    let rt = runtime();
    let async_pool = {
        let _guard = rt.enter();
        Pool::builder()
            .capacity(IO_CAPACITY)
            .build_async(|_| Io)
            .unwrap()
    };
    let thread_pool = Pool::builder()
        .capacity(IO_CAPACITY)
        .build(|_| BlockingIo)
        .unwrap();
    println!();
    println!(
        "io_load: {IO_CALLERS} callers, capacity {IO_CAPACITY}, each request awaits 1 ms, {:?} each",
        IO_SPAN
    );
    println!(
        "{:<34} {:>8} {:>12} {:>10} {:>10} {:>9}",
        "pool", "workers", "requests/s", "p50", "p99", "refused"
    );
    let rows: Vec<(String, usize, Load)> = vec![
        {
            let pool = async_pool.clone();
            let result = io_load(&rt, move || {
                let pool = pool.clone();
                async move { pool.call_async(()).await }
            });
            (
                "async pool (default workers)".into(),
                async_pool.workers(),
                result,
            )
        },
        {
            let pool = thread_pool.clone();
            let result = io_load(&rt, move || {
                let pool = pool.clone();
                async move { pool.call_async(()).await }
            });
            (
                "thread pool (default workers)".into(),
                thread_pool.workers(),
                result,
            )
        },
    ];
    for (name, workers, (rps, p50, p99, refused)) in &rows {
        println!(
            "{:<34} {:>8} {:>12.0} {:>10.2?} {:>10.2?} {:>9}",
            name, workers, rps, p50, p99, refused
        );
    }
    println!(
        "async / thread: {:.1}x the requests/s, {:.3}x the p99",
        rows[0].2 .0 / rows[1].2 .0,
        rows[0].2 .2.as_secs_f64() / rows[1].2 .2.as_secs_f64()
    );
    criterion.final_summary();
}
