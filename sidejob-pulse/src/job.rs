//! What a worker runs and what it hands the user's code: the [`Handler`]
//! trait, the [`Job`] it starts, the [`StopReason`] it stops one for, the
//! fencing [`Token`] every assignment carries, and the limits on a job's
//! key and payload.

use std::fmt;

/// The longest job key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// The longest payload (of a job or a notification), in bytes.
pub const MAX_PAYLOAD_LEN: usize = 1 << 20;

/// A fencing token: every assignment of a key to a worker gets a larger
/// one than any before it, across the whole pool and across a loss of
/// Redis' state (it is at least Redis' clock in microseconds). A resource
/// that remembers the largest token it has seen for a key and refuses
/// smaller ones cannot be written by a worker that lost the key, even one
/// that was frozen (SIGSTOP, a VM pause) through the hand-over.
///
/// # Examples
///
/// ```
/// use sidejob_pulse::Token;
///
/// // What a fenced resource does with each write.
/// fn accept(highest: &mut Option<Token>, t: Token) -> bool {
///     if highest.is_some_and(|h| t < h) { return false; }
///     *highest = Some(t);
///     true
/// }
/// let (old, new) = (Token::from_raw(7), Token::from_raw(9));
/// let mut seen = None;
/// assert!(accept(&mut seen, new));
/// assert!(!accept(&mut seen, old), "the stale owner is fenced off");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(u64);

impl Token {
    /// The token's value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// A token from its value (as stored by a resource).
    pub fn from_raw(v: u64) -> Token {
        Token(v)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A job given to [`Handler::start`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Job {
    /// The job's key.
    pub key: String,
    /// The payload it was dispatched with.
    pub payload: Vec<u8>,
    /// This assignment's fencing token.
    pub token: Token,
}

/// Why [`Handler::stop`] is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// [`Node::stop`](crate::Node::stop) was called for the key.
    Requested,
    /// The membership changed (a worker joined, or this one is being
    /// removed or closed) and another worker owns the key now; it starts
    /// the job after this stop returns.
    Moved,
    /// This worker's lease ran out on its own clock (Redis unreachable, or
    /// the process was frozen): the key may be given to another worker, so
    /// the job stops now. If the process was frozen past the lease, the
    /// new owner may already run it: only the token fences writes then.
    /// If Redis lost the pool's state meanwhile, the worker hands the job
    /// back when its node rejoins the re-created pool, and the key's owner
    /// then starts it again under a larger token.
    LeaseLost,
    /// After Redis lost its state, another worker asserted the key with a
    /// newer token.
    Superseded,
    /// [`Node::shutdown`](crate::Node::shutdown).
    Shutdown,
}

/// What a worker runs: the user's jobs, started and stopped by key.
///
/// `start` should return promptly (spawn the job's work, or hand it to a
/// task): a worker calls its handler from one thread, and a call longer
/// than the lease's margin (a tenth of the worker TTL) can delay a
/// lease-lost stop past the moment another worker may start the job. A
/// panic in a handler call is caught and the job is treated as started
/// (for `start`) or stopped (for `stop`).
///
/// # Examples
///
/// ```
/// use std::collections::HashMap;
/// use sidejob_pulse::{Handler, Job, StopReason, Token};
///
/// /// One background task per tenant.
/// #[derive(Default)]
/// struct Tenants { running: HashMap<String, Token> }
///
/// impl Handler for Tenants {
///     fn start(&mut self, job: Job) {
///         self.running.insert(job.key, job.token); // spawn the tenant's task here
///     }
///     fn stop(&mut self, key: &str, _token: Token, _why: StopReason) {
///         self.running.remove(key);
///     }
///     fn notify(&mut self, key: &str, _token: Token, payload: &[u8]) {
///         assert!(self.running.contains_key(key), "{payload:?}");
///     }
/// }
/// let mut h = Tenants::default();
/// h.start(Job::for_test("t1", b"cfg", Token::from_raw(1)));
/// h.stop("t1", Token::from_raw(1), StopReason::Requested);
/// assert!(h.running.is_empty());
/// ```
pub trait Handler: Send + 'static {
    /// Starts job `job.key`; the worker holds it until `stop`.
    fn start(&mut self, job: Job);
    /// Stops job `key` (started under `token`), and returns only once it
    /// has stopped.
    ///
    /// # Contract
    ///
    /// * **Do not return until the job has stopped**: once `stop` returns,
    ///   nothing of the job runs and it writes nothing more. The worker
    ///   tells Redis the job stopped when `stop` returns, and from then on
    ///   another worker may start it ([`StopReason::Moved`], or a new
    ///   dispatch after [`StopReason::Requested`]): a job still running
    ///   then runs twice. So signal the job's thread or task to stop, and
    ///   join it (as the example below does).
    /// * **Within the lease margin**: on [`StopReason::LeaseLost`] the worker
    ///   calls `stop` for each of its jobs, one after another, when its
    ///   lease has run out on its own clock, a margin (a tenth of the worker
    ///   TTL) before Redis may give the keys to other workers. The stops
    ///   of all its jobs together must finish within that margin, or a new
    ///   owner may start a job while this one still runs it; only the
    ///   fencing [`Token`] then keeps the old run's writes out. Other
    ///   reasons have no such deadline, but the worker's thread waits in
    ///   `stop` and starts nothing meanwhile.
    /// * A panic in `stop` is caught and the job is taken as stopped: a
    ///   handler that can panic must have stopped the job first.
    ///
    /// # Examples
    ///
    /// A long-running job on its own thread, cancelled and joined:
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::{mpsc, Arc};
    /// use std::thread::JoinHandle;
    /// use std::time::Duration;
    /// use sidejob_pulse::{Handler, Job, StopReason, Token};
    ///
    /// #[derive(Default)]
    /// struct Tenants {
    ///     running: HashMap<String, (mpsc::Sender<()>, JoinHandle<()>)>,
    ///     finished: Arc<AtomicUsize>,
    /// }
    ///
    /// impl Handler for Tenants {
    ///     fn start(&mut self, job: Job) {
    ///         let (cancel, cancelled) = mpsc::channel::<()>();
    ///         let finished = self.finished.clone();
    ///         let worker = std::thread::spawn(move || {
    ///             // The tenant's work, a step at a time (each write fenced
    ///             // with job.token), until it is cancelled.
    ///             while let Err(mpsc::RecvTimeoutError::Timeout) =
    ///                 cancelled.recv_timeout(Duration::from_millis(1))
    ///             {}
    ///             finished.fetch_add(1, Ordering::SeqCst);
    ///         });
    ///         self.running.insert(job.key, (cancel, worker));
    ///     }
    ///
    ///     fn stop(&mut self, key: &str, _token: Token, _why: StopReason) {
    ///         if let Some((cancel, worker)) = self.running.remove(key) {
    ///             let _ = cancel.send(()); // ask the job to stop,
    ///             let _ = worker.join(); // and return only once it has
    ///         }
    ///     }
    /// }
    ///
    /// let mut h = Tenants::default();
    /// h.start(Job::for_test("t1", b"cfg", Token::from_raw(1)));
    /// h.stop("t1", Token::from_raw(1), StopReason::Moved);
    /// // When `stop` returned, the job's thread had ended.
    /// assert_eq!(h.finished.load(Ordering::SeqCst), 1);
    /// assert!(h.running.is_empty());
    /// ```
    ///
    /// With tokio, the same shape: keep a `CancellationToken` (or a
    /// oneshot sender) and the task's `JoinHandle`; in `stop`, cancel,
    /// then block on the handle (`runtime_handle.block_on(handle)`; the
    /// worker's thread is not a runtime thread).
    fn stop(&mut self, key: &str, token: Token, why: StopReason);
    /// A notification for job `key` ([`Node::notify`](crate::Node::notify)).
    fn notify(&mut self, key: &str, token: Token, payload: &[u8]) {
        let _ = (key, token, payload);
    }
}

impl Job {
    /// A job as the worker would hand it, for testing handlers.
    pub fn for_test(key: &str, payload: &[u8], token: Token) -> Job {
        Job {
            key: key.into(),
            payload: payload.into(),
            token,
        }
    }
}
