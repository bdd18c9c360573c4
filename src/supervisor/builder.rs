//! [`SupervisorBuilder`]: capacity, shards, waiting, keys, thread settings; checked once, in `build`.

use super::{Common, Idle, Inner, RegistryShard, Supervisor, MAX_CHILDREN};
use crate::engine::keys::children::KeySet;
use crate::engine::keys::KeySettings;
use crate::engine::probe::Probe;
use crate::engine::table::Table;
use crate::engine::waiters::{Policy, QueueOrder};
use crate::error::ConfigError;
use crate::sync::{Arc, AtomicUsize, CoarseClock, Condvar, Mutex};
use crossbeam_utils::CachePadded;
use std::time::Duration;

/// Configures a [`Supervisor`]; made by [`Supervisor::builder`].
///
/// # Examples
///
/// ```
/// use sidejob::probe::Probe;
/// use sidejob::Supervisor;
///
/// let sup = Supervisor::builder()
///     .name("get_fsm")
///     .capacity(10_000)
///     .shards(4)
///     .probe(Probe::Thread)
///     .build()?;
/// assert_eq!((sup.name(), sup.capacity(), sup.shards()), ("get_fsm", 10_000, 4));
///
/// let err = Supervisor::builder().name("bad\0name").capacity(1).build().unwrap_err();
/// assert_eq!(err.field(), "name");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SupervisorBuilder {
    name: Option<String>,
    capacity: Option<usize>,
    shards: Option<usize>,
    max_capacity: Option<usize>,
    probe: Probe,
    stack_size: Option<usize>,
    policy: Policy,
    per_key: Option<usize>,
    keys: KeySettings,
}

/// The builder's limits and defaults.
impl SupervisorBuilder {
    crate::engine::waiters::waiting_limits!();
}

impl SupervisorBuilder {
    /// The supervisor's name; spawned threads are named `{name}-child`.
    /// Defaults to `sidejob`. Must not contain a NUL byte.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// How many children may be alive at once. Required; at least 1 and
    /// at most 2^24. The registry allocates an 8-byte slot per unit when
    /// the supervisor is built (80 KB for 10,000 children), so admission
    /// never allocates; with the `tokio` feature, also a 16-byte cell per
    /// unit for the abort handle of a task (see `Supervisor::abort_all`).
    ///
    /// The capacity also counts tasks and reserved children, so it is not
    /// limited to what the OS can run as threads; but children started by
    /// [`Supervisor::spawn`] are OS threads, and past some thousands of
    /// those std may abort the process instead of returning
    /// [`Error::Spawn`](crate::Error::Spawn) (see [`MAX_WORKERS`](crate::PoolBuilder::MAX_WORKERS) for why).
    /// For thread children, keep the capacity in the low thousands.
    pub fn capacity(&mut self, capacity: usize) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// How many shards to split the capacity and the registry over.
    /// Defaults to the number of CPUs. Every shard is kept even with less
    /// capacity than shards (the extra shards' share is 0 until the
    /// capacity grows).
    pub fn shards(&mut self, shards: usize) -> &mut Self {
        self.shards = Some(shards);
        self
    }

    /// Where a caller starts probing; see [`Probe`].
    pub fn probe(&mut self, probe: Probe) -> &mut Self {
        self.probe = probe;
        self
    }

    /// How many callers of [`Supervisor::spawn`], [`reserve`](crate::Supervisor::reserve),
    /// [`reserve_async`](crate::Supervisor::reserve_async) and
    /// `spawn_task_async` (feature `tokio`) may wait for capacity when
    /// `capacity` children are alive; past that they get `Overload` at
    /// once. Defaults to 0: no waiting, fail fast.
    /// [`try_reserve`](crate::Supervisor::try_reserve) and `spawn_task` never
    /// wait.
    pub fn max_waiters(&mut self, waiters: usize) -> &mut Self {
        self.policy.max_waiters = waiters;
        self
    }

    /// How long one caller may wait for capacity before it gets
    /// [`Error::Timeout`](crate::Error::Timeout). Defaults to
    /// [`DEFAULT_MAX_WAIT`](crate::LimiterBuilder::DEFAULT_MAX_WAIT) (1 s).
    pub fn max_wait(&mut self, wait: Duration) -> &mut Self {
        self.policy.max_wait = wait;
        self
    }

    /// The fraction of the capacity in force that requests of `class` may
    /// fill: a request of the class is admitted only while the units held
    /// (of every class) leave it room under that fraction, so the rest is
    /// kept for the classes above it; see [`Class`](crate::Class).
    /// Defaults: `SheddablePlus` 0.9, `Sheddable` 0.8 (or the class
    /// above's, if set lower); `CriticalPlus` and `Critical` always 1, the
    /// whole capacity.
    ///
    /// Checked at build: a [`ConfigError`](crate::ConfigError) naming
    /// `headroom` for a fraction outside `[0, 1]` (or not a number), a top
    /// class set below 1, or a `Sheddable` fraction above
    /// `SheddablePlus`'s.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Class, Error, Supervisor};
    ///
    /// let sup = Supervisor::builder()
    ///     .capacity(10)
    ///     .headroom(Class::Sheddable, 0.2)
    ///     .build()?;
    /// let background = Ask::new().class(Class::Sheddable).fail_fast();
    /// let first = sup.reserve_with(background.units(2))?;
    /// assert_eq!(sup.reserve_with(background).unwrap_err(), Error::Overload);
    /// let user = sup.reserve()?; // 8 units are kept for the other classes
    /// # drop((first, user));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn headroom(&mut self, class: crate::Class, fraction: f64) -> &mut Self {
        self.policy.headroom.set(class, fraction);
        self
    }

    /// A min share for a sheddable class: a fraction of the capacity in
    /// force that the class may hold whatever its headroom, and that a
    /// waiting room keeps for it under sustained load from the classes
    /// above. While the units the class holds, these counted in, stay
    /// within its min share, its requests are admitted up to the
    /// capacity (not its line), and its waiters are served ahead of every
    /// other class's (the most important sheddable class first). No unit
    /// is kept idle for it: a fail-fast request of it takes a unit only if
    /// one is free. Default: none (0) for every class. See
    /// [`guide::priority`](crate::guide::priority), "A min share".
    ///
    /// Checked at build: a [`ConfigError`](crate::ConfigError) naming
    /// `min_share` for a fraction outside `[0, 1]` (or not a number), one
    /// above the class's headroom, one set above 0 for `CriticalPlus` or
    /// `Critical` (no line holds them back), or shares that add up to more
    /// than 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Class, Supervisor};
    ///
    /// let sup = Supervisor::builder()
    ///     .capacity(10)
    ///     .min_share(Class::Sheddable, 0.1)
    ///     .build()?;
    /// let users: Vec<_> = (0..9).map(|_| sup.reserve()).collect::<Result<_, _>>()?;
    /// // 9 of 10 held, above the default line of 8: the min share admits one.
    /// let background = sup.reserve_with(Ask::new().class(Class::Sheddable).fail_fast())?;
    /// # drop((users, background));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn min_share(&mut self, class: crate::Class, fraction: f64) -> &mut Self {
        self.policy.headroom.set_min_share(class, fraction);
        self
    }

    crate::engine::keys::key_settings!(
        setup: "",
        make: "sidejob::Supervisor::builder().capacity(8)",
        build: ".build()"
    );

    /// Which waiter a freed unit goes to; see [`QueueOrder`]. Defaults to
    /// FIFO.
    pub fn queue_order(&mut self, order: QueueOrder) -> &mut Self {
        self.policy.order = order;
        self
    }

    /// How many units later requests may take past a waiting child of many units
    /// ([`Supervisor::reserve_many`](crate::Supervisor::reserve_many)) before every freed unit is kept for it. As
    /// [`LimiterBuilder::pass_budget`](crate::LimiterBuilder::pass_budget):
    /// defaults to the capacity in force; `0` is strict FIFO, `usize::MAX`
    /// first fit.
    ///
    /// # Examples
    ///
    /// Strict FIFO: no child passes a waiting child of many units.
    ///
    /// ```
    /// let sup = sidejob::Supervisor::builder()
    ///     .capacity(16)
    ///     .max_waiters(32)
    ///     .pass_budget(0)
    ///     .build()?;
    /// assert_eq!(sup.capacity(), 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pass_budget(&mut self, units: usize) -> &mut Self {
        self.policy.pass_budget = Some(units);
        self
    }

    /// How many children of one key may be alive at once, for the keyed
    /// forms ([`Supervisor::reserve_keyed`] and friends). Defaults to 1:
    /// a key's children run one after another. At least 1; children
    /// admitted without a key are not counted against any key.
    pub fn per_key(&mut self, children: usize) -> &mut Self {
        self.per_key = Some(children);
        self
    }

    /// The largest capacity [`Supervisor::set_capacity`] may set later.
    /// Defaults to `capacity`; at most 2^24. The registry's slots are
    /// allocated for it up front (8 bytes each), so a resize never
    /// allocates and admission never does.
    pub fn max_capacity(&mut self, max: usize) -> &mut Self {
        self.max_capacity = Some(max);
        self
    }

    /// The stack size, in bytes, of threads started by
    /// [`Supervisor::spawn`]. Defaults to std's (2 MiB, or
    /// `RUST_MIN_STACK`). A size the OS cannot give makes `spawn` fail with
    /// [`Error::Spawn`](crate::Error::Spawn).
    pub fn stack_size(&mut self, bytes: usize) -> &mut Self {
        self.stack_size = Some(bytes);
        self
    }

    /// Builds the supervisor.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or
    /// above 2^24 (the registry allocates a slot per unit up front),
    /// `shards` is 0 or too large, `per_key` is 0 or above 2^32 - 1, or
    /// `name` contains a NUL byte (thread names cannot).
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// let err = Supervisor::builder().capacity(8).per_key(0).build().unwrap_err();
    /// assert_eq!(err.field(), "per_key");
    /// ```
    pub fn build(&self) -> Result<Supervisor, ConfigError> {
        let name = ConfigError::check_name(self.name.as_deref())?.to_owned();
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        if capacity > MAX_CHILDREN {
            return Err(ConfigError::too_large("capacity", MAX_CHILDREN));
        }
        let max = self.max_capacity.unwrap_or(capacity);
        if max > MAX_CHILDREN {
            return Err(ConfigError::too_large("max_capacity", MAX_CHILDREN));
        }
        let per_key = match self.per_key.unwrap_or(1) {
            0 => return Err(ConfigError::zero("per_key")),
            n => u32::try_from(n)
                .map_err(|_| ConfigError::too_large("per_key", u32::MAX as usize))?,
        };
        let shards = self.shards.unwrap_or_else(num_cpus::get);
        let table = Table::with_max(capacity, max, shards, self.probe)?
            .with_policy(&self.policy)?
            .with_keys(&self.keys)?;
        let keys = KeySet::new(
            table.shard_count(),
            max,
            per_key,
            self.policy.max_waiters,
            self.policy.max_wait,
        );
        let common = Arc::new(Common {
            keys,
            table,
            waiters: CachePadded::new(AtomicUsize::new(0)),
            idle: Mutex::new(Idle::default()),
            idle_cv: Condvar::new(),
            feed: Default::default(),
        });
        let registry = (0..common.table.shard_count())
            .map(|index| Arc::new(RegistryShard::new(index, Arc::clone(&common))))
            .collect();
        Ok(Supervisor {
            inner: Arc::new(Inner {
                common,
                registry,
                clock: CoarseClock::new(),
                thread_name: format!("{name}-child"),
                name,
                named: self.name.is_some(),
                stack_size: self.stack_size,
            }),
        })
    }
}
