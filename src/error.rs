//! Every error the crate returns: [`Error`] from admission and requests,
//! [`ConfigError`] from builders.

use std::fmt;
use std::io;

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
    /// [`Pool::call_timeout`](crate::Pool::call_timeout) waited its full
    /// duration without a reply. The request was admitted and may still run;
    /// its unit is released when it does.
    Timeout,
    /// The pool was shut down (or its last handle dropped) before the request
    /// was admitted, or the reply can no longer come.
    Shutdown,
    /// The worker panicked while handling this request. The worker was
    /// rebuilt and keeps serving; the request's unit was released.
    WorkerPanicked,
    /// A child could not be started, and the unit it had been admitted on
    /// was released (or none was taken). From
    /// [`Supervisor::spawn`](crate::Supervisor::spawn): the operating system
    /// refused the thread, and this carries the OS error's kind. From
    /// `Supervisor::spawn_task` (feature `tokio`): there is no current tokio
    /// runtime, [`io::ErrorKind::NotFound`].
    Spawn(io::ErrorKind),
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
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Overload => f.write_str("overloaded: every shard is at its limit"),
            Error::Timeout => f.write_str("timed out waiting for the reply"),
            Error::Shutdown => f.write_str("shut down"),
            Error::WorkerPanicked => f.write_str("the worker panicked handling the request"),
            Error::Spawn(kind) => write!(f, "could not start the child: {kind}"),
        }
    }
}

impl std::error::Error for Error {}

/// A builder was given a value it cannot accept.
///
/// Returned by every `build()` ([`LimiterBuilder`](crate::LimiterBuilder),
/// [`PoolBuilder`](crate::PoolBuilder),
/// [`SupervisorBuilder`](crate::SupervisorBuilder),
/// [`ReporterBuilder`](crate::ReporterBuilder),
/// [`AlarmBuilder`](crate::AlarmBuilder)) and by the `new`
/// shorthands. Its message names the field and the rule it broke;
/// [`ConfigError::field`] gives the field alone.
///
/// # Examples
///
/// ```
/// use sidejob::Limiter;
///
/// let err = Limiter::builder().capacity(0).build().unwrap_err();
/// assert_eq!(err.field(), "capacity");
/// assert_eq!(err.to_string(), "invalid `capacity`: must be at least 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    problem: Problem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Problem {
    Missing,
    Zero,
    ZeroDuration,
    TooLarge(usize),
    Nul,
    Spawn(io::ErrorKind),
}

impl ConfigError {
    pub(crate) fn missing(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::Missing,
        }
    }

    pub(crate) fn zero(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::Zero,
        }
    }

    pub(crate) fn zero_duration(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::ZeroDuration,
        }
    }

    pub(crate) fn too_large(field: &'static str, max: usize) -> Self {
        ConfigError {
            field,
            problem: Problem::TooLarge(max),
        }
    }

    pub(crate) fn nul(field: &'static str) -> Self {
        ConfigError {
            field,
            problem: Problem::Nul,
        }
    }

    pub(crate) fn spawn(field: &'static str, kind: io::ErrorKind) -> Self {
        ConfigError {
            field,
            problem: Problem::Spawn(kind),
        }
    }

    /// The same problem, reported against another field name.
    pub(crate) fn with_field(self, field: &'static str) -> Self {
        ConfigError { field, ..self }
    }

    /// The builder field that was wrong: `"capacity"`, `"shards"`,
    /// `"workers"` or `"name"`; from the reporter and alarm builders also
    /// `"interval"`, `"threshold"` or `"raise_after"`. (`"workers"` also when the OS refused to
    /// start a worker thread: the message then says so.)
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.field;
        match self.problem {
            Problem::Missing => write!(f, "invalid `{field}`: must be set"),
            Problem::Zero => write!(f, "invalid `{field}`: must be at least 1"),
            Problem::ZeroDuration => write!(f, "invalid `{field}`: must be longer than zero"),
            Problem::TooLarge(max) => write!(f, "invalid `{field}`: must be at most {max}"),
            Problem::Nul => write!(f, "invalid `{field}`: must not contain a NUL byte"),
            Problem::Spawn(kind) => write!(
                f,
                "cannot start the `{field}`: the OS refused a thread ({kind})"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}
