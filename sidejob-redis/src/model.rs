//! The lease state machine in Rust: a line-for-line port of the Lua scripts.
//!
//! [`Model`] holds the same five structures as the Redis keys of one budget
//! (CLUSTER.md §2.3) and applies `init`, `renew`, `release` and `status`
//! exactly as the scripts in `lua/` do, with the store's clock and process
//! identity passed in. The differential test (`tests/differential.rs`) runs
//! random call sequences against both and compares every answer; the
//! simulation runs fleets of keepers against it in virtual time.
//! [`MemoryStore`] wraps it as a [`LeaseStore`] on the system clock.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::store::{
    FleetCapacity, Grant, InitArgs, InitReply, LeaseStore, NodeLease, RenewArgs, RenewReply,
    Status, StoreError,
};
use crate::sync::{Arc, Mutex};

/// The budget's `meta` hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Global capacity `C`.
    pub capacity: i64,
    /// The version of the capacity setting (`cap_ver`).
    pub capacity_version: i64,
    /// Lease TTL in ms.
    pub ttl: i64,
    /// Grace in ms.
    pub grace: i64,
    /// Random per creation.
    pub epoch: String,
    /// Sum of `held`.
    pub granted: i64,
    /// Grant counter.
    pub seq: i64,
    /// No grant grows before this store time.
    pub learn_until: i64,
    /// Identity of the store process that last wrote.
    pub run_id: String,
    /// State losses seen.
    pub losses: i64,
    /// Created in test mode.
    pub test: bool,
    /// Test mode: the pinned clock.
    pub debug_now: Option<i64>,
    /// Test mode: a clock shift.
    pub debug_offset: i64,
    /// When the fair-share sums below were computed over every node (they
    /// are kept for `ttl / 10`); `None` after a resize.
    pub fair_at: Option<i64>,
    /// Cached: nodes counted.
    pub fair_k: i64,
    /// Cached: sum of their needs.
    pub fair_total: i64,
    /// Cached: sum of `min(need, capacity / fair_k)`.
    pub fair_base: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Info {
    want: i64,
    need: i64,
    ver: i64,
    req: i64,
}

/// One budget's state, with the scripts' transitions. See the module docs.
///
/// # Examples
///
/// ```
/// use sidejob_redis::{FleetCapacity, InitArgs, Model, RenewArgs, RenewReply};
///
/// let mut model = Model::default();
/// model.init(0, "run1", &InitArgs {
///     capacity: 10, capacity_version: 0, ttl_ms: 1000, grace_ms: 500, epoch: "e".into(),
///     fresh: false, test: false, debug_now: None,
/// });
/// // A budget created without `fresh` starts in learning mode: no growth.
/// let args = RenewArgs {
///     node: "a".into(), req: 1, epoch_seen: "e".into(), ver_seen: 0, has: 0, need: 5, want: 5,
///     capacity: FleetCapacity { capacity: 10, version: 0 },
/// };
/// let RenewReply::Ok(grant) = model.renew(10, "run1", &args) else { unreachable!() };
/// assert_eq!((grant.grant, grant.learn_remaining_ms), (0, 1490));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    /// `None` when the budget does not exist (never created, or lost).
    pub meta: Option<Meta>,
    held: BTreeMap<String, i64>,
    exp: BTreeMap<String, i64>,
    info: BTreeMap<String, Info>,
    starve: BTreeMap<String, i64>,
}

fn u(x: i64) -> u64 {
    x.max(0) as u64
}

impl Model {
    /// Forgets everything, as a Redis restarted without persistence does.
    pub fn wipe(&mut self) {
        *self = Model::default();
    }

    fn clock(&self, real: i64) -> i64 {
        match &self.meta {
            Some(m) if m.test => m.debug_now.unwrap_or(real + m.debug_offset),
            _ => real,
        }
    }

    fn forget(&mut self, n: &str) {
        self.held.remove(n);
        self.exp.remove(n);
        self.info.remove(n);
        self.starve.remove(n);
    }

    /// `init` at store time `real_now` on the store process `run_id`.
    pub fn init(&mut self, real_now: i64, run_id: &str, a: &InitArgs) -> InitReply {
        let (cap, ttl, grace) = (a.capacity as i64, a.ttl_ms as i64, a.grace_ms as i64);
        let cap_ver = a.capacity_version as i64;
        if let Some(m) = &mut self.meta {
            m.ttl = ttl;
            m.grace = grace;
            if cap_ver > m.capacity_version {
                m.capacity = cap;
                m.capacity_version = cap_ver;
            }
            m.fair_at = None;
            return InitReply::Exists(m.epoch.clone());
        }
        let mut meta = Meta {
            capacity: cap,
            capacity_version: cap_ver,
            ttl,
            grace,
            epoch: a.epoch.clone(),
            granted: 0,
            seq: 0,
            learn_until: 0,
            run_id: run_id.to_string(),
            losses: 0,
            test: a.test,
            debug_now: if a.test { a.debug_now } else { None },
            debug_offset: 0,
            fair_at: None,
            fair_k: 0,
            fair_total: 0,
            fair_base: 0,
        };
        let now = if meta.test {
            meta.debug_now.unwrap_or(real_now)
        } else {
            real_now
        };
        if !a.fresh {
            meta.learn_until = now + ttl + grace;
        }
        self.meta = Some(meta);
        InitReply::Created(a.epoch.clone())
    }

    /// `renew` at store time `real_now` on the store process `run_id`.
    pub fn renew(&mut self, real_now: i64, run_id: &str, a: &RenewArgs) -> RenewReply {
        let Some(mut meta) = self.meta.clone() else {
            return RenewReply::NoBudget;
        };
        let now = self.clock(real_now);
        // 1b. A capacity setting of a higher version replaces the budget's.
        if a.capacity.version as i64 > meta.capacity_version {
            meta.capacity = a.capacity.capacity as i64;
            meta.capacity_version = a.capacity.version as i64;
            meta.fair_at = None;
            let m = self.meta.as_mut().expect("meta exists");
            m.capacity = meta.capacity;
            m.capacity_version = meta.capacity_version;
            m.fair_at = None;
        }
        let setting = FleetCapacity {
            capacity: u(meta.capacity),
            version: u(meta.capacity_version),
        };
        let node = a.node.as_str();
        let (req, has, need, want) = (a.req as i64, a.has as i64, a.need as i64, a.want as i64);
        let (cap, ttl, grace) = (meta.capacity, meta.ttl, meta.grace);
        let epoch = meta.epoch.clone();
        let (mut granted, mut seq, mut learn_until, mut losses) =
            (meta.granted, meta.seq, meta.learn_until, meta.losses);
        let lose = |learn_until: &mut i64, losses: &mut i64| {
            *learn_until = (*learn_until).max(now + ttl + grace);
            *losses += 1;
        };
        if run_id != meta.run_id {
            lose(&mut learn_until, &mut losses);
        }
        // Reap: ZRANGEBYSCORE exp -inf now-grace LIMIT 0 100, by (score, member).
        let mut lapsed: Vec<(i64, String)> = self
            .exp
            .iter()
            .filter(|(_, &e)| e <= now - grace)
            .map(|(n, &e)| (e, n.clone()))
            .collect();
        lapsed.sort();
        for (_, n) in lapsed.into_iter().take(100) {
            granted -= self.held.get(&n).copied().unwrap_or(0);
            self.forget(&n);
        }
        let rec = self.held.get(node).copied();
        let ver = self.info.get(node).map_or(0, |i| i.ver);
        let save = |model: &mut Model, granted, seq, learn_until, losses| {
            let m = model.meta.as_mut().expect("meta exists");
            m.granted = granted;
            m.seq = seq;
            m.learn_until = learn_until;
            m.run_id = run_id.to_string();
            m.losses = losses;
        };
        if req <= self.info.get(node).map_or(0, |i| i.req) {
            save(self, granted, seq, learn_until, losses);
            return RenewReply::Stale(Grant {
                grant: u(rec.unwrap_or(0)),
                ttl_ms: u(ttl),
                ver: u(ver),
                epoch,
                target: None,
                learn_remaining_ms: u(learn_until - now),
                now_ms: now,
                reap_in_ms: None,
                capacity: setting,
            });
        }
        if has > 0 && (a.epoch_seen != epoch || rec.is_none() || a.ver_seen as i64 > ver) {
            lose(&mut learn_until, &mut losses);
        }
        let mut g = rec.unwrap_or(0);
        if rec.is_none() && has > 0 {
            g = has.min((cap - granted).max(0));
            granted += g;
        }
        if has < g {
            granted -= g - has;
            g = has;
        }
        // Fair share. Overloaded (needs above C): each node is guaranteed its
        // need up to an equal share, and the rest goes in proportion to the
        // need beyond that. Otherwise: its need plus the leftover in
        // proportion to need. The sums are cached for ttl / 10; in between
        // a renewal swaps its own old need for its new one.
        let cached = meta
            .fair_at
            .filter(|&at| now >= at && now < at + ttl.div_euclid(10));
        let (fair_at, k, total, base) = match cached {
            None => {
                let mut needs = vec![need];
                needs.extend(
                    self.exp
                        .keys()
                        .filter(|n| n.as_str() != node)
                        .map(|n| self.info.get(n).map_or(0, |i| i.need)),
                );
                let k = needs.len() as i64;
                let eq = cap.div_euclid(k);
                let total: i64 = needs.iter().sum();
                let base: i64 = needs.iter().map(|&n| n.min(eq)).sum();
                (now, k, total, base)
            }
            Some(at) => {
                let (mut k, mut old) = (meta.fair_k, self.info.get(node).map(|i| i.need));
                let eq = cap.div_euclid(k);
                if old.is_none() || rec.is_none() {
                    k += 1;
                    old = Some(0);
                }
                let old = old.unwrap_or(0);
                (
                    at,
                    k,
                    meta.fair_total - old + need,
                    meta.fair_base - old.min(eq) + need.min(eq),
                )
            }
        };
        {
            let m = self.meta.as_mut().expect("meta exists");
            m.fair_at = Some(fair_at);
            m.fair_k = k;
            m.fair_total = total;
            m.fair_base = base;
        }
        let equal = cap.div_euclid(k);
        let fair = if total > cap {
            let mine = need.min(equal);
            mine + ((cap - base).max(0) * (need - mine)).div_euclid((total - base).max(1))
        } else if total > 0 {
            need + ((cap - total) * need).div_euclid(total)
        } else {
            equal
        };
        let mut others = self.starve.values().filter(|&&s| s > now).count() as i64;
        if self.starve.get(node).is_some_and(|&s| s > now) {
            others -= 1;
        }
        if now >= learn_until && want > g && granted < cap {
            let limit = if others > 0 {
                want.min(g.max(fair))
            } else {
                want
            };
            let add = (limit - g).min(cap - granted);
            if add > 0 {
                g += add;
                granted += add;
            }
        }
        if want > g {
            self.starve.insert(node.to_string(), now + ttl);
        } else {
            self.starve.remove(node);
        }
        // While the fleet holds more than the capacity, every node above its
        // fair share is asked down to it (no hysteresis).
        let target =
            ((granted > cap && g > fair) || (others > 0 && g * 10 > fair * 11)).then_some(u(fair));
        seq += 1;
        self.held.insert(node.to_string(), g);
        self.exp.insert(node.to_string(), now + ttl);
        self.info.insert(
            node.to_string(),
            Info {
                want,
                need,
                ver: seq,
                req,
            },
        );
        save(self, granted, seq, learn_until, losses);
        // The earliest other lease's reap time (ZRANGE exp 0 1 WITHSCORES).
        let reap_in_ms = self
            .exp
            .iter()
            .filter(|(n, _)| n.as_str() != node)
            .map(|(_, &e)| e)
            .min()
            .map(|e| u(e + grace - now));
        RenewReply::Ok(Grant {
            grant: u(g),
            ttl_ms: u(ttl),
            ver: u(seq),
            epoch,
            target,
            learn_remaining_ms: u(learn_until - now),
            now_ms: now,
            reap_in_ms,
            capacity: setting,
        })
    }

    /// `set_capacity`, the admin's change: the capacity becomes `capacity`
    /// with a version one above the budget's; `None` if there is no budget.
    pub fn set_fleet_capacity(&mut self, capacity: u64) -> Option<FleetCapacity> {
        let m = self.meta.as_mut()?;
        m.capacity = capacity as i64;
        m.capacity_version += 1;
        m.fair_at = None;
        Some(FleetCapacity {
            capacity,
            version: u(m.capacity_version),
        })
    }

    /// `release`: gives the node's grant back.
    pub fn release(&mut self, node: &str, req: u64) -> u64 {
        let Some(rec) = self.held.get(node).copied() else {
            return 0;
        };
        if self.meta.is_none() || req as i64 <= self.info.get(node).map_or(0, |i| i.req) {
            return 0;
        }
        self.forget(node);
        self.meta.as_mut().expect("checked").granted -= rec;
        u(rec)
    }

    /// `status` at store time `real_now`.
    pub fn status(&self, real_now: i64) -> Option<Status> {
        let m = self.meta.as_ref()?;
        let now = self.clock(real_now);
        let mut nodes: Vec<NodeLease> = self
            .exp
            .iter()
            .map(|(n, &e)| {
                let info = self.info.get(n);
                NodeLease {
                    node: n.clone(),
                    held: u(self.held.get(n).copied().unwrap_or(0)),
                    expires_ms: e,
                    want: u(info.map_or(0, |i| i.want)),
                    need: u(info.map_or(0, |i| i.need)),
                }
            })
            .collect();
        nodes.sort_by(|a, b| (a.expires_ms, &a.node).cmp(&(b.expires_ms, &b.node)));
        Some(Status {
            capacity: u(m.capacity),
            capacity_version: u(m.capacity_version),
            granted: u(m.granted),
            learn_remaining_ms: u(m.learn_until - now),
            losses: u(m.losses),
            epoch: m.epoch.clone(),
            seq: u(m.seq),
            now_ms: now,
            nodes,
        })
    }

    /// Sum of every recorded grant (equals `meta.granted` if the model is
    /// consistent; the simulation checks both).
    pub fn held_sum(&self) -> i64 {
        self.held.values().sum()
    }
}

/// A [`LeaseStore`] over a shared [`Model`] on the system clock: several
/// keepers in one process can share one (clone it). For unit tests and
/// demos without Redis; it is not a fleet-wide bound.
///
/// # Examples
///
/// ```
/// use sidejob_redis::{LeaseStore, MemoryStore};
///
/// let store = MemoryStore::new();
/// let mut other = store.clone(); // the same budget state
/// assert!(other.status()?.is_none()); // nothing created yet
/// # Ok::<(), sidejob_redis::StoreError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    model: Arc<Mutex<Model>>,
    run_id: Arc<Mutex<String>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// Simulates a store restart: `keep_data` false wipes the budget, and in
    /// either case the process identity changes.
    pub fn restart(&self, keep_data: bool) {
        if !keep_data {
            self.model.lock().wipe();
        }
        self.run_id.lock().push('+');
    }

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }
}

impl LeaseStore for MemoryStore {
    fn init(&mut self, args: &InitArgs) -> Result<InitReply, StoreError> {
        let run_id = self.run_id.lock().clone();
        Ok(self.model.lock().init(Self::now(), &run_id, args))
    }

    fn renew(&mut self, args: &RenewArgs) -> Result<RenewReply, StoreError> {
        let run_id = self.run_id.lock().clone();
        Ok(self.model.lock().renew(Self::now(), &run_id, args))
    }

    fn release(&mut self, node: &str, req: u64) -> Result<u64, StoreError> {
        Ok(self.model.lock().release(node, req))
    }

    fn status(&mut self) -> Result<Option<Status>, StoreError> {
        Ok(self.model.lock().status(Self::now()))
    }

    fn set_fleet_capacity(&mut self, capacity: u64) -> Result<Option<FleetCapacity>, StoreError> {
        Ok(self.model.lock().set_fleet_capacity(capacity))
    }
}
