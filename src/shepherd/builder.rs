//! [`ShepherdBuilder`]: capacity, workers, retry policy, waiting, clock; checked once, in `build`, which starts the workers and the timer.

use super::clock::{Clock, Stamps};
use super::line::Line;
use super::policy::{Budget, Rng};
use super::queue::InMemory;
use super::state::{Core, Factory, Shared};
use super::stats::Counters;
use super::worker::{run_timer, WorkerLoop};
use super::{Handler, Inner, ManualClock, RetryPolicy, Shepherd, UnitRelease};
use crate::engine::probe::Probe;
use crate::engine::table::Table;
use crate::engine::threads;
use crate::engine::waiters::{Policy, QueueOrder};
use crate::error::ConfigError;
use crate::sync::{os_thread, Arc, AtomicUsize, Condvar, Mutex};
use crossbeam_utils::CachePadded;
use std::collections::hash_map::RandomState;
use std::collections::BinaryHeap;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Configures a [`Shepherd`]; made by [`Shepherd::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::shepherd::{Jitter, RetryPolicy, Shepherd};
/// # use sidejob::shepherd::Handler;
/// # struct Echo;
/// # impl Handler for Echo {
/// #     type Op = u8; type Output = u8; type Error = ();
/// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
/// # }
/// let shepherd = Shepherd::builder()
///     .name("mailer")
///     .capacity(10_000)
///     .workers(4)
///     .retry(RetryPolicy::new().max_attempts(6).jitter(Jitter::Full))
///     .attempt_timeout(Duration::from_secs(30))
///     .build(|_| Echo)?;
/// assert_eq!((shepherd.capacity(), shepherd.workers()), (10_000, 4));
///
/// let err = Shepherd::builder().capacity(1).retry(RetryPolicy::new().max_attempts(0))
///     .build(|_| Echo).unwrap_err();
/// assert_eq!(err.to_string(), "invalid `max_attempts`: must be at least 1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ShepherdBuilder {
    name: Option<String>,
    capacity: Option<usize>,
    workers: Option<usize>,
    shards: Option<usize>,
    probe: Probe,
    policy: Policy,
    retry: RetryPolicy,
    attempt_timeout: Option<Duration>,
    spin_wait: Option<Duration>,
    clock: Clock,
    seed: Option<u64>,
    unit_release: UnitRelease,
}

/// The builder's limits and defaults.
impl ShepherdBuilder {
    /// The most workers: as for a thread pool
    /// ([`PoolBuilder::MAX_WORKERS`](crate::PoolBuilder::MAX_WORKERS), which
    /// says why), since each worker is a thread.
    pub const MAX_WORKERS: usize = crate::engine::threads::MAX_WORKERS;

    /// How long an idle worker polls before parking, unless
    /// [`spin_wait`](Self::spin_wait) says otherwise: 50 µs.
    pub const DEFAULT_SPIN_WAIT: Duration = crate::engine::threads::DEFAULT_SPIN_WAIT;

    /// The longest [`spin_wait`](Self::spin_wait) accepted: 10 ms (see
    /// [`PoolBuilder::MAX_SPIN_WAIT`](crate::PoolBuilder::MAX_SPIN_WAIT)).
    pub const MAX_SPIN_WAIT: Duration = crate::engine::threads::MAX_SPIN_WAIT;

    crate::engine::waiters::waiting_limits!();
}

impl ShepherdBuilder {
    /// The name of its threads (`{name}-{index}`, `{name}-timer`).
    /// Defaults to `"shepherd"`; must not contain a NUL byte.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// How many operations it may hold at once, due, delayed or running.
    /// Required; at least 1.
    pub fn capacity(&mut self, capacity: usize) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// How many workers, one handler (one resource) each. Defaults to the
    /// number of CPUs; for CPU-bound work, one fewer leaves a core for the
    /// shepherd's own threads and the callers.
    ///
    /// Each worker is an OS thread: at least 1, at most [`MAX_WORKERS`](crate::PoolBuilder::MAX_WORKERS)
    /// (4096; the default is capped there too). [`build`](Self::build)
    /// refuses more before starting any thread, since past some thousands
    /// of threads std aborts the process rather than return an error (see
    /// [`MAX_WORKERS`](crate::PoolBuilder::MAX_WORKERS)).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::shepherd::Handler;
    /// # struct Echo;
    /// # impl Handler for Echo {
    /// #     type Op = u8; type Output = u8; type Error = ();
    /// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
    /// # }
    /// use sidejob::shepherd::{Shepherd, ShepherdBuilder};
    ///
    /// let err = Shepherd::builder().capacity(64).workers(20_000).build(|_| Echo).unwrap_err();
    /// assert_eq!(err.field(), "workers");
    /// assert_eq!(err.to_string(), format!("invalid `workers`: must be at most {}", ShepherdBuilder::MAX_WORKERS));
    /// ```
    pub fn workers(&mut self, workers: usize) -> &mut Self {
        self.workers = Some(workers);
        self
    }

    /// Shards of the admission table; defaults to the number of CPUs.
    pub fn shards(&mut self, shards: usize) -> &mut Self {
        self.shards = Some(shards);
        self
    }

    /// Where a submitter starts probing the table; see [`Probe`].
    pub fn probe(&mut self, probe: Probe) -> &mut Self {
        self.probe = probe;
        self
    }

    /// How many submitters may wait for capacity when it is full; 0 (the
    /// default) refuses at once. See [`PoolBuilder::max_waiters`](crate::PoolBuilder::max_waiters).
    pub fn max_waiters(&mut self, waiters: usize) -> &mut Self {
        self.policy.max_waiters = waiters;
        self
    }

    /// How long one submitter may wait for capacity.
    pub fn max_wait(&mut self, wait: Duration) -> &mut Self {
        self.policy.max_wait = wait;
        self
    }

    /// Which waiting submitter a freed unit goes to; see [`QueueOrder`].
    pub fn queue_order(&mut self, order: QueueOrder) -> &mut Self {
        self.policy.order = order;
        self
    }

    /// The retry policy; [`RetryPolicy::default`] by default.
    pub fn retry(&mut self, policy: RetryPolicy) -> &mut Self {
        self.retry = policy;
        self
    }

    /// The longest one attempt may take before it counts as failed (and
    /// is retried or failed, as the policy says); none by default. The late
    /// attempt itself cannot be stopped; see [`Shepherd`] ("A late
    /// attempt").
    pub fn attempt_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// How long an idle worker, and a waiting [`Completion::wait`](crate::shepherd::Completion::wait), poll
    /// before they sleep; [`DEFAULT_SPIN_WAIT`](crate::PoolBuilder::DEFAULT_SPIN_WAIT)
    /// by default, at most [`MAX_SPIN_WAIT`](crate::PoolBuilder::MAX_SPIN_WAIT). See
    /// [`PoolBuilder::spin_wait`](crate::PoolBuilder::spin_wait).
    ///
    /// A completion spins only if, when it was submitted, at most
    /// `workers` operations were due ahead of it beyond one in each
    /// worker's hands (at most `2 × workers` open): one with more ahead of
    /// it waits at least an attempt's time, and a waiter that spins that
    /// long takes a core the workers need whenever threads outnumber cores
    /// (a submitter holding many operations and waiting for the oldest, on
    /// 2 cores with 2 workers, lost a third of its throughput to it). The
    /// open count also holds the completions a busy worker has not yet
    /// counted out (at most 32 each, while the line never runs dry), so
    /// in a busy shepherd a completion spins less often, never more.
    pub fn spin_wait(&mut self, spin: Duration) -> &mut Self {
        self.spin_wait = Some(spin);
        self
    }

    /// When an operation's unit of capacity goes back:
    /// [`UnitRelease::OnHandOver`] (the default) or
    /// [`UnitRelease::OnCompletion`].
    ///
    /// # Examples
    ///
    /// Submit a batch first and read the outcomes after: with the units
    /// given back at completion, a waiting room lets the submitter wait for
    /// the workers (with the default, it would wait for its own unread
    /// outcomes until `max_wait`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::shepherd::{Handler, Shepherd, UnitRelease};
    /// # struct Double;
    /// # impl Handler for Double {
    /// #     type Op = u32; type Output = u32; type Error = ();
    /// #     fn handle(&mut self, n: &u32, _: u32) -> Result<u32, ()> { Ok(n * 2) }
    /// # }
    /// let shepherd = Shepherd::builder()
    ///     .capacity(4)
    ///     .max_waiters(1)
    ///     .max_wait(Duration::from_secs(60))
    ///     .unit_release(UnitRelease::OnCompletion)
    ///     .build(|_| Double)?;
    /// let batch: Vec<_> = (0..16).map(|n| shepherd.submit(n)).collect::<Result<_, _>>()?;
    /// let doubled: Vec<u32> = batch.into_iter().map(|done| done.wait().unwrap()).collect();
    /// assert_eq!(doubled, (0..16).map(|n| n * 2).collect::<Vec<_>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unit_release(&mut self, release: UnitRelease) -> &mut Self {
        self.unit_release = release;
        self
    }

    /// Runs the shepherd's time (delays, backoff, attempt timeouts, the
    /// retry budget) on `clock` instead of the real one: for tests.
    pub fn clock(&mut self, clock: ManualClock) -> &mut Self {
        self.clock = Clock::Manual(clock);
        self
    }

    /// Seeds the jitter's random draws, so a test sees the same delays
    /// every run; by default a random seed.
    pub fn seed(&mut self, seed: u64) -> &mut Self {
        self.seed = Some(seed);
        self
    }

    /// Starts the workers, each with the handler `factory(index)` returns,
    /// and the timer thread.
    ///
    /// The factory runs on the worker's own thread, at start and after
    /// every panic or [`Recovery::Rebuild`](crate::shepherd::Recovery::Rebuild) (a restart).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or too
    /// large; `workers` is 0 or above [`MAX_WORKERS`](crate::PoolBuilder::MAX_WORKERS); `shards` is 0 or too
    /// large; `spin_wait` is above [`MAX_SPIN_WAIT`](crate::PoolBuilder::MAX_SPIN_WAIT); `attempt_timeout` is
    /// zero; `name` has a NUL byte; the retry policy is invalid
    /// (`max_attempts` 0, `backoff` initial above max, `budget` out of
    /// range); or the waiting settings are (`max_waiters`, `queue_order`).
    /// Naming `workers` if the OS refused a thread (those started are shut
    /// down first).
    pub fn build<H, F>(&self, factory: F) -> Result<Shepherd<H>, ConfigError>
    where
        H: Handler,
        F: Fn(usize) -> H + Send + Sync + 'static,
    {
        let name: Arc<str> = Arc::from(self.name.as_deref().unwrap_or("shepherd"));
        if name.contains('\0') {
            return Err(ConfigError::nul("name"));
        }
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        let workers = threads::workers(self.workers)?;
        let spin = threads::spin_wait(self.spin_wait)?;
        if self.attempt_timeout.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::zero_duration("attempt_timeout"));
        }
        self.retry.check()?;
        let shards = self.shards.unwrap_or_else(num_cpus::get);
        let table = Table::new(capacity, shards, self.probe)?.with_policy(&self.policy)?;
        let seed = self.seed.unwrap_or_else(|| {
            // A per-process random key from std; no clock, no dependency.
            RandomState::new().build_hasher().finish()
        });
        let start = self.clock.now();
        let table = Arc::new(table);
        let shared = Arc::new(Shared {
            homes: super::unit::Homes::new(&table),
            unit_release: self.unit_release,
            table,
            line: Line::new(workers),
            core: Mutex::new(Core {
                queue: InMemory::new(),
                rng: Rng::new(seed),
                deadlines: BinaryHeap::new(),
                closing: false,
                alive: workers,
                timer_wake: None,
            }),
            budget: self
                .retry
                .retry_budget()
                .map(|b| CachePadded::new(Mutex::new(Budget::new(b, start)))),
            timer: Condvar::new(),
            idle: Condvar::new(),
            idle_waiters: AtomicUsize::new(0),
            slots: (0..workers).map(|_| Mutex::new(None)).collect(),
            counters: Counters::new(workers, self.attempt_timeout.is_some()),
            policy: self.retry,
            attempt_timeout: self.attempt_timeout,
            stamps: Stamps::new(&self.clock),
            clock: self.clock.clone(),
            spin,
            factory: Arc::new(factory) as Arc<Factory<H>>,
        });
        let listener = match &self.clock {
            Clock::System => None,
            Clock::Manual(clock) => {
                let weak = Arc::downgrade(&shared);
                let listener: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                    if let Some(shared) = weak.upgrade() {
                        // Under the lock: the timer reads the clock under
                        // it, so it either sees the move or is asleep and
                        // gets this notification.
                        let _core = shared.core.lock();
                        shared.timer.notify_all();
                    }
                });
                clock.listen(&listener);
                Some(listener)
            }
        };

        let mut threads = Vec::with_capacity(workers + 1);
        let mut spawn_error = None;
        for index in 0..workers {
            let worker = WorkerLoop {
                index,
                shared: Arc::clone(&shared),
            };
            match os_thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || worker.run())
            {
                Ok(thread) => threads.push(thread),
                Err(err) => {
                    spawn_error = Some(err.kind());
                    // The workers that never started never leave.
                    shared.core.lock().alive -= workers - index;
                    break;
                }
            }
        }
        if spawn_error.is_none() {
            let timer = Arc::clone(&shared);
            match os_thread::Builder::new()
                .name(format!("{name}-timer"))
                .spawn(move || run_timer(&timer))
            {
                Ok(thread) => threads.push(thread),
                Err(err) => spawn_error = Some(err.kind()),
            }
        }
        let thread_ids = threads.iter().map(|t| t.thread().id()).collect();
        let inner = Inner {
            shared,
            threads: Mutex::new(threads),
            thread_ids,
            name,
            named: self.name.is_some(),
            workers,
            _listener: listener,
        };
        if let Some(kind) = spawn_error {
            // Dropping `inner` shuts down and joins what started.
            drop(inner);
            return Err(ConfigError::spawn("workers", kind));
        }
        Ok(Shepherd {
            inner: Arc::new(inner),
        })
    }
}
