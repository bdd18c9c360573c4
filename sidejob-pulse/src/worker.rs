//! A worker's handle ([`Worker`]) and its start: the limiter that bounds
//! its running jobs, its registration, and the thread that runs its loop
//! (`run.rs`).

use std::fmt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sidejob::Limiter;

use crate::error::{ConfigError, Error, RedisError};
use crate::job::Handler;
use crate::run::Run;
use crate::shared::{deadline_after, lock, random_id, thread_name, CellState, Shared, WorkerCell};
use crate::store::Arg;

/// A worker of this node: its handle. Dropping it leaves the worker
/// running; [`remove`](Self::remove) takes it out of the pool.
pub struct Worker {
    cell: Arc<WorkerCell>,
    shared: Arc<Shared>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id())
            .field("running", &self.running())
            .finish()
    }
}

impl Worker {
    /// The worker's current id in Redis (a new one after it lost its lease
    /// and joined again; empty once it has left).
    pub fn id(&self) -> String {
        self.cell.wid()
    }

    /// Jobs running on this worker now.
    pub fn running(&self) -> usize {
        lock(&self.cell.state).running
    }

    /// The local bound: the sidejob `Limiter` (crate `sidejob`) of
    /// capacity `max_jobs` whose permits this worker's running jobs hold;
    /// its `usage()` is how many run.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use sidejob_pulse::{Handler, Job, Node, StopReason, Token};
    /// # struct Tenants;
    /// # impl Handler for Tenants {
    /// #     fn start(&mut self, _: Job) {}
    /// #     fn stop(&mut self, _: &str, _: Token, _: StopReason) {}
    /// # }
    /// let node = Node::builder().name("tenants").url("redis://127.0.0.1:6379/").join()?;
    /// let worker = node.add_worker(10, Tenants)?;
    /// assert_eq!(worker.limiter().capacity(), 10);
    /// assert!(worker.limiter().usage() <= 10);
    /// # Ok::<(), sidejob_pulse::Error>(())
    /// ```
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.cell.limiter
    }

    /// Removes the worker from the pool: it leaves the membership, stops
    /// each of its jobs ([`StopReason::Moved`](crate::StopReason::Moved)) and hands it to its new
    /// owner, then exits. Waits up to the worker shutdown TTL.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if the worker had not finished by then (it goes
    /// on in the background; Redis removes it when its lease runs out).
    pub fn remove(self) -> Result<(), Error> {
        self.cell.begin_remove(&self.shared);
        let deadline =
            deadline_after(self.shared.opts.worker_shutdown_ttl + Duration::from_secs(1));
        if self.cell.wait_exit(deadline) {
            lock(&self.shared.workers).retain(|c| !Arc::ptr_eq(c, &self.cell));
            Ok(())
        } else {
            Err(Error::Timeout {
                left: self.running(),
            })
        }
    }
}

/// Starts a worker: registers it (so that errors reach the caller), then
/// runs its thread.
pub(crate) fn spawn(
    s: &Arc<Shared>,
    max_jobs: usize,
    handler: Box<dyn Handler>,
) -> Result<Worker, Error> {
    // Checked here, before anything reaches Redis.
    if max_jobs == 0 {
        return Err(ConfigError::new("max_jobs", "must be at least 1").into());
    }
    let max = sidejob::LimiterBuilder::MAX_CAPACITY;
    if max_jobs > max {
        return Err(ConfigError::new("max_jobs", format!("must be at most {max}")).into());
    }
    let limiter =
        Arc::new(Limiter::new(max_jobs).map_err(|e| ConfigError::new("max_jobs", e.to_string()))?);
    let cell = Arc::new(WorkerCell {
        state: Mutex::new(CellState::default()),
        changed: Condvar::new(),
        limiter,
        thread: Mutex::new(None),
    });
    let mut run = Run::new(s.clone(), cell.clone(), handler, s.conn()?);
    run.register(&random_id())?;
    lock(&s.workers).push(cell.clone());
    let wid = run.wid().to_string();
    let handle = match std::thread::Builder::new()
        .name(thread_name("worker", &s.name))
        .spawn(move || run.main())
    {
        Ok(h) => h,
        Err(e) => {
            // Registered but never run: leave the pool at once rather than
            // when the lease runs out (best effort; Redis removes it then
            // anyway).
            lock(&s.workers).retain(|c| !Arc::ptr_eq(c, &cell));
            if let Ok(mut c) = s.conn() {
                let _ = c.run(&s.scripts.leave, &s.prefix, &[Arg::S(&wid), Arg::N(2)]);
            }
            return Err(RedisError(format!("cannot start the worker thread: {e}")).into());
        }
    };
    *lock(&cell.thread) = Some(handle);
    Ok(Worker {
        cell,
        shared: s.clone(),
    })
}
