//! Every error of the crate, in one place.

use std::fmt;

use sidejob_redis::EndpointError;

/// Why a pool operation was refused or failed.
///
/// An [`EndpointError`](crate::EndpointError) converts into it (as
/// [`Error::Config`] naming `url`), so `?` works on
/// [`Endpoint::parse`](crate::Endpoint::parse) in a function that returns
/// this error.
///
/// # Examples
///
/// ```
/// use sidejob_pulse::{Endpoint, Error};
///
/// let e = Error::Full { max_queued_jobs: 1000 };
/// assert!(e.is_full());
/// assert_eq!(e.to_string(), "pool full: 1000 jobs queued");
///
/// fn endpoint(url: &str) -> Result<Endpoint, Error> {
///     Ok(Endpoint::parse(url)?.password("from-a-secret-store"))
/// }
/// assert!(endpoint("redis://127.0.0.1:6379/").is_ok());
/// let Err(Error::Config(c)) = endpoint("127.0.0.1:6379") else { panic!() };
/// assert_eq!(c.field(), "url");
/// assert!(c.to_string().contains("\"127.0.0.1:6379\": no scheme"), "{c}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// [`Node::dispatch`](crate::Node::dispatch): as many jobs as
    /// `max_queued_jobs` are waiting to start; refused at once.
    Full {
        /// The bound in force for this node.
        max_queued_jobs: usize,
    },
    /// The key is empty or longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN).
    InvalidKey,
    /// The payload is longer than [`MAX_PAYLOAD_LEN`](crate::MAX_PAYLOAD_LEN).
    InvalidPayload,
    /// [`Node::dispatch`](crate::Node::dispatch): a job with this key is
    /// already in the pool (stop it first to run it with another payload).
    Exists,
    /// [`Node::stop`](crate::Node::stop), [`Node::notify`](crate::Node::notify):
    /// no job with this key (for `notify`: none assigned to a worker).
    NotFound,
    /// The pool is shutting down ([`Node::shutdown`](crate::Node::shutdown)):
    /// no new job or worker is accepted.
    ShuttingDown,
    /// The pool has no state in Redis: Redis lost it (a restart without
    /// persistence, a failover to a replica that had not caught up) and no
    /// worker node has re-created it yet. A pool that was shut down answers
    /// [`Error::PoolShutDown`] instead. The re-created pool has a new
    /// [`Generation`](crate::Generation) (see
    /// [`Node::watch_generation`](crate::Node::watch_generation)).
    NoPool,
    /// The pool was shut down ([`Node::shutdown`](crate::Node::shutdown),
    /// by this node or another) and stays so: no dispatch, stop or notify
    /// reaches it, and no node's [`join`](crate::NodeBuilder::join)
    /// re-creates it unless it asks to with
    /// [`NodeBuilder::reopen`](crate::NodeBuilder::reopen).
    PoolShutDown,
    /// This node was closed.
    Closed,
    /// [`Node::add_worker`](crate::Node::add_worker) on a client-only node.
    ClientOnly,
    /// A graceful step (shutdown, removing a worker) did not finish within
    /// the worker shutdown TTL; `left` workers or jobs were still there.
    Timeout {
        /// Workers (or jobs, when removing one worker) not done in time.
        left: usize,
    },
    /// [`Node::dispatch`](crate::Node::dispatch) or
    /// [`Node::stop`](crate::Node::stop) with
    /// [`Durability::Replicas`](crate::Durability::Replicas): Redis' primary
    /// recorded it, but fewer replicas than asked confirmed they hold it
    /// within the timeout. It may be lost if the primary fails before they
    /// copy it; while the primary lives it stands (a dispatch of the key
    /// again answers [`Error::Exists`]).
    NotDurable {
        /// How many replicas confirmed.
        replicas_acked: usize,
        /// How many were asked for.
        replicas_asked: usize,
        /// How long they were waited for.
        within: std::time::Duration,
    },
    /// A setting was wrong.
    Config(ConfigError),
    /// Redis could not be reached or answered something unexpected.
    Redis(RedisError),
}

impl Error {
    /// Whether this is [`Error::PoolShutDown`]: the pool was shut down for
    /// good (as opposed to [`Error::NoPool`], a pool Redis lost).
    pub fn is_pool_shut_down(&self) -> bool {
        matches!(self, Error::PoolShutDown)
    }

    /// Whether this is [`Error::Full`].
    pub fn is_full(&self) -> bool {
        matches!(self, Error::Full { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Full { max_queued_jobs } => {
                write!(f, "pool full: {max_queued_jobs} jobs queued")
            }
            Error::InvalidKey => write!(
                f,
                "invalid job key: empty or longer than {} bytes",
                crate::job::MAX_KEY_LEN
            ),
            Error::InvalidPayload => write!(
                f,
                "invalid payload: longer than {} bytes",
                crate::job::MAX_PAYLOAD_LEN
            ),
            Error::Exists => f.write_str("a job with this key is already in the pool"),
            Error::NotFound => f.write_str("no job with this key in the pool"),
            Error::ShuttingDown => f.write_str("the pool is shutting down"),
            Error::NoPool => {
                f.write_str("no such pool in Redis (lost by Redis and not re-created yet)")
            }
            Error::PoolShutDown => f.write_str("the pool was shut down"),
            Error::Closed => f.write_str("this node is closed"),
            Error::ClientOnly => f.write_str("a client-only node hosts no workers"),
            Error::Timeout { left } => {
                write!(f, "not done within the worker shutdown TTL ({left} left)")
            }
            Error::NotDurable {
                replicas_acked,
                replicas_asked,
                within,
            } => write!(
                f,
                "not durable: recorded on the primary, but {replicas_acked} of the {replicas_asked} replicas asked for confirmed it within {within:?} (it may be lost if the primary fails now)"
            ),
            Error::Config(e) => e.fmt(f),
            Error::Redis(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

impl From<RedisError> for Error {
    fn from(e: RedisError) -> Self {
        Error::Redis(e)
    }
}

impl From<EndpointError> for Error {
    /// A bad Redis URL or CA file: [`Error::Config`] naming `url`.
    fn from(e: EndpointError) -> Self {
        Error::Config(e.into())
    }
}

impl From<EndpointError> for ConfigError {
    /// Names the field `url`; the text is the endpoint error's (the input
    /// with every secret redacted, and the reason).
    fn from(e: EndpointError) -> Self {
        ConfigError::new("url", e.to_string())
    }
}

/// Redis failed: unreachable, refused the login, or answered something
/// unexpected. The text names the endpoint without its password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisError(pub(crate) String);

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedisError {}

/// A node setting that was missing or broke a rule; names the field.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob_pulse::{Error, Node};
///
/// let err = Node::builder().name("tenants").url("redis://127.0.0.1:1/")
///     .worker_ttl(Duration::from_millis(10))
///     .join().unwrap_err();
/// let Error::Config(c) = err else { panic!("{err}") };
/// assert_eq!(c.field(), "worker_ttl");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    problem: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, problem: impl Into<String>) -> Self {
        ConfigError {
            field,
            problem: problem.into(),
        }
    }

    /// The setting that was wrong: `"name"`, `"url"`, `"worker_ttl"`,
    /// `"pending_job_ttl"`, `"worker_shutdown_ttl"`, `"max_queued_jobs"`,
    /// `"max_jobs"`, `"job_sink_block"` or `"durability"`.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.problem)
    }
}

impl std::error::Error for ConfigError {}
