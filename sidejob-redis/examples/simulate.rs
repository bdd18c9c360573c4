//! Runs the discrete-event simulation of `tests/support/sim.rs` in bulk:
//! `cargo run --release -p sidejob-redis --example simulate -- [runs]`.
//!
//! Prints utilisation against an ideal global semaphore (and a static
//! split) under skewed steady and moving load at two scales, with where
//! the lost utilisation goes, then the seeded fault runs: violations, peak,
//! crash-back time and reap lateness, and each mutant's catch rate.

#[path = "../tests/support/sim.rs"]
mod sim;

use sim::{run, Mutant, SimConfig};

fn main() {
    let runs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    // Two scales: the simulation's default (C/N = 40) and CLUSTER.md §2.8's
    // (C/N = 100). The refusal columns say where the lost utilisation goes:
    // refusals while the fleet used less than C, because the units were
    // free in the store (grow latency), granted but not in any local
    // capacity (a shrink not yet reported), or local on another node and
    // idle there (the pooling a split cannot keep).
    for (nodes, capacity) in [(5usize, 200u64), (10, 1000)] {
        println!(
            "\nutilisation vs an ideal global semaphore ({nodes} nodes, C = {capacity}, Zipf 1.2, 20 s, 5 seeds)"
        );
        println!(
            "{:<28} {:>7} {:>7}  {:>8} {:>8} {:>10}   (refusals while the fleet used < C)",
            "scenario", "leases", "static", "free", "unlocal", "idle there"
        );
        for (name, load, moving) in [
            ("80 % load, steady", 0.8, None),
            ("80 % load, hot spot moving", 0.8, Some(5.0)),
            ("120 % load, steady", 1.2, None),
            ("120 % load, hot spot moving", 1.2, Some(5.0)),
        ] {
            let (mut lease, mut stat, mut why) = (0.0, 0.0, [0u64; 3]);
            for seed in 0..5 {
                let mut cfg = SimConfig::new(1_000 + seed);
                cfg.nodes = nodes;
                cfg.capacity = capacity;
                cfg.load = load;
                cfg.move_every = moving;
                let r = run(&cfg);
                lease += r.utilisation() / 5.0;
                for (w, x) in why.iter_mut().zip(r.refusals_below_c) {
                    *w += x;
                }
                cfg.static_split = true;
                stat += run(&cfg).utilisation() / 5.0;
            }
            println!(
                "{name:<28} {lease:>7.3} {stat:>7.3}  {:>8} {:>8} {:>10}",
                why[0], why[1], why[2]
            );
        }
    }

    // The seeded fault runs, split over two threads (deterministic per seed).
    let results: Vec<(u64, sim::SimResult, f64)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                s.spawn(move || {
                    (0..runs)
                        .filter(|seed| seed % 2 == w)
                        .map(|seed| {
                            let mut cfg = SimConfig::new(seed);
                            cfg.faults = true;
                            cfg.adversarial = seed % 2 == 0;
                            // Adversarial runs: 300 % load and 30 % long holds, so the
                            // others fill a lost node's share at once and its units linger.
                            cfg.load = if cfg.adversarial { 3.0 } else { 1.5 };
                            cfg.long_holds = if cfg.adversarial { 0.3 } else { 0.05 };
                            cfg.seconds = 15.0;
                            cfg.move_every = (seed % 3 == 0).then_some(5.0);
                            (seed, run(&cfg), cfg.seconds)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    let (mut violations, mut bad_runs, mut peak, mut back, mut calls) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut store_bad, mut seconds, mut crashes) = (0, 0.0, 0u64);
    let (mut late, mut over, mut late_runs) = (i64::MIN, 0u64, Vec::new());
    for (seed, r, secs) in &results {
        violations += r.violations;
        bad_runs += u64::from(r.violations > 0);
        store_bad += r.store_violations;
        peak = peak.max(r.peak);
        back = back.max(r.crash_back_ms.unwrap_or(0));
        crashes += u64::from(r.crash_back_ms.is_some());
        late = late.max(r.reap_late_ms.unwrap_or(i64::MIN));
        if r.reap_late_ms.is_some_and(|l| l > 20) {
            late_runs.push(*seed);
        }
        over += u64::from(r.crash_back_ms.is_some_and(|b| b > sim::T_MS + sim::G_MS));
        calls += r.store_calls;
        seconds += secs;
        if r.violations > 0 {
            println!(
                "seed {seed}: {} violations, peak {}; faults {:?}",
                r.violations, r.peak, r.faults
            );
        }
    }
    println!(
        "\n{runs} seeded runs with faults (150 % or 300 % load): {violations} violating events in {bad_runs} runs, \
         {store_bad} store inconsistencies, peak in flight {peak} of 200, crashed share back within {back} ms \
         of the crash in {crashes} runs with a crash (T + G = {} ms from its last renewal; {over} runs above it \
         from the crash, which came just after a renewal or before a renewal in flight landed), reaped at most {late} ms \
         after the crashed lease's last expiry + G (store time, runs without a clock step; over 20 ms in {} runs, seeds {:?}), \
         {:.1} store calls per node-second",
        sim::T_MS + sim::G_MS,
        late_runs.len(),
        &late_runs[..late_runs.len().min(5)],
        calls as f64 / (seconds * 5.0)
    );

    println!("\nmutants (adversarial faults, 200 seeds each): runs with violations");
    for mutant in [
        Mutant::NoMargins,
        Mutant::NoGrace,
        Mutant::GrowBeforeRecord,
        Mutant::NoLearning,
        Mutant::NodeClockExpiry,
        Mutant::MarginsAndGrace,
    ] {
        let (mut caught, mut events, mut peak) = (0, 0, 0);
        for seed in 0..200 {
            let mut cfg = SimConfig::new(seed);
            cfg.adversarial = true;
            cfg.load = 1.5;
            cfg.seconds = 15.0;
            cfg.mutant = mutant;
            cfg.long_holds = 0.3;
            cfg.load = 3.0;
            let r = run(&cfg);
            caught += u64::from(r.violations > 0);
            events += r.violations;
            peak = peak.max(r.peak);
        }
        println!(
            "{:<20} {caught:>4}/200 runs, {events} violating events, peak {peak} of 200",
            format!("{mutant:?}")
        );
    }
}
