//! The simulation behind `benches/adaptive.rs`, shared with
//! `tests/adaptive_harness.rs`: a discrete-event model of a backend with a
//! concurrency knee under open-loop load, on a virtual clock, and the
//! contenders it drives (see the bench's docs for the model).

// The test uses our contender alone, not the peers'.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use sidejob::adaptive::{Controller, ControllerBuilder, Outcome};
use sidejob::{Limiter, OwnedPermit};

/// The ticks of the virtual clock: nanoseconds.
pub type Nanos = u64;
pub const MS: Nanos = 1_000_000;
pub const SEC: Nanos = 1_000 * MS;
pub const KNEE: usize = 100;
pub const WORK: f64 = 0.010;
pub const DEADLINE: Nanos = 100 * MS;
pub const INITIAL: usize = 20;
pub const CEILING: usize = 1_000;

/// One algorithm under test, as the simulation sees it.
pub trait Contender {
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
pub enum Held {
    // Held for its drop alone: the unit goes back when the request ends.
    #[allow(dead_code)]
    Ours(OwnedPermit),
    Peer,
}

pub struct Ours {
    pub limiter: Arc<Limiter>,
    pub controller: Controller,
}

impl Ours {
    /// With the controller's default sampling
    /// (`ControllerBuilder::DEFAULT_SAMPLE_EVERY`).
    pub fn new<A: sidejob::adaptive::Algorithm>(algorithm: A) -> Self {
        Self::sampled(algorithm, ControllerBuilder::DEFAULT_SAMPLE_EVERY)
    }

    /// Timing about one request in `every`, as `Controller::timed` does.
    pub fn sampled<A: sidejob::adaptive::Algorithm>(algorithm: A, every: u32) -> Self {
        Self::starting(algorithm, every, INITIAL)
    }

    /// Timing one request in `every`, from a limit of `initial`.
    pub fn starting<A: sidejob::adaptive::Algorithm>(
        algorithm: A,
        every: u32,
        initial: usize,
    ) -> Self {
        let limiter = Arc::new(
            Limiter::builder()
                .capacity(initial)
                .shards(1)
                .build()
                .expect("valid"),
        );
        let controller = Controller::builder()
            .floor(1)
            .ceiling(CEILING)
            .sample_every(every)
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
                    // Only the sampled requests are timed. (Asked at the end rather
                    // than at the start, as `Timed` does: the same draw.)
        if !self.controller.should_time() {
            return;
        }
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
pub struct Peer<A> {
    pub algorithm: A,
    pub in_flight: usize,
    pub update: fn(&mut A, Duration, usize, bool),
    pub limit: fn(&A) -> usize,
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

/// One phase of the run.
#[derive(Clone, Copy)]
pub struct Phase {
    /// Offered load, as a share of the backend's best throughput.
    pub load: f64,
    pub knee: usize,
    /// Mean work of a request, seconds.
    pub work: f64,
    pub length: Nanos,
}

/// How a request's work varies around the phase's mean.
#[derive(Clone, Copy, Debug)]
pub enum Spread {
    /// `work × U(0.5, 1.5)`: the main table's.
    Uniform,
    /// `work × exp(σ·z)`, z standard normal: log-normal noise of σ
    /// around a median of `work` (the independent harness's, σ 0.1).
    LogNormal(f64),
}

/// The backend's fixed traits: how work varies, and the deadline past
/// which a completion is a timeout (not goodput, a drop to the algorithm).
#[derive(Clone, Copy, Debug)]
pub struct Backend {
    pub spread: Spread,
    pub deadline: Nanos,
}

/// The main table's backend: uniform work, a 100 ms deadline.
pub const UNIFORM: Backend = Backend {
    spread: Spread::Uniform,
    deadline: DEADLINE,
};

/// What one phase measured.
#[derive(Default, Clone)]
pub struct Measured {
    /// Time from the phase's start to the first limit within ±10 % of
    /// the knee; `None` if never.
    pub reach: Option<Nanos>,
    /// Requests refused once the backlog carried over from the previous
    /// phase had drained (the in-flight had been at or below the phase's
    /// knee at least once): with the backend below its knee, none is needed.
    pub shed: u64,
    /// Requests refused earlier in the phase, while the in-flight the
    /// previous phase left was still above the knee: the backend was past
    /// its knee, so these refusals are the previous phase's overload, not
    /// a false shed of this phase's load.
    pub carried: u64,
    pub arrived: u64,
    pub goodput: u64,
    /// The limit every 10 ms over the phase's second half.
    pub limits: Vec<f64>,
    /// The limit every 10 ms over the phase's first 200 ms.
    pub early: Vec<f64>,
    /// The limit at the phase's end.
    pub end_limit: usize,
    /// When the last refusal counted in `shed` came, since the phase's
    /// start.
    pub last_shed: Option<Nanos>,
    /// Refusals counted in `shed` that came 100 ms or more into the phase:
    /// after the first two 50 ms windows, so after the controller has read
    /// a latency (a refusal before any request completes is the start
    /// limit's, whatever the algorithm).
    pub shed_late: u64,
    /// Of `shed_late`, those refused by a limit below the phase's knee:
    /// a burst the backend would have served at its no-load latency. (A
    /// limit at or above the knee refusing a burst past it is the knee's
    /// refusal, which the optimal limit makes too.)
    pub shed_below_knee: u64,
    /// Latencies of admitted requests completed in the phase, ns.
    pub latencies: Vec<Nanos>,
}

/// A deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    /// A standard normal draw (Box-Muller, two uniform draws).
    fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-12);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A request in the backend.
pub struct Request {
    pub start: Nanos,
    pub held: Held,
}

/// Runs `phases` against the main table's backend ([`UNIFORM`]) on the
/// draws of [`SEED`]: one run, for a test that checks a single seed.
pub fn simulate(contender: &mut dyn Contender, phases: &[Phase]) -> Vec<Measured> {
    simulate_seeded(contender, phases, UNIFORM, SEED)
}

/// The seed of [`simulate`].
pub const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The `n`th seed of a run over many (splitmix64 of `n`: well mixed, so
/// neighbouring seeds do not start in related draws).
pub fn nth_seed(n: u64) -> u64 {
    let mut z = n.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `run` once for each of `seeds` seeds (given [`nth_seed`] of its
/// number), each on a fresh thread, all at once: the sampling countdown
/// is the thread's, so a run does not depend on the runs before it.
/// Their answers, in the seeds' order.
pub fn on_seeds<T: Send + 'static>(
    seeds: u64,
    run: impl Fn(u64) -> T + Send + Copy + 'static,
) -> Vec<T> {
    (0..seeds)
        .map(|n| std::thread::spawn(move || run(nth_seed(n))))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|run| run.join().expect("the simulation does not panic"))
        .collect()
}

/// Runs `phases` one after the other against `backend`, from an empty
/// backend at virtual time 0, on the draws of `seed` (arrivals and work):
/// one run of many, for a figure read as a median over seeds rather than
/// from one run's luck.
pub fn simulate_seeded(
    contender: &mut dyn Contender,
    phases: &[Phase],
    backend: Backend,
    seed: u64,
) -> Vec<Measured> {
    // xorshift needs a state other than zero.
    let mut rng = Rng(seed.max(1));
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
        // Until the in-flight is first at or below the knee, the backlog of
        // the previous phase fills the backend.
        let mut drained = finishing.len() <= phase.knee;
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
            drained |= in_flight <= phase.knee;
            if now == next_sample {
                if now >= start + phase.length / 2 {
                    measured.limits.push(contender.limit() as f64);
                }
                if now < start + 200 * MS {
                    measured.early.push(contender.limit() as f64);
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
                let timed_out = latency > backend.deadline;
                if !timed_out {
                    measured.goodput += 1;
                }
                measured.latencies.push(latency);
                contender.complete(request.held, now, latency, in_flight, timed_out);
            } else {
                measured.arrived += 1;
                match contender.admit() {
                    Some(held) => {
                        let work = phase.work
                            * match backend.spread {
                                Spread::Uniform => 0.5 + rng.unit(),
                                Spread::LogNormal(sigma) => (sigma * rng.normal()).exp(),
                            };
                        let target = ((work_done + work) * 1e9) as u64;
                        let slot = free.pop().unwrap_or_else(|| {
                            requests.push(None);
                            requests.len() - 1
                        });
                        requests[slot] = Some(Request { start: now, held });
                        finishing.push(Reverse((target, slot)));
                    }
                    None if drained => {
                        measured.shed += 1;
                        measured.last_shed = Some(now - start);
                        if now - start >= 100 * MS {
                            measured.shed_late += 1;
                            if contender.limit() < phase.knee {
                                measured.shed_below_knee += 1;
                            }
                        }
                    }
                    None => measured.carried += 1,
                }
                next_arrival = now + exp(&mut rng, rate);
            }
        }
        measured.end_limit = contender.limit();
        results.push(measured);
    }
    results
}

/// An exponential gap at `rate` per second, in ns (at least 1).
pub fn exp(rng: &mut Rng, rate: f64) -> Nanos {
    let u = rng.unit().max(1e-12);
    ((-u.ln() / rate * 1e9) as Nanos).max(1)
}

pub fn quantile(values: &mut [Nanos], q: f64) -> Nanos {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    values[((values.len() as f64 * q) as usize).min(values.len() - 1)]
}
