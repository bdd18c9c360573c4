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
//! sheds), 1.5×, 4× (goodput, oscillation, p99), the knee halved at 4×,
//! recovered, and a shift to requests twice as heavy (same knee).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use sidejob::adaptive::{Aimd, Controller, Gradient2, Guarded, LittlesLaw, Outcome, Vegas};
use sidejob::{Limiter, OwnedPermit};

/// The ticks of the virtual clock: nanoseconds.
type Nanos = u64;
const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000 * MS;
const KNEE: usize = 100;
const WORK: f64 = 0.010;
const DEADLINE: Nanos = 100 * MS;
const INITIAL: usize = 20;
const CEILING: usize = 1_000;

// ---- the contenders ----------------------------------------------------------

/// One algorithm under test, as the simulation sees it.
trait Contender {
    /// Admits a request or refuses it.
    fn admit(&mut self) -> Option<Held>;
    /// A request admitted at `start` completed at `now`.
    fn complete(
        &mut self,
        held: Held,
        now: Nanos,
        latency: Nanos,
        in_flight: usize,
        timed_out: bool,
    );
    /// The limit in force.
    fn limit(&self) -> usize;
}

/// What an admitted request holds: our permit, or nothing (the peers'
/// limit is checked against the in-flight count).
enum Held {
    // Held for its drop alone: the unit goes back when the request ends.
    #[allow(dead_code)]
    Ours(OwnedPermit),
    Peer,
}

struct Ours {
    limiter: Arc<Limiter>,
    controller: Controller,
}

impl Ours {
    fn new<A: sidejob::adaptive::Algorithm>(algorithm: A) -> Self {
        let limiter = Arc::new(
            Limiter::builder()
                .capacity(INITIAL)
                .shards(1)
                .build()
                .expect("valid"),
        );
        let controller = Controller::builder()
            .floor(1)
            .ceiling(CEILING)
            .build(Arc::clone(&limiter), algorithm)
            .expect("valid");
        Ours {
            limiter,
            controller,
        }
    }
}

impl Contender for Ours {
    fn admit(&mut self) -> Option<Held> {
        self.limiter.try_acquire_owned().ok().map(Held::Ours)
    }

    fn complete(&mut self, held: Held, now: Nanos, latency: Nanos, _: usize, timed_out: bool) {
        drop(held); // the unit back first, as `Timed` does
        let outcome = if timed_out {
            Outcome::Dropped
        } else {
            Outcome::Success
        };
        self.controller.record_at(
            Duration::from_nanos(now),
            Duration::from_nanos(latency),
            outcome,
        );
    }

    fn limit(&self) -> usize {
        self.limiter.capacity()
    }
}

/// A peer: its algorithm, and the in-flight count its semaphore would keep.
struct Peer<A> {
    algorithm: A,
    in_flight: usize,
    update: fn(&mut A, Duration, usize, bool),
    limit: fn(&A) -> usize,
}

impl<A> Contender for Peer<A> {
    fn admit(&mut self) -> Option<Held> {
        (self.in_flight < (self.limit)(&self.algorithm)).then(|| {
            self.in_flight += 1;
            Held::Peer
        })
    }

    fn complete(&mut self, _: Held, _: Nanos, latency: Nanos, in_flight: usize, timed_out: bool) {
        (self.update)(
            &mut self.algorithm,
            Duration::from_nanos(latency),
            in_flight,
            timed_out,
        );
        self.in_flight -= 1;
    }

    fn limit(&self) -> usize {
        (self.limit)(&self.algorithm)
    }
}

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

// ---- the simulation ------------------------------------------------------------

/// One phase of the run.
#[derive(Clone, Copy)]
struct Phase {
    /// Offered load, as a share of the backend's best throughput.
    load: f64,
    knee: usize,
    /// Mean work of a request, seconds.
    work: f64,
    length: Nanos,
}

/// What one phase measured.
#[derive(Default, Clone)]
struct Measured {
    /// Time from the phase's start to the first limit within ±10 % of
    /// the knee; `None` if never.
    reach: Option<Nanos>,
    shed: u64,
    arrived: u64,
    goodput: u64,
    /// The limit every 10 ms over the phase's second half.
    limits: Vec<f64>,
    /// Latencies of admitted requests completed in the phase, ns.
    latencies: Vec<Nanos>,
}

/// A deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A request in the backend.
struct Request {
    start: Nanos,
    held: Held,
}

fn simulate(contender: &mut dyn Contender, phases: &[Phase]) -> Vec<Measured> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Processor sharing on a virtual-work clock: `work_done` advances at
    // the backend's speed; a request finishes when it reaches its target.
    let mut work_done = 0.0f64;
    let mut finishing: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut requests: Vec<Option<Request>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut now: Nanos = 0;
    let mut results = Vec::new();
    for phase in phases {
        let end = now + phase.length;
        let start = now;
        let rate = phase.load * phase.knee as f64 / phase.work; // per second
        let mut measured = Measured::default();
        let mut next_arrival = now + exp(&mut rng, rate);
        let mut next_sample = now;
        loop {
            let in_flight = finishing.len();
            let speed = if in_flight <= phase.knee {
                1.0
            } else {
                (phase.knee as f64 / in_flight as f64).powf(1.5)
            };
            // When the first request in the heap finishes at this speed.
            let next_finish = finishing.peek().map(|Reverse((target, _))| {
                let left = (*target as f64 / 1e9 - work_done).max(0.0);
                now + (left / speed * 1e9).ceil() as Nanos
            });
            let next = next_arrival
                .min(next_finish.unwrap_or(Nanos::MAX))
                .min(next_sample);
            if next >= end {
                work_done += (end - now) as f64 / 1e9 * speed;
                now = end;
                break;
            }
            work_done += (next - now) as f64 / 1e9 * speed;
            now = next;
            if now == next_sample {
                if now >= start + phase.length / 2 {
                    measured.limits.push(contender.limit() as f64);
                }
                if measured.reach.is_none() {
                    let limit = contender.limit() as f64;
                    if (limit - phase.knee as f64).abs() <= 0.1 * phase.knee as f64 {
                        measured.reach = Some(now - start);
                    }
                }
                next_sample += 10 * MS;
            } else if Some(now) == next_finish {
                let Reverse((_, slot)) = finishing.pop().expect("peeked");
                let request = requests[slot].take().expect("in flight");
                free.push(slot);
                let latency = now - request.start;
                let timed_out = latency > DEADLINE;
                if !timed_out {
                    measured.goodput += 1;
                }
                measured.latencies.push(latency);
                contender.complete(request.held, now, latency, in_flight, timed_out);
            } else {
                measured.arrived += 1;
                match contender.admit() {
                    Some(held) => {
                        let work = phase.work * (0.5 + rng.unit());
                        let target = ((work_done + work) * 1e9) as u64;
                        let slot = free.pop().unwrap_or_else(|| {
                            requests.push(None);
                            requests.len() - 1
                        });
                        requests[slot] = Some(Request { start: now, held });
                        finishing.push(Reverse((target, slot)));
                    }
                    None => measured.shed += 1,
                }
                next_arrival = now + exp(&mut rng, rate);
            }
        }
        results.push(measured);
    }
    results
}

/// An exponential gap at `rate` per second, in ns (at least 1).
fn exp(rng: &mut Rng, rate: f64) -> Nanos {
    let u = rng.unit().max(1e-12);
    ((-u.ln() / rate * 1e9) as Nanos).max(1)
}

fn quantile(values: &mut [Nanos], q: f64) -> Nanos {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    values[((values.len() as f64 * q) as usize).min(values.len() - 1)]
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
        "{:<23} {:>7} {:>9} {:>7} {:>7} {:>9} {:>7} {:>8} {:>8} {:>8} {:>7}\n",
        "algorithm",
        "cold",
        "sheds@.5",
        "1.5x",
        "4x",
        "goodput",
        "osc%",
        "p99/unl",
        "halved",
        "recover",
        "mix"
    ));
    for (name, mut contender) in contenders() {
        let mut m = simulate(&mut *contender, &phases);
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
            "{:<23} {:>7} {:>9} {:>7} {:>7} {:>9.3} {:>7.1} {:>8.2} {:>8} {:>8} {:>7}\n",
            name,
            reach(&m[0]),
            m[1].shed,
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
        "cold: from a limit of 20 at 1x. sheds@.5: requests refused at half load. goodput: completions within\n\
         the deadline at 4x over the backend's best. osc%: the limit's standard deviation over its mean, second half\n\
         of the 4x phase. p99/unl: p99 latency of admitted requests at 4x over the unloaded p99.\n",
    );
    print!("{out}");
    if full {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/results/adaptive.txt");
        if let Err(err) = std::fs::write(path, &out) {
            eprintln!("could not write {path}: {err}");
        }
    }
}
