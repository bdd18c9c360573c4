//! Timing helpers the benches' ratio tables share: a timed loop, and the
//! best of several interleaved runs of each contender (interleaving spreads
//! the machine's noise over every contender alike; the best run is the
//! one least disturbed).

// Each bench compiles this module on its own and uses what it needs.
#![allow(dead_code)]

use std::time::Instant;

/// ns per call of `f` over `iters` calls.
pub fn time_loop(iters: u64, mut f: impl FnMut()) -> f64 {
    let began = Instant::now();
    for _ in 0..iters {
        f();
    }
    began.elapsed().as_nanos() as f64 / iters as f64
}

/// Runs every contender `rounds` times, interleaved, and keeps each one's
/// best (lowest) figure.
pub fn best_of(rounds: usize, contenders: &mut [&mut dyn FnMut() -> f64]) -> Vec<f64> {
    let mut best = vec![f64::INFINITY; contenders.len()];
    for _ in 0..rounds {
        for (b, run) in best.iter_mut().zip(contenders.iter_mut()) {
            *b = b.min(run());
        }
    }
    best
}
