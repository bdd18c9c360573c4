//! The [`Handler`] trait: what one shepherd worker does with one attempt of
//! an operation, and how it recovers from a failed one.

/// What a [`Handler`] wants done with itself after a failed attempt.
///
/// # Examples
///
/// ```
/// use sidejob::shepherd::Recovery;
/// assert_ne!(Recovery::Keep, Recovery::Rebuild);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Recovery {
    /// Keep serving with this value (after any reset the handler did
    /// itself in [`Handler::recover`]: a state reset).
    #[default]
    Keep,
    /// Drop this value and build a fresh one with the factory (a full
    /// restart): a broken connection, a poisoned cache.
    Rebuild,
}

/// The worker of a [`Shepherd`](crate::shepherd::Shepherd): owns one limited resource
/// (a database connection, a CPU) and handles one operation at a time,
/// returning `Ok` or an error the shepherd may retry.
///
/// A shepherd runs one handler per worker thread, built by the factory
/// given to [`ShepherdBuilder::build`](crate::shepherd::ShepherdBuilder::build), so
/// `handle` takes `&mut self` and needs no lock. Operations must be
/// independent and idempotent: an attempt may be
/// repeated after a failure, a panic or a timeout, so `handle` sees the
/// operation by reference and the attempt number (1 for the first).
///
/// After an attempt returns `Err`, the shepherd asks
/// [`is_retryable`](Self::is_retryable) whether another attempt may help
/// and [`recover`](Self::recover) whether this worker should be rebuilt. A
/// panic always rebuilds the worker, and is retried if the
/// [`RetryPolicy`](crate::shepherd::RetryPolicy) says so (by default it is).
///
/// # Examples
///
/// ```
/// use sidejob::shepherd::{Handler, Recovery};
///
/// /// A client over one connection; the connection may break.
/// struct Client { connected: bool }
///
/// #[derive(Debug)]
/// enum DbError { Broken, NotFound }
///
/// impl Handler for Client {
///     type Op = String; // a key
///     type Output = u64;
///     type Error = DbError;
///
///     fn handle(&mut self, key: &String, _attempt: u32) -> Result<u64, DbError> {
///         if !self.connected {
///             return Err(DbError::Broken);
///         }
///         if key.is_empty() { Err(DbError::NotFound) } else { Ok(key.len() as u64) }
///     }
///
///     fn is_retryable(&self, error: &DbError) -> bool {
///         matches!(error, DbError::Broken) // NotFound will not change
///     }
///
///     fn recover(&mut self, error: &DbError) -> Recovery {
///         match error {
///             DbError::Broken => Recovery::Rebuild, // a fresh connection
///             DbError::NotFound => Recovery::Keep,
///         }
///     }
/// }
///
/// let mut client = Client { connected: true };
/// assert_eq!(client.handle(&"key".to_string(), 1).unwrap(), 3);
/// assert!(!client.is_retryable(&DbError::NotFound));
/// ```
pub trait Handler: Send + 'static {
    /// One operation. Shared between attempts (and with a late attempt
    /// still running past its timeout), hence `Sync`.
    type Op: Send + Sync + 'static;
    /// What a successful attempt returns to the caller.
    type Output: Send + 'static;
    /// What a failed attempt returns; the last one reaches the caller in a
    /// [`Failure`](crate::shepherd::Failure).
    type Error: Send + 'static;

    /// Makes one attempt at `op`; `attempt` counts from 1.
    fn handle(&mut self, op: &Self::Op, attempt: u32) -> Result<Self::Output, Self::Error>;

    /// Whether `error` may go away on another attempt. `true` by default:
    /// every error is retried (as the policy allows).
    fn is_retryable(&self, error: &Self::Error) -> bool {
        let _ = error;
        true
    }

    /// Called after an attempt returned `error`, before the next operation:
    /// reset what needs resetting, or ask to be rebuilt. [`Recovery::Keep`]
    /// by default. A panic here is caught and rebuilds the worker.
    fn recover(&mut self, error: &Self::Error) -> Recovery {
        let _ = error;
        Recovery::Keep
    }

    /// Runs once when the shepherd shuts down, after the worker's last
    /// attempt. A panic here is caught.
    fn terminate(&mut self) {}
}
