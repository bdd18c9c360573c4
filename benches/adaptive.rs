//! Adaptive limits against a simulated backend: every algorithm of ours and
//! the Rust peers' (`tower-acc`, `tower-resilience-adaptive`), in one run.
//!
//! `cargo bench --bench adaptive` prints the table and writes it to
//! `benches/results/adaptive.txt`; `cargo test --benches` runs a short
//! smoke pass.
//!
//! **A discrete-event simulation on a virtual clock.** No threads, no
//! sleeps, no wall clock: the same seed gives the same table on a busy
//! 2-core machine as on an idle one, and a minute of traffic takes a
//! fraction of a second. Our contenders run the real thing on the virtual
//! clock: a [`Limiter`] admitting each request with `try_acquire_owned`
//! (its `set_capacity` moved by a [`Controller`], fed with
//! `Controller::record_at` as each request completes, ticking every 50 ms
//! of virtual time). The peers' layers read `std::time::Instant`, which
//! no virtual clock can drive, so the simulation drives their public
//! algorithm types through their own traits, as their layers do after
//! each response: `tower_acc::Algorithm::update(rtt, in_flight, is_error,
//! false)` and `max_concurrency()`; `tower_resilience_adaptive::
//! ConcurrencyAlgorithm::record_success_with_load` / `record_failure` and
//! `limit()`. Everyone sheds at the limit (fail fast): tower-acc's own
//! layer would queue in `poll_ready` instead.
//!
//! **The backend.** Processor sharing with a knee: up to `knee` requests
//! run at full speed; past it each runs at `(knee / n)^1.5` of full speed,
//! so throughput falls past the knee (contention). A request's work is
//! 10 ms × U(0.5, 1.5) (20 ms after the mix shift). A request slower than
//! 100 ms (10× the mean work) is a timeout: it completes, but is not
//! goodput, and reaches the algorithm as a drop. The optimal limit is the
//! knee: the most throughput at the no-load latency.
//!
//! **The run.** Open-loop Poisson arrivals, as a share of the backend's
//! best throughput: warm-up at 1× (from a limit of 20), then 0.5× (false
//! sheds, counted once the in-flight the 1× phase left has first fallen to
//! the knee; the refusals before that, while the backend is still past its
//! knee with the warm-up's requests, are reported apart as `carried`), 1.5×, 4× (goodput, oscillation, p99), the knee halved at 4×,
//! recovered, and a shift to requests twice as heavy (same knee).

use sidejob::adaptive::{Aimd, Gradient2, Guarded, LittlesLaw, Vegas};

mod common;

use common::adaptive_sim::*;

fn acc<A: tower_acc::Algorithm>(algorithm: A) -> Peer<A> {
    Peer {
        algorithm,
        in_flight: 0,
        update: |a, rtt, in_flight, error| a.update(rtt, in_flight, error, false),
        limit: |a| a.max_concurrency(),
    }
}

fn resilience<A: tower_resilience_adaptive::ConcurrencyAlgorithm>(algorithm: A) -> Peer<A> {
    Peer {
        algorithm,
        in_flight: 0,
        update: |a, rtt, in_flight, failed| {
            if failed {
                a.record_failure();
            } else {
                a.record_success_with_load(rtt, in_flight);
            }
        },
        limit: |a| a.limit(),
    }
}

fn contenders() -> Vec<(&'static str, Box<dyn Contender>)> {
    use tower_resilience_adaptive as tra;
    vec![
        ("sidejob Guarded", Box::new(Ours::new(Guarded::default()))),
        (
            "sidejob Guarded 1/1",
            Box::new(Ours::sampled(Guarded::default(), 1)),
        ),
        (
            "sidejob Guarded 1/8",
            Box::new(Ours::sampled(Guarded::default(), 8)),
        ),
        (
            "sidejob Guarded 1/32",
            Box::new(Ours::sampled(Guarded::default(), 32)),
        ),
        (
            "sidejob Guarded 1/64",
            Box::new(Ours::sampled(Guarded::default(), 64)),
        ),
        ("sidejob Aimd", Box::new(Ours::new(Aimd::default()))),
        ("sidejob Vegas", Box::new(Ours::new(Vegas::default()))),
        (
            "sidejob Gradient2",
            Box::new(Ours::new(Gradient2::default())),
        ),
        (
            "sidejob LittlesLaw",
            Box::new(Ours::new(LittlesLaw::default())),
        ),
        (
            "tower-acc Aimd",
            Box::new(acc(tower_acc::Aimd::builder()
                .initial_limit(INITIAL)
                .min_limit(1)
                .max_limit(CEILING)
                .build())),
        ),
        (
            "tower-acc Vegas",
            Box::new(acc(tower_acc::Vegas::builder()
                .initial_limit(INITIAL)
                .max_limit(CEILING)
                .build())),
        ),
        (
            "tower-acc Gradient2",
            Box::new(acc(tower_acc::Gradient2::builder()
                .initial_limit(INITIAL)
                .min_limit(1)
                .max_limit(CEILING)
                .build())),
        ),
        (
            "t-resilience Aimd",
            Box::new(resilience(
                tra::Aimd::builder()
                    .initial_limit(INITIAL)
                    .max_limit(CEILING)
                    .build()
                    .expect("valid"),
            )),
        ),
        (
            "t-resilience Vegas",
            Box::new(resilience(
                tra::Vegas::builder()
                    .initial_limit(INITIAL)
                    .max_limit(CEILING)
                    .build()
                    .expect("valid"),
            )),
        ),
        (
            "t-resilience Gradient2",
            Box::new(resilience(
                tra::Gradient2::builder()
                    .initial_limit(INITIAL)
                    .max_limit(CEILING)
                    .build()
                    .expect("valid"),
            )),
        ),
    ]
}

// ---- the table -----------------------------------------------------------------

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let length = if full { 10 * SEC } else { SEC };
    let phase = |_name: &str, load, knee, work| Phase {
        load,
        knee,
        work,
        length,
    };
    let phases = [
        phase("warm-up 1x", 1.0, KNEE, WORK),
        phase("0.5x", 0.5, KNEE, WORK),
        phase("1.5x", 1.5, KNEE, WORK),
        phase("4x", 4.0, KNEE, WORK),
        phase("knee halved", 4.0, KNEE / 2, WORK),
        phase("recovered", 4.0, KNEE, WORK),
        phase("mix 2x heavier", 4.0, KNEE, 2.0 * WORK),
    ];
    // The unloaded p99: of U(0.5, 1.5) × 10 ms.
    let unloaded_p99 = WORK * 1.49;

    let mut out = String::new();
    out.push_str(&format!(
        "== adaptive limits: simulated backend (knee {KNEE}, work 10 ms x U(0.5,1.5), deadline 100 ms), {} s per phase, virtual clock ==\n",
        length / SEC
    ));
    out.push_str("reach: first time within +-10 % of the optimal limit (the knee) after the step; '-' never\n");
    out.push_str(&format!(
        "{:<23} {:>7} {:>9} {:>7} {:>7} {:>7} {:>9} {:>7} {:>8} {:>8} {:>8} {:>7}\n",
        "algorithm",
        "cold",
        "sheds@.5",
        "carried",
        "1.5x",
        "4x",
        "goodput",
        "osc%",
        "p99/unl",
        "halved",
        "recover",
        "mix"
    ));
    for index in 0..contenders().len() {
        // Each on a fresh thread: the sampling countdown is the thread's,
        // so a row does not depend on the rows before it.
        let (name, mut m) = std::thread::spawn(move || {
            let (name, mut contender) = contenders().swap_remove(index);
            (name, simulate(&mut *contender, &phases))
        })
        .join()
        .expect("the simulation does not panic");
        let reach = |m: &Measured| match m.reach {
            Some(t) => format!("{:.2}s", t as f64 / SEC as f64),
            None => "-".to_string(),
        };
        let four = &m[3];
        let best = KNEE as f64 / WORK * (length as f64 / SEC as f64);
        let goodput = four.goodput as f64 / best;
        let mean = four.limits.iter().sum::<f64>() / four.limits.len().max(1) as f64;
        let var = four.limits.iter().map(|l| (l - mean).powi(2)).sum::<f64>()
            / four.limits.len().max(1) as f64;
        let osc = 100.0 * var.sqrt() / mean.max(1.0);
        let p99 = quantile(&mut m[3].latencies, 0.99) as f64 / 1e9 / unloaded_p99;
        out.push_str(&format!(
            "{:<23} {:>7} {:>9} {:>7} {:>7} {:>7} {:>9.3} {:>7.1} {:>8.2} {:>8} {:>8} {:>7}\n",
            name,
            reach(&m[0]),
            m[1].shed,
            m[1].carried,
            reach(&m[2]),
            reach(&m[3]),
            goodput,
            osc,
            p99,
            reach(&m[4]),
            reach(&m[5]),
            reach(&m[6]),
        ));
    }
    out.push_str(
        "cold: from a limit of 20 at 1x. sheds@.5: requests refused at half load once the 1x phase's backlog has\n\
         drained (the in-flight first at or below the knee); carried: refused before that, while the backend was\n\
         still past its knee with the 1x phase's requests. goodput: completions within\n\
         the deadline at 4x over the backend's best. osc%: the limit's standard deviation over its mean, second half\n\
         of the 4x phase. p99/unl: p99 latency of admitted requests at 4x over the unloaded p99.\n\
         sidejob rows time one request in 16 (ControllerBuilder::DEFAULT_SAMPLE_EVERY) as Controller::timed does;\n\
         'Guarded 1/n' times one in n. Each row runs on a fresh thread (the sampling draws are the thread's).\n",
    );
    print!("{out}");
    if full {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/results/adaptive.txt");
        if let Err(err) = std::fs::write(path, &out) {
            eprintln!("could not write {path}: {err}");
        }
    }
}
