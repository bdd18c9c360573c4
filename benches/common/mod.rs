//! Timing helpers the benches' ratio tables share: a timed loop, and the
//! best of several interleaved runs of each contender (interleaving spreads
//! the machine's noise over every contender alike; the best run is the
//! one least disturbed).

// Each bench compiles this module on its own and uses what it needs.
#![allow(dead_code)]

pub mod adaptive_sim;
pub mod head_of_line;
pub mod rng;

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

/// The median of `xs` (the upper one for an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// ns per call of `op`: the best of 7 timed loops of `iters` calls.
pub fn ns_per_op(iters: u64, mut op: impl FnMut()) -> f64 {
    (0..7)
        .map(|_| time_loop(iters, &mut op))
        .fold(f64::INFINITY, f64::min)
}

/// Process CPU time (user + system) so far, from /proc/self/stat; `None`
/// where that file cannot be read.
pub fn cpu_time() -> Option<std::time::Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    // After the command name: state is field 3, utime 14, stime 15.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(std::time::Duration::from_millis(ticks * 10)) // USER_HZ is 100 on Linux
}

/// The median, 99th percentile and maximum of `latencies` (not empty).
pub fn quantiles(
    mut latencies: Vec<std::time::Duration>,
) -> (
    std::time::Duration,
    std::time::Duration,
    std::time::Duration,
) {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    (at(0.50), at(0.99), *latencies.last().expect("no latencies"))
}

/// The environment variable that makes a bench executable measure one
/// thing and exit (see [`in_fresh_processes`]).
pub const CHILD: &str = "SIDEJOB_BENCH_CHILD";

/// How many fresh processes a bench times its round trips in again.
pub const FRESH_RUNS: usize = 9;

/// Which measurement this process was started to make alone, if any: the
/// value of [`CHILD`]. A bench's `main` checks it first.
pub fn child_task() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// A child's answer: its figures on one line, as [`in_fresh_processes`]
/// parses them.
pub fn print_figures(figures: &[f64]) {
    let fields: Vec<String> = figures.iter().map(f64::to_string).collect();
    println!("{}", fields.join(" "));
}

/// Runs this bench's executable `runs` times more, one process after the
/// other, each with [`CHILD`] set to `task`, and parses what each prints
/// on its last line as numbers separated by spaces. A process that fails
/// or prints something else is skipped (and said so on stderr).
///
/// Why: a cross-core round trip settles, for a whole process, into one of
/// a few states that depend on where its threads landed; measured within
/// one process, two contenders share that state, but the ratio between
/// them still moves by 10-20 % from one process to the next. The median
/// over fresh processes is the figure to quote, the range says how far one
/// reading may stray.
pub fn in_fresh_processes(task: &str, runs: usize) -> Vec<Vec<f64>> {
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("fresh processes: this executable's path is unknown");
        return Vec::new();
    };
    (0..runs)
        .filter_map(|_| {
            let output = std::process::Command::new(&exe).env(CHILD, task).output();
            let parsed = output
                .ok()
                .filter(|out| out.status.success())
                .and_then(|out| {
                    let text = String::from_utf8(out.stdout).ok()?;
                    text.lines()
                        .last()?
                        .split_whitespace()
                        .map(|field| field.parse::<f64>().ok())
                        .collect::<Option<Vec<f64>>>()
                });
            if parsed.is_none() {
                eprintln!("fresh processes: a run of {task:?} failed or printed no figures");
            }
            parsed
        })
        .collect()
}

/// Each run's figure `num` over its figure `den` (runs without both are
/// left out).
pub fn ratios(runs: &[Vec<f64>], num: usize, den: usize) -> Vec<f64> {
    runs.iter()
        .filter_map(|figures| Some(figures.get(num)? / figures.get(den)?))
        .collect()
}

/// Prints the median and range of `ratios`, one per fresh process, after
/// `what`; nothing if no process gave one.
pub fn print_spread(what: &str, ratios: &[f64]) {
    if ratios.is_empty() {
        return;
    }
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    println!(
        "  {what} in {} fresh processes: median {:.3}, range {min:.3}-{max:.3}",
        ratios.len(),
        median(ratios.to_vec())
    );
}

/// The async benches' runtime: tokio's multi-thread scheduler on 2 worker
/// threads (this machine's cores), with timers and I/O.
pub fn two_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
