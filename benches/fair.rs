//! Fair shares across tenant keys (issue 37), four scenarios, each row
//! beside its peers in the same run:
//!
//! * **ours**: a `Limiter` of capacity C with a waiting room of 4 C (of
//!   4 per tenant in scenario 4, where C is 2), each
//!   request `acquire_with_async(Ask::new().key(&tenant))` (its weight set
//!   on the builder with `key_weight`); in the flood scenario also
//!   fail-fast (`.fail_fast()`, no room: the fair line);
//! * **tokio**: one `Semaphore` of C permits, `acquire` (FIFO; fail-fast:
//!   `try_acquire`): no notion of tenants;
//! * **per-key**: .NET's `PartitionedRateLimiter` shape, a semaphore per
//!   tenant of C / (the scenario's active tenants) permits (at least 1)
//!   under a global one of C, taken in that order: hard per-tenant
//!   ceilings that cannot lend.
//!
//! Every waiting request is cut at W = 4 S (virtual) and then counts as
//! refused. Arrivals are Poisson per tenant, holds exponential of mean S,
//! on tokio's paused clock (`start_paused`): the figures do not depend on
//! how busy the machine is, and every contender sees the same arrivals and
//! holds (one seed).
//!
//! The scenarios and what is printed:
//!
//! 1. **zipf**: 1,000 tenants with Zipf(1.1) demand (by rank), weights
//!    1, 2, 5 in turn, offered at 2x the capacity, at C = 64 and 256 (at
//!    64 the tenants that wait hold a fifth of a unit per weight, the
//!    tail of small tenants the rest: a 1 s average of so few units is
//!    noisy whatever the order). Jain's index of
//!    (in-flight share / weight) over the tenants backlogged through a
//!    1 s window (one of their requests waiting throughout), its mean and
//!    lowest over the windows, and the share of windows at or above 0.99
//!    (the target); the utilisation.
//! 2. **two**: 2 active tenants of 1,000, offering 1.6x and 0.4x of the
//!    capacity: the utilisation (target: at least 99 %).
//! 3. **flood**: one tenant at 10x the capacity, 20 light tenants each
//!    offering 1 % of it: the light tenants' p99 wait against S (target
//!    at most 2x) and their refusals (target 0), the flood's goodput, the
//!    utilisation. Waiting, then fail-fast.
//! 4. **cockroach** (CockroachDB#91533): 2 units, 10 equal tenants kept busy
//!    (each offering the whole capacity);
//!    in every window of 100 consecutive grants, each tenant's count
//!    against the 8 to 12 of "within 20 % of a tenth" (the target): the
//!    share of windows where all ten are, and the widest count seen.
//!
//! `FAIR_SECS` sets the measured run of each row in virtual seconds
//! (default 60, after a warm-up of 4 s not counted).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::rng::Rng;
use sidejob::{units::Ask, Limiter};
use tokio::sync::Semaphore;
use tokio::time::Instant;

const C: usize = 64;
const SHARDS: usize = 4;
/// Mean hold, virtual.
const S: Duration = Duration::from_millis(10);
/// Every wait is cut here (virtual).
const W: Duration = Duration::from_millis(40);
const WARMUP: Duration = Duration::from_secs(4);
const WINDOW: Duration = Duration::from_secs(1);
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Ours,
    Tokio,
    PerKey,
}

impl Kind {
    fn name(self, fail_fast: bool) -> &'static str {
        match (self, fail_fast) {
            (Kind::Ours, false) => "sidejob, keyed, a room",
            (Kind::Ours, true) => "sidejob, keyed, fail-fast",
            (Kind::Tokio, false) => "tokio Semaphore, acquire",
            (Kind::Tokio, true) => "tokio Semaphore, try_acquire",
            (Kind::PerKey, false) => "per-key semaphores, acquire",
            (Kind::PerKey, true) => "per-key semaphores, try",
        }
    }
}

/// One tenant's demand: offered load in Erlangs, and weight.
#[derive(Clone, Copy)]
struct Tenant {
    load: f64,
    weight: u32,
}

/// A scenario: its tenants, its capacity, how many of them the per-key
/// shape sizes its semaphores for, and our waiting room's size.
struct Scenario {
    tenants: Vec<Tenant>,
    capacity: usize,
    active: usize,
    room: usize,
}

/// What the run saw, per tenant and in total.
#[derive(Default)]
struct Tally {
    /// Per tenant: units held now, since when, and the held-time this
    /// window; requests waiting now, and whether the count hit 0 this
    /// window.
    held: Vec<usize>,
    since: Vec<Instant>,
    area: Vec<f64>,
    waiting: Vec<usize>,
    idle: Vec<bool>,
    /// Jain's index of each window (with at least two backlogged
    /// tenants).
    jain: Vec<f64>,
    /// Held unit-seconds in total, measured part.
    busy: f64,
    /// Per tenant: served, refused (or cut), and waits of the served.
    served: Vec<u64>,
    refused: Vec<u64>,
    waits: Vec<Vec<Duration>>,
    /// The tenants granted, in order (measured part).
    grants: Vec<u32>,
    measuring: bool,
}

impl Tally {
    fn new(n: usize, now: Instant) -> Tally {
        Tally {
            held: vec![0; n],
            since: vec![now; n],
            area: vec![0.0; n],
            waiting: vec![0; n],
            idle: vec![true; n],
            served: vec![0; n],
            refused: vec![0; n],
            waits: vec![Vec::new(); n],
            ..Tally::default()
        }
    }

    fn settle(&mut self, t: usize, now: Instant) {
        let dt = now.duration_since(self.since[t]).as_secs_f64();
        let units = self.held[t] as f64 * dt;
        self.area[t] += units;
        if self.measuring {
            self.busy += units;
        }
        self.since[t] = now;
    }

    fn hold(&mut self, t: usize, delta: isize, now: Instant) {
        self.settle(t, now);
        self.held[t] = self.held[t].wrapping_add_signed(delta);
    }

    fn wait(&mut self, t: usize, delta: isize) {
        self.waiting[t] = self.waiting[t].wrapping_add_signed(delta);
        if self.waiting[t] == 0 {
            self.idle[t] = true;
        }
    }

    /// Closes a window at `now`: Jain's index over the tenants backlogged
    /// throughout it.
    fn close_window(&mut self, now: Instant, weights: &[u32], capacity: usize) {
        let mut xs = Vec::new();
        for (t, &weight) in weights.iter().enumerate() {
            self.settle(t, now);
            if !self.idle[t] {
                let share = self.area[t] / WINDOW.as_secs_f64() / capacity as f64;
                xs.push(share / f64::from(weight));
            }
            self.area[t] = 0.0;
            self.idle[t] = self.waiting[t] == 0;
        }
        if self.measuring && xs.len() >= 2 && xs.iter().any(|&x| x > 0.0) {
            let sum: f64 = xs.iter().sum();
            let squares: f64 = xs.iter().map(|x| x * x).sum();
            self.jain.push(sum * sum / (xs.len() as f64 * squares));
        }
    }
}

/// The contender's admission, shared by every request task.
enum Gate {
    Ours(Arc<Limiter>),
    Tokio(Arc<Semaphore>),
    PerKey(Arc<Semaphore>, Arc<Vec<Arc<Semaphore>>>),
}

/// Something held until the hold ends.
#[allow(dead_code)]
enum Held {
    Ours(sidejob::OwnedPermit<sidejob::units::Many>),
    Tokio(tokio::sync::OwnedSemaphorePermit),
    PerKey(
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedSemaphorePermit,
    ),
}

impl Gate {
    async fn admit(&self, tenant: usize, fail_fast: bool) -> Option<Held> {
        match self {
            Gate::Ours(limiter) => {
                let ask = Ask::new().key(&tenant);
                let permit = if fail_fast {
                    limiter.acquire_with_owned(ask.fail_fast())
                } else {
                    Arc::clone(limiter).acquire_with_owned_async(ask).await
                };
                permit.ok().map(Held::Ours)
            }
            Gate::Tokio(semaphore) => {
                let permit = if fail_fast {
                    Arc::clone(semaphore).try_acquire_owned().ok()
                } else {
                    Arc::clone(semaphore).acquire_owned().await.ok()
                };
                permit.map(Held::Tokio)
            }
            Gate::PerKey(global, keys) => {
                let key = Arc::clone(&keys[tenant]);
                if fail_fast {
                    let own = key.try_acquire_owned().ok()?;
                    let all = Arc::clone(global).try_acquire_owned().ok()?;
                    Some(Held::PerKey(own, all))
                } else {
                    let own = key.acquire_owned().await.ok()?;
                    let all = Arc::clone(global).acquire_owned().await.ok()?;
                    Some(Held::PerKey(own, all))
                }
            }
        }
    }
}

/// Runs one contender over `scenario` for `secs` measured seconds.
fn run(scenario: &Scenario, kind: Kind, fail_fast: bool, secs: u64) -> Tally {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async move {
        let n = scenario.tenants.len();
        let weights: Vec<u32> = scenario.tenants.iter().map(|t| t.weight).collect();
        let capacity = scenario.capacity;
        let gate = Arc::new(match kind {
            Kind::Ours => {
                let mut builder = Limiter::builder();
                builder.capacity(capacity).shards(SHARDS.min(capacity));
                if !fail_fast {
                    builder
                        .max_waiters(scenario.room)
                        .max_wait(Duration::from_secs(3_600));
                }
                for (t, tenant) in scenario.tenants.iter().enumerate() {
                    if tenant.weight != 1 {
                        builder.key_weight(&t, tenant.weight);
                    }
                }
                Gate::Ours(Arc::new(builder.build().unwrap()))
            }
            Kind::Tokio => Gate::Tokio(Arc::new(Semaphore::new(capacity))),
            Kind::PerKey => {
                let each = (capacity / scenario.active).max(1);
                Gate::PerKey(
                    Arc::new(Semaphore::new(capacity)),
                    Arc::new((0..n).map(|_| Arc::new(Semaphore::new(each))).collect()),
                )
            }
        });
        let start = Instant::now();
        let tally = Arc::new(Mutex::new(Tally::new(n, start)));
        let end = start + WARMUP + Duration::from_secs(secs);
        // The windows' clock.
        {
            let (tally, weights) = (Arc::clone(&tally), weights.clone());
            tokio::spawn(async move {
                let mut at = start + WARMUP;
                tokio::time::sleep_until(at).await;
                tally.lock().unwrap().close_window(at, &weights, capacity);
                tally.lock().unwrap().measuring = true;
                while at + WINDOW <= end {
                    at += WINDOW;
                    tokio::time::sleep_until(at).await;
                    tally.lock().unwrap().close_window(at, &weights, capacity);
                }
                // Holds that run on past the end are not measured.
                tally.lock().unwrap().measuring = false;
            });
        }
        // Arrivals: one merged Poisson stream, each arrival's tenant drawn
        // by load (a cumulative table, searched).
        let total: f64 = scenario.tenants.iter().map(|t| t.load).sum();
        let mut cumulative = Vec::with_capacity(n);
        let mut acc = 0.0;
        for tenant in &scenario.tenants {
            acc += tenant.load / total;
            cumulative.push(acc);
        }
        let rate_gap = S.div_f64(total);
        let mut rng = Rng(SEED);
        let mut at = start;
        let mut tasks = Vec::new();
        while at < end {
            at += rng.exp(rate_gap);
            let u = rng.unit();
            let tenant = cumulative.partition_point(|&c| c < u).min(n - 1);
            let hold = rng.exp(S);
            tokio::time::sleep_until(at).await;
            let (gate, tally) = (Arc::clone(&gate), Arc::clone(&tally));
            tasks.push(tokio::spawn(async move {
                let came = Instant::now();
                tally.lock().unwrap().wait(tenant, 1);
                let held = tokio::time::timeout(W, gate.admit(tenant, fail_fast)).await;
                let now = Instant::now();
                {
                    let mut t = tally.lock().unwrap();
                    t.wait(tenant, -1);
                    let measuring = t.measuring;
                    match &held {
                        Ok(Some(_)) => {
                            t.hold(tenant, 1, now);
                            if measuring {
                                t.served[tenant] += 1;
                                t.waits[tenant].push(now - came);
                                t.grants.push(tenant as u32);
                            }
                        }
                        _ => {
                            if measuring {
                                t.refused[tenant] += 1;
                            }
                        }
                    }
                }
                if let Ok(Some(permit)) = held {
                    tokio::time::sleep(hold).await;
                    tally.lock().unwrap().hold(tenant, -1, Instant::now());
                    drop(permit);
                }
            }));
            if tasks.len() > 4_096 {
                tasks.retain(|task| !task.is_finished());
            }
        }
        for task in tasks {
            let _ = task.await;
        }
        Arc::try_unwrap(tally)
            .ok()
            .expect("every task has ended")
            .into_inner()
            .unwrap()
    })
}

fn p99(mut waits: Vec<Duration>) -> Duration {
    if waits.is_empty() {
        return Duration::ZERO;
    }
    waits.sort();
    waits[(waits.len() * 99 / 100).min(waits.len() - 1)]
}

fn utilisation(tally: &Tally, capacity: usize, secs: u64) -> f64 {
    tally.busy / (capacity as f64 * secs as f64)
}

fn main() {
    let secs: u64 = std::env::var("FAIR_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let kinds = [Kind::Ours, Kind::Tokio, Kind::PerKey];
    let erlangs = |x: f64| x * C as f64;
    println!(
        "fair shares: C = {C} on {SHARDS} shards, holds exp(mean {S:?}), waits cut at {W:?}, a room of 4 C (40 in scenario 4); {secs} s measured (virtual) after {WARMUP:?}"
    );

    // 1. Zipf, at C and at 4 C: at C the backlogged tenants hold a fifth
    // of a unit per weight (the tail takes the rest), so a 1 s window's
    // average of so few units is noisy whatever the order.
    let h: f64 = (1..=1000).map(|r| 1.0 / f64::powf(r as f64, 1.1)).sum();
    let zipf = |capacity: usize| Scenario {
        tenants: (0..1000)
            .map(|t| Tenant {
                load: 2.0 * capacity as f64 / f64::powf((t + 1) as f64, 1.1) / h,
                weight: [1, 2, 5][t % 3],
            })
            .collect(),
        capacity,
        active: 1000,
        room: 4 * capacity,
    };
    println!("\n1. zipf: 1,000 tenants, Zipf(1.1) demand, weights 1/2/5, 2x overload; Jain's index of (in-flight share / weight) over backlogged tenants, 1 s windows (target >= 0.99)");
    println!(
        "{:<32} {:>6} {:>10} {:>10} {:>12} {:>12}",
        "contender", "C", "mean J", "lowest J", "J >= 0.99", "utilisation"
    );
    for capacity in [C, 4 * C] {
        for kind in kinds {
            let tally = run(&zipf(capacity), kind, false, secs);
            let at_target = tally.jain.iter().filter(|&&j| j >= 0.99).count();
            let mean = tally.jain.iter().sum::<f64>() / tally.jain.len().max(1) as f64;
            let lowest = tally.jain.iter().copied().fold(f64::INFINITY, f64::min);
            println!(
                "{:<32} {:>6} {:>10.4} {:>10.4} {:>8}/{:<3} {:>11.1} %",
                kind.name(false),
                capacity,
                mean,
                lowest,
                at_target,
                tally.jain.len(),
                100.0 * utilisation(&tally, capacity, secs)
            );
        }
    }

    // 2. Two active tenants.
    let mut tenants = vec![
        Tenant {
            load: 0.0,
            weight: 1
        };
        1000
    ];
    tenants[0].load = erlangs(1.6);
    tenants[1].load = erlangs(0.4);
    tenants.retain(|t| t.load > 0.0);
    let two = Scenario {
        tenants,
        capacity: C,
        active: 2,
        room: 4 * C,
    };
    println!(
        "\n2. two: 2 active tenants of 1,000, offering 1.6x and 0.4x (target: utilisation >= 99 %)"
    );
    println!(
        "{:<32} {:>12} {:>14} {:>14}",
        "contender", "utilisation", "heavy served", "light served"
    );
    for kind in kinds {
        let tally = run(&two, kind, false, secs);
        let served =
            |t: usize| tally.served[t] as f64 / (tally.served[t] + tally.refused[t]).max(1) as f64;
        println!(
            "{:<32} {:>11.1} % {:>13.1} % {:>13.1} %",
            kind.name(false),
            100.0 * utilisation(&tally, C, secs),
            100.0 * served(0),
            100.0 * served(1)
        );
    }

    // 3. Flood.
    let mut tenants = vec![Tenant {
        load: erlangs(10.0),
        weight: 1,
    }];
    tenants.extend((0..20).map(|_| Tenant {
        load: erlangs(0.01),
        weight: 1,
    }));
    let flood = Scenario {
        tenants,
        capacity: C,
        active: 21,
        room: 4 * C,
    };
    println!("\n3. flood: one tenant at 10x, 20 light tenants at 1 % of C each (targets: light p99 wait <= 2 S, 0 light refusals)");
    println!(
        "{:<32} {:>14} {:>15} {:>14} {:>12}",
        "contender", "light p99 wait", "light refused", "flood served", "utilisation"
    );
    for fail_fast in [false, true] {
        for kind in kinds {
            let tally = run(&flood, kind, fail_fast, secs);
            let light_waits: Vec<Duration> = tally.waits[1..].iter().flatten().copied().collect();
            let light_refused: u64 = tally.refused[1..].iter().sum();
            let light_total: u64 = light_refused + tally.served[1..].iter().sum::<u64>();
            let flood_served =
                tally.served[0] as f64 / (tally.served[0] + tally.refused[0]).max(1) as f64;
            println!(
                "{:<32} {:>11.2} S {:>8} of {:<5} {:>12.1} % {:>11.1} %",
                kind.name(fail_fast),
                p99(light_waits).as_secs_f64() / S.as_secs_f64(),
                light_refused,
                light_total,
                100.0 * flood_served,
                100.0 * utilisation(&tally, C, secs)
            );
        }
    }

    // 4. CockroachDB#91533.
    let cockroach = Scenario {
        tenants: vec![
            Tenant {
                load: 2.0,
                weight: 1
            };
            10
        ],
        capacity: 2,
        active: 10,
        // Room for each tenant to keep a few waiting: backlogged.
        room: 40,
    };
    println!("\n4. cockroach: 2 units, 10 busy equal tenants (each offering 2 Erlangs: 10x the capacity in all); every window of 100 grants, each tenant's count (target: 8 to 12 in every window)");
    println!(
        "{:<32} {:>20} {:>14}",
        "contender", "windows all 8..12", "counts seen"
    );
    for kind in kinds {
        let tally = run(&cockroach, kind, false, secs);
        let mut good = 0;
        let (mut lowest, mut highest) = (usize::MAX, 0);
        let windows: Vec<&[u32]> = tally.grants.windows(100).step_by(10).collect();
        for window in &windows {
            let mut counts: HashMap<u32, usize> = HashMap::new();
            for &t in *window {
                *counts.entry(t).or_insert(0) += 1;
            }
            let all: Vec<usize> = (0..10)
                .map(|t| counts.get(&t).copied().unwrap_or(0))
                .collect();
            lowest = lowest.min(*all.iter().min().unwrap());
            highest = highest.max(*all.iter().max().unwrap());
            if all.iter().all(|c| (8..=12).contains(c)) {
                good += 1;
            }
        }
        println!(
            "{:<32} {:>13}/{:<6} {:>8}..{:<4}",
            kind.name(false),
            good,
            windows.len(),
            lowest,
            highest
        );
    }
}
