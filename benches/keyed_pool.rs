//! Keyed pool requests. Each figure beside its peers, in one run.
//!
//! * Round trip: `call_keyed` (one key, and keys cycling over 1,024)
//!   against a plain `call` on the same pool, in both keyed modes (2
//!   workers, capacity 64). One caller's plain calls keep to one worker, as
//!   one key's do; keys cycling in the pinned mode keep both workers
//!   spinning beside the caller, which a 2-core machine cannot run at once.
//!   The one-key ratios are timed again in fresh processes (see
//!   `common::in_fresh_processes`).
//! * Hot key: 4 workers, capacity 256, one request every 400 µs (2,500/s);
//!   half of them for one hot key, each 1 ms (a sleep: a slow I/O), the
//!   other half for 1,000 other keys, 20 µs each (spinning). Latency
//!   (queue and service) of the other keys' requests: pinned, ordered (at
//!   most 16 of the hot key admitted), and the same stream without the hot
//!   key.
//!
//! Why this shape: the other keys' load (1,250/s × 20 µs) is 3% of one
//! worker, so it fits in any one of them; the hot key alone asks 1.25 s of
//! work a second, more than one worker gives, so it saturates whichever
//! worker holds it (its excess is refused). Ordered, it holds one worker
//! and the other three serve the rest; pinned, the quarter of the keys that
//! hash to its worker wait behind it.

mod common;

use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    best_of, child_task, in_fresh_processes, ns_per_op, print_figures, print_spread, ratios,
    time_loop, FRESH_RUNS,
};
use criterion::{criterion_group, BenchmarkId, Criterion};
use sidejob::{Error, KeyedMode, Pool, Worker};

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

fn echo_pool(mode: KeyedMode) -> Pool<Echo> {
    Pool::builder()
        .name("bench")
        .capacity(64)
        .workers(2)
        .keyed(mode)
        .build(|_| Echo)
        .unwrap()
}

const MODES: [(&str, KeyedMode); 2] = [
    ("pinned", KeyedMode::Pinned),
    ("ordered", KeyedMode::Ordered),
];

fn round_trip(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_pool_round_trip_2workers");
    for (name, mode) in MODES {
        let pool = echo_pool(mode);
        group.bench_function(BenchmarkId::new("sidejob_call", name), |b| {
            b.iter(|| pool.call(black_box(1)).unwrap())
        });
        group.bench_function(BenchmarkId::new("sidejob_call_keyed_one_key", name), |b| {
            b.iter(|| pool.call_keyed(&7_u64, black_box(1)).unwrap())
        });
    }
    group.finish();
}

/// A hot-key request: when it was sent, how long it works, whether it is
/// the hot key's.
type Job = (Instant, Duration, bool);

struct Timed(Arc<Mutex<Vec<Duration>>>);

impl Worker for Timed {
    type Request = ();
    type Reply = ();
    type Message = Job;
    fn handle_call(&mut self, _: ()) {}
    fn handle_cast(&mut self, (sent, work, hot): Job) {
        if hot {
            thread::sleep(work);
            return;
        }
        let began = Instant::now();
        while began.elapsed() < work {
            std::hint::spin_loop();
        }
        self.0.lock().unwrap().push(sent.elapsed());
    }
}

const REQUESTS: usize = 6_000;
const GAP: Duration = Duration::from_micros(400);
const FAST: Duration = Duration::from_micros(20);
const SLOW: Duration = Duration::from_millis(1);
const OTHER_KEYS: u64 = 1_000;
const HOT_KEY: u64 = u64::MAX;

struct Latency {
    p50: Duration,
    p99: Duration,
    max: Duration,
    refused_other: usize,
    refused_hot: usize,
}

/// Runs the paced stream through a pool of `mode`; `with_hot` offers the
/// hot key's half too (else those slots stay empty).
fn hot_key_run(mode: KeyedMode, with_hot: bool) -> Latency {
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(REQUESTS)));
    let pool = {
        let latencies = latencies.clone();
        Pool::builder()
            .name("hot")
            .capacity(256)
            .workers(4)
            .keyed(mode)
            .max_queued_per_key(16)
            .build(move |_| Timed(latencies.clone()))
            .unwrap()
    };
    let (mut refused_other, mut refused_hot) = (0, 0);
    let start = Instant::now();
    let mut other = 0u64;
    for i in 0..REQUESTS {
        let hot = i % 2 == 0;
        if hot && !with_hot {
            continue;
        }
        let due = start + GAP * i as u32;
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        let (key, work) = if hot {
            (HOT_KEY, SLOW)
        } else {
            other = (other + 7) % OTHER_KEYS; // spread over the 1,000 keys
            (other, FAST)
        };
        match pool.cast_keyed(&key, (Instant::now(), work, hot)) {
            Ok(()) => {}
            Err(Error::Overload | Error::KeyBusy) if hot => refused_hot += 1,
            Err(Error::Overload | Error::KeyBusy) => refused_other += 1,
            Err(other) => panic!("unexpected {other}"),
        }
    }
    pool.shutdown();
    let (p50, p99, max) = common::quantiles(std::mem::take(&mut *latencies.lock().unwrap()));
    Latency {
        p50,
        p99,
        max,
        refused_other,
        refused_hot,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// The child task that times the one-key round trips alone.
const ROUND_TRIPS: &str = "round_trips";

/// ns per plain `call` and per `call_keyed` on one key, on `pool`: timed
/// in turns (best of 7 runs of 50k calls each), so a drift of the machine
/// falls on both.
fn one_key_round_trips(pool: &Pool<Echo>) -> Vec<f64> {
    best_of(
        7,
        &mut [
            &mut || {
                time_loop(50_000, || {
                    black_box(pool.call(black_box(1)).unwrap());
                })
            },
            &mut || {
                time_loop(50_000, || {
                    black_box(pool.call_keyed(&7_u64, black_box(1)).unwrap());
                })
            },
        ],
    )
}

fn ratio_table() {
    println!("\n== keyed pool: measured side by side in this run ==");
    for (name, mode) in MODES {
        let pool = echo_pool(mode);
        let [call, one_key] = one_key_round_trips(&pool)[..] else {
            unreachable!("two contenders, two figures");
        };
        let mut key = 0u64;
        let keys = ns_per_op(50_000, || {
            key = (key + 1) % 1024;
            pool.call_keyed(&key, black_box(1)).unwrap();
        });
        println!(
            "round trip, 1 caller, 2 workers, {name}: call {call:.0} ns | call_keyed one key {one_key:.0} ns (ratio {:.3}, target <= 1.1; best of 7 interleaved runs) | call_keyed over 1,024 keys {keys:.0} ns (ratio {:.3})",
            one_key / call,
            keys / call
        );
    }
    let runs = in_fresh_processes(ROUND_TRIPS, FRESH_RUNS);
    for (at, (name, _)) in MODES.iter().enumerate() {
        let what = format!("{name}, call_keyed one key / call");
        print_spread(&what, &ratios(&runs, 2 * at + 1, 2 * at));
    }

    println!(
        "hot key: 4 workers, capacity 256, one request every {} µs, half for one key (1 ms each, at most 16 admitted), half over {OTHER_KEYS} keys (20 µs each); latency of the other keys' requests",
        GAP.as_micros()
    );
    let rows = [
        ("pinned, hot key", hot_key_run(KeyedMode::Pinned, true)),
        ("ordered, hot key", hot_key_run(KeyedMode::Ordered, true)),
        (
            "ordered, no hot key",
            hot_key_run(KeyedMode::Ordered, false),
        ),
        ("pinned, no hot key", hot_key_run(KeyedMode::Pinned, false)),
    ];
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>14} {:>12}",
        "", "p50", "p99", "max", "refused other", "refused hot"
    );
    for (name, row) in &rows {
        println!(
            "{:<22} {:>10} {:>10} {:>10} {:>14} {:>12}",
            name,
            ms(row.p50),
            ms(row.p99),
            ms(row.max),
            row.refused_other,
            row.refused_hot
        );
    }
    let base = rows[2].1.p99.as_secs_f64();
    println!(
        "  p99 ratio to no hot key: ordered {:.2} (target <= 1.5), pinned {:.2}",
        rows[1].1.p99.as_secs_f64() / base,
        rows[0].1.p99.as_secs_f64() / base
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
    targets = round_trip
}

fn main() {
    if child_task().as_deref() == Some(ROUND_TRIPS) {
        let figures: Vec<f64> = MODES
            .iter()
            .flat_map(|&(_, mode)| one_key_round_trips(&echo_pool(mode)))
            .collect();
        print_figures(&figures);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratio_table();
}
