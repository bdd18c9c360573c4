//! Dispatch in the async pool: where a queued request runs, and what the
//! round trip costs beside the tokio actor idiom it replaces. Each figure
//! beside its peers, in one run, on a 2-thread tokio runtime.
//!
//! * Head-of-line: 2 workers, capacity 64, a paced stream of 20 µs requests
//!   (CPU work) with one 50 ms request (an await: a slow reply from a
//!   server) in every 200; latency (queue + service) of the fast ones: the
//!   async pool by default (one queue every free worker takes from), with
//!   `steal(false)` (each worker its own mailbox), and one shared tokio
//!   channel both worker tasks pull from (the ideal for latency: any free
//!   worker takes the next request).
//! * The `call_async` round trip (2 workers, capacity 64, an echo handler;
//!   and the default worker count, one per unit of capacity: 64)
//!   from 1 task and from 64, beside the actor idiom: 2 tasks each owning
//!   its state, each fed by a bounded tokio `mpsc` of 32 (the same bound),
//!   replying through a tokio `oneshot`; a calling task keeps to one actor
//!   (the idiom's most favourable choice). Criterion times each, then the
//!   ratio table: interleaved rounds in this process, medians, and the
//!   same again in fresh processes (a cross-core round trip settles per
//!   process, see `common::in_fresh_processes`).
//!
//! Run: `cargo bench --all-features --bench async_dispatch`.
//!
//! Instructions per round trip, exact on a busy machine:
//! `scripts/round-trip-instructions.sh` runs this executable's `probe`
//! mode (`async_dispatch-<hash> probe <contender> <tasks> <calls>
//! <ct|mt1>`: the round trips alone, on a one-thread runtime of either
//! scheduler) under callgrind.

mod common;

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::head_of_line::{offer_stream, summarize, Job, Latency, GAP, REQUESTS};
use criterion::{BenchmarkId, Criterion};
use sidejob::{AsyncPool, AsyncWorker, Error, Pool, PoolBuilder};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

/// Workers of every round-trip contender.
const WORKERS: usize = 2;
/// The bound of every round-trip contender.
const CAPACITY: usize = 64;

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

fn hol_pool(steal: Option<bool>) -> Latency {
    let rt = common::two_thread_runtime();
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let pool = {
        let latencies = latencies.clone();
        let mut builder = Pool::builder();
        builder.name("hol").capacity(64).workers(2);
        if let Some(steal) = steal {
            builder.steal(steal);
        }
        builder
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
    let rt = common::two_thread_runtime();
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

/// What an actor's mailbox carries: a request and where its reply goes.
type ActorMsg = (u64, oneshot::Sender<u64>);

/// The round-trip contenders.
#[derive(Clone)]
enum Contender {
    /// The async pool as built by default.
    Pool(AsyncPool<Echo>),
    /// The tokio actor idiom: one task per worker owning its state, each
    /// fed by its own bounded `mpsc`, replying through a `oneshot`.
    Actors(Arc<[mpsc::Sender<ActorMsg>]>),
}

impl Contender {
    /// The contender named `name` ("pool", "pool_own", "pool_dflt",
    /// "actor"), started on `rt`. "pool_dflt" leaves the worker count to
    /// the builder's default: one per unit of capacity, so `CAPACITY`.
    fn start(rt: &Runtime, name: &str) -> Contender {
        match name {
            "pool" | "pool_own" | "pool_dflt" => {
                let mut builder = Pool::builder();
                builder.capacity(CAPACITY);
                if name != "pool_dflt" {
                    builder.workers(WORKERS);
                }
                if name == "pool_own" {
                    builder.steal(false);
                }
                Contender::Pool(builder.build_async_on(rt.handle(), |_| Echo).unwrap())
            }
            "actor" => {
                let senders: Vec<_> = (0..WORKERS)
                    .map(|_| {
                        let (tx, mut rx) = mpsc::channel::<ActorMsg>(CAPACITY / WORKERS);
                        rt.spawn(async move {
                            let mut state = Echo;
                            while let Some((n, reply)) = rx.recv().await {
                                let _ = reply.send(state.handle_call(n).await);
                            }
                        });
                        tx
                    })
                    .collect();
                Contender::Actors(senders.into())
            }
            other => panic!("no contender {other:?}"),
        }
    }

    /// One round trip from task `task`.
    async fn call(&self, task: u64, n: u64) -> u64 {
        match self {
            Contender::Pool(pool) => loop {
                match pool.call_async(n).await {
                    Ok(reply) => break reply,
                    // 64 tasks at capacity 64 are never refused; kept for
                    // a reader who changes the figures.
                    Err(Error::Overload) => tokio::task::yield_now().await,
                    Err(other) => panic!("{other}"),
                }
            },
            Contender::Actors(senders) => {
                let (tx, rx) = oneshot::channel();
                let sender = &senders[task as usize % senders.len()];
                if sender.send((n, tx)).await.is_err() {
                    panic!("actor gone");
                }
                rx.await.unwrap()
            }
        }
    }
}

/// `calls` round trips spread over `tasks` tasks; the span.
fn fan_out(rt: &Runtime, contender: &Contender, tasks: u64, calls: u64) -> Duration {
    let contender = contender.clone();
    rt.block_on(async move {
        let per_task = calls.div_ceil(tasks);
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let contender = contender.clone();
                tokio::spawn(async move {
                    for i in 0..per_task {
                        black_box(contender.call(task, i).await);
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

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The contenders of the round-trip table, in its order: the idiom first.
const NAMES: [(&str, &str); 4] = [
    ("actor", "tokio actor (mpsc + oneshot)"),
    ("pool", "async pool, default"),
    ("pool_own", "async pool, steal(false)"),
    ("pool_dflt", "async pool, 64 workers (the default count)"),
];

/// Calls per timed run: (tasks, calls).
const ROUND_TRIPS: [(u64, u64); 2] = [(1, 20_000), (64, 100_000)];

/// ns per round trip of each contender (in [`NAMES`]' order), from
/// `tasks` tasks: the median of `rounds` interleaved runs of `calls`.
fn round_trip_row(
    rt: &Runtime,
    contenders: &[Contender],
    tasks: u64,
    calls: u64,
    rounds: usize,
) -> Vec<f64> {
    let mut times = vec![Vec::new(); contenders.len()];
    for _ in 0..rounds {
        for (i, contender) in contenders.iter().enumerate() {
            times[i].push(fan_out(rt, contender, tasks, calls).as_nanos() as f64 / calls as f64);
        }
    }
    times.into_iter().map(common::median).collect()
}

/// `probe <contender> <tasks> <calls> <runtime> [time]`: only the round
/// trips. `<runtime>` is `ct` (current-thread) or `mt1` (the multi-thread
/// scheduler with one worker thread: the pool's multi-thread path, still
/// one thread, so callgrind counts the same instructions every run), or
/// `mt` (the bench's 2-thread runtime). With `time`, every contender is
/// started (as in the ratio table) and the named one's ns per round trip
/// printed for 5 runs, for a profiler.
fn probe(args: &[String]) {
    let usage = "usage: probe <actor|pool|pool_own|pool_dflt> <tasks> <calls> <ct|mt1|mt> [time]";
    let (name, tasks, calls, flavor, time) = match args {
        [name, tasks, calls, flavor] => (name, tasks, calls, flavor, false),
        [name, tasks, calls, flavor, time] if time == "time" => (name, tasks, calls, flavor, true),
        _ => panic!("{usage}"),
    };
    let (tasks, calls) = (tasks.parse().unwrap(), calls.parse().unwrap());
    let rt = match flavor.as_str() {
        "ct" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        "mt1" => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
        "mt" => common::two_thread_runtime(),
        _ => panic!("{usage}"),
    };
    if !time {
        let contender = Contender::start(&rt, name);
        fan_out(&rt, &contender, tasks, calls);
        return;
    }
    let all: Vec<_> = NAMES
        .iter()
        .map(|(other, _)| Contender::start(&rt, other))
        .collect();
    let at = NAMES
        .iter()
        .position(|(other, _)| other == name)
        .expect("a contender's name");
    for _ in 0..5 {
        let span = fan_out(&rt, &all[at], tasks, calls);
        println!(
            "{name} {tasks}: {:.0} ns",
            span.as_nanos() as f64 / calls as f64
        );
    }
}

/// `harness [key=value ...]`: the independent harness of issue 39 item
/// 12b, for finding which conditions move the one-task ratio. A tokio
/// runtime (`rt=mt2`, the default: multi-thread with 2 worker threads;
/// `mt1`; `ct`), a pool built as a user would (`capacity=64`, `workers=`
/// unset: the default, one per unit of capacity; `steal=1`,
/// `probe=thread|cpu`), and beside it the actor idiom with ONE actor task
/// (a bounded `mpsc` of `capacity`, a `oneshot` reply), both answering
/// with the number of the thread that ran the handler. `tasks=1` callers,
/// spawned (`caller=spawn`) or the `block_on` future itself
/// (`caller=block_on`, one task only), `calls=20000` round trips per run,
/// `rounds=9` interleaved rounds, `first=actor|pool` (`only=pool|actor`:
/// one run of that side alone, printing nothing, for callgrind). Prints, for the
/// pool then the actor, the median ns per round trip and the share of
/// handlers run on another thread than the caller's, then the ratio of
/// the medians, on its last line.
fn harness(args: &[String]) {
    let mut rt_flavor = "mt2".to_string();
    let (mut capacity, mut workers, mut steal, mut probe_cpu) = (64usize, None, true, false);
    let (mut tasks, mut calls, mut rounds) = (1u64, 20_000u64, 9usize);
    let (mut block_on, mut actor_first, mut only) = (false, true, None);
    for arg in args {
        let (key, value) = arg.split_once('=').expect("key=value");
        match key {
            "rt" => rt_flavor = value.to_string(),
            "capacity" => capacity = value.parse().unwrap(),
            "workers" => workers = Some(value.parse().unwrap()),
            "steal" => steal = value == "1",
            "probe" => probe_cpu = value == "cpu",
            "tasks" => tasks = value.parse().unwrap(),
            "calls" => calls = value.parse().unwrap(),
            "rounds" => rounds = value.parse().unwrap(),
            "caller" => block_on = value == "block_on",
            "first" => actor_first = value == "actor",
            "only" => only = Some(value == "pool"),
            other => panic!("no key {other:?}"),
        }
    }
    let rt = match rt_flavor.as_str() {
        "ct" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        "mt1" => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
        "mt2" => common::two_thread_runtime(),
        other => panic!("no runtime {other:?}"),
    };
    let mut builder = Pool::builder();
    builder.capacity(capacity).steal(steal);
    if let Some(workers) = workers {
        builder.workers(workers);
    }
    if probe_cpu {
        builder.probe(sidejob::probe::Probe::Cpu);
    }
    let build = |builder: &PoolBuilder| builder.build_async_on(rt.handle(), |_| Where).unwrap();
    let (pool, actor) = if actor_first {
        let actor = where_actor(&rt, capacity);
        (build(&builder), actor)
    } else {
        let pool = build(&builder);
        (pool, where_actor(&rt, capacity))
    };
    // Runs `calls` round trips from `tasks` tasks; ns per round trip, and
    // the share of them handled on another thread than the caller's.
    let run = |pool_side: bool| -> (f64, f64) {
        let one = {
            let (pool, actor) = (pool.clone(), actor.clone());
            move |n: u64| {
                let (pool, actor) = (pool.clone(), actor.clone());
                async move {
                    if pool_side {
                        loop {
                            match pool.call_async(n).await {
                                Ok(reply) => break reply,
                                // Seen from 64 tasks at capacity 64 with
                                // 64 workers (a unit is always free).
                                Err(Error::Overload) => tokio::task::yield_now().await,
                                Err(other) => panic!("{other}"),
                            }
                        }
                    } else {
                        let (tx, rx) = oneshot::channel();
                        actor.send((n, tx)).await.ok().unwrap();
                        rx.await.unwrap()
                    }
                }
            }
        };
        let per_task = calls.div_ceil(tasks);
        let (span, away) = rt.block_on(async move {
            let start = Instant::now();
            let away = if block_on {
                assert_eq!(tasks, 1, "caller=block_on calls from one task");
                let mut away = 0;
                for n in 0..per_task {
                    away += u64::from(one(n).await != thread_number());
                }
                away
            } else {
                let handles: Vec<_> = (0..tasks)
                    .map(|_| {
                        let one = one.clone();
                        tokio::spawn(async move {
                            let mut away = 0;
                            for n in 0..per_task {
                                away += u64::from(one(n).await != thread_number());
                            }
                            away
                        })
                    })
                    .collect();
                let mut away = 0;
                for handle in handles {
                    away += handle.await.unwrap();
                }
                away
            };
            (start.elapsed(), away)
        });
        let done = per_task * tasks;
        (
            span.as_nanos() as f64 / done as f64,
            away as f64 / done as f64,
        )
    };
    if let Some(pool_side) = only {
        // For callgrind: one side alone, one run.
        run(pool_side);
        return;
    }
    let order: [bool; 2] = if actor_first {
        [false, true]
    } else {
        [true, false]
    };
    let mut times = [Vec::new(), Vec::new()];
    let mut aways = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for &pool_side in &order {
            let (ns, away) = run(pool_side);
            times[usize::from(!pool_side)].push(ns);
            aways[usize::from(!pool_side)].push(away);
        }
    }
    let [pool_ns, actor_ns] = times.map(common::median);
    let [pool_away, actor_away] = aways.map(common::median);
    println!(
        "{pool_ns:.1} {pool_away:.3} {actor_ns:.1} {actor_away:.3} {:.4}",
        pool_ns / actor_ns
    );
}

/// This thread's number: 1, 2, ... in the order threads first ask.
fn thread_number() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        // Relaxed: a counter handing out distinct numbers; nothing else is
        // published through it.
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

/// Answers with the number of the thread its handler ran on.
struct Where;

impl AsyncWorker for Where {
    type Request = u64;
    type Reply = u64;
    type Message = ();
    async fn handle_call(&mut self, n: u64) -> u64 {
        black_box(n);
        thread_number()
    }
    async fn handle_cast(&mut self, _: ()) {}
}

/// The actor idiom with one actor task running [`Where`]: a bounded `mpsc`
/// of `bound`, a `oneshot` reply.
fn where_actor(rt: &Runtime, bound: usize) -> mpsc::Sender<(u64, oneshot::Sender<u64>)> {
    let (tx, mut rx) = mpsc::channel::<(u64, oneshot::Sender<u64>)>(bound);
    rt.spawn(async move {
        let mut state = Where;
        while let Some((n, reply)) = rx.recv().await {
            let _ = reply.send(state.handle_call(n).await);
        }
    });
    tx
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("probe") {
        return probe(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("harness") {
        return harness(&args[1..]);
    }
    // A fresh process measuring the round-trip table alone (its figures
    // on its last line, in NAMES' order, 1 task then 64).
    if common::child_task().is_some() {
        let rt = common::two_thread_runtime();
        let contenders: Vec<_> = NAMES
            .iter()
            .map(|(name, _)| Contender::start(&rt, name))
            .collect();
        let figures: Vec<f64> = ROUND_TRIPS
            .iter()
            .flat_map(|&(tasks, calls)| round_trip_row(&rt, &contenders, tasks, calls / 2, 5))
            .collect();
        common::print_figures(&figures);
        return;
    }

    let mut criterion = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    let rt = common::two_thread_runtime();
    let contenders: Vec<_> = NAMES
        .iter()
        .map(|(name, _)| Contender::start(&rt, name))
        .collect();
    for (tasks, _) in ROUND_TRIPS {
        let mut group = criterion.benchmark_group(format!("async_call_{tasks}task"));
        for ((name, _), contender) in NAMES.iter().zip(&contenders) {
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| fan_out(&rt, contender, tasks, iters))
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
        ("async pool, default", hol_pool(None)),
        ("async pool, steal(false)", hol_pool(Some(false))),
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
        "  p99 ratio: default / shared = {:.2}, steal(false) / shared = {:.2}  (target: default <= 1.2)",
        rows[0].1.p99.as_secs_f64() / shared,
        rows[1].1.p99.as_secs_f64() / shared,
    );

    // Round trips beside the idiom: 9 interleaved rounds, medians.
    println!(
        "\ncall_async round trip, {WORKERS} workers, capacity {CAPACITY}, echo handler: ns per round trip, medians of 9 interleaved rounds; ours / actor"
    );
    for (tasks, calls) in ROUND_TRIPS {
        let row = round_trip_row(&rt, &contenders, tasks, calls, 9);
        let mut line = format!("{tasks:>2} task(s):");
        for (i, ((_, label), ns)) in NAMES.iter().zip(&row).enumerate() {
            line += &format!("  {label} {ns:.0} ns");
            if i > 0 {
                line += &format!(" ({:.3}x)", ns / row[0]);
            }
        }
        println!("{line}  (target: default <= 1.0x)");
    }
    let runs = common::in_fresh_processes("round trips", common::FRESH_RUNS);
    for (row, (tasks, _)) in ROUND_TRIPS.iter().enumerate() {
        let base = row * NAMES.len();
        common::print_spread(
            &format!("default / actor, {tasks} task(s),"),
            &common::ratios(&runs, base + 1, base),
        );
        common::print_spread(
            &format!("steal(false) / actor, {tasks} task(s),"),
            &common::ratios(&runs, base + 2, base),
        );
        common::print_spread(
            &format!("64 workers / actor, {tasks} task(s),"),
            &common::ratios(&runs, base + 3, base),
        );
    }
}
