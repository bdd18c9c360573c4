//! Adaptive limits against a simulated backend: every algorithm of ours and
//! the Rust peers' (`tower-acc`, `tower-resilience-adaptive`), in one run.
//!
//! `cargo bench --bench adaptive` prints the table and writes it to
//! `benches/results/adaptive.txt`; `cargo test --benches` runs a short
//! smoke pass.
//!
//! **A discrete-event simulation on a virtual clock.** No sleeps, no wall
//! clock: the same seeds give the same table on a busy 2-core machine as
//! on an idle one, and a minute of traffic takes a fraction of a second.
//! Every row is run on 25 seeds (the arrivals' and the work's draws) and
//! every column is their median: one run's figures are as much its
//! draws' luck as the algorithm's. Our contenders run the real thing on the virtual
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

use std::time::Duration;

use sidejob::adaptive::{Aimd, Algorithm, Gradient2, Guarded, LittlesLaw, Vegas};

mod common;

use common::adaptive_sim::*;

fn acc<A: tower_acc::Algorithm>(algorithm: A) -> Peer<A> {
    Peer {
        algorithm,
        in_flight: 0,
        // tower-acc's layer returns the permit before it updates the
        // algorithm: the in-flight it passes leaves the request out.
        update: |a, rtt, in_flight, error| a.update(rtt, in_flight - 1, error, false),
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

/// Every contender, from a limit of `initial`. The peers run with their
/// builders' defaults (what their docs recommend: the builder tables of
/// tower-acc 0.1 and tower-resilience-adaptive 0.14) but for the initial
/// limit, which is the scenario's, and tower-acc's `min_limit` (default
/// 20), lowered to the initial limit when it starts below it (its builder
/// refuses an initial limit under the minimum).
fn contenders(initial: usize) -> Vec<(&'static str, Box<dyn Contender>)> {
    use tower_resilience_adaptive as tra;
    fn ours<A: Algorithm>(algorithm: A, every: u32, initial: usize) -> Box<dyn Contender> {
        Box::new(Ours::starting(algorithm, every, initial))
    }
    let every = sidejob::adaptive::ControllerBuilder::DEFAULT_SAMPLE_EVERY;
    let acc_min = initial.min(20);
    vec![
        ("sidejob Guarded", ours(Guarded::default(), every, initial)),
        ("sidejob Guarded 1/1", ours(Guarded::default(), 1, initial)),
        ("sidejob Guarded 1/8", ours(Guarded::default(), 8, initial)),
        (
            "sidejob Guarded 1/32",
            ours(Guarded::default(), 32, initial),
        ),
        (
            "sidejob Guarded 1/64",
            ours(Guarded::default(), 64, initial),
        ),
        ("sidejob Aimd", ours(Aimd::default(), every, initial)),
        ("sidejob Vegas", ours(Vegas::default(), every, initial)),
        (
            "sidejob Gradient2",
            ours(Gradient2::default(), every, initial),
        ),
        (
            "sidejob LittlesLaw",
            ours(LittlesLaw::default(), every, initial),
        ),
        (
            "tower-acc Aimd",
            Box::new(acc(tower_acc::Aimd::builder()
                .initial_limit(initial)
                .min_limit(acc_min)
                .build())),
        ),
        (
            "tower-acc Vegas",
            Box::new(acc(tower_acc::Vegas::builder()
                .initial_limit(initial)
                .build())),
        ),
        (
            "tower-acc Gradient2",
            Box::new(acc(tower_acc::Gradient2::builder()
                .initial_limit(initial)
                .min_limit(acc_min)
                .build())),
        ),
        (
            "t-resilience Aimd",
            Box::new(resilience(
                tra::Aimd::builder()
                    .initial_limit(initial)
                    .build()
                    .expect("valid"),
            )),
        ),
        (
            "t-resilience Vegas",
            Box::new(resilience(
                tra::Vegas::builder()
                    .initial_limit(initial)
                    .build()
                    .expect("valid"),
            )),
        ),
        (
            "t-resilience Gradient2",
            Box::new(resilience(
                tra::Gradient2::builder()
                    .initial_limit(initial)
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
    // ADAPTIVE_SEEDS: seeds per row, for a closer look.
    let seeds = std::env::var("ADAPTIVE_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if full { H_SEEDS } else { 2 });
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
        "== adaptive limits: simulated backend (knee {KNEE}, work 10 ms x U(0.5,1.5), deadline 100 ms), {} s per phase, virtual clock; medians over {seeds} seeds ==\n",
        length / SEC
    ));
    out.push_str("reach: first time within +-10 % of the optimal limit (the knee) after the step; '-' never\n");
    out.push_str(&format!(
        "{:<23} {:>7} {:>11} {:>7} {:>7} {:>7} {:>9} {:>7} {:>8} {:>14} {:>8} {:>7}\n",
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
    let only = std::env::var("ADAPTIVE_ONLY").unwrap_or_default();
    for index in 0..contenders(INITIAL).len() {
        let name = contenders(INITIAL).swap_remove(index).0;
        if !name.contains(&only) {
            continue;
        }
        let runs: Vec<Vec<Measured>> = on_seeds(seeds, move |seed| {
            let mut contender = contenders(INITIAL).swap_remove(index).1;
            simulate_seeded(&mut *contender, &phases, UNIFORM, seed)
        });
        // A reach column: the median over the seeds, never reached sorting
        // last; `slowest` adds the slowest seed's.
        let reach = |phase: usize, slowest: bool| {
            let times: Vec<f64> = runs
                .iter()
                .map(|m| {
                    m[phase]
                        .reach
                        .map_or(f64::INFINITY, |t| t as f64 / SEC as f64)
                })
                .collect();
            let median = seconds(median(&times).unwrap_or(f64::INFINITY));
            if slowest {
                let max = times.iter().copied().fold(0.0, f64::max);
                format!("{median} ({})", seconds(max))
            } else {
                median
            }
        };
        let best = KNEE as f64 / WORK * (length as f64 / SEC as f64);
        let column = |f: &dyn Fn(&[Measured]) -> f64| {
            median(&runs.iter().map(|m| f(m)).collect::<Vec<_>>()).unwrap_or(0.0)
        };
        let goodput = column(&|m| m[3].goodput as f64 / best);
        let osc = column(&|m| {
            let limits = &m[3].limits;
            let mean = limits.iter().sum::<f64>() / limits.len().max(1) as f64;
            let var =
                limits.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / limits.len().max(1) as f64;
            100.0 * var.sqrt() / mean.max(1.0)
        });
        let p99 =
            column(&|m| quantile(&mut m[3].latencies.clone(), 0.99) as f64 / 1e9 / unloaded_p99);
        let sheds: Vec<u64> = runs.iter().map(|m| m[1].shed).collect();
        let carried: Vec<u64> = runs.iter().map(|m| m[1].carried).collect();
        out.push_str(&format!(
            "{:<23} {:>7} {:>11} {:>7} {:>7} {:>7} {:>9.3} {:>7.1} {:>8.2} {:>14} {:>8} {:>7}\n",
            name,
            reach(0, false),
            format!(
                "{} (<={})",
                median(&sheds).unwrap_or(0),
                sheds.iter().max().unwrap_or(&0)
            ),
            median(&carried).unwrap_or(0),
            reach(2, false),
            reach(3, false),
            goodput,
            osc,
            p99,
            reach(4, true),
            reach(5, false),
            reach(6, false),
        ));
    }
    out.push_str(
        "Every column is the median over the seeds. cold: from a limit of 20 at 1x. sheds@.5: requests refused at\n\
         half load once the 1x phase's backlog has\n\
         drained (the in-flight first at or below the knee); carried: refused before that, while the backend was\n\
         still past its knee with the 1x phase's requests. goodput: completions within\n\
         the deadline at 4x over the backend's best. osc%: the limit's standard deviation over its mean, second half\n\
         of the 4x phase. p99/unl: p99 latency of admitted requests at 4x over the unloaded p99.\n\
         sidejob rows time one request in 16 (ControllerBuilder::DEFAULT_SAMPLE_EVERY) as Controller::timed does;\n\
         'Guarded 1/n' times one in n. Each run is on a fresh thread (the sampling draws are the thread's).\n\
         sheds@.5 and halved add the worst seed's figure.\n",
    );
    out.push('\n');
    out.push_str(&harness(length, seeds));
    print!("{out}");
    if full {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/results/adaptive.txt");
        if let Err(err) = std::fs::write(path, &out) {
            eprintln!("could not write {path}: {err}");
        }
    }
}

// ---- the independent harness's conditions ----------------------------------------

/// The knee, base latency, noise and start of the independent harness
/// (issue 39, item 11).
const H_KNEE: usize = 32;
const H_WORK: f64 = 0.020;
const H_SIGMA: f64 = 0.1;
const H_START: usize = H_KNEE / 2;

/// Seeds per row of both tables (`--bench`; the smoke pass runs 2).
const H_SEEDS: u64 = 25;

/// The peers again, with the settings their own READMEs show (beside
/// their builders' defaults in [`contenders`]), from the harness's start.
fn documented_peers(initial: usize) -> Vec<(&'static str, Box<dyn Contender>)> {
    use tower_resilience_adaptive as tra;
    vec![
        (
            "tower-acc Aimd (docs)",
            Box::new(acc(tower_acc::Aimd::builder()
                .initial_limit(initial)
                .min_limit(10)
                .max_limit(200)
                .backoff_ratio(0.9)
                .timeout(Duration::from_secs(5))
                .build())),
        ),
        (
            "tower-acc Vegas (docs)",
            Box::new(acc(tower_acc::Vegas::builder()
                .initial_limit(initial)
                .max_limit(500)
                .smoothing(0.5)
                .build())),
        ),
        (
            "tower-acc Gradient2 (docs)",
            Box::new(acc(tower_acc::Gradient2::builder()
                .initial_limit(initial)
                .min_limit(initial.min(20))
                .max_limit(200)
                .smoothing(0.2)
                .rtt_tolerance(1.5)
                .long_window(600)
                .build())),
        ),
        (
            "t-resilience Aimd (docs)",
            Box::new(resilience(
                tra::Aimd::builder()
                    .initial_limit(initial)
                    .min_limit(1)
                    .max_limit(100)
                    .increase_by(1)
                    .decrease_factor(0.5)
                    .latency_threshold(Duration::from_millis(100))
                    .build()
                    .expect("valid"),
            )),
        ),
        (
            "t-resilience Vegas (docs)",
            Box::new(resilience(
                tra::Vegas::builder()
                    .initial_limit(initial)
                    .alpha(3)
                    .beta(6)
                    .build()
                    .expect("valid"),
            )),
        ),
        (
            "t-resilience Gradient2 (docs)",
            Box::new(resilience(
                tra::Gradient2::builder()
                    .initial_limit(initial)
                    .min_limit(1)
                    .max_limit(200)
                    .rtt_tolerance(1.5)
                    .build()
                    .expect("valid"),
            )),
        ),
    ]
}

/// Every row of the second table: ours and the peers at their builders'
/// defaults, then the peers as their docs configure them.
fn harness_rows() -> Vec<(&'static str, Box<dyn Contender>)> {
    let mut rows = contenders(H_START);
    rows.extend(documented_peers(H_START));
    rows
}

/// The median of `values` (the lower of the middle two), `None` when
/// empty.
fn median<T: Copy + PartialOrd>(values: &[T]) -> Option<T> {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    sorted.get(sorted.len().saturating_sub(1) / 2).copied()
}

/// A time in seconds as a table shows it; `-` for never (infinity).
fn seconds(t: f64) -> String {
    if t.is_finite() {
        format!("{t:.2}s")
    } else {
        "-".to_string()
    }
}

/// One seed's row of the second table.
struct HarnessRun {
    shed: u64,
    shed_late: u64,
    shed_below_knee: u64,
    shed_share: f64,
    end_limit: usize,
    gp_four: f64,
    gp_one_half: f64,
    /// `None`: never within ±10 % of the halved knee (sorted last).
    halved: Option<f64>,
    mean200: f64,
    gp_halved: f64,
}

/// The second table: the independent harness's conditions. A backend with
/// a knee of 32, 20 ms of work with log-normal noise σ 0.1 (median 20 ms),
/// a deadline of 200 ms (ten times the work, as the main table's), every
/// limit starting at 16 (half the knee) with the crate's defaults
/// otherwise. Phases: 0.5x from that start, 4x, 1.5x, then the knee
/// halved to 16 under 1.5x (of the halved backend's best, as the main
/// table's steps are).
///
/// Each row is `seeds` runs on different draws (arrivals and work), each
/// on a fresh thread: one run's figures are as much its draws' luck as
/// the algorithm's (a halved knee read in 0.15 s on one seed is 0.21 s
/// at the median of 150), so every column is a median over the runs,
/// the two that matter most with their range.
fn harness(length: Nanos, seeds: u64) -> String {
    let backend = Backend {
        spread: Spread::LogNormal(H_SIGMA),
        deadline: 200 * MS,
    };
    let phase = |load, knee| Phase {
        load,
        knee,
        work: H_WORK,
        length,
    };
    let phases = [
        phase(0.5, H_KNEE),
        phase(4.0, H_KNEE),
        phase(1.5, H_KNEE),
        phase(1.5, H_KNEE / 2),
    ];
    let mut out = format!(
        "== the independent harness's conditions: knee {H_KNEE}, work 20 ms x lognormal(sigma {H_SIGMA}), deadline 200 ms, every limit from {H_START}, {} s per phase; medians over {seeds} seeds ==\n",
        length / SEC
    );
    out.push_str(&format!(
        "{:<29} {:>16} {:>11} {:>6} {:>6} {:>6} {:>6} {:>7} {:>20} {:>7} {:>9}\n",
        "algorithm",
        "sheds@.5",
        "after.1s",
        "<knee",
        "shed%",
        "lim@.5",
        "gp 4x",
        "gp 1.5x",
        "halved",
        "mean200",
        "gp halved"
    ));
    let best = |knee: usize| knee as f64 / H_WORK * (length as f64 / SEC as f64);
    // ADAPTIVE_ONLY: the rows whose name holds it, for a closer look.
    let only = std::env::var("ADAPTIVE_ONLY").unwrap_or_default();
    for index in 0..harness_rows().len() {
        let name = harness_rows().swap_remove(index).0;
        if !name.contains(&only) {
            continue;
        }
        let runs: Vec<HarnessRun> = on_seeds(seeds, move |seed| {
            let mut contender = harness_rows().swap_remove(index).1;
            simulate_seeded(&mut *contender, &phases, backend, seed)
        })
        .into_iter()
        .map(|m| {
            let (half, halved) = (&m[0], &m[3]);
            HarnessRun {
                shed: half.shed + half.carried,
                shed_late: half.shed_late,
                shed_below_knee: half.shed_below_knee,
                shed_share: 100.0 * (half.shed + half.carried) as f64 / half.arrived.max(1) as f64,
                end_limit: half.end_limit,
                gp_four: m[1].goodput as f64 / best(H_KNEE),
                gp_one_half: m[2].goodput as f64 / best(H_KNEE),
                halved: halved.reach.map(|t| t as f64 / SEC as f64),
                mean200: halved.early.iter().sum::<f64>() / halved.early.len().max(1) as f64,
                gp_halved: halved.goodput as f64 / best(H_KNEE / 2),
            }
        })
        .collect();
        let column = |f: fn(&HarnessRun) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        let sheds: Vec<u64> = runs.iter().map(|r| r.shed).collect();
        let late: Vec<u64> = runs.iter().map(|r| r.shed_late).collect();
        let below: u64 = runs.iter().map(|r| r.shed_below_knee).sum();
        // Never reached sorts last: as if at infinity.
        let halved: Vec<f64> = runs
            .iter()
            .map(|r| r.halved.unwrap_or(f64::INFINITY))
            .collect();
        let extreme = |pick: fn(f64, f64) -> f64, start| halved.iter().copied().fold(start, pick);
        out.push_str(&format!(
            "{:<29} {:>16} {:>11} {:>6} {:>6.2} {:>6} {:>6.3} {:>7.3} {:>20} {:>7.1} {:>9.3}\n",
            name,
            format!(
                "{} ({}-{})",
                median(&sheds).unwrap_or(0),
                sheds.iter().min().unwrap_or(&0),
                sheds.iter().max().unwrap_or(&0)
            ),
            format!(
                "{} (<={})",
                median(&late).unwrap_or(0),
                late.iter().max().unwrap_or(&0)
            ),
            below,
            column(|r| r.shed_share).unwrap_or(0.0),
            median(&runs.iter().map(|r| r.end_limit).collect::<Vec<_>>()).unwrap_or(0),
            column(|r| r.gp_four).unwrap_or(0.0),
            column(|r| r.gp_one_half).unwrap_or(0.0),
            format!(
                "{} ({}-{})",
                seconds(median(&halved).unwrap_or(f64::INFINITY)),
                seconds(extreme(f64::min, f64::INFINITY)),
                seconds(extreme(f64::max, 0.0))
            ),
            column(|r| r.mean200).unwrap_or(0.0),
            column(|r| r.gp_halved).unwrap_or(0.0),
        ));
    }
    out.push_str(
        "Every column is the median over the seeds. sheds@.5: requests refused at 0.5x from the start (none carried:\n\
         the backend starts empty), median (least-most); after.1s: of them, refused 0.1 s or more into the phase\n\
         (after two 50 ms windows: what the controller refused having read a latency), median (most); <knee: of\n\
         those, refused by a limit below the knee (32), summed over all seeds: a burst the backend would have\n\
         served at its no-load latency (a limit at the knee refuses the rest too); shed%:\n\
         of arrivals; lim@.5: the limit at the end of that phase. gp: completions within the deadline over the\n\
         backend's best (knee / 20 ms) in that phase. halved: first time within +-10 % of the halved knee (16) after\n\
         it halves under 1.5x, median (fastest-slowest; '-' never); mean200: the limit's mean over the 200 ms after\n\
         (every 10 ms). sidejob rows time one request in 16 (the default) unless '1/n'; the peers run from a limit\n\
         of 16 with their builders' defaults, and with the settings their READMEs show ('(docs)').\n",
    );
    out
}
