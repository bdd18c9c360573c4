//! Discrete-event simulation (CLUSTER.md §3.4): a fleet of keepers running
//! the production `Core` against the Rust `Model` of the scripts, in
//! virtual time, deterministic per seed.
//!
//! Real time is in microseconds. Each node's monotonic clock runs at a rate
//! within `1 ± ρ`; the store's clock too, and it can be stepped forward by
//! up to `G` (allowed by A2). Messages take 0.2–2 ms, sometimes longer than
//! the renew timeout (the reply is lost, the store applied it anyway).
//! Faults: node crash (its work dies with it), partitions, Redis restart
//! with or without data. Workload: Poisson arrivals per node with Zipf
//! weights, optionally a hot spot that moves, holds exponential and capped
//! at `H` (a fraction, 5 % by default, uniform in [H/5, H]). The invariant `Σ in-flight ≤ C` is checked at every event; the
//! same arrivals run through an ideal global semaphore for utilisation.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use sidejob_redis::{Budget, Core, Due, InitArgs, Model, Reading, RenewArgs, RenewReply};

/// A deliberately broken variant the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    None,
    /// 1. no `H`/`ε`/`ρ` margin in the node's deadline.
    NoMargins,
    /// 2. the store reaps at expiry, without grace.
    NoGrace,
    /// 3. the node raises its local limit to `want` before Redis records it.
    GrowBeforeRecord,
    /// 4. no learning mode after state loss.
    NoLearning,
    /// 5. expiry judged on the node's wall clock (against the store's stamp).
    NodeClockExpiry,
    /// 1 + 2.
    MarginsAndGrace,
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub nodes: usize,
    pub capacity: u64,
    /// Offered load as a fraction of `C`.
    pub load: f64,
    pub skew: f64,
    /// Move the hot spot every this many seconds.
    pub move_every: Option<f64>,
    pub seconds: f64,
    pub mean_hold_ms: f64,
    pub seed: u64,
    pub faults: bool,
    /// The faults that break each mutant: the hot node partitioned while
    /// the store's clock steps forward by G, or while the store is wiped.
    pub adversarial: bool,
    pub mutant: Mutant,
    /// Baseline: a static C/N split, no keeper (Riak-style).
    pub static_split: bool,
    /// Fraction of holds uniform in [H/5, H] (the rest exponential).
    pub long_holds: f64,
}

impl SimConfig {
    pub fn new(seed: u64) -> Self {
        SimConfig {
            nodes: 5,
            capacity: 200,
            load: 0.8,
            skew: 1.2,
            move_every: None,
            seconds: 20.0,
            mean_hold_ms: 50.0,
            seed,
            faults: false,
            adversarial: false,
            mutant: Mutant::None,
            static_split: false,
            long_holds: 0.05,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct SimResult {
    /// Events at which Σ in-flight exceeded C.
    pub violations: u64,
    pub peak: u64,
    pub accepted: u64,
    pub ideal_accepted: u64,
    pub offered: u64,
    /// Store states with granted > C (after the capacity) or ≠ Σ held.
    pub store_violations: u64,
    pub store_calls: u64,
    /// Refusals while fleet usage was below C: [units free in the store,
    /// granted but not in any local capacity, local but idle elsewhere].
    pub refusals_below_c: [u64; 3],
    /// Longest from a crash until the crashed node's record was reaped, ms.
    pub crash_back_ms: Option<u64>,
    /// Longest from a crashed node's last recorded expiry + G (store time,
    /// the earliest the store may reap it) until its record was reaped, ms
    /// (runs without a store clock step).
    pub reap_late_ms: Option<i64>,
    pub faults: Vec<String>,
}

impl SimResult {
    pub fn utilisation(&self) -> f64 {
        self.accepted as f64 / self.ideal_accepted.max(1) as f64
    }
}

// Timing of the simulated fleet (seconds-scale, as in production).
pub const T_MS: u64 = 3000;
pub const R_MS: u64 = 500;
pub const G_MS: u64 = 1000;
pub const H_MS: u64 = 500;
pub const EPS_MS: u64 = 100;
pub const RHO: f64 = 1e-3;

pub fn budget(cfg: &SimConfig) -> Budget {
    let ms = Duration::from_millis;
    let no_margins = matches!(cfg.mutant, Mutant::NoMargins | Mutant::MarginsAndGrace);
    Budget::builder()
        .name("sim")
        .capacity(cfg.capacity as usize)
        .ttl(ms(T_MS))
        .renew_every(ms(R_MS))
        .grace(ms(G_MS))
        .max_hold(ms(if no_margins { 0 } else { H_MS }))
        .pause_margin(ms(if no_margins { 0 } else { EPS_MS }))
        .clock_margin(if no_margins { 0.0 } else { RHO })
        .min_block(1)
        .build()
        .expect("sim budget")
}

/// splitmix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_F42D_4C95_7F2D)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

#[derive(Debug, Clone)]
enum Ev {
    Arrival {
        node: usize,
        hold: u64,
    },
    Done {
        node: usize,
        life: u32,
    },
    Wake {
        node: usize,
        life: u32,
    },
    AtStore {
        node: usize,
        life: u32,
        call: Call,
        t_send: Duration,
    },
    Reply {
        node: usize,
        life: u32,
        req: u64,
        t_send: Duration,
        reply: Option<StoreReply>,
    },
    Timeout {
        node: usize,
        life: u32,
        req: u64,
        t_send: Duration,
    },
    Crash {
        node: usize,
    },
    Partition {
        node: usize,
        on: bool,
    },
    StoreRestart {
        keep: bool,
    },
    ClockStep {
        ms: i64,
    },
    Move,
}

#[derive(Debug, Clone)]
enum Call {
    Init(InitArgs),
    Renew(RenewArgs),
}

#[derive(Debug, Clone)]
enum StoreReply {
    Init,
    Renew(RenewReply),
}

struct Node {
    core: Core,
    capacity: u64,
    usage: u64,
    accepted: u64,
    rejected: u64,
    rate: f64,
    /// Wall-clock offset from the store, ms (only mutant 5 uses wall clocks).
    wall_offset_ms: i64,
    alive: bool,
    life: u32,
    busy: Option<u64>,
    partitioned: bool,
    weight: f64,
    init: InitArgs,
}

impl Node {
    fn local(&self, real_us: u64) -> Duration {
        Duration::from_nanos((real_us as f64 * 1000.0 * self.rate) as u64)
    }
    fn real(&self, local: Duration) -> u64 {
        (local.as_nanos() as f64 / 1000.0 / self.rate).ceil() as u64
    }
    fn reading(&self) -> Reading {
        Reading {
            capacity: self.capacity as usize,
            usage: self.usage as usize,
            accepted: self.accepted,
            rejected: self.rejected,
        }
    }
}

pub fn run(cfg: &SimConfig) -> SimResult {
    let mut rng = Rng::new(cfg.seed);
    let budget = budget(cfg);
    let grace = if matches!(cfg.mutant, Mutant::NoGrace | Mutant::MarginsAndGrace) {
        0
    } else {
        G_MS
    };
    let end = (cfg.seconds * 1e6) as u64;
    let mut res = SimResult::default();
    let mut heap: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut evs: Vec<Ev> = Vec::new();
    let mut seq = 0u64;
    let mut push =
        |heap: &mut BinaryHeap<Reverse<(u64, u64, usize)>>, evs: &mut Vec<Ev>, at: u64, ev: Ev| {
            seq += 1;
            evs.push(ev);
            heap.push(Reverse((at, seq, evs.len() - 1)));
        };
    let mut model = Model::default();
    let mut run_id = String::from("r0");
    let store_rate = 1.0 + (rng.unit() * 2.0 - 1.0) * RHO;
    let mut store_step: i64 = 0;
    let store_base: i64 = 1_700_000_000_000;
    let store_now =
        |real: u64, step: i64| store_base + (real as f64 / 1000.0 * store_rate) as i64 + step;

    // Zipf weights; the hot spot is node 0 unless it moves.
    let weights: Vec<f64> = (1..=cfg.nodes)
        .map(|i| 1.0 / (i as f64).powf(cfg.skew))
        .collect();
    let wsum: f64 = weights.iter().sum();
    // The mean hold of the mix below: exponential, or uniform in [H/5, H].
    let lh = cfg.long_holds;
    let mean_hold_s = ((1.0 - lh) * cfg.mean_hold_ms + lh * 0.6 * H_MS as f64) / 1000.0;
    let total_rate = cfg.load * cfg.capacity as f64 / mean_hold_s; // per second
    let mut nodes: Vec<Node> = (0..cfg.nodes)
        .map(|i| Node {
            core: Core::new(format!("n{i}"), &budget),
            capacity: 0,
            usage: 0,
            accepted: 0,
            rejected: 0,
            rate: 1.0 + (rng.unit() * 2.0 - 1.0) * RHO,
            wall_offset_ms: rng.range(0, 4000) as i64 - 2000,
            alive: true,
            life: 0,
            busy: None,
            partitioned: false,
            weight: weights[i] / wsum,
            init: InitArgs {
                capacity: cfg.capacity,
                capacity_version: 0,
                ttl_ms: T_MS,
                grace_ms: grace,
                epoch: format!("e{}", cfg.seed),
                fresh: true,
                test: false,
                debug_now: None,
            },
        })
        .collect();

    // The arrival trace, shared with the ideal semaphore.
    let mut trace: Vec<(u64, usize, u64)> = Vec::new();
    let mut rotation = 0usize;
    let segment = cfg.move_every.map_or(end, |s| (s * 1e6) as u64);
    let mut seg_start = 0u64;
    while seg_start < end {
        let seg_end = (seg_start + segment).min(end);
        for (i, n) in nodes.iter().enumerate() {
            let w = nodes[(i + rotation) % cfg.nodes].weight;
            let _ = n;
            let rate = total_rate * w;
            let mut t = seg_start as f64;
            loop {
                t += rng.exp(1e6 / rate);
                if t >= seg_end as f64 {
                    break;
                }
                // Mostly short holds, some long (up to H, as A3 allows).
                let hold = if rng.unit() < lh {
                    rng.range(H_MS * 200, H_MS * 1000)
                } else {
                    rng.exp(cfg.mean_hold_ms * 1000.0) as u64
                }
                .clamp(1, H_MS * 1000);
                trace.push((t as u64, i, hold));
            }
        }
        rotation += 1;
        seg_start = seg_end;
    }
    trace.sort_unstable();
    res.offered = trace.len() as u64;
    res.ideal_accepted = ideal(&trace, cfg.capacity);
    for &(t, node, hold) in &trace {
        push(&mut heap, &mut evs, t, Ev::Arrival { node, hold });
    }
    for (i, n) in nodes.iter_mut().enumerate() {
        if cfg.static_split {
            n.capacity = cfg.capacity / cfg.nodes as u64;
        } else {
            push(
                &mut heap,
                &mut evs,
                rng.range(0, 20_000),
                Ev::Wake {
                    node: i,
                    life: n.life,
                },
            );
        }
    }

    // Faults.
    // (node, real time of the crash, store time its record may be reaped).
    let mut crash_at: Vec<(usize, u64, Option<i64>)> = Vec::new();
    let mut stepped = false;
    if cfg.faults {
        let count = rng.range(1, 4);
        for _ in 0..count {
            let at = rng.range(3_000_000, end.saturating_sub(2_000_000).max(3_000_001));
            let node = rng.range(0, cfg.nodes as u64) as usize;
            match rng.range(0, 5) {
                0 => {
                    res.faults.push(format!("crash n{node} at {at}us"));
                    push(&mut heap, &mut evs, at, Ev::Crash { node });
                }
                1 => {
                    let len = rng.range(500_000, 6_000_000);
                    res.faults.push(format!("partition n{node} {at}+{len}us"));
                    push(&mut heap, &mut evs, at, Ev::Partition { node, on: true });
                    push(
                        &mut heap,
                        &mut evs,
                        at + len,
                        Ev::Partition { node, on: false },
                    );
                }
                2 => {
                    let keep = rng.unit() < 0.5;
                    res.faults
                        .push(format!("store restart keep={keep} at {at}us"));
                    push(&mut heap, &mut evs, at, Ev::StoreRestart { keep });
                }
                3 if !stepped && !cfg.adversarial => {
                    // A2: the store's clock steps forward by at most G in all.
                    stepped = true;
                    let ms = rng.range(G_MS / 2, G_MS + 1) as i64;
                    res.faults
                        .push(format!("store clock step +{ms}ms at {at}us"));
                    push(&mut heap, &mut evs, at, Ev::ClockStep { ms });
                }
                3 => {}
                _ => {
                    // A partition of the hot node, the case that matters most.
                    let len = rng.range(2_000_000, 8_000_000);
                    res.faults.push(format!("partition n0 {at}+{len}us"));
                    push(&mut heap, &mut evs, at, Ev::Partition { node: 0, on: true });
                    push(
                        &mut heap,
                        &mut evs,
                        at + len,
                        Ev::Partition { node: 0, on: false },
                    );
                }
            }
        }
    }
    if cfg.adversarial {
        let at = rng.range(4_000_000, 6_000_000);
        let len = rng.range(4_000_000, 7_000_000);
        res.faults.push(format!("partition n0 {at}+{len}us"));
        push(&mut heap, &mut evs, at, Ev::Partition { node: 0, on: true });
        push(
            &mut heap,
            &mut evs,
            at + len,
            Ev::Partition { node: 0, on: false },
        );
        let later = at + rng.range(0, 1_000_000);
        if rng.unit() < 0.5 {
            res.faults
                .push(format!("store clock step +{G_MS}ms at {later}us"));
            push(
                &mut heap,
                &mut evs,
                later,
                Ev::ClockStep { ms: G_MS as i64 },
            );
        } else {
            res.faults
                .push(format!("store restart keep=false at {later}us"));
            push(&mut heap, &mut evs, later, Ev::StoreRestart { keep: false });
        }
    }

    let timeout_us = budget.renew_timeout().as_micros() as u64;
    while let Some(Reverse((now, _, idx))) = heap.pop() {
        if now > end {
            break;
        }
        let ev = evs[idx].clone();
        match ev {
            Ev::Arrival { node, hold } => {
                let n = &mut nodes[node];
                if !n.alive {
                    continue;
                }
                if n.usage < n.capacity {
                    n.usage += 1;
                    n.accepted += 1;
                    res.accepted += 1;
                    let life = n.life;
                    push(&mut heap, &mut evs, now + hold, Ev::Done { node, life });
                } else {
                    n.rejected += 1;
                    // Why a refusal the ideal semaphore might not make: units
                    // free in the store, granted but not local, or local
                    // elsewhere and idle.
                    let used: u64 = nodes.iter().map(|n| n.usage).sum();
                    if used < cfg.capacity {
                        let local: u64 = nodes.iter().filter(|n| n.alive).map(|n| n.capacity).sum();
                        let granted = model.meta.as_ref().map_or(0, |m| m.granted.max(0) as u64);
                        let k = if granted < cfg.capacity {
                            0
                        } else if local < granted {
                            1
                        } else {
                            2
                        };
                        res.refusals_below_c[k] += 1;
                    }
                }
            }
            Ev::Done { node, life } => {
                let n = &mut nodes[node];
                if n.alive && n.life == life {
                    n.usage -= 1;
                }
            }
            Ev::Wake { node, life } => {
                let n = &mut nodes[node];
                if !n.alive || n.life != life || n.busy.is_some() {
                    continue;
                }
                let local = n.local(now);
                let r = n.reading();
                n.core.sample(&r);
                if let Some(c) = n.core.expire(local, &r) {
                    n.capacity = c as u64;
                }
                let due = n.core.due(local, &r);
                if due != Due::Nothing {
                    if let Some(c) = n.core.guard_call(local) {
                        n.capacity = c as u64;
                    }
                }
                let call = match due {
                    Due::Nothing => None,
                    Due::Init => {
                        // As the keeper does: the highest setting it knows.
                        let mut init = n.init.clone();
                        let setting = n.core.capacity_setting();
                        init.capacity = setting.capacity;
                        init.capacity_version = setting.version;
                        Some((Call::Init(init), local, 0))
                    }
                    Due::Renew => {
                        if let Some(c) = n.core.prepare(local, &r) {
                            n.capacity = c as u64;
                        }
                        let has = n.capacity.max(n.usage) - n.core.floor;
                        let args = n.core.renew_args(local, has);
                        if cfg.mutant == Mutant::GrowBeforeRecord && args.want > n.capacity {
                            n.capacity = args.want; // broken: local first
                        }
                        let req = args.req;
                        Some((Call::Renew(args), local, req))
                    }
                };
                if let Some((call, t_send, req)) = call {
                    res.store_calls += 1;
                    n.busy = Some(req);
                    let life = n.life;
                    if !n.partitioned {
                        let lat = latency(&mut rng);
                        push(
                            &mut heap,
                            &mut evs,
                            now + lat,
                            Ev::AtStore {
                                node,
                                life,
                                call,
                                t_send,
                            },
                        );
                    }
                    push(
                        &mut heap,
                        &mut evs,
                        now + timeout_us,
                        Ev::Timeout {
                            node,
                            life,
                            req,
                            t_send,
                        },
                    );
                } else {
                    let wake = n.core.next_wake(local);
                    let at = n.real(wake).max(now + 1);
                    push(&mut heap, &mut evs, at, Ev::Wake { node, life });
                }
            }
            Ev::AtStore {
                node,
                life,
                call,
                t_send,
            } => {
                let snow = store_now(now, store_step);
                let reply = match call {
                    Call::Init(a) => {
                        model.init(snow, &run_id, &a);
                        StoreReply::Init
                    }
                    Call::Renew(a) => {
                        let req = a.req;
                        let r = model.renew(snow, &run_id, &a);
                        if cfg.mutant == Mutant::NoLearning {
                            if let Some(m) = model.meta.as_mut() {
                                m.learn_until = 0;
                            }
                        }
                        let _ = req;
                        StoreReply::Renew(r)
                    }
                };
                if cfg.mutant == Mutant::NoLearning {
                    if let Some(m) = model.meta.as_mut() {
                        m.learn_until = 0;
                    }
                }
                if let Some(m) = &model.meta {
                    if m.granted != model.held_sum() || m.granted < 0 {
                        res.store_violations += 1;
                    }
                }
                // Crash-back: a crashed node's record reaped.
                if !crash_at.is_empty() {
                    let status = model.status(snow);
                    crash_at.retain_mut(|(c, at, reap_at)| {
                        let (c, at) = (*c, *at);
                        let lease = status.as_ref().and_then(|s| {
                            s.nodes.iter().find(|l| l.node == format!("n{c}")).cloned()
                        });
                        // A renewal sent before the crash may still land: the
                        // reap is due at the last recorded expiry + G. A clock
                        // step since then makes store-time lateness meaningless.
                        if let Some(l) = &lease {
                            *reap_at = (store_step == 0).then_some(l.expires_ms + grace as i64);
                        }
                        let present = lease.is_some();
                        if !present {
                            let back = (now - at) / 1000;
                            res.crash_back_ms = Some(res.crash_back_ms.unwrap_or(0).max(back));
                            if let Some(r) = reap_at.filter(|_| store_step == 0) {
                                let late = snow - r;
                                res.reap_late_ms =
                                    Some(res.reap_late_ms.unwrap_or(i64::MIN).max(late));
                            }
                        }
                        present
                    });
                }
                let n = &nodes[node];
                if !n.partitioned {
                    let lat = latency(&mut rng);
                    let req = n.busy.unwrap_or(0);
                    push(
                        &mut heap,
                        &mut evs,
                        now + lat,
                        Ev::Reply {
                            node,
                            life,
                            req,
                            t_send,
                            reply: Some(reply),
                        },
                    );
                }
            }
            Ev::Reply {
                node,
                life,
                req,
                t_send,
                reply,
            } => {
                let n = &mut nodes[node];
                if !n.alive || n.life != life || n.busy != Some(req) {
                    continue; // late: the keeper gave up on it
                }
                n.busy = None;
                let local = n.local(now);
                match reply {
                    Some(StoreReply::Init) => n.core.on_init(local, true),
                    Some(StoreReply::Renew(mut r)) => {
                        let mut t_send = t_send;
                        if cfg.mutant == Mutant::NodeClockExpiry {
                            if let RenewReply::Ok(g) = &mut r {
                                // The store's expiry read on the node's wall clock.
                                let expiry = g.now_ms + g.ttl_ms as i64;
                                let node_wall = store_now(now, 0) - store_step + n.wall_offset_ms;
                                g.ttl_ms = (expiry - node_wall).max(0) as u64;
                                t_send = local;
                            }
                        }
                        if matches!(r, RenewReply::NoBudget) {
                            n.init.fresh = false;
                        }
                        if let Some(c) = n.core.on_renew(t_send, local, Some(r)) {
                            n.capacity = c as u64;
                        }
                    }
                    None => {}
                }
                let life = n.life;
                push(&mut heap, &mut evs, now + 1, Ev::Wake { node, life });
            }
            Ev::Timeout {
                node,
                life,
                req,
                t_send,
            } => {
                let n = &mut nodes[node];
                if !n.alive || n.life != life || n.busy != Some(req) {
                    continue;
                }
                n.busy = None;
                let local = n.local(now);
                if req == 0 {
                    n.core.on_init(local, false);
                } else if let Some(c) = n.core.on_renew(t_send, local, None) {
                    n.capacity = c as u64;
                }
                push(&mut heap, &mut evs, now + 1, Ev::Wake { node, life });
            }
            Ev::Crash { node } => {
                let n = &mut nodes[node];
                if n.alive {
                    n.alive = false;
                    n.usage = 0; // its work dies with it
                    crash_at.push((node, now, None));
                }
            }
            Ev::Partition { node, on } => nodes[node].partitioned = on,
            Ev::StoreRestart { keep } => {
                if !keep {
                    model.wipe();
                }
                run_id.push('+');
            }
            Ev::ClockStep { ms } => store_step += ms,
            Ev::Move => {}
        }
        let total: u64 = nodes.iter().map(|n| n.usage).sum();
        res.peak = res.peak.max(total);
        if total > cfg.capacity {
            res.violations += 1;
        }
    }
    res
}

fn latency(rng: &mut Rng) -> u64 {
    if rng.unit() < 0.002 {
        rng.range(200_000, 400_000) // slower than the renew timeout: the reply is lost
    } else {
        rng.range(200, 2_000)
    }
}

/// Admissions of an ideal zero-latency global semaphore on the same trace.
pub fn ideal(trace: &[(u64, usize, u64)], capacity: u64) -> u64 {
    let mut done: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    let mut accepted = 0;
    for &(t, _, hold) in trace {
        while done.peek().is_some_and(|Reverse(d)| *d <= t) {
            done.pop();
        }
        if (done.len() as u64) < capacity {
            done.push(Reverse(t + hold));
            accepted += 1;
        }
    }
    accepted
}
