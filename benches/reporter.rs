//! Acquire + release on a `Limiter` with a metrics `Reporter` running
//! beside it, against the same limiter with none.
//!
//! The reporter reads the per-shard counters on its own thread and sets
//! cached handles of a real Prometheus recorder; the admission path is not
//! touched, so the only cost it can add is the cache traffic of those
//! reads. To make that visible the reporter ticks every millisecond here,
//! a thousand times more often than its default. Printed as the ratio
//! with / without (target <= 1.05).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use sidejob::observe::Reporter;
use sidejob::Limiter;

const ITERS: u64 = 2_000_000;
const ROUNDS: usize = 9;

fn loop_ns(limiter: &Limiter) -> f64 {
    let began = Instant::now();
    for _ in 0..ITERS {
        let permit = limiter.try_acquire().expect("never full here");
        black_box(&permit);
    }
    began.elapsed().as_nanos() as f64 / ITERS as f64
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        return; // `cargo test --benches` smoke run: nothing to time
    }
    let recorder = PrometheusBuilder::new().build_recorder();
    let with = Arc::new(Limiter::new(1 << 20).unwrap());
    let without = Arc::new(Limiter::new(1 << 20).unwrap());
    let reporter = metrics::with_local_recorder(&recorder, || {
        Reporter::builder()
            .name("bench")
            .interval(Duration::from_millis(1))
            .build(&with)
    })
    .unwrap()
    .spawn()
    .unwrap();
    let (mut best_with, mut best_without) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..ROUNDS {
        best_without = best_without.min(loop_ns(&without));
        best_with = best_with.min(loop_ns(&with));
    }
    let last = reporter.stop().expect("the limiter is alive");
    println!();
    println!("== acquire + release, min of {ROUNDS} interleaved runs, {ITERS} ops each ==");
    println!(
        "ns per acquire+release: with reporter (1 ms ticks) {best_with:.2}, without {best_without:.2}"
    );
    println!(
        "ratio with/without reporter = {:.3}   (target <= 1.05)",
        best_with / best_without
    );
    println!(
        "(the reporter's last report saw {} admissions)",
        last.accepted
    );
}
