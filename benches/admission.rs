//! Admission: acquire + release, one and two threads, and the overload
//! answer, each measured beside its peers in one criterion group.
//!
//! Peers: a single `AtomicUsize` CAS-under-limit loop (the floor: two locked
//! RMWs on one line), tokio's `Semaphore::try_acquire`, and a
//! `parking_lot::Mutex<usize>` counter. After the criterion groups a plain
//! side-by-side timing of each pair prints the ratios DESIGN.md sets targets
//! for (criterion's absolute times drift on a small shared machine; a ratio
//! measured in the same loop, interleaved, is the figure).

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};

mod common;
use common::{best_of, time_loop};
use parking_lot::Mutex;
use sidejob::probe::Probe;
use sidejob::{Limiter, Permit};
use tokio::sync::Semaphore;

/// Large enough that the no-overload benches never meet the limit.
const BIG: usize = 1 << 20;

fn limiter(capacity: usize, shards: Option<usize>, probe: Probe) -> Limiter {
    let mut builder = Limiter::builder();
    builder.capacity(capacity).probe(probe);
    if let Some(shards) = shards {
        builder.shards(shards);
    }
    builder.build().expect("valid bench configuration")
}

// ---- the contenders, one op = one acquire + one release -------------------

#[inline]
fn ours_once(limiter: &Limiter) {
    let permit = limiter.try_acquire().expect("no overload in this bench");
    black_box(&permit);
}

/// The single shared counter: CAS up while under the limit, `fetch_sub` to
/// release. Acquire/Release as a real limiter needs.
#[inline]
fn atomic_try_acquire(counter: &AtomicUsize, limit: usize) -> bool {
    let mut current = counter.load(Ordering::Relaxed);
    loop {
        if current >= limit {
            return false;
        }
        match counter.compare_exchange_weak(
            current,
            current + 1,
            Ordering::Acquire,
            Ordering::Relaxed,
        ) {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}

#[inline]
fn atomic_once(counter: &AtomicUsize) {
    assert!(atomic_try_acquire(black_box(counter), BIG));
    counter.fetch_sub(1, Ordering::Release);
}

#[inline]
fn tokio_once(semaphore: &Semaphore) {
    let permit = semaphore.try_acquire().expect("no overload in this bench");
    black_box(&permit);
}

#[inline]
fn mutex_once(counter: &Mutex<usize>) {
    {
        let mut count = counter.lock();
        assert!(*count < BIG);
        *count += 1;
    }
    *black_box(counter).lock() -= 1;
}

/// Runs `work(iters)` on two threads released by one barrier and timed
/// until both reach the end barrier; thread start-up is not timed.
fn run_pair<F: Fn(u64) + Sync>(iters: u64, work: &F) -> Duration {
    let start = Barrier::new(3);
    let end = Barrier::new(3);
    thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                start.wait();
                work(iters);
                end.wait();
            });
        }
        start.wait();
        let began = Instant::now();
        end.wait();
        began.elapsed()
    })
}

/// Two permits at most per thread, on a capacity of 2 shared by two
/// threads: overload really happens. Each attempt is one op.
fn tight_worker(limiter: &Limiter, iters: u64) {
    let mut slots: [Option<Permit<'_>>; 2] = [None, None];
    for i in 0..iters {
        // The new attempt is made before the old permit in that slot drops,
        // so the thread holds up to 2.
        slots[(i & 1) as usize] = limiter.try_acquire().ok();
    }
}

// ---- criterion groups ------------------------------------------------------

fn one_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("acquire_release_1thread");
    group.throughput(Throughput::Elements(1));
    let by_thread = limiter(BIG, None, Probe::Thread);
    let by_cpu = limiter(BIG, None, Probe::Cpu);
    let atomic = AtomicUsize::new(0);
    let semaphore = Semaphore::new(BIG);
    let mutex = Mutex::new(0usize);
    group.bench_function(BenchmarkId::new("sidejob", "probe_thread"), |b| {
        b.iter(|| ours_once(&by_thread))
    });
    group.bench_function(BenchmarkId::new("sidejob", "probe_cpu"), |b| {
        b.iter(|| ours_once(&by_cpu))
    });
    group.bench_function(BenchmarkId::new("single_atomic", "cas"), |b| {
        b.iter(|| atomic_once(&atomic))
    });
    group.bench_function(BenchmarkId::new("tokio_semaphore", "try_acquire"), |b| {
        b.iter(|| tokio_once(&semaphore))
    });
    group.bench_function(BenchmarkId::new("parking_lot_mutex", "counter"), |b| {
        b.iter(|| mutex_once(&mutex))
    });
    group.finish();
    assert_eq!(by_thread.usage(), 0);
    assert_eq!(by_thread.stats().rejected, 0);
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("acquire_release_2threads");
    // One iteration = one op on each of the two threads.
    group.throughput(Throughput::Elements(2));
    let ours = limiter(BIG, None, Probe::Thread);
    let ours_cpu = limiter(BIG, None, Probe::Cpu);
    let atomic = AtomicUsize::new(0);
    let semaphore = Semaphore::new(BIG);
    let mutex = Mutex::new(0usize);
    // Capacity 1 < default shard count: one shard kept, both threads on it;
    // overload happens whenever the other thread holds the unit.
    let small = limiter(1, None, Probe::Thread);
    let tight = limiter(2, None, Probe::Thread);

    group.bench_function(BenchmarkId::new("sidejob", "probe_thread"), |b| {
        b.iter_custom(|iters| {
            run_pair(iters, &|n| {
                for _ in 0..n {
                    ours_once(&ours)
                }
            })
        })
    });
    group.bench_function(BenchmarkId::new("sidejob", "probe_cpu"), |b| {
        b.iter_custom(|iters| {
            run_pair(iters, &|n| {
                for _ in 0..n {
                    ours_once(&ours_cpu)
                }
            })
        })
    });
    group.bench_function(BenchmarkId::new("single_atomic", "cas"), |b| {
        b.iter_custom(|iters| {
            run_pair(iters, &|n| {
                for _ in 0..n {
                    atomic_once(&atomic)
                }
            })
        })
    });
    group.bench_function(BenchmarkId::new("tokio_semaphore", "try_acquire"), |b| {
        b.iter_custom(|iters| {
            run_pair(iters, &|n| {
                for _ in 0..n {
                    tokio_once(&semaphore)
                }
            })
        })
    });
    group.bench_function(BenchmarkId::new("parking_lot_mutex", "counter"), |b| {
        b.iter_custom(|iters| {
            run_pair(iters, &|n| {
                for _ in 0..n {
                    mutex_once(&mutex)
                }
            })
        })
    });
    group.bench_function(BenchmarkId::new("sidejob", "capacity_1_lt_shards"), |b| {
        b.iter_custom(|iters| {
            run_pair(iters, &|n| {
                for _ in 0..n {
                    black_box(small.try_acquire().is_ok());
                }
            })
        })
    });
    group.bench_function(
        BenchmarkId::new("sidejob", "tight_capacity_2_overload"),
        |b| b.iter_custom(|iters| run_pair(iters, &|n| tight_worker(&tight, n))),
    );
    group.finish();

    for (name, l) in [("capacity 1", &small), ("tight capacity 2", &tight)] {
        let stats = l.stats();
        assert_eq!(l.usage(), 0);
        assert_eq!(stats.completed, stats.accepted);
        println!(
            "acquire_release_2threads {name}: accepted {} rejected {} ({:.1}% refused)",
            stats.accepted,
            stats.rejected,
            100.0 * stats.rejected as f64 / (stats.accepted + stats.rejected).max(1) as f64
        );
    }
}

/// A limiter with every unit held; the permits are leaked on purpose so
/// the limiter stays full for the whole bench.
fn full_limiter(capacity: usize, shards: Option<usize>) -> &'static Limiter {
    let limiter: &'static Limiter =
        Box::leak(Box::new(self::limiter(capacity, shards, Probe::Thread)));
    for _ in 0..limiter.capacity() {
        std::mem::forget(limiter.try_acquire().expect("room while filling"));
    }
    assert!(limiter.try_acquire().is_err());
    // The rejection is counted, exactly.
    let before = limiter.stats().rejected;
    for _ in 0..1000 {
        assert!(limiter.try_acquire().is_err());
    }
    assert_eq!(limiter.stats().rejected - before, 1000);
    limiter
}

fn overload(c: &mut Criterion) {
    let mut group = c.benchmark_group("overload_when_full");
    group.throughput(Throughput::Elements(1));
    let default_shards = full_limiter(num_cpus_default(), None);
    let empty = Semaphore::new(0);
    group.bench_function(
        BenchmarkId::new("sidejob", format!("{}_shards", default_shards.shards())),
        |b| b.iter(|| black_box(default_shards.try_acquire().is_err())),
    );
    // One word of the full set up to 64 shards, the count of marked shards
    // beyond: the refusal should cost the same at every size.
    for shards in MANY_SHARDS {
        let limiter = full_limiter(shards, Some(shards));
        assert_eq!(limiter.shards(), shards);
        group.bench_function(
            BenchmarkId::new("sidejob", format!("{shards}_shards")),
            |b| b.iter(|| black_box(limiter.try_acquire().is_err())),
        );
    }
    group.bench_function(BenchmarkId::new("tokio_semaphore", "no_permits"), |b| {
        b.iter(|| black_box(empty.try_acquire().is_err()))
    });
    group.finish();
    let stats = default_shards.stats();
    assert_eq!(stats.accepted, stats.capacity as u64);
    assert!(stats.rejected > 1000);
}

/// The shard counts the overload benches refuse from, beside the default.
const MANY_SHARDS: [usize; 3] = [64, 1024, 65_536];

/// The default shard count, as the limiter chooses it.
fn num_cpus_default() -> usize {
    Limiter::new(BIG).unwrap().shards()
}

// ---- the ratio table -------------------------------------------------------

fn ratio_table() {
    const ITERS: u64 = 2_000_000;
    const ROUNDS: usize = 7;
    println!();
    println!("== side-by-side ratios (min of {ROUNDS} interleaved runs, {ITERS} ops each) ==");

    // 1 thread: ns/op, lower is better.
    let by_thread = limiter(BIG, None, Probe::Thread);
    let by_cpu = limiter(BIG, None, Probe::Cpu);
    let atomic = AtomicUsize::new(0);
    let semaphore = Semaphore::new(BIG);
    let mutex = Mutex::new(0usize);
    let ns = best_of(
        ROUNDS,
        &mut [
            &mut || time_loop(ITERS, || ours_once(&by_thread)),
            &mut || time_loop(ITERS, || ours_once(&by_cpu)),
            &mut || time_loop(ITERS, || atomic_once(&atomic)),
            &mut || time_loop(ITERS, || tokio_once(&semaphore)),
            &mut || time_loop(ITERS, || mutex_once(&mutex)),
        ],
    );
    let [thread_ns, cpu_ns, atomic_ns, tokio_ns, mutex_ns] = ns[..] else {
        unreachable!()
    };
    println!("1 thread, ns per acquire+release: sidejob(probe thread) {thread_ns:.2}, sidejob(probe cpu) {cpu_ns:.2}, single_atomic {atomic_ns:.2}, tokio {tokio_ns:.2}, parking_lot_mutex {mutex_ns:.2}");
    println!(
        "ratio 1thread ours(thread)/single_atomic = {:.2}   (target <= 1.10)",
        thread_ns / atomic_ns
    );
    println!(
        "ratio 1thread ours(thread)/tokio         = {:.2}   (target <= 0.50)",
        thread_ns / tokio_ns
    );
    println!(
        "ratio 1thread ours(thread)/parking_lot   = {:.2}",
        thread_ns / mutex_ns
    );
    println!(
        "ratio 1thread ours(cpu)/single_atomic    = {:.2}",
        cpu_ns / atomic_ns
    );
    println!(
        "ratio 1thread ours(cpu)/tokio            = {:.2}",
        cpu_ns / tokio_ns
    );
    println!(
        "ratio 1thread ours(cpu)/ours(thread)     = {:.2}   (< 1 means Probe::Cpu is faster)",
        cpu_ns / thread_ns
    );

    // 2 threads: total ops per second, higher is better.
    let ours = limiter(BIG, None, Probe::Thread);
    let ours_cpu = limiter(BIG, None, Probe::Cpu);
    let atomic = AtomicUsize::new(0);
    let semaphore = Semaphore::new(BIG);
    let mutex = Mutex::new(0usize);
    let pair_ns = |work: &(dyn Fn(u64) + Sync)| {
        let elapsed = run_pair(ITERS, &|n| work(n));
        elapsed.as_nanos() as f64 / (2 * ITERS) as f64
    };
    let ns = best_of(
        ROUNDS,
        &mut [
            &mut || pair_ns(&|n| (0..n).for_each(|_| ours_once(&ours))),
            &mut || pair_ns(&|n| (0..n).for_each(|_| ours_once(&ours_cpu))),
            &mut || pair_ns(&|n| (0..n).for_each(|_| atomic_once(&atomic))),
            &mut || pair_ns(&|n| (0..n).for_each(|_| tokio_once(&semaphore))),
            &mut || pair_ns(&|n| (0..n).for_each(|_| mutex_once(&mutex))),
        ],
    );
    let mops = |ns: f64| 1e3 / ns;
    let [ours_ns, ours_cpu_ns, atomic_ns, tokio_ns, mutex_ns] = ns[..] else {
        unreachable!()
    };
    println!(
        "2 threads, total M ops/s: sidejob(probe thread) {:.1}, sidejob(probe cpu) {:.1}, single_atomic {:.1}, tokio {:.1}, parking_lot_mutex {:.1}",
        mops(ours_ns), mops(ours_cpu_ns), mops(atomic_ns), mops(tokio_ns), mops(mutex_ns)
    );
    println!(
        "ratio 2threads ours(thread)/single_atomic throughput = {:.2}   (target >= 4)",
        atomic_ns / ours_ns
    );
    println!(
        "ratio 2threads ours(thread)/tokio throughput         = {:.2}   (target >= 10)",
        tokio_ns / ours_ns
    );
    println!(
        "ratio 2threads ours(thread)/parking_lot throughput   = {:.2}",
        mutex_ns / ours_ns
    );
    println!("ratio 2threads ours(cpu)/ours(thread) throughput     = {:.2}   (> 1 means Probe::Cpu is faster)", ours_ns / ours_cpu_ns);

    // Overload: ns per refusal, lower is better.
    let default_shards = full_limiter(num_cpus_default(), None);
    let many: Vec<&'static Limiter> = MANY_SHARDS
        .iter()
        .map(|&shards| full_limiter(shards, Some(shards)))
        .collect();
    let empty = Semaphore::new(0);
    let refuse = |limiter: &'static Limiter| {
        move || time_loop(ITERS, || assert!(black_box(limiter).try_acquire().is_err()))
    };
    let mut runs: Vec<Box<dyn FnMut() -> f64>> = vec![Box::new(refuse(default_shards))];
    runs.extend(
        many.iter()
            .map(|&limiter| Box::new(refuse(limiter)) as Box<dyn FnMut() -> f64>),
    );
    runs.push(Box::new(|| {
        time_loop(ITERS, || assert!(black_box(&empty).try_acquire().is_err()))
    }));
    let mut refs: Vec<&mut dyn FnMut() -> f64> =
        runs.iter_mut().map(|run| &mut **run as _).collect();
    let ns = best_of(ROUNDS, &mut refs);
    let tokio_ns = ns[ns.len() - 1];
    let default_ns = ns[0];
    let many_ns = &ns[1..ns.len() - 1];
    let mut line = format!(
        "overload, ns per refusal: sidejob({} shards) {default_ns:.2}",
        default_shards.shards()
    );
    for (shards, ns) in MANY_SHARDS.iter().zip(many_ns) {
        line += &format!(", sidejob({shards} shards) {ns:.2}");
    }
    println!("{line}, tokio(no permits) {tokio_ns:.2}");
    println!(
        "ratio overload ours({} shards)/tokio = {:.2}   (target <= 3)",
        default_shards.shards(),
        default_ns / tokio_ns
    );
    for (shards, ns) in MANY_SHARDS.iter().zip(many_ns) {
        println!(
            "ratio overload ours({shards} shards)/tokio = {:.2}   (flat: same as {} shards)",
            ns / tokio_ns,
            default_shards.shards()
        );
    }
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
    targets = one_thread, two_threads, overload
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // Only under `cargo bench` (which passes `--bench`), not when
    // `cargo test --benches` runs each bench once as a smoke test.
    if std::env::args().any(|arg| arg == "--bench") {
        ratio_table();
    }
}
