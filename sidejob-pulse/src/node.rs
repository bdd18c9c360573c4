//! A node: one process's handle on a pool. It dispatches, stops and
//! notifies jobs, hosts workers, and (unless client-only) runs the keeper
//! thread that renews its workers' leases and places orphaned jobs.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use sidejob_redis::{escape_name, Endpoint, EndpointError};

use crate::durability::Durability;
use crate::error::{ConfigError, Error, RedisError};
use crate::generation::Generation;
use crate::job::{Handler, MAX_KEY_LEN, MAX_PAYLOAD_LEN};
use crate::route::route;
use crate::shared::{
    deadline_after, lock, random_id, thread_name, NodeState, Options, Shared, View, WorkerCell,
    CLOCK_RATE_MARGIN, MAX_LONG_WAIT,
};
use crate::store::{ms, now, num, slots_from, text, Arg, Conn, Scripts, Tag};
use crate::worker::{self, Worker};

/// The longest worker TTL: after Redis loses its state (or on a Redis up
/// for less than `ttl + grace`) no job starts for `ttl + grace`, so a TTL
/// of years would start none at all.
const MAX_WORKER_TTL: Duration = Duration::from_secs(3600);
/// Where a pool stands, as [`Node::pool_state`] reads it from Redis.
///
/// # Examples
///
/// ```no_run
/// use sidejob_pulse::{Node, PoolState};
///
/// let node = Node::builder().name("tenants").url("redis://127.0.0.1:6379/").join()?;
/// assert_eq!(node.pool_state()?, PoolState::Open);
/// node.shutdown()?;
/// assert_eq!(node.pool_state()?, PoolState::ShutDown);
/// # Ok::<(), sidejob_pulse::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolState {
    /// Running: jobs are accepted.
    Open,
    /// [`Node::shutdown`] has begun: new jobs are refused, workers stop.
    ShuttingDown,
    /// Shut down, and it stays so ([`Error::PoolShutDown`]) until a node
    /// joins with [`NodeBuilder::reopen`].
    ShutDown,
    /// Not in Redis, and not shut down: Redis lost its state
    /// ([`Error::NoPool`]); the next worker node's heartbeat re-creates it.
    Missing,
}

/// Configures a [`Node`]; made by [`Node::builder`].
///
/// The defaults are the Pulse design's: worker TTL 10 s, pending-job TTL 20 s,
/// worker shutdown TTL 2 min, 1,000 queued jobs at most.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use sidejob_pulse::Node;
///
/// let node = Node::builder()
///     .name("tenants")
///     .url("redis://127.0.0.1:6379/")
///     .worker_ttl(Duration::from_secs(5))
///     .max_queued_jobs(10_000)
///     .join()?;
/// # Ok::<(), sidejob_pulse::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    name: Option<String>,
    endpoint: Option<Result<Endpoint, EndpointError>>,
    worker_ttl: Duration,
    pending_job_ttl: Duration,
    worker_shutdown_ttl: Duration,
    max_queued_jobs: usize,
    client_only: bool,
    job_sink_block: Duration,
    reopen: bool,
    assume_fresh_redis: bool,
    durability: Durability,
}

impl Default for NodeBuilder {
    fn default() -> Self {
        NodeBuilder {
            name: None,
            endpoint: None,
            worker_ttl: Duration::from_secs(10),
            pending_job_ttl: Duration::from_secs(20),
            worker_shutdown_ttl: Duration::from_secs(120),
            max_queued_jobs: 1000,
            client_only: false,
            job_sink_block: Duration::from_secs(5),
            reopen: false,
            assume_fresh_redis: false,
            durability: Durability::Primary,
        }
    }
}

impl NodeBuilder {
    /// The pool's name, shared by every node of the pool. Required,
    /// non-empty, any characters: it is escaped into the keys' prefix
    /// `{sjp:<name>}:` so that no name reaches another pool's keys.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// The Redis URL (`redis://[user[:password]@]host:port/db`, `rediss://`
    /// with the `tls` feature, `unix:///path`). A URL that does not parse
    /// is reported by [`join`](Self::join) as [`Error::Config`] naming
    /// `url`: the input with every secret redacted, and the reason.
    pub fn url(&mut self, url: impl AsRef<str>) -> &mut Self {
        self.endpoint = Some(Endpoint::parse(url.as_ref()));
        self
    }

    /// The Redis with its login and TLS settings; replaces
    /// [`url`](Self::url).
    pub fn endpoint(&mut self, endpoint: Endpoint) -> &mut Self {
        self.endpoint = Some(Ok(endpoint));
        self
    }

    /// Longest time between two heartbeats of a worker before Redis removes
    /// it and its jobs go to other workers (10 s). At least 100 ms, at most
    /// 1 h: after Redis loses its state, and on a pool created on a Redis
    /// up for less than TTL + grace, no job starts for TTL + grace. A
    /// worker that cannot renew stops its jobs a margin (a tenth of it)
    /// before that, on its own clock; Redis removes it a grace (another
    /// tenth) after it. Heartbeats go every fifth of it.
    ///
    /// Every node of a pool must use the same value, the one the pool was
    /// created with: after Redis loses its state, the pool's learning mode
    /// lasts the TTL and grace of the node that re-creates it, and must
    /// outlast every worker's lease. [`join`](Self::join) refuses another
    /// value with [`Error::Config`] naming `worker_ttl` (client-only nodes
    /// too: they may re-create a lost pool).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sidejob_pulse::{Error, Node};
    ///
    /// let url = "redis://127.0.0.1:6379/";
    /// let _a = Node::builder().name("t").url(url).worker_ttl(Duration::from_secs(5)).join()?;
    /// let b = Node::builder().name("t").url(url).worker_ttl(Duration::from_secs(9)).join();
    /// let Err(Error::Config(c)) = b else { panic!("{b:?}") };
    /// assert_eq!(c.field(), "worker_ttl");
    /// # Ok::<(), Error>(())
    /// ```
    pub fn worker_ttl(&mut self, ttl: Duration) -> &mut Self {
        self.worker_ttl = ttl;
        self
    }

    /// Longest time a job may stay assigned and not started before it is
    /// assigned again, to the worker that owns its key then (20 s). At
    /// least 10 ms, at most 24 h.
    ///
    /// Like the [worker TTL](Self::worker_ttl), a timing of the pool: fixed
    /// when the pool is created (and re-created after Redis loses it), and
    /// [`join`](Self::join) refuses another value with [`Error::Config`]
    /// naming `pending_job_ttl` (client-only nodes too: their dispatches
    /// set the deadline). Every node of a pool sets the same timings.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sidejob_pulse::{Error, Node};
    ///
    /// let url = "redis://127.0.0.1:6379/";
    /// let join = |pending| Node::builder().name("t").url(url).pending_job_ttl(pending).join();
    /// let _a = join(Duration::from_secs(20))?;
    /// let Err(Error::Config(c)) = join(Duration::from_secs(5)) else { panic!() };
    /// assert_eq!(c.field(), "pending_job_ttl");
    /// # Ok::<(), Error>(())
    /// ```
    pub fn pending_job_ttl(&mut self, ttl: Duration) -> &mut Self {
        self.pending_job_ttl = ttl;
        self
    }

    /// Longest wait for workers to stop gracefully (2 min): in
    /// [`Node::shutdown`], [`Worker::remove`] and [`Node::close`]. Above
    /// zero, at most 24 h.
    pub fn worker_shutdown_ttl(&mut self, ttl: Duration) -> &mut Self {
        self.worker_shutdown_ttl = ttl;
        self
    }

    /// Jobs queued in the pool past which [`Node::dispatch`] answers
    /// [`Error::Full`] (1,000). Queued means not yet claimed by a worker:
    /// dispatched or orphaned and not started, including a key dispatched
    /// again while its previous run is still stopping (it counts from the
    /// acknowledgement, not from when the stop completes). The bound is the
    /// pool's count in Redis, checked by every dispatch in the same script
    /// that records the job, so it is exact across nodes.
    pub fn max_queued_jobs(&mut self, max: usize) -> &mut Self {
        self.max_queued_jobs = max;
        self
    }

    /// Re-create the pool if it was shut down (false). A shut-down pool
    /// stays shut: without this, [`join`](Self::join) answers
    /// [`Error::PoolShutDown`] and creates nothing, so that no node started
    /// late (or restarted by a supervisor) brings a pool back that was
    /// shut down on purpose. With it, the join removes the shutdown's mark
    /// and creates the pool afresh: do it from one place (a deploy step),
    /// not from every node.
    ///
    /// ```no_run
    /// use sidejob_pulse::{Error, Node};
    ///
    /// let url = "redis://127.0.0.1:6379/";
    /// Node::builder().name("tenants").url(url).join()?.shutdown()?;
    /// let again = Node::builder().name("tenants").url(url).join();
    /// assert_eq!(again.unwrap_err(), Error::PoolShutDown);
    /// let node = Node::builder().name("tenants").url(url).reopen(true).join()?;
    /// # Ok::<(), Error>(())
    /// ```
    pub fn reopen(&mut self, yes: bool) -> &mut Self {
        self.reopen = yes;
        self
    }

    /// Skip the start-up learning mode when this node's
    /// [`join`](Self::join) creates the pool on a young Redis (false).
    ///
    /// A pool created on a Redis up for less than the worker TTL and grace
    /// learns for that long from Redis' start ([`Node::learning_remaining`]
    /// says how long is left): no job starts meanwhile, because nothing
    /// tells a new Redis from one that restarted empty and lost a pool
    /// whose workers still run their jobs. A deployment that starts Redis
    /// and the pool together, and knows no pool of this name lived on it
    /// before, can say so here: jobs then start at once.
    ///
    /// **The risk.** If the Redis in fact restarted empty (or failed over
    /// to a replica that had not seen the pool) while workers of another
    /// node still held their leases, a job they run may start a second
    /// time elsewhere, each run under its own [`Token`](crate::Token):
    /// only a resource fenced by the token keeps the old run's writes out.
    /// So set it from the step that starts a new Redis, not on every node
    /// (a node restarted later by a supervisor would carry it to a Redis
    /// that may have lost its state). It applies only when this join
    /// creates the pool; a pool already there, a pool re-created later by
    /// a heartbeat, and the learning after Redis restarts or fails over
    /// under a pool (a new `run_id`) are not affected.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sidejob_pulse::Node;
    ///
    /// // A test fixture that has just started its own Redis.
    /// let node = Node::builder()
    ///     .name("tenants")
    ///     .url("redis://127.0.0.1:6379/")
    ///     .assume_fresh_redis(true)
    ///     .join()?;
    /// assert_eq!(node.learning_remaining()?, Duration::ZERO);
    /// # Ok::<(), sidejob_pulse::Error>(())
    /// ```
    pub fn assume_fresh_redis(&mut self, yes: bool) -> &mut Self {
        self.assume_fresh_redis = yes;
        self
    }

    /// What this node's [`dispatch`](Node::dispatch) and
    /// [`stop`](Node::stop) wait for before they are acknowledged
    /// ([`Durability::Primary`]: the primary holds it in memory). See
    /// [`Durability`] for what each choice survives.
    ///
    /// [`join`](Self::join) answers [`Error::Config`] naming `durability`
    /// for `Replicas` with no replica or a timeout of zero or above a
    /// minute, and for `Fsync` on a Redis without `appendonly yes` and
    /// `appendfsync always` (the message names the setting).
    ///
    /// ```no_run
    /// use sidejob_pulse::{Durability, Error, Node};
    ///
    /// let join = Node::builder()
    ///     .name("tenants")
    ///     .url("redis://127.0.0.1:6379/") // appendfsync everysec
    ///     .durability(Durability::Fsync)
    ///     .join();
    /// let Err(Error::Config(c)) = join else { panic!("{join:?}") };
    /// assert_eq!(c.field(), "durability");
    /// assert!(c.to_string().contains("appendfsync"), "{c}");
    /// # Ok::<(), Error>(())
    /// ```
    pub fn durability(&mut self, durability: Durability) -> &mut Self {
        self.durability = durability;
        self
    }

    /// A node that only dispatches: no keeper thread, no workers.
    pub fn client_only(&mut self, yes: bool) -> &mut Self {
        self.client_only = yes;
        self
    }

    /// Longest blocking read of a worker's mailbox (5 s; it is also cut
    /// short by the heartbeat period, so any value above it means the
    /// period). At least 1 ms. Shorter makes removal and close of idle
    /// workers quicker.
    pub fn job_sink_block(&mut self, block: Duration) -> &mut Self {
        self.job_sink_block = block;
        self
    }

    fn options(&self) -> Result<Options, ConfigError> {
        let ttl = self.worker_ttl;
        if !(Duration::from_millis(100)..=MAX_WORKER_TTL).contains(&ttl) {
            return Err(ConfigError::new(
                "worker_ttl",
                format!(
                    "must be at least 100 ms and at most 1 h (after Redis loses its state no job starts for the TTL and a tenth), not {ttl:?}"
                ),
            ));
        }
        if !(Duration::from_millis(10)..=MAX_LONG_WAIT).contains(&self.pending_job_ttl) {
            return Err(ConfigError::new(
                "pending_job_ttl",
                format!(
                    "must be at least 10 ms and at most 24 h, not {:?}",
                    self.pending_job_ttl
                ),
            ));
        }
        if self.worker_shutdown_ttl.is_zero() || self.worker_shutdown_ttl > MAX_LONG_WAIT {
            return Err(ConfigError::new(
                "worker_shutdown_ttl",
                format!(
                    "must be above zero and at most 24 h, not {:?}",
                    self.worker_shutdown_ttl
                ),
            ));
        }
        if self.max_queued_jobs == 0 {
            return Err(ConfigError::new("max_queued_jobs", "must be at least 1"));
        }
        if self.job_sink_block < Duration::from_millis(1) {
            return Err(ConfigError::new("job_sink_block", "must be at least 1 ms"));
        }
        self.durability.check()?;
        let heartbeat_every = ttl / 5;
        Ok(Options {
            worker_ttl: ttl,
            pending_job_ttl: self.pending_job_ttl,
            worker_shutdown_ttl: self.worker_shutdown_ttl,
            max_queued_jobs: self.max_queued_jobs,
            client_only: self.client_only,
            job_sink_block: self.job_sink_block.min(heartbeat_every),
            heartbeat_every,
            grace: ttl / 10,
            stop_margin: ttl / 10,
            io_timeout: (heartbeat_every / 2).min(Duration::from_secs(1)),
            durability: self.durability,
        })
    }

    /// Joins the pool (creating it in Redis if missing) and, unless
    /// client-only, starts the keeper thread.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the setting (`worker_ttl` or
    /// `pending_job_ttl` if the pool was created with another; `grace` if
    /// it was created with another grace, by a version of this crate that
    /// derives it otherwise); [`Error::PoolShutDown`] if the pool was shut
    /// down (see [`reopen`](Self::reopen)); [`Error::Redis`] if Redis
    /// cannot be reached or refuses the login.
    pub fn join(&self) -> Result<Node, Error> {
        let name = self
            .name
            .clone()
            .ok_or_else(|| ConfigError::new("name", "required"))?;
        if name.is_empty() {
            return Err(ConfigError::new("name", "must be non-empty").into());
        }
        let endpoint = match &self.endpoint {
            None => return Err(ConfigError::new("url", "required").into()),
            Some(Err(e)) => return Err(e.clone().into()),
            Some(Ok(e)) => e.clone(),
        };
        let opts = self.options()?;
        // The node's own calls (dispatch, stop, notify, shutdown) hold no
        // lease, so they may wait longer than a worker's (a TLS handshake
        // on a busy machine): at least a second.
        let mut conn = Conn::new(&endpoint, opts.io_timeout.max(Duration::from_secs(1)))?;
        if opts.durability == Durability::Fsync {
            if let Some(problem) = conn.fsync_problem()? {
                return Err(ConfigError::new("durability", problem).into());
            }
            conn.require_fsync();
        }
        let scripts = Scripts::new();
        let prefix = format!("{{sjp:{}}}:", escape_name(&name));
        let epoch = random_id();
        let a = conn.run(
            &scripts.join,
            &prefix,
            &[
                Arg::N(ms(opts.worker_ttl)),
                Arg::N(ms(opts.grace)),
                Arg::S(&epoch),
                Arg::N(u64::from(self.reopen)),
                Arg::N(u64::from(self.assume_fresh_redis)),
                Arg::N(ms(opts.pending_job_ttl)),
            ],
        )?;
        if a.first().map(num) == Some(3) {
            return Err(Error::PoolShutDown);
        }
        // The pool's timings live in the pool: a node with another worker
        // TTL, grace or pending-job TTL is refused rather than joining
        // silently (a 0: a pool created before that timing was recorded).
        // After a state loss the node that re-creates the pool sets its
        // learning mode from its own TTL and grace, which must outlast
        // every worker's lease, and every heartbeat reaps with its
        // caller's grace: with values that differ, jobs could start while
        // a longer lease still runs. The pending-job TTL is no such
        // danger, but the same rule holds for it: each node's dispatches
        // and hand-overs would otherwise give jobs different deadlines in
        // one pool. (Adopting the pool's values instead would hide a
        // misconfiguration and change a node's timings under it.)
        let timings = [
            ("worker_ttl", "worker TTL", opts.worker_ttl),
            ("grace", "grace (a tenth of the worker TTL)", opts.grace),
            ("pending_job_ttl", "pending-job TTL", opts.pending_job_ttl),
        ];
        for (i, (field, what, ours)) in timings.into_iter().enumerate() {
            let pool = a.get(4 + i).map(num).unwrap_or(0);
            if pool != 0 && pool != ms(ours) {
                return Err(ConfigError::new(
                    field,
                    format!(
                        "the pool runs with a {what} of {:?}, this node asked for {ours:?}: every node of a pool must use the pool's",
                        Duration::from_millis(pool),
                    ),
                )
                .into());
            }
        }
        let view = View {
            shut: a.first().map(num).unwrap_or(0),
            ver: a.get(1).map(num).unwrap_or(0),
            generation: a.get(2).map(text).unwrap_or_default(),
            superseded: Default::default(),
            slots: slots_from(&a, 7),
        };
        let shared = Arc::new(Shared {
            name,
            prefix,
            endpoint,
            opts,
            scripts,
            epoch,
            conn: Mutex::new(conn),
            view: Mutex::new(view),
            state: Mutex::new(NodeState::default()),
            workers: Mutex::new(Vec::new()),
            keeper: Mutex::new(None),
            watchers: Mutex::new(Vec::new()),
        });
        if !shared.opts.client_only {
            start_keeper(&shared)?;
        }
        Ok(Node {
            shared: shared.clone(),
            _last: Arc::new(LastHandle(shared)),
        })
    }
}

/// A process's handle on a pool of dedicated workers: dispatch, stop and
/// notify jobs, host workers. Cheap to clone; the last clone dropped
/// closes the node.
///
/// # Examples
///
/// ```no_run
/// use sidejob_pulse::{Handler, Job, Node, StopReason, Token};
///
/// struct Tenants;
/// impl Handler for Tenants {
///     fn start(&mut self, job: Job) {
///         println!("start {} under token {}", job.key, job.token);
///     }
///     fn stop(&mut self, key: &str, token: Token, why: StopReason) {
///         println!("stop {key} ({token}, {why:?})");
///     }
/// }
///
/// let node = Node::builder().name("tenants").url("redis://127.0.0.1:6379/").join()?;
/// let worker = node.add_worker(100, Tenants)?;
/// node.dispatch("tenant-42", b"config")?;
/// node.notify("tenant-42", b"reload")?;
/// node.stop("tenant-42")?;
/// worker.remove()?;
/// node.shutdown()?;
/// # Ok::<(), sidejob_pulse::Error>(())
/// ```
#[derive(Clone)]
pub struct Node {
    shared: Arc<Shared>,
    _last: Arc<LastHandle>,
}

struct LastHandle(Arc<Shared>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        close(&self.0);
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("pool", &self.shared.name)
            .field("endpoint", &self.shared.endpoint)
            .field("client_only", &self.shared.opts.client_only)
            .field("workers", &lock(&self.shared.workers).len())
            .finish()
    }
}

fn check_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Error::InvalidKey);
    }
    Ok(())
}

fn check_payload(payload: &[u8]) -> Result<(), Error> {
    if payload.len() > MAX_PAYLOAD_LEN {
        return Err(Error::InvalidPayload);
    }
    Ok(())
}

impl Node {
    /// Starts a [`NodeBuilder`] with the defaults (the Pulse design's).
    pub fn builder() -> NodeBuilder {
        NodeBuilder::default()
    }

    /// The pool's name.
    pub fn pool(&self) -> &str {
        &self.shared.name
    }

    /// Adds a worker that runs at most `max_jobs` jobs at once (a sidejob
    /// [`Limiter`](sidejob::Limiter) of that capacity; a job assigned past
    /// it waits, counted as queued, until one of the worker's jobs stops).
    /// The worker joins the pool's membership at once; about `1/(n+1)` of
    /// the keys move to it from the `n` workers there, each stopped by its
    /// old owner before the new one starts it.
    ///
    /// # Errors
    ///
    /// [`Error::ClientOnly`], [`Error::Closed`], [`Error::ShuttingDown`],
    /// [`Error::PoolShutDown`],
    /// [`Error::Config`] naming `max_jobs` if it is 0 or above
    /// [`LimiterBuilder::MAX_CAPACITY`](sidejob::LimiterBuilder::MAX_CAPACITY)
    /// (checked before anything reaches Redis), or [`Error::Redis`].
    pub fn add_worker<H: Handler>(&self, max_jobs: usize, handler: H) -> Result<Worker, Error> {
        if self.shared.opts.client_only {
            return Err(Error::ClientOnly);
        }
        self.shared.check_open()?;
        worker::spawn(&self.shared, max_jobs, Box::new(handler))
    }

    /// Dispatches a job: records it in Redis and mails it to the worker
    /// that owns `key` (jump hash over the live workers). One round trip
    /// when this node's view of the membership is current; while the
    /// membership keeps changing under it, one more per change, for up to
    /// a heartbeat period (a fifth of the worker TTL), after which the job
    /// is recorded unassigned and a keeper places it at its next
    /// heartbeat. Returns once
    /// Redis holds the job: from then on it starts, eventually, on exactly
    /// one worker while one lives (if there is none yet, it waits for one,
    /// counted as queued). "Holds" is the node's
    /// [`durability`](NodeBuilder::durability): the primary's memory by
    /// default, or a replica (`WAIT`), or the primary's fsynced AOF.
    ///
    /// # Errors
    ///
    /// [`Error::Full`] at once when `max_queued_jobs` jobs are waiting to
    /// start; [`Error::InvalidKey`], [`Error::InvalidPayload`];
    /// [`Error::Exists`] if the key is in the pool; [`Error::ShuttingDown`],
    /// [`Error::Closed`], [`Error::PoolShutDown`], [`Error::NoPool`];
    /// [`Error::NotDurable`] with [`Durability::Replicas`] when fewer
    /// replicas than asked confirmed it in time (recorded on the primary,
    /// not acknowledged); [`Error::Redis`] (the job may
    /// or may not have been recorded: dispatching it again answers
    /// [`Error::Exists`] if it was).
    pub fn dispatch(&self, key: &str, payload: &[u8]) -> Result<(), Error> {
        self.dispatch_acked(key, payload).map(drop)
    }

    /// [`dispatch`](Self::dispatch), answering the [`Generation`] of the
    /// pool's state that acknowledged the job.
    ///
    /// A job acknowledged under a generation that has changed since (see
    /// [`watch_generation`](Self::watch_generation)) may have been lost
    /// with Redis' state if it had not started: dispatch it again (if the
    /// pool still holds it, or a worker handed it back, the answer is
    /// [`Error::Exists`] and nothing else happens). `dispatch` keeps its
    /// `()` so that code matching on `Ok(())` does not break; this is the
    /// same call with the generation kept.
    ///
    /// # Errors
    ///
    /// As [`dispatch`](Self::dispatch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use sidejob_pulse::{Error, Node};
    ///
    /// let node = Node::builder().name("tenants").url("redis://127.0.0.1:6379/").join()?;
    /// let acked = node.dispatch_acked("tenant-1", b"{}")?;
    /// assert_eq!(acked, node.generation()?);
    /// // Again, under the same generation: the pool holds it.
    /// assert_eq!(node.dispatch_acked("tenant-1", b"{}"), Err(Error::Exists));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn dispatch_acked(&self, key: &str, payload: &[u8]) -> Result<Generation, Error> {
        check_key(key)?;
        check_payload(payload)?;
        self.shared.check_open()?;
        let s = &self.shared;
        // Each STALE answer brings the newest membership, so a retry fails
        // only if it changed again meanwhile. A count of tries made a
        // healthy Redis under churn look failed; a deadline of one
        // heartbeat period bounds the retries instead, after which the job
        // is recorded unassigned, and a keeper places it at its next
        // heartbeat: no later than waiting longer here would.
        let deadline = deadline_after(s.opts.heartbeat_every);
        let mut unassigned = false;
        loop {
            let (ver, owner) = if unassigned {
                ("*".to_string(), String::new())
            } else {
                let v = lock(&s.view);
                (
                    v.ver.to_string(),
                    route(key.as_bytes(), &v.slots).unwrap_or("").to_string(),
                )
            };
            let mut conn = lock(&s.conn);
            let a = conn.run(
                &s.scripts.dispatch,
                &s.prefix,
                &[
                    Arg::N(ms(s.opts.worker_ttl)),
                    Arg::N(ms(s.opts.grace)),
                    Arg::N(ms(s.opts.pending_job_ttl)),
                    Arg::S(&ver),
                    Arg::N(s.opts.max_queued_jobs as u64),
                    Arg::S(key),
                    Arg::B(payload),
                    Arg::S(&owner),
                ],
            )?;
            let tag = Tag::of(&a);
            if tag == Some(Tag::Ok) {
                // On the connection that recorded it, before anything else.
                s.make_durable(&mut conn)?;
            }
            drop(conn);
            match tag {
                Some(Tag::Ok) => {
                    let generation = a.get(2).map(text).unwrap_or_default();
                    s.learn_generation(&generation);
                    return Ok(Generation(generation));
                }
                Some(Tag::Stale) if !unassigned => {
                    s.learn_view(a.get(1).map(num).unwrap_or(0), Some(slots_from(&a, 2)));
                    unassigned = now() >= deadline;
                }
                Some(Tag::Full) => {
                    return Err(Error::Full {
                        max_queued_jobs: s.opts.max_queued_jobs,
                    })
                }
                Some(Tag::Exists) => return Err(Error::Exists),
                Some(Tag::ShuttingDown) => return Err(Error::ShuttingDown),
                Some(Tag::NoPool) => return Err(Error::NoPool),
                Some(Tag::Closed) => return Err(s.saw_shut_down()),
                _ => return Err(unexpected("dispatch", &a)),
            }
        }
    }

    /// Stops the job `key`: a job not started yet is dropped at once; a
    /// running one is stopped by its worker (its handler's
    /// [`stop`](Handler::stop)) shortly after. A job stopped this way is
    /// not restarted anywhere.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`], [`Error::InvalidKey`], [`Error::Closed`],
    /// [`Error::PoolShutDown`], [`Error::NoPool`], [`Error::NotDurable`]
    /// (as for [`dispatch`](Self::dispatch): the stop is recorded on the
    /// primary, too few replicas confirmed it), [`Error::Redis`].
    pub fn stop(&self, key: &str) -> Result<(), Error> {
        check_key(key)?;
        if self.shared.is_closed() {
            return Err(Error::Closed);
        }
        let s = &self.shared;
        let mut conn = lock(&s.conn);
        let a = conn.run(
            &s.scripts.stop,
            &s.prefix,
            &[
                Arg::N(ms(s.opts.worker_ttl)),
                Arg::N(ms(s.opts.grace)),
                Arg::S(key),
            ],
        )?;
        if Tag::of(&a) == Some(Tag::Ok) {
            s.make_durable(&mut conn)?;
        }
        drop(conn);
        match Tag::of(&a) {
            Some(Tag::Ok) => Ok(()),
            Some(Tag::NotFound) => Err(Error::NotFound),
            Some(Tag::NoPool) => Err(Error::NoPool),
            Some(Tag::Closed) => Err(s.saw_shut_down()),
            _ => Err(unexpected("stop", &a)),
        }
    }

    /// Sends `payload` to the worker that holds job `key`, whose handler's
    /// [`notify`](Handler::notify) gets it after the job's start. At most
    /// once: a notification to a job that moves meanwhile is dropped.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] if no worker holds the job; [`Error::InvalidKey`],
    /// [`Error::InvalidPayload`], [`Error::Closed`], [`Error::PoolShutDown`],
    /// [`Error::NoPool`],
    /// [`Error::Redis`].
    pub fn notify(&self, key: &str, payload: &[u8]) -> Result<(), Error> {
        check_key(key)?;
        check_payload(payload)?;
        if self.shared.is_closed() {
            return Err(Error::Closed);
        }
        let s = &self.shared;
        let a = lock(&s.conn).run(
            &s.scripts.notify,
            &s.prefix,
            &[Arg::S(key), Arg::B(payload)],
        )?;
        match Tag::of(&a) {
            Some(Tag::Ok) => Ok(()),
            Some(Tag::NotFound) => Err(Error::NotFound),
            Some(Tag::NoPool) => Err(Error::NoPool),
            Some(Tag::Closed) => Err(s.saw_shut_down()),
            _ => Err(unexpected("notify", &a)),
        }
    }

    /// Shuts the whole pool down, on every node: new jobs are refused
    /// ([`Error::ShuttingDown`]), the jobs already queued start, then every
    /// worker stops its jobs ([`StopReason::Shutdown`](crate::StopReason))
    /// and leaves, then the pool's keys are deleted from Redis. Each wait
    /// is bounded by the worker shutdown TTL; workers that did not leave by
    /// then are removed anyway. This node is closed afterwards.
    ///
    /// The shutdown is final: Redis keeps one small mark of it, so that no
    /// later [`join`](NodeBuilder::join) (client-only or not) re-creates
    /// the pool, and every node's dispatch, stop and notify answer
    /// [`Error::PoolShutDown`]. Another node learns of it from
    /// [`Node::wait_shutdown`] or [`Node::pool_state`]. To run the pool
    /// again, join with [`NodeBuilder::reopen`]. (A Redis that loses its
    /// state loses the mark too: a node that did not see the shutdown may
    /// then re-create the pool, as after any state loss.)
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if workers were still there at the deadline (the
    /// keys are deleted all the same); [`Error::Redis`].
    pub fn shutdown(&self) -> Result<(), Error> {
        let s = &self.shared;
        lock(&s.state).shutting = true;
        let status = |phase: &str| -> Result<(u64, u64), Error> {
            let a = lock(&s.conn).run(
                &s.scripts.shutdown,
                &s.prefix,
                &[Arg::N(ms(s.opts.grace)), Arg::S(phase)],
            )?;
            Ok((
                a.first().map(num).unwrap_or(0),
                a.get(1).map(num).unwrap_or(0),
            ))
        };
        let deadline = deadline_after(s.opts.worker_shutdown_ttl);
        let poll = Duration::from_millis(20);
        status("1")?;
        // Polling Redis with a deadline: the queued jobs start on other
        // nodes, which tell nobody but Redis. With no worker left, nothing
        // queued can start: no point waiting.
        loop {
            let (queued, members) = status("0")?;
            if queued == 0 || members == 0 || now() >= deadline {
                break;
            }
            std::thread::sleep(poll);
        }
        status("2")?;
        let mut left = status("0")?.1;
        while left > 0 && now() < deadline {
            std::thread::sleep(poll);
            left = status("0")?.1;
        }
        stop_keeper(s);
        for w in std::mem::take(&mut *lock(&s.workers)) {
            w.wait_exit(deadline);
        }
        status("3")?;
        {
            let mut st = lock(&s.state);
            st.closed = true;
            st.shut_down = true;
        }
        if left > 0 {
            return Err(Error::Timeout {
                left: left as usize,
            });
        }
        Ok(())
    }

    /// Closes this node: its workers leave the pool (their jobs move to
    /// other workers, within the worker shutdown TTL) and its keeper stops.
    /// Workers on other nodes go on. Idempotent; dropping the last handle
    /// does the same.
    pub fn close(&self) {
        close(&self.shared);
    }

    /// Where the pool stands, read from Redis now (one round trip; also
    /// on a closed node).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub fn pool_state(&self) -> Result<PoolState, Error> {
        let s = &self.shared;
        let a = lock(&s.conn).run(&s.scripts.view, &s.prefix, &[])?;
        let (ver, shut) = (
            a.first().map(num).unwrap_or(0),
            a.get(2).map(num).unwrap_or(0),
        );
        Ok(match (ver, shut) {
            (_, 3) => {
                s.saw_shut_down();
                PoolState::ShutDown
            }
            (0, _) => PoolState::Missing,
            (_, 0) => PoolState::Open,
            _ => PoolState::ShuttingDown,
        })
    }

    /// Waits until the pool has been shut down (by any node), or `timeout`:
    /// whether it was. For a process that should exit when its pool is
    /// shut down. Reads Redis every twentieth of the worker TTL (at most
    /// every 250 ms); returns at once if this node already saw the
    /// shutdown.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] if Redis fails (the wait ends there).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sidejob_pulse::Node;
    ///
    /// let node = Node::builder().name("tenants").url("redis://127.0.0.1:6379/").join()?;
    /// let watcher = node.clone();
    /// let t = std::thread::spawn(move || watcher.wait_shutdown(Duration::from_secs(60)));
    /// node.shutdown()?;
    /// assert!(t.join().unwrap()?);
    /// # Ok::<(), sidejob_pulse::Error>(())
    /// ```
    pub fn wait_shutdown(&self, timeout: Duration) -> Result<bool, Error> {
        let deadline = deadline_after(timeout);
        let every = (self.shared.opts.worker_ttl / 20).min(Duration::from_millis(250));
        loop {
            if lock(&self.shared.state).shut_down || self.pool_state()? == PoolState::ShutDown {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(now());
            if left.is_zero() {
                return Ok(false);
            }
            // Polling Redis with a deadline: the shutdown may come from
            // any node, which tells only Redis.
            std::thread::sleep(every.min(left));
        }
    }

    /// The pool's current [`Generation`], read from Redis now (one round
    /// trip). A node that has watchers tells them if it is new.
    ///
    /// # Errors
    ///
    /// [`Error::NoPool`] if Redis lost the pool and no worker node has
    /// re-created it yet; [`Error::PoolShutDown`]; [`Error::Redis`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use sidejob_pulse::Node;
    ///
    /// let node = Node::builder().name("tenants").url("redis://127.0.0.1:6379/").join()?;
    /// let now = node.generation()?;
    /// assert_eq!(node.dispatch_acked("tenant-1", b"{}")?, now);
    /// # Ok::<(), sidejob_pulse::Error>(())
    /// ```
    pub fn generation(&self) -> Result<Generation, Error> {
        let s = &self.shared;
        let a = lock(&s.conn).run(&s.scripts.view, &s.prefix, &[])?;
        if a.first().map(num).unwrap_or(0) == 0 {
            return Err(match a.get(2).map(num) {
                Some(3) => s.saw_shut_down(),
                _ => Error::NoPool,
            });
        }
        let generation = a.get(1).map(text).unwrap_or_default();
        s.learn_generation(&generation);
        Ok(Generation(generation))
    }

    /// A receiver told of each new [`Generation`] of the pool this node
    /// sees from now on, so that a producer can dispatch again what was
    /// acknowledged under an older one (see [`Generation`]).
    ///
    /// The node reads the generation at least every heartbeat period (a
    /// fifth of the worker TTL): a worker node in its keeper thread, a
    /// client-only node in a keeper thread started for its first watcher
    /// (it only reads, and never re-creates a lost pool). Replies to this
    /// node's own calls ([`dispatch_acked`](Self::dispatch_acked),
    /// [`generation`](Self::generation), its workers' joins) tell of a
    /// change sooner. Each change is sent once, in the order this node saw
    /// them; nothing is sent while the pool is missing (Redis lost it and
    /// no worker node has re-created it yet), and the new generation is
    /// sent once one has. The sender is dropped when the node closes or
    /// shuts the pool down (the receiver then reports disconnection).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::collections::HashMap;
    /// use std::time::Duration;
    /// use sidejob_pulse::{Error, Generation, Node};
    ///
    /// let node = Node::builder().name("tenants").url("redis://127.0.0.1:6379/").join()?;
    /// let changes = node.watch_generation();
    /// let mut acked: HashMap<String, Generation> = HashMap::new();
    /// for key in ["tenant-1", "tenant-2"] {
    ///     acked.insert(key.into(), node.dispatch_acked(key, b"{}")?);
    /// }
    /// // Redis lost its state: dispatch again what was acked before.
    /// if let Ok(now) = changes.recv_timeout(Duration::from_secs(60)) {
    ///     for (key, g) in acked.iter_mut().filter(|(_, g)| **g != now) {
    ///         match node.dispatch_acked(key, b"{}") {
    ///             Ok(new) => *g = new,
    ///             Err(Error::Exists) => *g = now.clone(),
    ///             Err(e) => return Err(e),
    ///         }
    ///     }
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn watch_generation(&self) -> mpsc::Receiver<Generation> {
        let (tx, rx) = mpsc::channel();
        let s = &self.shared;
        if s.is_closed() {
            return rx; // tx dropped: disconnected at once
        }
        lock(&s.watchers).push(tx);
        // A client-only node reads the generation in a keeper of its own,
        // started for its first watcher. (A failure to start it leaves the
        // watcher told by this node's own calls only.)
        if s.opts.client_only && lock(&s.keeper).is_none() {
            let _ = start_keeper(s);
        }
        rx
    }

    /// How long the pool's learning mode lasts from now, read from Redis
    /// (one round trip): zero once it is over.
    ///
    /// While the pool learns, no job starts: dispatches are acknowledged
    /// and wait, counted as queued, and the keepers place them the moment
    /// it ends. A pool learns for the worker TTL and grace (a tenth of the
    /// TTL) after it is created on a Redis up for less than that (counted
    /// from Redis' start, whose uptime Redis reports in whole seconds:
    /// taken as the worst case, so up to a second longer; see
    /// [`NodeBuilder::assume_fresh_redis`]), and after Redis restarts or
    /// fails over under it.
    ///
    /// # Errors
    ///
    /// [`Error::NoPool`] if Redis lost the pool and no worker node has
    /// re-created it yet; [`Error::PoolShutDown`]; [`Error::Redis`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sidejob_pulse::Node;
    ///
    /// let node = Node::builder()
    ///     .name("tenants")
    ///     .url("redis://127.0.0.1:6379/")
    ///     .worker_ttl(Duration::from_secs(10))
    ///     .join()?;
    /// // At most ttl + grace (and the second Redis' uptime may overstate).
    /// assert!(node.learning_remaining()? <= Duration::from_secs(12));
    /// # Ok::<(), sidejob_pulse::Error>(())
    /// ```
    pub fn learning_remaining(&self) -> Result<Duration, Error> {
        let s = &self.shared;
        let a = lock(&s.conn).run(&s.scripts.view, &s.prefix, &[])?;
        if a.first().map(num).unwrap_or(0) == 0 {
            return Err(match a.get(2).map(num) {
                Some(3) => s.saw_shut_down(),
                _ => Error::NoPool,
            });
        }
        Ok(Duration::from_millis(a.get(3).map(num).unwrap_or(0)))
    }

    /// The membership version and slots this node last saw (a free slot is
    /// `""`): for tests and diagnostics.
    pub fn membership(&self) -> (u64, Vec<String>) {
        let v = lock(&self.shared.view);
        (v.ver, v.slots.clone())
    }
}

fn unexpected(what: &str, a: &[redis::Value]) -> Error {
    RedisError(format!("unexpected {what} reply {a:?}")).into()
}

fn start_keeper(shared: &Arc<Shared>) -> Result<(), Error> {
    let (tx, rx) = mpsc::channel();
    let s = shared.clone();
    let handle = std::thread::Builder::new()
        .name(thread_name("keeper", &s.name))
        .spawn(move || keeper(s, rx))
        .map_err(|e| RedisError(format!("cannot start the keeper thread: {e}")))?;
    *lock(&shared.keeper) = Some((tx, handle));
    Ok(())
}

fn stop_keeper(s: &Shared) {
    if let Some((tx, h)) = lock(&s.keeper).take() {
        drop(tx);
        let _ = h.join();
    }
    // No more generations to tell of: the watchers see the end.
    lock(&s.watchers).clear();
}

fn close(s: &Arc<Shared>) {
    {
        let mut st = lock(&s.state);
        if st.closed {
            return;
        }
        st.closed = true;
    }
    let deadline = deadline_after(s.opts.worker_shutdown_ttl);
    let workers = std::mem::take(&mut *lock(&s.workers));
    for w in &workers {
        w.begin_remove(s);
    }
    for w in &workers {
        w.wait_exit(deadline);
    }
    stop_keeper(s);
}

/// The keeper thread: every heartbeat period, renews the leases of the
/// node's workers in one script (which also reaps dead workers anywhere in
/// the pool), then places due jobs (orphans, and jobs not started within
/// the pending-job TTL) on their owners. While the pool learns, it also
/// wakes the moment learning ends (as Redis reported the time left) and
/// places the jobs that waited, rather than at the next heartbeat.
fn keeper(s: Arc<Shared>, stop: mpsc::Receiver<()>) {
    let mut conn = match s.conn() {
        Ok(c) => c,
        Err(_) => return,
    };
    loop {
        let t_send = now();
        let next_heartbeat = t_send + s.opts.heartbeat_every;
        let mut wake = next_heartbeat;
        if let Ok(hb) = heartbeat(&s, &mut conn, t_send) {
            if hb.due > 0 {
                let _ = place_due(&s, &mut conn);
            }
            if let Some(end) = learning_end(hb.learning) {
                wake = wake.min(end);
            }
        }
        loop {
            let wait = wake.saturating_duration_since(now());
            match stop.recv_timeout(wait) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            if now() >= next_heartbeat {
                break;
            }
            // Learning has ended (on this node's clock): place what
            // waited. If Redis still learns (the clocks' rates differ),
            // wake again when it says it ends.
            wake = match place_due(&s, &mut conn).map(learning_end) {
                Ok(Some(end)) => end.min(next_heartbeat),
                _ => next_heartbeat,
            };
        }
    }
}

/// When learning ends, on this node's clock, given the time left that a
/// reply just received reported (`None` if it has ended). The reply left
/// Redis after the script read the time, so now plus what is left is not
/// early but for the clocks' rates, which the margin covers.
fn learning_end(left: Duration) -> Option<std::time::Instant> {
    (!left.is_zero())
        .then(|| now() + left.mul_f64(1.0 + 2.0 * CLOCK_RATE_MARGIN) + Duration::from_millis(1))
}

/// What the keeper's heartbeat learned.
#[derive(Default)]
struct Beat {
    /// Jobs due for placement (none while learning).
    due: u64,
    /// How long learning lasts (zero: over), as Redis reported it.
    learning: Duration,
}

fn heartbeat(s: &Shared, conn: &mut Conn, t_send: std::time::Instant) -> Result<Beat, Error> {
    let cells: Vec<Arc<WorkerCell>> = lock(&s.workers).clone();
    let wids: Vec<String> = cells.iter().map(|c| c.wid()).collect();
    let live: Vec<usize> = (0..cells.len()).filter(|&i| !wids[i].is_empty()).collect();
    if live.is_empty() {
        // No lease to renew; read the generation for the watchers, if any.
        if !lock(&s.watchers).is_empty() {
            let a = conn.run(&s.scripts.view, &s.prefix, &[])?;
            s.learn_generation(&a.get(1).map(text).unwrap_or_default());
        }
        return Ok(Beat::default());
    }
    let myver = lock(&s.view).ver;
    // A node that saw the pool shut down never re-creates it: after the
    // clean-up, a missing pool is a closed one, not a lost one.
    let epoch = if s.is_shutting() {
        ""
    } else {
        s.epoch.as_str()
    };
    let mut args = vec![
        Arg::N(ms(s.opts.worker_ttl)),
        Arg::N(ms(s.opts.grace)),
        Arg::S(epoch),
        Arg::N(myver),
        Arg::N(ms(s.opts.pending_job_ttl)),
    ];
    for &i in &live {
        args.push(Arg::S(&wids[i]));
    }
    let a = conn.run(&s.scripts.heartbeat, &s.prefix, &args)?;
    let ver = a.first().map(num).unwrap_or(0);
    let generation = a.get(1).map(text).unwrap_or_default();
    let shut = a.get(2).map(num).unwrap_or(0);
    let due = a.get(4).map(num).unwrap_or(0);
    let learning = Duration::from_millis(a.get(3).map(num).unwrap_or(0));
    let slots = (a.len() > 5 + live.len()).then(|| slots_from(&a, 5 + live.len()));
    s.learn_view(ver, slots);
    s.learn_generation(&generation);
    lock(&s.view).shut = shut;
    if shut > 0 {
        lock(&s.state).shutting = true;
    }
    if shut == 3 {
        s.saw_shut_down();
    }
    let valid_until = t_send + s.opts.lease_window();
    for (j, &i) in live.iter().enumerate() {
        let renewed = a.get(5 + j).map(num).unwrap_or(0) == 1;
        cells[i].heartbeat_result(&wids[i], renewed, valid_until, &generation, s, conn);
    }
    Ok(Beat { due, learning })
}

/// Due jobs fetched per script call.
const DUE_BATCH: usize = 200;

/// Places due jobs in batches until none is left (at most 50 batches a
/// heartbeat: 10,000 jobs), routing each over this node's view. Answers
/// how long the pool still learns (zero: it does not; nothing is placed
/// while it does).
fn place_due(s: &Shared, conn: &mut Conn) -> Result<Duration, Error> {
    for _ in 0..50 {
        let a = conn.run(&s.scripts.due, &s.prefix, &[Arg::N(DUE_BATCH as u64)])?;
        let learning = Duration::from_millis(a.get(1).map(num).unwrap_or(0));
        if a.len() < 4 {
            return Ok(learning);
        }
        let a = &a[1..];
        let full = a.len() == 1 + 2 * DUE_BATCH;
        let (ver, owners) = {
            let v = lock(&s.view);
            let owners: Vec<String> = a[1..]
                .chunks(2)
                .map(|c| {
                    route(&crate::store::bytes(&c[0]), &v.slots)
                        .unwrap_or("")
                        .to_string()
                })
                .collect();
            (v.ver, owners)
        };
        let keys: Vec<Vec<u8>> = a[1..]
            .chunks(2)
            .map(|c| crate::store::bytes(&c[0]))
            .collect();
        let toks: Vec<String> = a[1..].chunks(2).map(|c| text(&c[1])).collect();
        let mut args = vec![Arg::N(ms(s.opts.pending_job_ttl)), Arg::N(ver)];
        for i in 0..keys.len() {
            args.push(Arg::B(&keys[i]));
            args.push(Arg::S(&toks[i]));
            args.push(Arg::S(&owners[i]));
        }
        let r = conn.run(&s.scripts.place, &s.prefix, &args)?;
        match Tag::of(&r) {
            // Routed over an old view: learn the new one and go again.
            Some(Tag::Stale) => {
                s.learn_view(r.get(1).map(num).unwrap_or(0), Some(slots_from(&r, 2)));
            }
            Some(Tag::Ok) if full => {}
            _ => return Ok(Duration::ZERO),
        }
    }
    Ok(Duration::ZERO)
}
