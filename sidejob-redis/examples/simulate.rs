//! Runs the discrete-event simulation of `tests/support/sim.rs` in bulk:
//! `cargo run --release -p sidejob-redis --example simulate -- [runs]`.
//!
//! Prints utilisation against an ideal global semaphore (and a static
//! split) under skewed steady and moving load, then the seeded fault runs:
//! violations, peak, crash-back time, and each mutant's catch rate.

#[path = "../tests/support/sim.rs"]
mod sim;

use sim::{run, Mutant, SimConfig};

fn main() {
    if let Ok(seed) = std::env::var("SEED") {
        let mut cfg = SimConfig::new(seed.parse().unwrap());
        cfg.faults = true;
        cfg.load = 1.5;
        cfg.long_holds = 0.05;
        cfg.seconds = 15.0;
        cfg.move_every = (cfg.seed % 3 == 0).then_some(5.0);
        let r = run(&cfg);
        println!("{r:?}");
        return;
    }
    let runs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    println!(
        "utilisation vs an ideal global semaphore (5 nodes, C = 200, Zipf 1.2, 20 s, 5 seeds)"
    );
    println!("{:<28} {:>8} {:>8}", "scenario", "leases", "static");
    for (name, load, moving) in [
        ("80 % load, steady", 0.8, None),
        ("80 % load, hot spot moving", 0.8, Some(5.0)),
        ("120 % load, steady", 1.2, None),
        ("120 % load, hot spot moving", 1.2, Some(5.0)),
    ] {
        let (mut lease, mut stat) = (0.0, 0.0);
        for seed in 0..5 {
            let mut cfg = SimConfig::new(1_000 + seed);
            cfg.load = load;
            cfg.move_every = moving;
            lease += run(&cfg).utilisation() / 5.0;
            cfg.static_split = true;
            stat += run(&cfg).utilisation() / 5.0;
        }
        println!("{name:<28} {lease:>8.3} {stat:>8.3}");
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
    let (mut late, mut over) = (i64::MIN, 0u64);
    for (seed, r, secs) in &results {
        violations += r.violations;
        bad_runs += u64::from(r.violations > 0);
        store_bad += r.store_violations;
        peak = peak.max(r.peak);
        back = back.max(r.crash_back_ms.unwrap_or(0));
        crashes += u64::from(r.crash_back_ms.is_some());
        late = late.max(r.reap_late_ms.unwrap_or(i64::MIN));
        over += u64::from(r.crash_back_ms.is_some_and(|b| b > sim::T_MS + sim::G_MS));
        calls += r.store_calls;
        seconds += secs;
        if std::env::var("LATE").is_ok()
            && (r.reap_late_ms.is_some_and(|l| l > 20) || r.crash_back_ms.is_some_and(|b| b > 4000))
        {
            println!(
                "seed {seed}: late {:?} back {:?}; faults {:?}",
                r.reap_late_ms, r.crash_back_ms, r.faults
            );
        }
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
         of the crash in {crashes} runs with a crash (T + G = {} ms; {over} runs above it), reaped at most {late} ms after \
         the crashed lease's expiry + G (store time), {:.1} store calls per node-second",
        sim::T_MS + sim::G_MS,
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
