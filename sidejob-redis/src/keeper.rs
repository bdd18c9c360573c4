//! The lease keeper: one thread that keeps a local front-end's capacity
//! equal to its node's share of the fleet budget.
//!
//! The thread runs [`Core`](crate::Core) on the real monotonic clock against
//! a [`LeaseStore`]; it is the only thing that calls `set_capacity` on the
//! front-end. Admission itself is untouched: callers still take a unit with
//! the local CAS and get `Overload` when the local share is used up.

use std::time::Duration;

use sidejob::{Limiter, Pool, Stats, Supervisor, Worker};

use crate::config::{Budget, ConfigError};
use crate::core::{Core, Due, KeeperStats, Reading};
use crate::redis_store::RedisStore;
use crate::store::{InitArgs, LeaseStore, RenewReply, Status, StoreError};
use crate::sync::{thread, Arc, AtomicU64, Condvar, Instant, Mutex, Relaxed};

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

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    stop: bool,
    crash: bool,
    nudged: bool,
    stats: KeeperStats,
    released: Option<u64>,
    done: bool,
}

/// A running keeper: drives one front-end's capacity from a [`Budget`].
/// Made by [`Budget::attach`] or [`Budget::attach_store`].
///
/// Dropping it (or [`shutdown`](Self::shutdown)) sets the local capacity to
/// the floor, waits for the leased units to drain (at most until the lease's
/// `valid_until`), and releases the grant in Redis so other nodes can use it
/// at once.
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
    thread: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Budget {
    /// Starts a keeper for `target` on the Redis at the budget's URL. The
    /// target's capacity is set to the floor (0 by default) at once and
    /// grows as Redis grants units.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `url` if the budget has none or it does not
    /// parse.
    pub fn attach<T: Resizable>(&self, target: T) -> Result<Keeper, ConfigError> {
        let url = self
            .url
            .as_deref()
            .ok_or_else(|| ConfigError::new("url", "required to attach to Redis"))?;
        let store = RedisStore::new(url, &self.name, self.renew_timeout)
            .map_err(|e| ConfigError::new("url", e.0))?;
        Ok(self.attach_store(store, target))
    }

    /// Starts a keeper for `target` on any [`LeaseStore`].
    pub fn attach_store<S: LeaseStore + 'static, T: Resizable>(
        &self,
        store: S,
        target: T,
    ) -> Keeper {
        let node = node_id();
        let core = Core::new(node.clone(), self);
        let _ = target.set_capacity(core.local_capacity());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                stop: false,
                crash: false,
                nudged: false,
                stats: KeeperStats {
                    node,
                    ..KeeperStats::default()
                },
                released: None,
                done: false,
            }),
            changed: Condvar::new(),
        });
        let init = InitArgs {
            capacity: self.leased_capacity() as u64,
            ttl_ms: self.ttl.as_millis() as u64,
            grace_ms: self.grace.as_millis() as u64,
            epoch: node_id(),
            fresh: self.fresh,
            test: self.test_mode,
            debug_now: None,
        };
        let run = Run {
            core,
            store,
            target,
            init,
            shared: shared.clone(),
            start: Instant::now(),
        };
        let thread = thread::Builder::new()
            .name(format!("sidejob-redis:{}", self.name))
            .spawn(move || run.run())
            .ok();
        if thread.is_none() {
            let mut s = shared.state.lock();
            s.done = true;
        }
        Keeper { shared, thread }
    }

    /// Reads the whole budget from Redis (a one-off connection).
    ///
    /// # Errors
    ///
    /// If the budget has no URL or Redis cannot be reached.
    pub fn status(&self) -> Result<Option<Status>, StoreError> {
        let url = self
            .url
            .as_deref()
            .ok_or_else(|| StoreError("the budget has no url".into()))?;
        RedisStore::new(url, &self.name, self.renew_timeout)?.status()
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

    /// Asks for a renewal now (still at most one per early-grow gap): for
    /// a caller that just got `Overload` and does not want to wait for the
    /// keeper's next poll.
    pub fn nudge(&self) {
        self.shared.state.lock().nudged = true;
        self.shared.changed.notify_all();
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
        self.shared.state.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.state.lock().released
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Run<S, T> {
    core: Core,
    store: S,
    target: T,
    init: InitArgs,
    shared: Arc<Shared>,
    start: Instant,
}

impl<S: LeaseStore, T: Resizable> Run<S, T> {
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

    fn publish(&self) {
        let mut s = self.shared.state.lock();
        s.stats = self.core.stats(self.now());
        drop(s);
        self.shared.changed.notify_all();
    }

    fn run(mut self) {
        loop {
            let now = self.now();
            let reading = self.read();
            self.core.sample(&reading);
            let lowered = self.core.expire(now, &reading);
            self.apply(lowered);
            let due = self.core.due(now, &reading);
            if due != Due::Nothing {
                let lowered = self.core.guard_call(now);
                self.apply(lowered);
            }
            match due {
                Due::Nothing => {}
                Due::Init => {
                    let ok = self.store.init(&self.init).is_ok();
                    self.core.on_init(self.now(), ok);
                }
                Due::Renew => {
                    let lowered = self.core.prepare(now, &reading);
                    self.apply(lowered);
                    // `has` is read after the shrink: no shard admits above
                    // its new limit once `set_capacity` returned.
                    let r = self.read();
                    let has = (r.capacity.max(r.usage) as u64).saturating_sub(self.core.floor);
                    let t_send = self.now();
                    let args = self.core.renew_args(t_send, has);
                    let reply = self.store.renew(&args).ok();
                    if matches!(reply, Some(RenewReply::NoBudget)) {
                        self.init.fresh = false; // a lost budget is never fresh
                    }
                    let changed = self.core.on_renew(t_send, self.now(), reply);
                    self.apply(changed);
                }
            }
            self.publish();
            let wake = self.core.next_wake(self.now());
            let mut s = self.shared.state.lock();
            if !s.stop && !s.nudged {
                let wait = wake.saturating_sub(self.now());
                s = self.shared.changed.wait_timeout(s, wait);
            }
            s.nudged = false;
            if s.stop && s.crash {
                s.done = true;
                drop(s);
                self.shared.changed.notify_all();
                return;
            }
            if s.stop {
                drop(s);
                self.shut_down();
                return;
            }
        }
    }

    fn shut_down(mut self) {
        let floor = self.core.floor as usize;
        let _ = self.target.set_capacity(floor);
        let mut released = None;
        // Wait for the leased units to drain, at most until the lease ends.
        let drained = loop {
            let r = self.read();
            if r.usage <= floor {
                break true;
            }
            match self.core.valid_until() {
                Some(v) if self.now() < v => thread::sleep(Duration::from_millis(1)),
                _ => break false,
            }
        };
        if drained {
            let req = self.core.next_req();
            if let Ok(n) = self.store.release(self.core.node(), req) {
                self.core.on_release();
                released = Some(n);
            }
        }
        let mut s = self.shared.state.lock();
        s.stats = self.core.stats(self.now());
        s.released = released;
        s.done = true;
        drop(s);
        self.shared.changed.notify_all();
    }
}
