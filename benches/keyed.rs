//! Keyed admission against what a task worker (a service that claims
//! tasks of workflows and runs each workflow's tasks one after another)
//! writes by hand, measured side by side in one run.
//!
//! The operation: admit a task of workflow `id` unless that workflow has a
//! task in flight, then end it. Each thread cycles over 1,000 workflow ids
//! of its own (threads never share a key, so no admission is refused).
//!
//! | case | how |
//! |------|-----|
//! | `sidejob_try_reserve_keyed` (ours) | `sup.try_reserve_keyed(&id)` + drop of the guard (per key 1, capacity 1024) |
//! | `semaphore_mutex_hashset` | tokio `Semaphore::try_acquire_owned` + `Mutex<HashSet<u64>>` insert; on exit remove, then drop the permit |
//! | `semaphore_dashset` | the same with `dashmap::DashSet<u64>`, as a task worker's `in_flight_workflows` set |
//!
//! The peers take the key with `insert` (which answers whether it was
//! there) rather than a `contains` then `insert`, which lets two
//! racing claims of one workflow both in: the correct form, no slower.
//! Keys are `u64` ids (a task worker's are often UUIDs; a `u128` hashes at the same
//! cost). Criterion times each case; then the ratio table, ours against
//! each peer, measured again with the cases interleaved (median of 7
//! rounds), 1 thread and 2 threads.
//!
//! Run: `cargo bench --no-run --all-features --bench keyed`, then
//! `target/release/deps/keyed-<hash> --bench`.

mod common;

use std::collections::HashSet;
use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::median;
use criterion::{BenchmarkId, Criterion};
use dashmap::DashSet;
use sidejob::Supervisor;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

const CAPACITY: usize = 1024;
/// Workflow ids per thread.
const KEYS: u64 = 1000;

/// One admission + exit of the keyed scheme under test, by thread `t`, for
/// its `n`-th operation.
trait Keyed: Send + Sync + 'static {
    fn admit_and_end(&self, id: u64);
}

struct Ours(Supervisor);

impl Keyed for Ours {
    #[inline]
    fn admit_and_end(&self, id: u64) {
        drop(black_box(self.0.try_reserve_keyed(&id).unwrap()));
    }
}

/// A hand-written task worker's fields: a semaphore and a set of in-flight
/// workflow ids.
struct SemaphoreMutexSet {
    semaphore: Arc<Semaphore>,
    in_flight: Mutex<HashSet<u64>>,
}

impl SemaphoreMutexSet {
    fn admit(&self, id: u64) -> Option<OwnedSemaphorePermit> {
        if !self.in_flight.lock().unwrap().insert(id) {
            return None; // the workflow has a task in flight: skip
        }
        match Arc::clone(&self.semaphore).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                self.in_flight.lock().unwrap().remove(&id);
                None
            }
        }
    }
}

impl Keyed for SemaphoreMutexSet {
    #[inline]
    fn admit_and_end(&self, id: u64) {
        let permit = self.admit(id).unwrap();
        black_box(&permit);
        // The task's end, as a hand-written worker writes it.
        self.in_flight.lock().unwrap().remove(&id);
        drop(permit);
    }
}

struct SemaphoreDashSet {
    semaphore: Arc<Semaphore>,
    in_flight: DashSet<u64>,
}

impl SemaphoreDashSet {
    fn admit(&self, id: u64) -> Option<OwnedSemaphorePermit> {
        if !self.in_flight.insert(id) {
            return None;
        }
        match Arc::clone(&self.semaphore).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                self.in_flight.remove(&id);
                None
            }
        }
    }
}

impl Keyed for SemaphoreDashSet {
    #[inline]
    fn admit_and_end(&self, id: u64) {
        let permit = self.admit(id).unwrap();
        black_box(&permit);
        self.in_flight.remove(&id);
        drop(permit);
    }
}

/// Runs `iters` operations on each of `threads` threads at once, thread
/// `t` on ids `t * 1e9 + (n % KEYS)`; times the span from the start barrier
/// to the last thread's end (thread start-up not timed).
fn run<S: Keyed>(shared: &Arc<S>, threads: usize, iters: u64) -> Duration {
    if threads == 1 {
        let start = Instant::now();
        for n in 0..iters {
            shared.admit_and_end(n % KEYS);
        }
        return start.elapsed();
    }
    let start = Arc::new(Barrier::new(threads + 1));
    let end = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (shared, start, end) = (Arc::clone(shared), Arc::clone(&start), Arc::clone(&end));
            thread::spawn(move || {
                start.wait();
                let base = t * 1_000_000_000;
                for n in 0..iters {
                    shared.admit_and_end(base + n % KEYS);
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

type Routine = Box<dyn FnMut(u64) -> Duration>;

fn routine<S: Keyed>(shared: S, threads: usize) -> Routine {
    let shared = Arc::new(shared);
    Box::new(move |iters| run(&shared, threads, iters))
}

fn cases(threads: usize) -> Vec<(&'static str, Routine)> {
    let sup = Supervisor::builder().capacity(CAPACITY).build().unwrap();
    vec![
        ("sidejob_try_reserve_keyed", routine(Ours(sup), threads)),
        (
            "semaphore_mutex_hashset",
            routine(
                SemaphoreMutexSet {
                    semaphore: Arc::new(Semaphore::new(CAPACITY)),
                    in_flight: Mutex::new(HashSet::new()),
                },
                threads,
            ),
        ),
        (
            "semaphore_dashset",
            routine(
                SemaphoreDashSet {
                    semaphore: Arc::new(Semaphore::new(CAPACITY)),
                    in_flight: DashSet::new(),
                },
                threads,
            ),
        ),
    ]
}

fn main() {
    let mut criterion = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    let mut groups: Vec<(usize, Vec<(&'static str, Routine)>)> =
        [1, 2].into_iter().map(|t| (t, cases(t))).collect();
    for (threads, cases) in &mut groups {
        let mut group = criterion.benchmark_group(format!("keyed_{threads}thread"));
        for (name, routine) in cases.iter_mut() {
            group.bench_function(BenchmarkId::from_parameter(*name), |b| {
                b.iter_custom(&mut *routine)
            });
        }
        group.finish();
    }

    const ROUNDS: usize = 7;
    const ROUND: u64 = 500_000;
    println!();
    println!(
        "keyed admission + exit: ours against the hand-written forms, side by side in this run"
    );
    println!(
        "{:<8} {:<26} {:>12} {:>14} {:>16}",
        "threads", "case", "ns/op", "ops/s (all)", "ours' throughput"
    );
    for (threads, cases) in &mut groups {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
        for _ in 0..ROUNDS {
            for (i, (_, routine)) in cases.iter_mut().enumerate() {
                times[i].push(routine(ROUND).as_nanos() as f64 / ROUND as f64);
            }
        }
        let medians: Vec<f64> = times.into_iter().map(median).collect();
        let ours = medians[0];
        for ((name, _), ns) in cases.iter().zip(&medians) {
            // Each of `threads` threads ran ROUND ops in the span.
            let ops = *threads as f64 * 1e9 / ns;
            println!(
                "{:<8} {:<26} {:>12.1} {:>14.0} {:>15.2}x",
                threads,
                name,
                ns,
                ops,
                ns / ours,
            );
        }
    }
    criterion.final_summary();
}
