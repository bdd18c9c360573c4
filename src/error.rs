//! Every error the crate returns: [`Error`] from admission and requests,
//! [`Refused`] and [`TryCallError`] when a refused value is handed back,
//! [`ConfigError`] from builders.

use std::fmt;
use std::io;
use std::time::Duration;

/// Why a request, permit or child was refused or failed.
///
/// Returned by [`Limiter::try_acquire`](crate::Limiter::try_acquire),
/// [`Pool::call`](crate::Pool::call) and friends, and
/// [`Supervisor::spawn`](crate::Supervisor::spawn). New variants may be added,
/// so match with a wildcard arm.
///
/// # Examples
///
/// ```
/// use sidejob::{Error, Limiter};
///
/// let limiter = Limiter::new(1)?;
/// let _held = limiter.try_acquire()?;
/// let refused = limiter.try_acquire().unwrap_err();
/// assert_eq!(refused, Error::Overload);
/// assert!(refused.is_overload());
/// assert_eq!(refused.to_string(), "overloaded: every shard is at its limit");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// Every shard was at its limit: the work was refused at once, nothing
    /// was queued. Retry later, shed the request, or tell your own caller.
    ///
    /// What it promises: during the call, every shard was *seen* full,
    /// either tried and found at its limit, or marked full by a caller who
    /// found it so. The shards are not read at one instant, so a unit freed
    /// on a shard the caller had already passed does not save the call:
    /// `N` threads each holding at most one unit of capacity `N` can still,
    /// rarely, be refused (Erlang's sidejob answers the same way). A caller
    /// is never refused by its own shard while that shard has room, and
    /// never by a shard whose release it has already seen (through any
    /// synchronization: a channel, a join, a permit's drop).
    Overload,
    /// A wait ran out. Either a caller waited for capacity for its full
    /// `max_wait` (or its own deadline) in a waiting room and got no unit:
    /// nothing was admitted, nothing was sent. Or
    /// [`Pool::call_timeout`](crate::Pool::call_timeout) waited its full
    /// duration without a reply: the request was admitted and may still
    /// run; its unit is released when it does.
    Timeout,
    /// The pool was shut down (or its last handle dropped) before the request
    /// was admitted, or the reply can no longer come; or the
    /// [`Limiter`](crate::Limiter::close) or
    /// [`Supervisor`](crate::Supervisor::close) was closed.
    Shutdown,
    /// The worker panicked while handling this request. The worker was
    /// rebuilt and keeps serving; the request's unit was released.
    WorkerPanicked,
    /// A child could not be started, and the unit it had been admitted on
    /// was released (or none was taken). From
    /// [`Supervisor::spawn`](crate::Supervisor::spawn): the operating system
    /// refused the thread, and this carries the OS error's kind.
    Spawn(io::ErrorKind),
    /// There is no tokio runtime to run the task on: `Supervisor::spawn_task`
    /// and its siblings (feature `tokio`) were called outside a runtime
    /// (where `tokio::spawn` would panic). Nothing was admitted; name a
    /// runtime with `spawn_task_on`.
    NoRuntime,
    /// A pool's worker called its own pool, and the only worker that could
    /// serve the call was the caller itself: waiting would never end.
    /// Nothing was admitted or counted (not a rejection in the
    /// [`Stats`](crate::Stats)).
    ///
    /// A pool never hands a waiting call (`call`, `call_timeout`,
    /// `call_async`, `call_unbounded`, `try_call`) made by its worker `k`
    /// to worker `k`: with other workers the call goes to one of them (or
    /// is refused with [`Error::Overload`] if they are all full), with a
    /// single worker it is refused with `CallingSelf`. Casts are not
    /// affected: they do not wait.
    ///
    /// Cycles the pool cannot see remain the caller's job: a worker of pool
    /// A calling pool B whose worker calls pool A, or two workers of one
    /// pool calling each other while both are busy. Use
    /// [`Pool::call_timeout`](crate::Pool::call_timeout) there.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::{Arc, OnceLock};
    /// use sidejob::{Error, Pool, WeakPool, Worker};
    ///
    /// /// Asks its own pool for something: a deadlock with one worker.
    /// struct Recursive(Arc<OnceLock<WeakPool<Recursive>>>);
    ///
    /// impl Worker for Recursive {
    ///     type Request = u32;
    ///     type Reply = Result<u32, Error>;
    ///     type Message = ();
    ///     fn handle_call(&mut self, n: u32) -> Result<u32, Error> {
    ///         if n == 0 {
    ///             return Ok(0);
    ///         }
    ///         let pool = self.0.get().and_then(WeakPool::upgrade).ok_or(Error::Shutdown)?;
    ///         pool.call(n - 1)?
    ///     }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let slot = Arc::new(OnceLock::new());
    /// let pool = {
    ///     let slot = slot.clone();
    ///     Pool::builder().capacity(4).workers(1).build(move |_| Recursive(slot.clone()))?
    /// };
    /// slot.set(pool.downgrade()).unwrap();
    /// let refused = pool.call(1)?.unwrap_err(); // answered at once, no hang
    /// assert_eq!(refused, Error::CallingSelf);
    /// assert!(refused.is_calling_self());
    /// assert_eq!(pool.stats().rejected, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    CallingSelf,
    /// The request asks for more units than the capacity in force: it could
    /// never be admitted as the capacity stands, so it is refused at once
    /// instead of waiting for room that cannot come. Nothing was admitted
    /// or counted. From [`Limiter::try_acquire_many`](crate::Limiter::try_acquire_many)
    /// and the other forms that take several units at once. Raise the
    /// capacity, or split the work.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::new(8)?;
    /// assert_eq!(limiter.try_acquire_many(9).unwrap_err(), Error::TooLarge);
    /// assert!(limiter.try_acquire_many(8).is_ok());
    /// assert_eq!(limiter.stats().rejected, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    TooLarge,
    /// The key already has as many live children as the supervisor allows
    /// per key ([`per_key`](crate::SupervisorBuilder::per_key), 1 by
    /// default): nothing was admitted and no unit of the capacity was
    /// taken. From [`Supervisor::try_reserve_keyed`](crate::Supervisor::try_reserve_keyed)
    /// and the keyed forms that do not wait. Skip the work for now (a task
    /// worker leaves the task for a later claim) or wait for the key with
    /// a waiting form.
    ///
    /// Also from a pool's keyed requests in the ordered mode
    /// ([`Pool::call_keyed`](crate::Pool::call_keyed) and its siblings):
    /// the key already has
    /// [`max_queued_per_key`](crate::PoolBuilder::max_queued_per_key)
    /// requests admitted and unfinished; the request was not sent and its
    /// unit was given back.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::new(8)?;
    /// let _first = sup.try_reserve_keyed(&"workflow-7")?;
    /// let refused = sup.try_reserve_keyed(&"workflow-7").unwrap_err();
    /// assert_eq!(refused, Error::KeyBusy);
    /// assert!(refused.is_key_busy());
    /// assert_eq!(refused.to_string(), "the key already has as many at once as it may");
    /// assert!(sup.try_reserve_keyed(&"workflow-8").is_ok()); // other keys run
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    KeyBusy,
}

impl Error {
    /// True for [`Error::Overload`].
    pub fn is_overload(&self) -> bool {
        matches!(self, Error::Overload)
    }

    /// True for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout)
    }

    /// True for [`Error::Shutdown`].
    pub fn is_shutdown(&self) -> bool {
        matches!(self, Error::Shutdown)
    }

    /// True for [`Error::WorkerPanicked`].
    pub fn is_worker_panicked(&self) -> bool {
        matches!(self, Error::WorkerPanicked)
    }

    /// True for [`Error::CallingSelf`].
    pub fn is_calling_self(&self) -> bool {
        matches!(self, Error::CallingSelf)
    }

    /// True for [`Error::TooLarge`].
    pub fn is_too_large(&self) -> bool {
        matches!(self, Error::TooLarge)
    }

    /// True for [`Error::KeyBusy`].
    pub fn is_key_busy(&self) -> bool {
        matches!(self, Error::KeyBusy)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Overload => f.write_str("overloaded: every shard is at its limit"),
            Error::Timeout => f.write_str("timed out waiting for a unit or a reply"),
            Error::Shutdown => f.write_str("shut down"),
            Error::WorkerPanicked => f.write_str("the worker panicked handling the request"),
            Error::Spawn(kind) => write!(f, "could not start the child: {kind}"),
            Error::NoRuntime => f.write_str("no tokio runtime to spawn the task on"),
            Error::CallingSelf => f.write_str("the call would wait for the calling worker itself"),
            Error::KeyBusy => f.write_str("the key already has as many at once as it may"),
            Error::TooLarge => f.write_str("the request asks for more units than the capacity"),
        }
    }
}

impl std::error::Error for Error {}

/// A value that was not admitted, handed back with the reason.
///
/// Returned by [`Pool::try_cast`](crate::Pool::try_cast), and inside
/// [`TryCallError::Refused`] by [`Pool::try_call`](crate::Pool::try_call):
/// the error is [`Error::Overload`] (every shard was full),
/// [`Error::Shutdown`] (the pool is shut down) or [`Error::CallingSelf`]
/// (a worker's call that only it could serve). Nothing was sent, so the
/// value is intact; [`into_inner`](Self::into_inner) takes it back, to
/// retry later or to answer from elsewhere.
///
/// Its `Debug` does not require `T: Debug` and never prints the value:
/// `Refused { error: Overload, .. }`. It converts into [`Error`] with `?`.
///
/// # Examples
///
/// ```
/// use sidejob::{Error, Pool, Worker};
/// # struct Sink;
/// # impl Worker for Sink {
/// #     type Request = (); type Reply = (); type Message = Vec<u8>;
/// #     fn handle_call(&mut self, _: ()) {}
/// #     fn handle_cast(&mut self, _: Vec<u8>) {}
/// # }
///
/// let pool = Pool::builder().capacity(1).build(|_| Sink)?;
/// pool.shutdown();
/// let refused = pool.try_cast(vec![1, 2, 3]).unwrap_err();
/// assert_eq!(refused.error(), Error::Shutdown);
/// assert_eq!(format!("{refused:?}"), "Refused { error: Shutdown, .. }");
/// assert_eq!(refused.into_inner(), [1, 2, 3]); // the message, back
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Refused<T> {
    error: Error,
    value: T,
}

impl<T> Refused<T> {
    pub(crate) fn new(error: Error, value: T) -> Self {
        Refused { error, value }
    }

    /// Why the value was refused.
    pub fn error(&self) -> Error {
        self.error
    }

    /// The value that was refused, unchanged.
    pub fn into_inner(self) -> T {
        self.value
    }

    /// The reason and the value.
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.value)
    }

    /// True if refused for [`Error::Overload`].
    pub fn is_overload(&self) -> bool {
        self.error.is_overload()
    }

    /// True if refused for [`Error::Shutdown`].
    pub fn is_shutdown(&self) -> bool {
        self.error.is_shutdown()
    }

    /// True if refused for [`Error::CallingSelf`].
    pub fn is_calling_self(&self) -> bool {
        self.error.is_calling_self()
    }
}

impl<T> fmt::Debug for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for Refused<T> {}

impl<T> From<Refused<T>> for Error {
    /// The reason; the value is dropped.
    fn from(refused: Refused<T>) -> Error {
        refused.error
    }
}

/// Why [`Pool::try_call`](crate::Pool::try_call) gave no reply.
///
/// Either the request was never admitted, and comes back
/// ([`TryCallError::Refused`]), or it was admitted and consumed but no
/// reply came ([`TryCallError::Failed`]). Like [`Refused`], its `Debug`
/// does not require `T: Debug`, and it converts into [`Error`] with `?`.
///
/// # Examples
///
/// ```
/// use sidejob::{Error, Pool, TryCallError, Worker};
/// # struct Echo;
/// # impl Worker for Echo {
/// #     type Request = String; type Reply = String; type Message = ();
/// #     fn handle_call(&mut self, s: String) -> String { s }
/// #     fn handle_cast(&mut self, _: ()) {}
/// # }
///
/// let pool = Pool::builder().capacity(1).build(|_| Echo)?;
/// pool.shutdown();
/// match pool.try_call("hello".to_string()) {
///     Err(TryCallError::Refused(refused)) => {
///         assert_eq!(refused.error(), Error::Shutdown);
///         assert_eq!(refused.into_inner(), "hello");
///     }
///     other => panic!("expected a refusal, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub enum TryCallError<T> {
    /// Not admitted ([`Error::Overload`], [`Error::Shutdown`] or
    /// [`Error::CallingSelf`]): the request is handed back.
    Refused(Refused<T>),
    /// Admitted, but no reply came: [`Error::WorkerPanicked`] (the handler
    /// panicked on it) or [`Error::Shutdown`] (the reply can no longer
    /// come). The request was consumed.
    Failed(Error),
}

impl<T> TryCallError<T> {
    /// Why no reply came.
    pub fn error(&self) -> Error {
        match self {
            TryCallError::Refused(refused) => refused.error(),
            TryCallError::Failed(error) => *error,
        }
    }

    /// The request, if it was refused (`None` if it was admitted).
    pub fn into_request(self) -> Option<T> {
        match self {
            TryCallError::Refused(refused) => Some(refused.into_inner()),
            TryCallError::Failed(_) => None,
        }
    }

    /// True if the request was not admitted (and so comes back).
    pub fn is_refused(&self) -> bool {
        matches!(self, TryCallError::Refused(_))
    }
}

impl<T> fmt::Debug for TryCallError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryCallError::Refused(refused) => f.debug_tuple("Refused").field(refused).finish(),
            TryCallError::Failed(error) => f.debug_tuple("Failed").field(error).finish(),
        }
    }
}

impl<T> fmt::Display for TryCallError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error(), f)
    }
}

impl<T> std::error::Error for TryCallError<T> {}

impl<T> From<Refused<T>> for TryCallError<T> {
    fn from(refused: Refused<T>) -> Self {
        TryCallError::Refused(refused)
    }
}

impl<T> From<TryCallError<T>> for Error {
    /// The reason; a refused request is dropped.
    fn from(error: TryCallError<T>) -> Error {
        error.error()
    }
}

/// Why [`PoolBuilder::build_async_init`](crate::PoolBuilder::build_async_init)
/// made no pool: a setting was refused, or a worker's init failed.
///
/// When a worker's init fails, the pool is not built: every worker
/// already made is dropped, the inits still running are cancelled, and no
/// task of the pool is left running. The error names the worker
/// ([`worker`](Self::worker)) and carries your init's error, which
/// [`source`](std::error::Error::source) also returns (so a report that
/// walks the chain, `anyhow`'s or `eyre`'s, prints both). Its `Debug`
/// needs only `E: Debug`, its `Display` nothing, and it is a
/// [`std::error::Error`] whenever `E` is one, so `?` turns it into a
/// `Box<dyn Error>`.
///
/// # Examples
///
/// ```
/// use sidejob::{AsyncWorker, BuildError, Pool};
/// # struct Conn;
/// # impl AsyncWorker for Conn {
/// #     type Request = (); type Reply = (); type Message = ();
/// #     async fn handle_call(&mut self, _: ()) {}
/// #     async fn handle_cast(&mut self, _: ()) {}
/// # }
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// let built = runtime.block_on(Pool::builder().capacity(4).workers(2).build_async_init(
///     |index| async move {
///         if index == 1 {
///             return Err(std::io::Error::other("refused"));
///         }
///         Ok(Conn)
///     },
/// ));
/// let err = built.unwrap_err();
/// assert_eq!(err.worker(), Some(1));
/// assert_eq!(err.to_string(), "worker 1 failed to start");
/// assert!(matches!(&err, BuildError::Init { error, .. } if error.to_string() == "refused"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[non_exhaustive]
pub enum BuildError<E> {
    /// A setting was refused, or there is no runtime, as
    /// [`build_async`](crate::PoolBuilder::build_async) refuses them.
    Config(ConfigError),
    /// Worker `worker`'s init answered `Err(error)` (the first worker whose
    /// init failed, in the order they failed).
    Init {
        /// The index of the worker whose init failed (`0..workers`).
        worker: usize,
        /// What the init answered.
        error: E,
    },
}

#[cfg(feature = "tokio")]
impl<E> BuildError<E> {
    /// The index of the worker whose init failed; `None` for a refused
    /// setting.
    pub fn worker(&self) -> Option<usize> {
        match self {
            BuildError::Config(_) => None,
            BuildError::Init { worker, .. } => Some(*worker),
        }
    }

    /// The init's error, if a worker's init failed.
    pub fn into_init_error(self) -> Option<E> {
        match self {
            BuildError::Config(_) => None,
            BuildError::Init { error, .. } => Some(error),
        }
    }
}

#[cfg(feature = "tokio")]
impl<E> From<ConfigError> for BuildError<E> {
    fn from(error: ConfigError) -> Self {
        BuildError::Config(error)
    }
}

#[cfg(feature = "tokio")]
impl<E: fmt::Debug> fmt::Debug for BuildError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Config(error) => f.debug_tuple("Config").field(error).finish(),
            BuildError::Init { worker, error } => f
                .debug_struct("Init")
                .field("worker", worker)
                .field("error", error)
                .finish(),
        }
    }
}

#[cfg(feature = "tokio")]
impl<E> fmt::Display for BuildError<E> {
    /// The setting, or the worker; the init's own error is the
    /// [`source`](std::error::Error::source).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Config(error) => fmt::Display::fmt(error, f),
            BuildError::Init { worker, .. } => write!(f, "worker {worker} failed to start"),
        }
    }
}

#[cfg(feature = "tokio")]
impl<E: std::error::Error + 'static> std::error::Error for BuildError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Config(error) => error.source(),
            BuildError::Init { error, .. } => Some(error),
        }
    }
}

/// The most bytes of an environment variable's value a [`ConfigError`]
/// keeps.
const ECHOED: usize = 64;

/// A builder was given a value it cannot accept.
///
/// Returned by every `build()` and `from_env` ([`LimiterBuilder`](crate::LimiterBuilder),
/// [`PoolBuilder`](crate::PoolBuilder),
/// [`SupervisorBuilder`](crate::SupervisorBuilder),
/// [`ReporterBuilder`](crate::observe::ReporterBuilder),
/// [`AlarmBuilder`](crate::observe::AlarmBuilder)) and by the `new`
/// shorthands. Its message names the field and the rule it broke;
/// [`ConfigError::field`] gives the field alone. When the value came from
/// an environment variable ([`Env`](crate::env::Env)), the message names the
/// variable and its value too, and [`variable`](ConfigError::variable)
/// and [`value`](ConfigError::value) give them.
///
/// # Examples
///
/// ```
/// use sidejob::Limiter;
///
/// let err = Limiter::builder().capacity(0).build().unwrap_err();
/// assert_eq!(err.field(), "capacity");
/// assert_eq!(err.to_string(), "invalid `capacity`: must be at least 1");
/// assert_eq!(err.variable(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    problem: Problem,
    /// The environment variable the value came from, and the value.
    from_env: Option<Box<(String, String)>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Problem {
    Missing,
    Zero,
    ZeroDuration,
    TooLarge(usize),
    TooLong(Duration),
    Nul,
    /// An empty `name`, which a metrics label cannot carry.
    Empty,
    /// A `name` whose series another live front-end of this kind exports.
    Taken {
        kind: &'static str,
        name: Box<str>,
    },
    /// A value that does not read as the setting's type: what it must be.
    Unreadable(&'static str),
    /// `null` (unlimited) where there is no unlimited: why.
    NoUnlimited(&'static str),
    /// A number outside its range (a fraction above 1, a factor below 1,
    /// a floor above a ceiling): the rule it must keep.
    OutOfRange(&'static str),
    Spawn(io::ErrorKind),
    #[cfg(feature = "tokio")]
    NoRuntime,
}

impl ConfigError {
    pub(crate) fn missing(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::Missing,
            from_env: None,
        }
    }

    pub(crate) fn zero(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::Zero,
            from_env: None,
        }
    }

    pub(crate) fn zero_duration(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::ZeroDuration,
            from_env: None,
        }
    }

    pub(crate) fn too_large(field: &'static str, max: usize) -> Self {
        ConfigError {
            field,
            problem: Problem::TooLarge(max),
            from_env: None,
        }
    }

    pub(crate) fn too_long(field: &'static str, max: Duration) -> Self {
        ConfigError {
            field,
            problem: Problem::TooLong(max),
            from_env: None,
        }
    }

    /// A front-end's name: `name`, or `"sidejob"` if unset; refused if it
    /// holds a NUL byte (thread names cannot).
    pub(crate) fn check_name(name: Option<&str>) -> Result<&str, ConfigError> {
        let name = name.unwrap_or("sidejob");
        if name.contains('\0') {
            return Err(ConfigError::nul("name"));
        }
        Ok(name)
    }

    pub(crate) fn nul(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::Nul,
            from_env: None,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn empty(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::Empty,
            from_env: None,
        }
    }

    /// Another live front-end of `kind` exports its series under `name`.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn taken(kind: &'static str, name: &str) -> Self {
        ConfigError {
            field: "name",
            problem: Problem::Taken {
                kind,
                name: name.into(),
            },
            from_env: None,
        }
    }

    /// A value that does not read as `expected` says it must.
    pub(crate) fn unreadable(field: &'static str, expected: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::Unreadable(expected),
            from_env: None,
        }
    }

    /// `null` given where the setting has no unlimited value, for `why`.
    pub(crate) fn no_unlimited(field: &'static str, why: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::NoUnlimited(why),
            from_env: None,
        }
    }

    /// A number outside its range: `rule` says what it must be ("a
    /// fraction above 0 and below 1").
    pub(crate) fn out_of_range(field: &'static str, rule: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::OutOfRange(rule),
            from_env: None,
        }
    }

    /// The same problem, with the environment variable and the value it
    /// came from: the value cut to its first [`ECHOED`] bytes (at a
    /// character boundary) and `…` when longer, so a megabyte of it is
    /// not copied into every message.
    pub(crate) fn read_from(self, variable: &str, value: &str) -> Self {
        let value = if value.len() > ECHOED {
            let mut end = ECHOED;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &value[..end])
        } else {
            value.to_string()
        };
        ConfigError {
            from_env: Some(Box::new((variable.to_string(), value))),
            ..self
        }
    }

    pub(crate) fn spawn(field: &'static str, kind: io::ErrorKind) -> Self {
        ConfigError {
            field,
            problem: Problem::Spawn(kind),
            from_env: None,
        }
    }

    /// Async workers asked for outside a tokio runtime.
    #[cfg(feature = "tokio")]
    pub(crate) fn no_runtime(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::NoRuntime,
            from_env: None,
        }
    }

    /// The same problem, reported against another field name.
    pub(crate) fn with_field(self, field: &'static str) -> Self {
        ConfigError { field, ..self }
    }

    /// The builder field that was wrong: `"capacity"`, `"shards"`,
    /// `"workers"`, `"name"`, `"spin_wait"`, `"max_capacity"`,
    /// `"max_waiters"` or `"queue_order"`; from the reporter and alarm
    /// builders also `"interval"`, `"threshold"` or `"raise_after"`;
    /// from a builder's `from_env` also `"single_thread"` or `"max_wait"`
    /// (with [`variable`](Self::variable) and [`value`](Self::value)).
    /// A reporter's `"name"` is also refused when it is empty, or when
    /// another live front-end exports its series under it.
    /// (`"workers"` also when the OS refused to
    /// start a worker thread, or an async pool was built outside a tokio
    /// runtime: the message then says so.)
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// The environment variable the value came from, when it was read by
    /// [`Env`](crate::env::Env): `Some("WORKER_REQUEST_CONCURRENCY")`.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::env::Env;
    /// use sidejob::LimiterBuilder;
    ///
    /// let env = Env::with_lookup("APP_", |var| (var == "APP_CAPACITY").then(|| "ten".to_string()));
    /// let err = LimiterBuilder::from_env(&env).unwrap_err();
    /// assert_eq!((err.field(), err.variable(), err.value()), ("capacity", Some("APP_CAPACITY"), Some("ten")));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid `capacity` from APP_CAPACITY=\"ten\": must be a whole number, or `null` for no limit"
    /// );
    /// ```
    pub fn variable(&self) -> Option<&str> {
        self.from_env
            .as_deref()
            .map(|(variable, _)| variable.as_str())
    }

    /// The value of [`variable`](Self::variable), as it was read: its
    /// first 64 bytes and `…` when it is longer.
    pub fn value(&self) -> Option<&str> {
        self.from_env.as_deref().map(|(_, value)| value.as_str())
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.field;
        // The OS and the runtime are not the field's fault: said apart.
        match self.problem {
            Problem::Spawn(kind) => {
                return write!(
                    f,
                    "cannot start the `{field}`: the OS refused a thread ({kind})"
                )
            }
            #[cfg(feature = "tokio")]
            Problem::NoRuntime => return write!(
                f,
                "cannot start the `{field}`: no tokio runtime here (build inside one, or name one with `build_async_on`)"
            ),
            _ => {}
        }
        write!(f, "invalid `{field}`")?;
        if let Some((variable, value)) = self.from_env.as_deref() {
            write!(f, " from {variable}={value:?}")?;
        }
        match &self.problem {
            Problem::Missing => write!(f, ": must be set"),
            Problem::Zero => write!(f, ": must be at least 1"),
            Problem::ZeroDuration => write!(f, ": must be longer than zero"),
            Problem::TooLarge(max) => write!(f, ": must be at most {max}"),
            // `Duration`'s Debug is the short human form: "10ms", "1.5s".
            Problem::TooLong(max) => write!(f, ": must be at most {max:?}"),
            Problem::Nul => write!(f, ": must not contain a NUL byte"),
            Problem::Empty => write!(f, ": must not be empty"),
            Problem::Taken { kind, name } => write!(
                f,
                ": another live {kind} already exports its series as {name:?} (give each its own name)"
            ),
            Problem::Unreadable(expected) => write!(f, ": must be {expected}"),
            Problem::NoUnlimited(why) => write!(f, ": cannot be `null` (unlimited): {why}"),
            Problem::OutOfRange(rule) => write!(f, ": must be {rule}"),
            Problem::Spawn(_) => Ok(()),
            #[cfg(feature = "tokio")]
            Problem::NoRuntime => Ok(()),
        }
    }
}

impl std::error::Error for ConfigError {}
