//! How admission + release scales with threads (issue 35): 1, 2, 4, 8, 16
//! ... threads up to the machine's CPUs, each pinned to its own core
//! (`core_affinity`), looping `try_acquire` + drop for a fixed time. Two
//! regimes:
//!
//! * **not binding**: the capacity is far above what the threads hold;
//! * **at 95-100 % occupancy**: 95 % of the capacity is held for the whole
//!   run, and the threads share the last 5 % (a refusal counts as an
//!   operation: it is what a caller at the limit gets).
//!
//! Beside the limiter, in the same run: tokio's `Semaphore` (`try_acquire`
//! and drop) and one `AtomicUsize` CAS counter (the unsharded floor). Printed
//! as total operations per second and as a ratio to linear (the total over
//! N times the same contender's one-thread figure). On the 2-core machine
//! the project is built on it runs at 1 and 2 threads; it is what a
//! 16-core machine will be measured with.
//!
//! `SCALING_MS` sets each cell's run (default 300 ms).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use sidejob::Limiter;
use tokio::sync::Semaphore;

/// A bare shared counter: CAS up under a limit, `fetch_sub` down.
struct Counter {
    used: AtomicUsize,
    limit: usize,
}

impl Counter {
    fn try_take(&self) -> bool {
        let mut now = self.used.load(Ordering::Relaxed);
        loop {
            if now >= self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(
                now,
                now + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => now = actual,
            }
        }
    }

    fn give_back(&self) {
        self.used.fetch_sub(1, Ordering::Release);
    }
}

#[derive(Clone)]
enum Subject {
    Ours(Arc<Limiter>),
    Tokio(Arc<Semaphore>),
    Atomic(Arc<Counter>),
}

impl Subject {
    /// One admission + release (or one refusal).
    #[inline]
    fn op(&self) {
        match self {
            Subject::Ours(limiter) => drop(black_box(limiter.try_acquire())),
            Subject::Tokio(sem) => drop(black_box(sem.try_acquire())),
            Subject::Atomic(counter) => {
                if black_box(counter.try_take()) {
                    counter.give_back();
                }
            }
        }
    }
}

/// The contenders for a regime: capacity `capacity`, `held` of it taken
/// for the whole run (kept alive by the returned guard).
fn subjects(
    capacity: usize,
    held: usize,
    shards: usize,
) -> (Vec<(&'static str, Subject)>, Box<dyn std::any::Any>) {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .unwrap(),
    );
    let sem = Arc::new(Semaphore::new(capacity));
    let counter = Arc::new(Counter {
        used: AtomicUsize::new(held),
        limit: capacity,
    });
    let kept_ours = limiter.try_acquire_many_owned(held).ok();
    assert!(held == 0 || kept_ours.is_some());
    let kept_tokio = Arc::clone(&sem)
        .try_acquire_many_owned(held as u32)
        .unwrap();
    let guard: Box<dyn std::any::Any> = Box::new((kept_ours, kept_tokio));
    (
        vec![
            ("sidejob Limiter", Subject::Ours(limiter)),
            ("tokio Semaphore", Subject::Tokio(sem)),
            ("one AtomicUsize", Subject::Atomic(counter)),
        ],
        guard,
    )
}

/// Operations per second of `subject` from `threads` threads pinned to
/// `cores`, each looping for `run`.
fn measure(
    subject: &Subject,
    threads: usize,
    cores: &[core_affinity::CoreId],
    run: Duration,
) -> f64 {
    let start = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (subject, start, stop) = (subject.clone(), Arc::clone(&start), Arc::clone(&stop));
            let core = cores.get(t % cores.len().max(1)).copied();
            std::thread::spawn(move || {
                if let Some(core) = core {
                    core_affinity::set_for_current(core);
                }
                start.wait();
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        subject.op();
                    }
                    ops += 256;
                }
                ops
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(run); // the measured interval, not a synchronization
    stop.store(true, Ordering::Relaxed);
    let ops: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    ops as f64 / began.elapsed().as_secs_f64()
}

fn main() {
    let run = Duration::from_millis(
        std::env::var("SCALING_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300),
    );
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let cpus = cores.len().max(1);
    let counts: Vec<usize> = [1, 2, 4, 8, 16, 32, 64, 128]
        .into_iter()
        .filter(|&n| n <= cpus)
        .collect();
    println!(
        "admission + release, threads pinned one a core ({cpus} CPUs here), {} ms a cell; Mops/s and the ratio to linear (total / (N x the same contender at 1 thread))",
        run.as_millis()
    );
    let big = 1 << 20;
    for (regime, capacity, held) in [
        ("not binding", big, 0),
        ("95-100 % occupancy", 64 * cpus, 64 * cpus * 95 / 100),
    ] {
        println!("\n== {regime} (capacity {capacity}, {held} held for the run)");
        let (subjects, _kept) = subjects(capacity, held, cpus);
        print!("{:<18}", "threads");
        for n in &counts {
            print!("{:>20}", n);
        }
        println!();
        for (name, subject) in &subjects {
            print!("{name:<18}");
            let mut one = 0.0;
            for &n in &counts {
                let ops = measure(subject, n, &cores, run);
                if n == 1 {
                    one = ops;
                }
                let linear = ops / (n as f64 * one);
                print!("{:>11.1} ({:>4.2}x)", ops / 1e6, linear);
            }
            println!();
        }
    }
}
