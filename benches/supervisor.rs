//! The supervisor against its peers, measured side by side in one run.
//!
//! | group            | ours                                   | peer                                |
//! |------------------|----------------------------------------|-------------------------------------|
//! | `spawn_join`     | `sup.spawn(empty)` + `join`            | `std::thread::spawn(empty)` + `join`|
//! | `reserve_drop`   | `sup.reserve()` + drop                 | `Limiter::try_acquire` + drop (and `try_acquire_owned`, the `'static` permit) |
//! | `reserve_2threads` | 2 threads reserving and dropping     | 2 threads on a `Limiter`            |
//! | `spawn_task`     | `sup.spawn_task` to completion, 1 caller | `tokio::spawn` to completion     |
//!
//! Criterion times each case; then a ratio table ours/peer is printed,
//! measured again in this run with ours and the peer interleaved (median of
//! several rounds), since a ratio taken side by side is the figure on a
//! small shared machine, not an absolute time.
//!
//! Run with `cargo bench --features tokio --bench supervisor`.

mod common;

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::median;
use criterion::{BenchmarkId, Criterion};
use sidejob::{Limiter, Supervisor};

/// A case in `iter_custom` form: run `iters` operations, return the time.
type Routine = Box<dyn FnMut(u64) -> Duration>;

struct Pair {
    group: &'static str,
    what: &'static str,
    ours: (&'static str, Routine),
    peers: Vec<(&'static str, Routine)>,
    /// How many operations one ratio round runs.
    round: u64,
}

fn spawn_join() -> Pair {
    let sup = Supervisor::builder()
        .name("bench")
        .capacity(64)
        .build()
        .unwrap();
    Pair {
        group: "spawn_join",
        what: "spawn + join of an empty child",
        ours: (
            "sidejob_spawn",
            Box::new(move |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    sup.spawn(|| black_box(())).unwrap().join().unwrap();
                }
                start.elapsed()
            }),
        ),
        peers: vec![(
            "std_thread_spawn",
            Box::new(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    thread::spawn(|| black_box(())).join().unwrap();
                }
                start.elapsed()
            }),
        )],
        round: 2_000,
    }
}

fn reserve_drop() -> Pair {
    let sup = Supervisor::builder().capacity(1024).build().unwrap();
    let limiter = Limiter::builder().capacity(1024).build().unwrap();
    let owned = Arc::new(Limiter::builder().capacity(1024).build().unwrap());
    Pair {
        group: "reserve_drop",
        what: "reserve + drop, 1 thread",
        ours: (
            "sidejob_reserve",
            Box::new(move |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    drop(black_box(sup.reserve().unwrap()));
                }
                start.elapsed()
            }),
        ),
        peers: vec![
            (
                "limiter_try_acquire",
                Box::new(move |iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        drop(black_box(limiter.try_acquire().unwrap()));
                    }
                    start.elapsed()
                }),
            ),
            (
                "limiter_try_acquire_owned",
                Box::new(move |iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        drop(black_box(owned.try_acquire_owned().unwrap()));
                    }
                    start.elapsed()
                }),
            ),
        ],
        round: 2_000_000,
    }
}

/// Runs `op` `iters` times on each of 2 threads at once; times the span from
/// the start barrier to the last thread's end (thread start-up not timed).
fn two_threads<S: Send + Sync + 'static>(shared: Arc<S>, op: fn(&S), iters: u64) -> Duration {
    let start = Arc::new(Barrier::new(3));
    let end = Arc::new(Barrier::new(3));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (shared, start, end) = (Arc::clone(&shared), Arc::clone(&start), Arc::clone(&end));
            thread::spawn(move || {
                start.wait();
                for _ in 0..iters {
                    op(&shared);
                }
                end.wait();
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    end.wait();
    let elapsed = began.elapsed();
    for worker in workers {
        worker.join().unwrap();
    }
    elapsed
}

fn reserve_two_threads() -> Pair {
    let sup = Arc::new(Supervisor::builder().capacity(1024).build().unwrap());
    let limiter = Arc::new(Limiter::builder().capacity(1024).build().unwrap());
    Pair {
        group: "reserve_2threads",
        what: "2 threads reserve + drop (time per op pair)",
        ours: (
            "sidejob_reserve",
            Box::new(move |iters| {
                two_threads(
                    Arc::clone(&sup),
                    |sup| drop(black_box(sup.reserve().unwrap())),
                    iters,
                )
            }),
        ),
        peers: vec![(
            "limiter_try_acquire",
            Box::new(move |iters| {
                two_threads(
                    Arc::clone(&limiter),
                    |limiter| drop(black_box(limiter.try_acquire().unwrap())),
                    iters,
                )
            }),
        )],
        round: 1_000_000,
    }
}

/// Tasks spawned, then awaited, in batches of this many.
const BATCH: u64 = 1024;

fn spawn_task() -> Pair {
    let rt = Arc::new(
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap(),
    );
    let peer_rt = Arc::clone(&rt);
    let sup = Supervisor::builder()
        .capacity(BATCH as usize)
        .build()
        .unwrap();
    Pair {
        group: "spawn_task",
        what: "spawn a task and run it to completion, 1 caller, current_thread runtime",
        ours: (
            "sidejob_spawn_task",
            Box::new(move |iters| {
                let sup = sup.clone();
                rt.block_on(async move {
                    let mut tasks = Vec::with_capacity(BATCH as usize);
                    let start = Instant::now();
                    let mut left = iters;
                    while left > 0 {
                        let n = left.min(BATCH);
                        for _ in 0..n {
                            tasks.push(sup.spawn_task(async { black_box(()) }).unwrap());
                        }
                        for task in tasks.drain(..) {
                            task.await.unwrap();
                        }
                        left -= n;
                    }
                    start.elapsed()
                })
            }),
        ),
        peers: vec![(
            "tokio_spawn",
            Box::new(move |iters| {
                peer_rt.block_on(async move {
                    let mut tasks = Vec::with_capacity(BATCH as usize);
                    let start = Instant::now();
                    let mut left = iters;
                    while left > 0 {
                        let n = left.min(BATCH);
                        for _ in 0..n {
                            tasks.push(tokio::spawn(async { black_box(()) }));
                        }
                        for task in tasks.drain(..) {
                            task.await.unwrap();
                        }
                        left -= n;
                    }
                    start.elapsed()
                })
            }),
        )],
        round: 200_000,
    }
}

fn main() {
    let mut criterion = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    let mut pairs = vec![
        spawn_join(),
        reserve_drop(),
        reserve_two_threads(),
        spawn_task(),
    ];

    for pair in &mut pairs {
        let mut group = criterion.benchmark_group(pair.group);
        let Pair { ours, peers, .. } = pair;
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
    println!("supervisor: ours / peer, measured side by side in this run");
    println!(
        "{:<18} {:<28} {:>12} {:>12} {:>8} {:>14}",
        "group", "peer", "ours ns/op", "peer ns/op", "ratio", "ours ops/s"
    );
    for pair in &mut pairs {
        let round = pair.round;
        let mut ours = Vec::new();
        let mut peers: Vec<Vec<f64>> = vec![Vec::new(); pair.peers.len()];
        for _ in 0..ROUNDS {
            ours.push((pair.ours.1)(round).as_nanos() as f64 / round as f64);
            for (i, (_, routine)) in pair.peers.iter_mut().enumerate() {
                peers[i].push(routine(round).as_nanos() as f64 / round as f64);
            }
        }
        let ours = median(ours);
        for ((name, _), times) in pair.peers.iter().zip(peers) {
            let peer = median(times);
            println!(
                "{:<18} {:<28} {:>12.1} {:>12.1} {:>7.2}x {:>14.0}",
                pair.group,
                name,
                ours,
                peer,
                ours / peer,
                // Two threads each run `round` ops in the measured span.
                if pair.group == "reserve_2threads" {
                    2e9 / ours
                } else {
                    1e9 / ours
                },
            );
        }
        let _ = pair.what;
    }
    println!(
        "(Erlang sidejob_supervisor:spawn, 1 caller, this class of machine: ~135k children/s)"
    );
    criterion.final_summary();
}
