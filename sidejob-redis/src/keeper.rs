//! The lease keeper: one thread per Redis address that keeps every
//! attached front-end's capacity equal to its node's share of its budget.
//!
//! Each [`Budget::attach`] adds an attachment (its own [`Core`], schedule,
//! budget scripts and front-end) to the keeper thread of the budget's Redis
//! URL, which owns one connection to that Redis; the thread starts with the
//! first attachment and stops when the last is dropped. Attachments made
//! with [`Budget::attach_store`] bring their own store and share one more
//! thread. The thread runs each [`Core`](crate::Core) on the real monotonic
//! clock and is the only thing that calls `set_capacity` on the front-ends.
//! Admission itself is untouched: callers still take a unit with the local
//! CAS and get `Overload` when the local share is used up.
//!
//! The thread makes one blocking call at a time, for up to that budget's
//! renew timeout, so before every call it drops the leased capacity of
//! *every* attachment whose admission window could end meanwhile
//! ([`Core::guard_for`](crate::Core::guard_for)): a slow call for one
//! budget never stretches another's window. A shutting-down attachment
//! drains without blocking the thread: it is polled every millisecond.

use std::time::Duration;

use sidejob::{Limiter, Pool, Stats, Supervisor, Worker};

use crate::config::{Budget, ConfigError};
use crate::core::{Core, Due, KeeperStats, Reading};
use crate::redis_store::{BudgetScripts, RedisConn, RedisStore};
use crate::store::{FleetCapacity, InitArgs, LeaseStore, RenewReply, Status, StoreError};
use crate::sync::{thread, Arc, AtomicU64, Condvar, Instant, Mutex, Relaxed, Weak};

/// A front-end whose capacity a keeper drives: [`Limiter`], [`Pool`] and
/// [`Supervisor`] implement it.
///
/// # Examples
///
/// ```
/// use sidejob_redis::Resizable;
///
/// let limiter = sidejob::Limiter::new(5)?;
/// Resizable::set_capacity(&limiter, 2)?;
/// assert_eq!(Resizable::stats(&limiter).capacity, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Resizable: Send + Sync + 'static {
    /// Moves the capacity, exactly under races (a shrink drains as a debt).
    fn set_capacity(&self, capacity: usize) -> Result<(), sidejob::ConfigError>;
    /// Capacity, usage and the accepted and rejected counters.
    fn stats(&self) -> Stats;
}

impl Resizable for Limiter {
    fn set_capacity(&self, capacity: usize) -> Result<(), sidejob::ConfigError> {
        Limiter::set_capacity(self, capacity)
    }
    fn stats(&self) -> Stats {
        Limiter::stats(self)
    }
}

impl<W: Worker> Resizable for Pool<W> {
    fn set_capacity(&self, capacity: usize) -> Result<(), sidejob::ConfigError> {
        Pool::set_capacity(self, capacity)
    }
    fn stats(&self) -> Stats {
        Pool::stats(self)
    }
}

impl Resizable for Supervisor {
    fn set_capacity(&self, capacity: usize) -> Result<(), sidejob::ConfigError> {
        Supervisor::set_capacity(self, capacity)
    }
    fn stats(&self) -> Stats {
        Supervisor::stats(self)
    }
}

impl<T: Resizable> Resizable for Arc<T> {
    fn set_capacity(&self, capacity: usize) -> Result<(), sidejob::ConfigError> {
        (**self).set_capacity(capacity)
    }
    fn stats(&self) -> Stats {
        (**self).stats()
    }
}

/// One keeper's flags and published view, shared by its handle and the
/// keeper thread.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    stop: bool,
    crash: bool,
    stats: KeeperStats,
    released: Option<u64>,
    done: bool,
}

/// A keeper thread and its inbox; shared by every [`Keeper`] on it.
struct Hub {
    inbox: Arc<Inbox>,
    thread: Option<thread::JoinHandle<()>>,
    id: Option<thread::ThreadId>,
}

struct Inbox {
    state: Mutex<InboxState>,
    wake: Condvar,
}

#[derive(Default)]
struct InboxState {
    new: Vec<Attachment>,
    poke: bool,
    stop: bool,
}

/// The keeper threads alive, by key (a Redis URL, or "" for attachments
/// that bring their own store). Weak: the last [`Keeper`] of a thread
/// stops it.
static HUBS: Mutex<Vec<(String, Weak<Hub>)>> = Mutex::new(Vec::new());

impl Hub {
    /// The running thread for `key`, or a new one (with `conn` for a Redis
    /// address).
    fn get(key: &str, conn: Option<RedisConn>) -> Arc<Hub> {
        let mut hubs = HUBS.lock();
        hubs.retain(|(_, w)| w.strong_count() > 0);
        if let Some(hub) = hubs
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            return hub;
        }
        let inbox = Arc::new(Inbox {
            state: Mutex::new(InboxState::default()),
            wake: Condvar::new(),
        });
        let thread = {
            let inbox = inbox.clone();
            // The key holds a digest of the login; the name shows only
            // the address part (`Endpoint`'s Display, no password).
            let name = match key.split_once('#') {
                Some((shown, _)) => format!("sidejob-keeper:{shown}"),
                None => "sidejob-keeper".to_string(),
            };
            thread::Builder::new()
                .name(name)
                .spawn(move || run(inbox, conn))
                .ok()
        };
        let id = thread.as_ref().map(|t| t.thread().id());
        let hub = Arc::new(Hub { inbox, thread, id });
        hubs.push((key.to_string(), Arc::downgrade(&hub)));
        hub
    }

    fn poke(&self) {
        self.inbox.state.lock().poke = true;
        self.inbox.wake.notify_all();
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.inbox.state.lock().stop = true;
        self.inbox.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Test hook: whether a keeper thread for `url` (a Redis URL) is running.
#[doc(hidden)]
pub fn keeper_thread_running(url: &str) -> bool {
    let key = crate::endpoint::Endpoint::parse(url)
        .map(|e| e.identity())
        .unwrap_or_default();
    HUBS.lock()
        .iter()
        .any(|(k, w)| *k == key && w.strong_count() > 0)
}

/// A running keeper: drives one front-end's capacity from a [`Budget`].
/// Made by [`Budget::attach`] or [`Budget::attach_store`]; every keeper on
/// one Redis address shares one thread and one connection.
///
/// Dropping it (or [`shutdown`](Self::shutdown)) sets the local capacity to
/// the floor, waits for the leased units to drain (at most until the lease's
/// `valid_until`), and releases the grant in Redis so other nodes can use it
/// at once. Dropping the last keeper of a thread stops the thread.
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use sidejob::Limiter;
/// use sidejob_redis::{Budget, MemoryStore};
///
/// let ms = Duration::from_millis;
/// let budget = Budget::builder()
///     .name("doc").capacity(8).fresh(true)
///     .ttl(ms(1000)).renew_every(ms(200)).grace(ms(300)).max_hold(ms(200)).pause_margin(ms(50))
///     .build()?;
/// let limiter = Arc::new(Limiter::new(1)?);
/// let keeper = budget.attach_store(MemoryStore::new(), limiter.clone());
/// // Callers hold what they get; refusals make the keeper grow the lease.
/// let mut held = Vec::new();
/// while !keeper.wait_for(ms(20), |s| s.leased >= 4) {
///     held.extend(limiter.try_acquire());
/// }
/// assert!(limiter.capacity() >= 4 && limiter.capacity() <= 8);
/// drop(held);
/// // Nothing is out: the grant goes back to the store at once.
/// let granted = keeper.stats().grant;
/// assert_eq!(keeper.shutdown(), Some(granted));
/// assert_eq!(limiter.capacity(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Keeper {
    shared: Arc<Shared>,
    hub: Option<Arc<Hub>>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Budget {
    /// Starts a keeper for `target` on the Redis at the budget's URL, on
    /// that address's keeper thread (started if this is its first
    /// attachment). The target's capacity is set to the floor (0 by
    /// default) at once and grows as Redis grants units.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `url` if the budget has none or it does not
    /// parse.
    pub fn attach<T: Resizable>(&self, target: T) -> Result<Keeper, ConfigError> {
        let url = self
            .url
            .as_ref()
            .ok_or_else(|| ConfigError::new("url", "required to attach to Redis"))?;
        let conn =
            RedisConn::new(url, self.renew_timeout).map_err(|e| ConfigError::new("url", e.0))?;
        let hub = Hub::get(&url.identity(), Some(conn));
        Ok(self.start(
            hub,
            Store::Redis(Box::new(BudgetScripts::new(&self.name))),
            Box::new(target),
        ))
    }

    /// Starts a keeper for `target` on any [`LeaseStore`]; such keepers
    /// share one thread of their own.
    pub fn attach_store<S: LeaseStore + 'static, T: Resizable>(
        &self,
        store: S,
        target: T,
    ) -> Keeper {
        let hub = Hub::get("", None);
        self.start(hub, Store::Own(Box::new(store)), Box::new(target))
    }

    fn start(&self, hub: Arc<Hub>, store: Store, target: Box<dyn Resizable>) -> Keeper {
        let node = node_id();
        let core = Core::new(node.clone(), self);
        let _ = target.set_capacity(core.local_capacity());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                stop: false,
                crash: false,
                stats: KeeperStats {
                    node,
                    ..KeeperStats::default()
                },
                released: None,
                // No thread: nothing will ever run this keeper.
                done: hub.thread.is_none(),
            }),
            changed: Condvar::new(),
        });
        let init = InitArgs {
            capacity: self.leased_capacity() as u64,
            capacity_version: self.capacity_version,
            ttl_ms: self.ttl.as_millis() as u64,
            grace_ms: self.grace.as_millis() as u64,
            epoch: node_id(),
            fresh: self.fresh,
            test: self.test_mode,
            debug_now: None,
        };
        let att = Attachment {
            core,
            store,
            target,
            init,
            timeout: self.renew_timeout,
            shared: shared.clone(),
            start: Instant::now(),
            draining: false,
        };
        hub.inbox.state.lock().new.push(att);
        hub.poke();
        Keeper {
            shared,
            hub: Some(hub),
        }
    }

    /// Reads the whole budget from Redis (a one-off connection).
    ///
    /// # Errors
    ///
    /// If the budget has no URL or Redis cannot be reached.
    pub fn status(&self) -> Result<Option<Status>, StoreError> {
        let url = self
            .url
            .as_ref()
            .ok_or_else(|| StoreError("the budget has no url".into()))?;
        RedisStore::with_endpoint(url, &self.name, self.renew_timeout)?.status()
    }

    /// Changes the fleet's capacity `C` deliberately (a one-off connection
    /// to the budget's Redis): the budget's capacity becomes `capacity`
    /// (reserved floors included, as in [`BudgetBuilder::capacity`](crate::BudgetBuilder::capacity)) with a
    /// version one above the budget's, in one atomic script. Nodes
    /// configured with an older setting follow it (each says so in
    /// [`KeeperStats::capacity_mismatch`](crate::KeeperStats::capacity_mismatch)),
    /// and nodes that learned it restore it if Redis loses the budget.
    /// Returns the new setting as Redis holds it: the units it leases (the
    /// capacity less this budget's reserved floors) and the version.
    ///
    /// A lowered capacity holds for grants at once: no grant grows while
    /// the fleet holds more, and every node above its share of the new
    /// capacity is asked down to it at its next renewal, so the units in
    /// flight come down to it within about a renew period plus the time the
    /// units above it take to come back. A change that Redis loses before any node renewed (a failover
    /// right after it) is lost: read [`status`](Self::status) to check.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] that says so if the budget has no URL, if
    /// `capacity` is below the reserved floors, if the budget does not
    /// exist in Redis (no node has created it, or Redis lost it and no
    /// node has re-created it yet), or if Redis cannot be reached.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sidejob_redis::Budget;
    ///
    /// let budget = Budget::builder()
    ///     .url("redis://127.0.0.1:6379/")
    ///     .name("orders-db")
    ///     .capacity(300)
    ///     .max_hold(Duration::from_secs(3))
    ///     .build()?;
    /// // The database is struggling: lower the whole fleet to 150.
    /// let setting = budget.set_fleet_capacity(150)?;
    /// assert_eq!(setting.capacity, 150);
    /// println!("fleet capacity 150 in force, version {}", setting.version);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_fleet_capacity(&self, capacity: usize) -> Result<FleetCapacity, StoreError> {
        let url = self
            .url
            .as_ref()
            .ok_or_else(|| StoreError("the budget has no url".into()))?;
        let floors = self.floor() * self.max_nodes();
        let leased = capacity.checked_sub(floors).ok_or_else(|| {
            StoreError(format!(
                "fleet capacity {capacity} is below the reserved floors ({floors} units)"
            ))
        })?;
        RedisStore::with_endpoint(url, &self.name, self.renew_timeout)?
            .set_fleet_capacity(leased as u64)?
            .ok_or_else(|| {
                StoreError(format!(
                    "budget `{}` does not exist in Redis: no node has created it yet, or Redis lost it and no node has re-created it",
                    self.name
                ))
            })
    }
}

static NODE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// 128 bits unlikely to repeat across processes and restarts: the clock,
/// the pid, a per-process counter and std's per-process random hasher keys.
fn node_id() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let n = NODE_COUNTER.fetch_add(1, Relaxed); // a counter only: pairs with nothing
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut a = RandomState::new().build_hasher();
    a.write_u128(t);
    a.write_u32(std::process::id());
    a.write_u64(n);
    let mut b = RandomState::new().build_hasher();
    b.write_u64(a.finish());
    b.write_u64(n);
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    format!("{host}-{:016x}{:016x}", a.finish(), b.finish())
}

impl Keeper {
    /// The keeper's view now.
    pub fn stats(&self) -> KeeperStats {
        self.shared.state.lock().stats.clone()
    }

    /// The keeper thread serving this keeper: the same for every keeper on
    /// one Redis address (`None` if the thread could not be spawned).
    pub fn thread_id(&self) -> Option<thread::ThreadId> {
        self.hub.as_ref().and_then(|h| h.id)
    }

    /// Asks for a renewal now (still at most one per early-grow gap): for
    /// a caller that just got `Overload` and does not want to wait for the
    /// keeper's next poll.
    pub fn nudge(&self) {
        if let Some(hub) = &self.hub {
            hub.poke();
        }
    }

    /// Waits up to `timeout` for `pred` to hold on the keeper's stats
    /// (checked after every keeper step); true if it did.
    pub fn wait_for(&self, timeout: Duration, mut pred: impl FnMut(&KeeperStats) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.state.lock();
        loop {
            if pred(&state.stats) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || state.done {
                return false;
            }
            state = self.shared.changed.wait_timeout(state, deadline - now);
        }
    }

    /// Stops the keeper: local capacity to the floor, wait for the leased
    /// units to drain, release the grant. Returns the units released in
    /// Redis (`None` if the release did not happen: the store was
    /// unreachable, or units were still out when the lease ran out, in
    /// which case Redis frees them at expiry + grace).
    pub fn shutdown(mut self) -> Option<u64> {
        self.stop()
    }

    /// Test hook: stops the keeper as a crashed process would, touching
    /// neither the front-end nor the store (the lease lapses in Redis).
    #[doc(hidden)]
    pub fn crash(mut self) {
        self.shared.state.lock().crash = true;
        self.stop();
    }

    fn stop(&mut self) -> Option<u64> {
        let Some(hub) = self.hub.take() else {
            return self.shared.state.lock().released;
        };
        self.shared.state.lock().stop = true;
        hub.poke();
        let mut state = self.shared.state.lock();
        while !state.done {
            state = self
                .shared
                .changed
                .wait_timeout(state, Duration::from_millis(100));
        }
        let released = state.released;
        drop(state);
        drop(hub); // the last keeper of a thread stops it
        released
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where an attachment's calls go.
enum Store {
    /// Its budget's scripts over the thread's connection.
    Redis(Box<BudgetScripts>),
    /// A store of its own.
    Own(Box<dyn LeaseStore>),
}

/// One keeper's state on the keeper thread.
struct Attachment {
    core: Core,
    store: Store,
    target: Box<dyn Resizable>,
    init: InitArgs,
    timeout: Duration,
    shared: Arc<Shared>,
    start: Instant,
    draining: bool,
}

impl Attachment {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn read(&self) -> Reading {
        let s = self.target.stats();
        Reading {
            capacity: s.capacity,
            usage: s.usage,
            accepted: s.accepted,
            rejected: s.rejected,
        }
    }

    fn apply(&self, capacity: Option<usize>) {
        if let Some(c) = capacity {
            // Cannot fail: capacities come from the budget, far below the
            // front-end's maximum.
            let _ = self.target.set_capacity(c);
        }
    }

    /// Runs `f` on this attachment's store.
    fn call<R>(
        &mut self,
        conn: &mut Option<RedisConn>,
        f: impl FnOnce(&mut dyn LeaseStore) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        match (&mut self.store, conn) {
            (Store::Own(s), _) => f(s.as_mut()),
            (Store::Redis(b), Some(c)) => f(&mut c.bind(b, self.timeout)),
            (Store::Redis(_), None) => Err(StoreError("no connection".into())),
        }
    }

    fn publish(&self, done: Option<Option<u64>>) {
        let mut s = self.shared.state.lock();
        s.stats = self.core.stats(self.now());
        if let Some(released) = done {
            s.released = released;
            s.done = true;
        }
        drop(s);
        self.shared.changed.notify_all();
    }
}

/// Before a call that may block for `blocked_for`: every attachment whose
/// admission window could end meanwhile drops its leased capacity now.
fn guard_all(atts: &mut [Attachment], blocked_for: Duration) {
    for a in atts.iter_mut() {
        let lowered = a.core.guard_for(a.now(), blocked_for);
        a.apply(lowered);
    }
}

/// One step of attachment `i`: sample, expire, and make its call if due.
/// Returns `Some(released)` when the attachment is finished.
fn step(atts: &mut [Attachment], i: usize, conn: &mut Option<RedisConn>) -> Option<Option<u64>> {
    let (stop, crash) = {
        let s = atts[i].shared.state.lock();
        (s.stop, s.crash)
    };
    if stop && crash {
        return Some(None);
    }
    if stop && !atts[i].draining {
        atts[i].draining = true;
        let floor = atts[i].core.floor as usize;
        let _ = atts[i].target.set_capacity(floor);
    }
    if atts[i].draining {
        // Drained: release. Out of time (the lease ends): Redis frees it.
        let floor = atts[i].core.floor as usize;
        let a = &atts[i];
        if a.read().usage <= floor {
            let timeout = a.timeout;
            guard_all(atts, timeout);
            let a = &mut atts[i];
            let req = a.core.next_req();
            let node = a.core.node().to_string();
            let released = a.call(conn, |s| s.release(&node, req)).ok();
            if released.is_some() {
                a.core.on_release();
            }
            return Some(released);
        }
        return match a.core.valid_until() {
            Some(v) if a.now() < v => None,
            _ => Some(None),
        };
    }
    let a = &mut atts[i];
    let now = a.now();
    let reading = a.read();
    a.core.sample(&reading);
    let lowered = a.core.expire(now, &reading);
    a.apply(lowered);
    let due = a.core.due(now, &reading);
    if due == Due::Nothing {
        return None;
    }
    let timeout = a.timeout;
    guard_all(atts, timeout);
    let a = &mut atts[i];
    match due {
        Due::Nothing => {}
        Due::Init => {
            // The highest capacity setting the node knows, not only its
            // configured one: a budget re-created after a state loss gets
            // the fleet's capacity back rather than a stale node's.
            let mut init = a.init.clone();
            let setting = a.core.capacity_setting();
            init.capacity = setting.capacity;
            init.capacity_version = setting.version;
            let ok = a.call(conn, |s| s.init(&init)).is_ok();
            let t = a.now();
            a.core.on_init(t, ok);
        }
        Due::Renew => {
            let lowered = a.core.prepare(now, &reading);
            a.apply(lowered);
            // `has` is read after the shrink: no shard admits above its new
            // limit once `set_capacity` returned.
            let r = a.read();
            let has = (r.capacity.max(r.usage) as u64).saturating_sub(a.core.floor);
            let t_send = a.now();
            let args = a.core.renew_args(t_send, has);
            let reply = a.call(conn, |s| s.renew(&args)).ok();
            if matches!(reply, Some(RenewReply::NoBudget)) {
                a.init.fresh = false; // a lost budget is never fresh
            }
            let t = a.now();
            let changed = a.core.on_renew(t_send, t, reply);
            a.apply(changed);
        }
    }
    None
}

/// The keeper thread: steps every attachment, then sleeps until the
/// earliest one's next wake, a new attachment, a nudge or a stop.
fn run(inbox: Arc<Inbox>, mut conn: Option<RedisConn>) {
    let mut atts: Vec<Attachment> = Vec::new();
    loop {
        {
            let mut s = inbox.state.lock();
            atts.append(&mut s.new);
            s.poke = false;
            if s.stop && atts.is_empty() {
                return;
            }
        }
        let mut i = 0;
        while i < atts.len() {
            match step(&mut atts, i, &mut conn) {
                Some(released) => {
                    let a = atts.swap_remove(i);
                    a.publish(Some(released));
                }
                None => {
                    atts[i].publish(None);
                    i += 1;
                }
            }
        }
        // Sleep until the earliest wake (draining attachments poll every ms).
        let mut wait = Duration::from_secs(1);
        for a in &atts {
            let now = a.now();
            let w = if a.draining {
                Duration::from_millis(1)
            } else {
                a.core.next_wake(now).saturating_sub(now)
            };
            wait = wait.min(w);
        }
        let s = inbox.state.lock();
        if !s.poke && s.new.is_empty() && !s.stop {
            let _s = inbox.wake.wait_timeout(s, wait);
        }
    }
}
