//! The keeper's decisions as a sans-IO state machine.
//!
//! [`Core`] holds one node's view of its lease and decides, from the
//! node's monotonic time and readings of the local front-end, when to call
//! the store, what to report, and what the local capacity becomes. It does
//! no I/O and reads no clock: the keeper thread feeds it real time and a
//! real store, the simulation virtual time and the Rust model, so both run
//! the same decisions.
//!
//! # Protocol (CLUSTER.md §2.5)
//!
//! * **Deadlines.** `t_send` is taken just before a renewal is sent. On
//!   success, `valid_until = t_send + T(1−2ρ) − ε` and
//!   `admit_until = valid_until − H`. A late reply only shortens the window.
//!   At `admit_until` the leased part of the local capacity drops to 0.
//! * **Blocking calls.** The keeper blocks in a store call for up to the
//!   renew timeout, so before each call it drops the leased capacity if
//!   `admit_until` falls within that timeout ([`Core::guard_call`]).
//! * **Grow**: Redis records the larger grant (the reply); only then does
//!   the local capacity rise ([`Core::on_renew`]).
//! * **Shrink**: the local capacity drops first ([`Core::prepare`]); the
//!   node then reports `has = max(limit, usage)` read after the resize, and
//!   only then does Redis lower the grant.
//! * **Demand.** Per window: `need = max(peak, ⌈mean usage × offered /
//!   accepted⌉)` (Little's law on the offered load, so a node at its limit
//!   still shows what it would use), `want = ⌈need(1+h)⌉ + block`; `block`
//!   doubles on windows with refusals and halves on others, within
//!   `[min_block, C/8]`. The window runs from one regular renewal to the
//!   next: early calls report the estimate so far without closing it
//!   (short windows made noisy needs, and noisy needs made shrink targets
//!   and regrowth), unless the demand since the last call jumped above
//!   twice the window's mean usage (a hot spot arrived): then it closes.
//! * **Early grow**: a refusal seen since the last call triggers a call at
//!   once, at most every `early_grow_gap`.
//! * **Timed renewals**: a node held below what it asks for renews when the
//!   store said the earliest other lease can be reaped (its expiry + grace)
//!   or learning mode ends, if that comes before its next period, so a
//!   crashed node's share comes back at its expiry + grace, not up to a
//!   renew period later. The store's milliseconds are stretched by `1 + 2ρ`
//!   on the node's clock, so the call lands after the reap; one that lands
//!   early is told again and retries.
//! * **Give-back**: a shrink target, or a grant above `want` for three
//!   windows, lowers the local capacity; the node reports as soon as its
//!   usage fits.
//! * **Fleet capacity.** The node's configured capacity is a versioned
//!   setting ([`FleetCapacity`]); every reply says which one is in force,
//!   and the node remembers the highest it has seen. It sends that one with
//!   every call (and creates the budget with it after a state loss), so the
//!   store adopts it if its copy is older; a configured setting that is not
//!   in force shows as [`KeeperStats::capacity_mismatch`].

use std::fmt;
use std::time::Duration;

use crate::config::Budget;
use crate::store::{FleetCapacity, Grant, RenewArgs, RenewReply};

/// A reading of the local front-end, taken by the keeper.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// Its capacity in force.
    pub capacity: usize,
    /// Units held now.
    pub usage: usize,
    /// Admissions so far (a counter).
    pub accepted: u64,
    /// Refusals so far (a counter).
    pub rejected: u64,
}

/// What the store call the keeper should make next is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// Nothing yet.
    Nothing,
    /// `init` (the budget is missing or this node just started).
    Init,
    /// `renew`.
    Renew,
}

/// One node's lease state and decisions; see the module docs.
#[derive(Debug, Clone)]
pub struct Core {
    node: String,
    // Settings.
    renew_every: Duration,
    valid_window_factor: f64,
    clock_margin: f64,
    pause_margin: Duration,
    max_hold: Duration,
    early_gap: Duration,
    renew_timeout: Duration,
    min_block: u64,
    max_block: u64,
    headroom: f64,
    /// Units the floor keeps local.
    pub floor: u64,
    /// The fleet capacity this node was configured with.
    configured: FleetCapacity,
    /// The highest fleet capacity setting a reply has shown.
    fleet: Option<FleetCapacity>,
    // Lease.
    req: u64,
    epoch: String,
    ver: u64,
    grant: u64,
    leased: u64,
    target: Option<u64>,
    valid_until: Option<Duration>,
    admit_until: Option<Duration>,
    next_call: Duration,
    last_call: Option<Duration>,
    need_init: bool,
    learning: bool,
    failing: bool,
    give_back: bool,
    /// The next call was pulled in to a reap or the end of learning mode.
    timed: bool,
    /// The call in flight is such a timed one.
    timed_sent: bool,
    // Demand window.
    acc0: u64,
    rej0: u64,
    // Since the last call (for early grows and jump detection).
    acc_call: u64,
    rej_call: u64,
    call_sum: u64,
    call_samples: u64,
    call_peak: u64,
    usage_sum: u64,
    samples: u64,
    peak: u64,
    block: u64,
    idle_windows: u32,
    need: u64,
    want: u64,
    // Counters.
    renewals: u64,
    failures: u64,
    early_grows: u64,
    overruns: u64,
    overrun_checked: bool,
    timed_renewals: u64,
    timed_grows: u64,
}

/// A snapshot of a keeper's view, for tests and operators.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeeperStats {
    /// The node id.
    pub node: String,
    /// Units Redis recorded for this node at the last reply.
    pub grant: u64,
    /// The leased part of the local capacity in force (local capacity is
    /// this plus the floor).
    pub leased: u64,
    /// Time left until the node stops admitting under its lease, if any.
    pub admit_for: Option<Duration>,
    /// Time left until the lease's units must all be back.
    pub valid_for: Option<Duration>,
    /// Successful renewals.
    pub renewals: u64,
    /// Store calls that failed (timeouts, connection errors, stale replies).
    pub failures: u64,
    /// Renewals made early because the front-end refused a request.
    pub early_grows: u64,
    /// The last reply said the budget is in learning mode.
    pub learning: bool,
    /// Times units were still in flight after `valid_until` (the one case
    /// where the bound can be exceeded: a hold longer than `max_hold` while
    /// Redis was unreachable).
    pub overruns: u64,
    /// The last demand estimate.
    pub need: u64,
    /// The last request.
    pub want: u64,
    /// A shrink target from Redis in force.
    pub target: Option<u64>,
    /// Renewals timed to another lease's reap (expiry + grace) or to the
    /// end of learning mode, ahead of the regular period.
    pub timed_renewals: u64,
    /// Timed renewals whose reply grew the grant (the reaped share or the
    /// end of learning mode arrived with them).
    pub timed_grows: u64,
    /// The fleet capacity in force (units Redis leases to the whole fleet,
    /// reserved floors excluded) and its setting's version, from the last
    /// reply; `None` before the first.
    pub capacity: Option<FleetCapacity>,
    /// This node's configured setting: the budget's leased capacity and
    /// its [`capacity_version`](crate::BudgetBuilder::capacity_version).
    pub configured_capacity: FleetCapacity,
    /// Set while the fleet runs at another capacity than this node was
    /// configured with, because the budget's setting is newer (or as new
    /// and was there first); its `Display` says what to do.
    pub capacity_mismatch: Option<CapacityMismatch>,
}

/// A node's configured fleet capacity is not the one in force: the budget
/// in Redis holds a setting of a higher version (an admin's
/// [`set_fleet_capacity`](crate::Budget::set_fleet_capacity), or a deploy
/// with a higher [`capacity_version`](crate::BudgetBuilder::capacity_version)),
/// or one of the same version that another node wrote first. The node
/// follows the fleet's setting; this says so, in
/// [`KeeperStats::capacity_mismatch`], for a log line or an alert.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use sidejob::Limiter;
/// use sidejob_redis::{Budget, FleetCapacity, LeaseStore, MemoryStore};
///
/// let ms = Duration::from_millis;
/// let budget = |capacity| {
///     Budget::builder()
///         .name("doc").capacity(capacity).fresh(true)
///         .ttl(ms(1000)).renew_every(ms(200)).grace(ms(300)).max_hold(ms(200)).pause_margin(ms(50))
///         .build()
/// };
/// let mut store = MemoryStore::new();
/// let first = budget(8)?.attach_store(store.clone(), Arc::new(Limiter::new(1)?));
/// assert!(first.wait_for(ms(5000), |s| s.capacity.is_some()));
/// // An admin lowers the fleet's capacity; a node still configured with 8 joins.
/// assert_eq!(store.set_fleet_capacity(5)?, Some(FleetCapacity { capacity: 5, version: 1 }));
/// let stale = budget(8)?.attach_store(store.clone(), Arc::new(Limiter::new(1)?));
/// assert!(stale.wait_for(ms(5000), |s| s.capacity_mismatch.is_some()));
/// let mismatch = stale.stats().capacity_mismatch.unwrap();
/// assert_eq!(mismatch.in_force(), FleetCapacity { capacity: 5, version: 1 });
/// assert!(mismatch.to_string().contains("is not in force"), "{mismatch}");
/// assert_eq!(store.status()?.unwrap().capacity, 5); // the stale node changed nothing
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityMismatch {
    configured: FleetCapacity,
    in_force: FleetCapacity,
}

impl CapacityMismatch {
    /// The mismatch, if `in_force` differs from `configured` and is not
    /// about to be replaced by it (its version is not lower).
    fn between(configured: FleetCapacity, in_force: FleetCapacity) -> Option<Self> {
        (in_force.capacity != configured.capacity && !configured.replaces(&in_force)).then_some(
            CapacityMismatch {
                configured,
                in_force,
            },
        )
    }

    /// This node's configured setting.
    pub fn configured(&self) -> FleetCapacity {
        self.configured
    }

    /// The setting in force for the fleet.
    pub fn in_force(&self) -> FleetCapacity {
        self.in_force
    }
}

impl fmt::Display for CapacityMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, i) = (self.configured, self.in_force);
        write!(
            f,
            "configured fleet capacity {} (version {}) is not in force: the budget's is {} (version {}), ",
            c.capacity, c.version, i.capacity, i.version
        )?;
        if i.version > c.version {
            write!(f, "a newer setting")?;
        } else {
            write!(f, "written first at the same version")?;
        }
        write!(
            f,
            ", which this node follows; to change it, call set_fleet_capacity or configure capacity_version above {}",
            i.version
        )
    }
}

impl std::error::Error for CapacityMismatch {}

impl Core {
    /// A core for node `node` under `budget`, at monotonic time 0.
    pub fn new(node: impl Into<String>, budget: &Budget) -> Self {
        let leased_cap = budget.leased_capacity() as u64;
        Core {
            node: node.into(),
            renew_every: budget.renew_every,
            valid_window_factor: 1.0 - 2.0 * budget.clock_margin,
            clock_margin: budget.clock_margin,
            pause_margin: budget.pause_margin,
            max_hold: budget.max_hold,
            early_gap: budget.early_grow_gap,
            renew_timeout: budget.renew_timeout,
            min_block: budget.min_block,
            max_block: (leased_cap / 8).max(budget.min_block),
            headroom: budget.headroom,
            floor: budget.floor() as u64,
            configured: FleetCapacity {
                capacity: leased_cap,
                version: budget.capacity_version,
            },
            fleet: None,
            req: 0,
            epoch: String::new(),
            ver: 0,
            grant: 0,
            leased: 0,
            target: None,
            valid_until: None,
            admit_until: None,
            next_call: Duration::ZERO,
            last_call: None,
            need_init: true,
            learning: false,
            failing: false,
            give_back: false,
            timed: false,
            timed_sent: false,
            acc0: 0,
            rej0: 0,
            acc_call: 0,
            rej_call: 0,
            call_sum: 0,
            call_samples: 0,
            call_peak: 0,
            usage_sum: 0,
            samples: 0,
            peak: 0,
            block: budget.min_block,
            idle_windows: 0,
            need: 0,
            want: 0,
            renewals: 0,
            failures: 0,
            early_grows: 0,
            overruns: 0,
            overrun_checked: true,
            timed_renewals: 0,
            timed_grows: 0,
        }
    }

    /// The node id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The fleet capacity setting this node sends with every call (and
    /// creates a missing budget with): the highest it knows, the fleet's
    /// as a reply last showed it unless its own configured one is newer.
    pub fn capacity_setting(&self) -> FleetCapacity {
        match self.fleet {
            Some(f) if !self.configured.replaces(&f) => f,
            _ => self.configured,
        }
    }

    /// Learns the setting a reply showed; the growth step's ceiling follows
    /// the capacity in force.
    fn learn_capacity(&mut self, seen: FleetCapacity) {
        if self.fleet.is_none_or(|f| !f.replaces(&seen)) {
            self.fleet = Some(seen);
            self.max_block = (seen.capacity / 8).max(self.min_block);
            self.block = self.block.min(self.max_block);
        }
    }

    /// The local capacity the front-end should have: floor + leased.
    pub fn local_capacity(&self) -> usize {
        (self.floor + self.leased) as usize
    }

    /// Records a reading (every wake) for the demand estimate.
    pub fn sample(&mut self, r: &Reading) {
        let used = (r.usage as u64).saturating_sub(self.floor);
        self.usage_sum += used;
        self.samples += 1;
        self.peak = self.peak.max(used);
        self.call_sum += used;
        self.call_samples += 1;
        self.call_peak = self.call_peak.max(used);
    }

    /// At `admit_until` the leased capacity drops to 0: returns the new
    /// local capacity if it changed. Also counts an overrun if units are
    /// still out past `valid_until` without a renewal.
    pub fn expire(&mut self, now: Duration, r: &Reading) -> Option<usize> {
        if !self.overrun_checked && self.valid_until.is_some_and(|v| now >= v) {
            self.overrun_checked = true;
            if r.usage as u64 > self.floor {
                self.overruns += 1;
            }
        }
        if self.leased > 0 && self.admit_until.is_some_and(|a| now >= a) {
            self.leased = 0;
            return Some(self.local_capacity());
        }
        None
    }

    /// Before a store call, which blocks the keeper for up to the renew
    /// timeout: if the admission window could end while it is blocked, the
    /// leased capacity drops now rather than up to a timeout late. Returns
    /// the new local capacity if it changed.
    pub fn guard_call(&mut self, now: Duration) -> Option<usize> {
        self.guard_for(now, self.renew_timeout)
    }

    /// As [`guard_call`](Self::guard_call), before a call (this node's or
    /// another budget's on the same keeper thread) that may block the
    /// keeper for up to `blocked_for`.
    pub fn guard_for(&mut self, now: Duration, blocked_for: Duration) -> Option<usize> {
        if self.leased > 0 && self.admit_until.is_some_and(|a| now + blocked_for >= a) {
            self.leased = 0;
            return Some(self.local_capacity());
        }
        None
    }

    /// Which call is due now, if any.
    pub fn due(&self, now: Duration, r: &Reading) -> Due {
        if self.need_init {
            return if now >= self.next_call {
                Due::Init
            } else {
                Due::Nothing
            };
        }
        if now >= self.next_call {
            return Due::Renew;
        }
        if self.failing {
            return Due::Nothing; // no early calls while the store is failing
        }
        let gap_ok = self.last_call.is_none_or(|t| now >= t + self.early_gap);
        // Early grow: at most every gap, or every R/4 if the store did not
        // grant all that was asked last time (held to a fair share, asking
        // at once would mostly be told no again).
        let starved_gap = self.early_gap.max(self.renew_every / 4);
        let grow_ok =
            self.grant >= self.want || self.last_call.is_none_or(|t| now >= t + starved_gap);
        if gap_ok && grow_ok && r.rejected > self.rej_call && !self.learning {
            return Due::Renew; // early grow
        }
        if gap_ok && self.give_back && (r.usage as u64) <= self.local_capacity() as u64 {
            return Due::Renew; // give-back: usage fits under the lowered limit
        }
        Due::Nothing
    }

    /// When the keeper should look again (it also polls every early-grow gap).
    pub fn next_wake(&self, now: Duration) -> Duration {
        let mut at = self.next_call.min(now + self.early_gap);
        for t in [self.admit_until, self.valid_until].into_iter().flatten() {
            if t > now {
                at = at.min(t);
            }
        }
        at.max(now)
    }

    /// Closes the demand window before a renewal and applies shrinks (a
    /// target, or an idle grant): returns the lowered local capacity to set
    /// *before* the call.
    pub fn prepare(&mut self, now: Duration, r: &Reading) -> Option<usize> {
        let early = now < self.next_call;
        if early {
            self.early_grows += u64::from(r.rejected > self.rej_call);
        }
        let mean_of = |sum: u64, n: u64| if n > 0 { sum as f64 / n as f64 } else { 0.0 };
        // Little's law on the offered load over a window.
        let estimate = |peak: u64, mean: f64, acc: u64, rej: u64| {
            if acc > 0 {
                peak.max((mean * (acc + rej) as f64 / acc as f64).ceil() as u64)
            } else {
                peak
            }
        };
        let mean = mean_of(self.usage_sum, self.samples);
        let since_call = estimate(
            self.call_peak,
            mean_of(self.call_sum, self.call_samples),
            r.accepted - self.acc_call,
            r.rejected - self.rej_call,
        );
        self.acc_call = r.accepted;
        self.rej_call = r.rejected;
        self.call_sum = 0;
        self.call_samples = 0;
        self.call_peak = 0;
        let jumped = since_call as f64 > 2.0 * mean.max(1.0);
        let close = !early || jumped;
        let (acc, rej) = (r.accepted - self.acc0, r.rejected - self.rej0);
        let mut need = estimate(self.peak, mean, acc, rej);
        if acc == 0 && rej > 0 {
            need = need.max(self.leased + self.block);
        }
        if close {
            self.acc0 = r.accepted;
            self.rej0 = r.rejected;
            self.usage_sum = 0;
            self.samples = 0;
            self.peak = 0;
            self.block = if rej > 0 {
                (self.block * 2).min(self.max_block)
            } else {
                (self.block / 2).max(self.min_block)
            };
            // Idle give-back: three windows with the grant well above need.
            if self.grant > need && self.grant - need > self.min_block.max(self.grant / 4) {
                self.idle_windows += 1;
            } else {
                self.idle_windows = 0;
            }
        }
        self.need = need;
        self.want = (need as f64 * (1.0 + self.headroom)).ceil() as u64 + self.block;
        let mut lower = self.leased;
        if let Some(t) = self.target {
            lower = lower.min(t);
        }
        if self.idle_windows >= 3 {
            lower = lower.min(self.want);
        }
        if lower < self.leased {
            self.leased = lower;
            self.give_back = true;
            return Some(self.local_capacity());
        }
        None
    }

    /// The renewal to send at `t_send`, reporting `has` (the most units
    /// the leased part may hold, read after any shrink).
    pub fn renew_args(&mut self, t_send: Duration, has: u64) -> RenewArgs {
        self.req += 1;
        self.timed_sent = self.timed && t_send >= self.next_call;
        self.timed_renewals += u64::from(self.timed_sent);
        self.timed = false;
        self.last_call = Some(t_send);
        self.next_call = t_send + self.renew_every;
        RenewArgs {
            node: self.node.clone(),
            req: self.req,
            epoch_seen: self.epoch.clone(),
            ver_seen: self.ver,
            has,
            need: self.need,
            want: self.want,
            capacity: self.capacity_setting(),
        }
    }

    /// `init` succeeded (`Ok`) or failed; at `now`.
    pub fn on_init(&mut self, now: Duration, ok: bool) {
        if ok {
            self.need_init = false;
            self.next_call = now;
        } else {
            self.failures += 1;
            self.failing = true;
            self.next_call = now + self.renew_every / 2;
        }
    }

    /// The renewal sent at `t_send` answered (`None`: it failed) at `now`:
    /// returns the new local capacity if it changed (a grow happens only
    /// here, after Redis recorded it).
    pub fn on_renew(
        &mut self,
        t_send: Duration,
        now: Duration,
        reply: Option<RenewReply>,
    ) -> Option<usize> {
        let timed = std::mem::take(&mut self.timed_sent);
        let grant = match reply {
            Some(RenewReply::Ok(g)) => g,
            Some(RenewReply::NoBudget) => {
                self.need_init = true;
                self.next_call = now;
                return None;
            }
            stale_or_none => {
                if let Some(RenewReply::Stale(g)) = stale_or_none {
                    self.learn_capacity(g.capacity); // the store's, even unrenewed
                }
                self.failures += 1;
                self.failing = true;
                self.next_call = now + self.renew_every / 2;
                return None;
            }
        };
        self.renewals += 1;
        self.failing = false;
        self.learn_capacity(grant.capacity);
        if timed && grant.grant > self.grant {
            self.timed_grows += 1;
        }
        self.epoch = grant.epoch.clone();
        self.ver = grant.ver;
        self.grant = grant.grant;
        self.learning = grant.learn_remaining_ms > 0;
        self.target = grant.target;
        let valid = t_send
            + Duration::from_millis(grant.ttl_ms)
                .mul_f64(self.valid_window_factor)
                .saturating_sub(self.pause_margin);
        let admit = valid.saturating_sub(self.max_hold);
        self.valid_until = Some(valid);
        self.admit_until = Some(admit);
        self.overrun_checked = false;
        let before = self.leased;
        self.leased = if now < admit {
            self.grant.min(self.target.unwrap_or(u64::MAX))
        } else {
            0
        };
        self.give_back = self.leased < self.grant;
        self.time_next(now, &grant);
        (self.leased != before).then(|| self.local_capacity())
    }

    /// A node held below what it asks for renews when the store can next
    /// give it more, if that is before its next period: when the earliest
    /// other lease is reaped, or when learning mode ends. Store time is
    /// stretched by `1 + 2ρ` (plus 1 ms) on the node's clock so the call
    /// lands after the event; landing early only costs a call, and the
    /// reply then times the next one again.
    fn time_next(&mut self, now: Duration, grant: &Grant) {
        if self.want <= self.grant {
            return;
        }
        let learning = (grant.learn_remaining_ms > 0).then_some(grant.learn_remaining_ms);
        let Some(store_ms) = [grant.reap_in_ms, learning].into_iter().flatten().min() else {
            return;
        };
        let at = now
            + Duration::from_millis(store_ms).mul_f64(1.0 + 2.0 * self.clock_margin)
            + Duration::from_millis(1);
        if at < self.next_call {
            self.next_call = at;
            self.timed = true;
        }
    }

    /// The lease's units are all back and released: forget the lease.
    pub fn on_release(&mut self) {
        self.grant = 0;
        self.leased = 0;
        self.valid_until = None;
        self.admit_until = None;
    }

    /// The next request number to use (release shares the counter).
    pub fn next_req(&mut self) -> u64 {
        self.req += 1;
        self.req
    }

    /// When this node's units must all be back, on its monotonic clock.
    pub fn valid_until(&self) -> Option<Duration> {
        self.valid_until
    }

    /// A snapshot at `now`.
    pub fn stats(&self, now: Duration) -> KeeperStats {
        KeeperStats {
            node: self.node.clone(),
            grant: self.grant,
            leased: self.leased,
            admit_for: self.admit_until.map(|a| a.saturating_sub(now)),
            valid_for: self.valid_until.map(|v| v.saturating_sub(now)),
            renewals: self.renewals,
            failures: self.failures,
            early_grows: self.early_grows,
            learning: self.learning,
            overruns: self.overruns,
            need: self.need,
            want: self.want,
            target: self.target,
            timed_renewals: self.timed_renewals,
            timed_grows: self.timed_grows,
            capacity: self.fleet,
            configured_capacity: self.configured,
            capacity_mismatch: self
                .fleet
                .and_then(|f| CapacityMismatch::between(self.configured, f)),
        }
    }
}
