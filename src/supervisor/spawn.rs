//! Spawning children: OS threads (`spawn`) and tokio tasks (`spawn_task` and friends, feature `tokio`), each holding its guard until it ends.

#[cfg(feature = "tokio")]
use super::{kind_of, ChildId};
use super::{Child, ChildGuard, ChildKind, Common, How, Supervisor};
use crate::adaptive::{Feed, Outcome};
use crate::engine::foreign::drop_payload;
use crate::error::Error;
use crate::sync::{os_thread, Arc};
use crate::units::Ask;
#[cfg(feature = "tokio")]
use std::fmt;
#[cfg(feature = "tokio")]
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

impl Supervisor {
    /// Starts `f` on a new OS thread, as a child. Waits for capacity only
    /// under the supervisor's waiting policy
    /// ([`max_waiters`](crate::SupervisorBuilder::max_waiters); by default it
    /// never does).
    ///
    /// The thread is named `{name}-child`. The child's unit is given back
    /// when `f` returns or panics (a panic is counted in
    /// [`Stats::panicked`](crate::Stats::panicked)), before [`Child::join`] returns, so a joined
    /// child is never counted as alive.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`](crate::Error::Overload) when `capacity` children are alive; counted in
    ///   [`Stats::rejected`](crate::Stats::rejected). `f` is dropped without running.
    /// * [`Error::Shutdown`](crate::Error::Shutdown) once [`close`](Self::close) has been called;
    ///   `f` is dropped without running.
    /// * [`Error::Spawn`](crate::Error::Spawn) when the OS refuses to start the thread (too many
    ///   threads, no memory for the stack). The unit was released: the
    ///   refusal is not an `Overload`. (A thread that starts but cannot
    ///   map its signal stack aborts the process inside std, which this
    ///   cannot catch: on Linux, at about 16,000 live threads; see
    ///   [`SupervisorBuilder::capacity`](crate::SupervisorBuilder::capacity).)
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().name("fsm").capacity(4).build()?;
    /// let child = sup.spawn(|| std::thread::current().name().map(str::to_owned))?;
    /// assert_eq!(child.join().unwrap().as_deref(), Some("fsm-child"));
    ///
    /// // A panicking child releases its unit and is counted.
    /// let crashing = sup.spawn(|| panic!("boom"))?;
    /// assert!(crashing.join().is_err());
    /// assert_eq!(sup.usage(), 0);
    /// assert_eq!(sup.stats().panicked, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawn<F, T>(&self, f: F) -> Result<Child<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let guard = self.inner.enter(How::Wait(None), ChildKind::Thread)?;
        self.spawn_thread(guard, f)
    }

    /// [`spawn`](Self::spawn) of a child of what `ask` describes: its
    /// units (a job that needs 4 of 16 cores), failing fast or waiting as
    /// the ask says (blocking the calling thread while it waits). The
    /// child holds every unit until `f` returns or panics.
    ///
    /// # Errors
    ///
    /// As [`spawn`](Self::spawn), and as [`reserve_with`](Self::reserve_with)
    /// for the ask ([`Error::TooLarge`](crate::Error::TooLarge) for 0
    /// units or more than the capacity in force).
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Supervisor};
    ///
    /// let cores = Supervisor::new(16)?;
    /// let build = cores.spawn_with(Ask::new().units(4), || 2 + 2)?;
    /// assert_eq!(build.join().unwrap(), 4);
    /// assert_eq!(cores.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawn_with<F, T>(&self, ask: Ask, f: F) -> Result<Child<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let guard = self.inner.enter_with(ask, ChildKind::Thread)?;
        self.spawn_thread(guard, f)
    }

    /// Runs `f` on a new thread as the child `guard` admitted.
    fn spawn_thread<F, T>(&self, mut guard: ChildGuard, f: F) -> Result<Child<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let id = guard.id();
        let mut builder = os_thread::Builder::new().name(self.inner.thread_name.clone());
        if let Some(size) = self.inner.stack_size {
            builder = builder.stack_size(size);
        }
        let spawned = builder.spawn(move || {
            // Timed, if a controller is attached: here, on the child's
            // thread, not on the admission that spawned it.
            let started = started(&guard);
            let result = panic::catch_unwind(AssertUnwindSafe(f));
            // The unit goes back before the thread's result is published,
            // so `join` never sees a finished child still counted.
            guard.panicked = result.is_err();
            let due = ended(&guard, started, result.is_ok());
            drop(guard);
            if let Some((common, at)) = due {
                tick(&common, at);
            }
            match result {
                Ok(value) => value,
                Err(payload) => panic::resume_unwind(payload),
            }
        });
        match spawned {
            Ok(handle) => Ok(Child { id, handle }),
            // The closure, and the guard in it, was dropped by the failed
            // spawn: the child is unregistered and its unit released.
            Err(err) => Err(Error::Spawn(err.kind())),
        }
    }

    /// Spawns `future` on the current tokio runtime as a child; never waits
    /// for capacity, whatever the waiting policy (it is called on a
    /// runtime thread, which must not block: `spawn_task_async` waits).
    ///
    /// The child's unit is given back when the task completes, panics
    /// (counted in [`Stats::panicked`](crate::Stats::panicked)) or is aborted (counted as
    /// completed), whichever comes first. The returned [`Task`] is a
    /// `JoinHandle`: await it for the output; dropping it detaches the task.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`](crate::Error::Overload) when `capacity` children are alive; counted in
    ///   [`Stats::rejected`](crate::Stats::rejected). `future` is dropped without being polled.
    /// * [`Error::Shutdown`](crate::Error::Shutdown) once [`close`](Self::close) has been called;
    ///   `future` is dropped without being polled.
    /// * [`Error::NoRuntime`](crate::Error::NoRuntime)
    ///   when called outside a tokio runtime (where `tokio::spawn` would
    ///   panic); nothing was admitted. Use
    ///   [`spawn_task_on`](Self::spawn_task_on) to name a runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = Supervisor::new(1)?;
    /// let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
    /// let task = sup.spawn_task(async move { rx.await.unwrap() * 2 })?;
    /// assert_eq!(sup.spawn_task(async {}).unwrap_err(), Error::Overload);
    ///
    /// tx.send(21).unwrap();
    /// assert_eq!(task.await?, 42);
    /// assert_eq!(sup.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// // Outside a runtime there is nowhere to spawn: an error, not a panic.
    /// # let sup = Supervisor::new(1)?;
    /// assert!(matches!(sup.spawn_task(async {}), Err(Error::NoRuntime)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn spawn_task<F>(&self, future: F) -> Result<Task<F::Output>, Error>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        self.spawn_task_on(&handle, future)
    }

    /// Like [`spawn_task`](Self::spawn_task), on the runtime `handle` names;
    /// callable from any thread.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`](crate::Error::Overload) when `capacity` children are alive; counted in
    ///   [`Stats::rejected`](crate::Stats::rejected).
    /// * [`Error::Shutdown`](crate::Error::Shutdown) once [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// let sup = Supervisor::new(4)?;
    /// // From outside the runtime, naming it:
    /// let task = sup.spawn_task_on(rt.handle(), async { 7 })?;
    /// assert_eq!(rt.block_on(task)?, 7);
    /// assert_eq!(sup.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn spawn_task_on<F>(
        &self,
        handle: &tokio::runtime::Handle,
        future: F,
    ) -> Result<Task<F::Output>, Error>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        // Never waits: this is a plain function called on a runtime's
        // thread, which must not block. `spawn_task_async` waits.
        let guard = self.inner.enter(How::Try, ChildKind::Task)?;
        Ok(self.spawn_guarded(handle, guard, future))
    }

    /// [`spawn_task`](Self::spawn_task) that waits for capacity under the
    /// supervisor's waiting policy, without blocking the executor, then
    /// spawns `future` on the current runtime.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve); [`Error::Spawn`](crate::Error::Spawn) outside a tokio
    /// runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves gives up the wait; `future`
    /// is dropped without running.
    ///
    /// # Examples
    ///
    /// Thousands of IO tasks, at most 2 at once, the rest waiting their
    /// turn:
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().capacity(2).max_waiters(1000).build()?;
    /// let mut tasks = Vec::new();
    /// for n in 0..10u64 {
    ///     tasks.push(sup.spawn_task_async(async move { n * n }).await?);
    /// }
    /// let mut sum = 0;
    /// for task in tasks {
    ///     sum += task.await?;
    /// }
    /// assert_eq!(sum, 285);
    /// assert_eq!(sup.stats().peak_usage, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn spawn_task_async<F>(&self, future: F) -> Result<Task<F::Output>, Error>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let shard = self.inner.common.table.acquire_async(None).await?;
        let guard = self.inner.register(shard, ChildKind::Task);
        Ok(self.spawn_guarded(&handle, guard, future))
    }

    /// [`spawn_task_async`](Self::spawn_task_async) of a child of what
    /// `ask` describes: its units, failing fast or waiting (without
    /// blocking the executor) as the ask says; then `future` is spawned on
    /// the current runtime, holding every unit until it completes, panics
    /// or is aborted.
    ///
    /// # Errors
    ///
    /// As [`reserve_with`](Self::reserve_with); [`Error::NoRuntime`](crate::Error::NoRuntime)
    /// outside a tokio runtime (nothing admitted).
    ///
    /// # Cancel safety
    ///
    /// As [`spawn_task_async`](Self::spawn_task_async): dropping the
    /// future gives up the wait, and `future` is dropped without running.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::{units::Ask, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(8).max_waiters(16).build()?;
    /// let export = sup.spawn_task_with(Ask::new().units(6), async { 6 * 7 }).await?;
    /// assert_eq!(export.await?, 42);
    /// assert_eq!(sup.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn spawn_task_with<F>(&self, ask: Ask, future: F) -> Result<Task<F::Output>, Error>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let guard = self.inner.enter_with_async(ask, ChildKind::Task).await?;
        Ok(self.spawn_guarded(&handle, guard, future))
    }

    /// Spawns `future` on the current tokio runtime as a child of `key`
    /// (at most [`per_key`](crate::SupervisorBuilder::per_key) live per key);
    /// never waits, for the key or for capacity, whatever the waiting
    /// policy. [`spawn_task_keyed_async`](Self::spawn_task_keyed_async)
    /// waits.
    ///
    /// The key's slot and the unit are released when the task completes,
    /// panics or is aborted, the unit first: the key's next task can start
    /// as soon as the key is free.
    ///
    /// # Errors
    ///
    /// As [`try_reserve_keyed`](Self::try_reserve_keyed) ([`Error::KeyBusy`](crate::Error::KeyBusy),
    /// [`Error::Overload`](crate::Error::Overload), [`Error::Shutdown`](crate::Error::Shutdown)), and [`Error::Spawn`](crate::Error::Spawn)
    /// outside a tokio runtime; `future` is dropped without being polled.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = Supervisor::new(100)?;
    /// let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    /// let first = sup.spawn_task_keyed(&"wf-1", async move { rx.await.unwrap() })?;
    /// let busy = sup.spawn_task_keyed(&"wf-1", async {}).unwrap_err();
    /// assert_eq!(busy, Error::KeyBusy); // skip it: wf-1's task runs
    /// let other = sup.spawn_task_keyed(&"wf-2", async {})?;
    /// tx.send(()).unwrap();
    /// first.await?;
    /// other.await?;
    /// assert!(sup.spawn_task_keyed(&"wf-1", async {}).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn spawn_task_keyed<K, F>(&self, key: &K, future: F) -> Result<Task<F::Output>, Error>
    where
        K: Hash + ?Sized,
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let keys = &self.inner.common.keys;
        let key = keys
            .try_enter(keys.id(key))
            .map_err(|err| self.keyed_refusal(err))?;
        let guard = self.inner.enter(How::Try, ChildKind::Task)?;
        Ok(self.spawn_guarded(&handle, guard.with_key(key), future))
    }

    /// [`spawn_task_keyed`](Self::spawn_task_keyed) that waits for the key
    /// (first come first served per key), then for capacity, under the
    /// supervisor's waiting policy, without blocking the executor; then
    /// spawns `future` on the current runtime. The key is hashed at the
    /// call.
    ///
    /// # Errors
    ///
    /// As [`reserve_keyed`](Self::reserve_keyed); [`Error::Spawn`](crate::Error::Spawn) outside
    /// a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves gives up the wait (a slot or
    /// unit handed to it goes to the next waiter); `future` is dropped
    /// without running.
    ///
    /// # Examples
    ///
    /// Three workflows of three steps each; a workflow's steps run in
    /// order, one at a time:
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use std::sync::{Arc, Mutex};
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().capacity(8).max_waiters(100).build()?;
    /// let log = Arc::new(Mutex::new(Vec::new()));
    /// let mut tasks = Vec::new();
    /// for step in 0..3 {
    ///     for workflow in ["a", "b", "c"] {
    ///         let log = log.clone();
    ///         let task = sup
    ///             .spawn_task_keyed_async(&workflow, async move {
    ///                 tokio::task::yield_now().await;
    ///                 log.lock().unwrap().push((workflow, step));
    ///             })
    ///             .await?;
    ///         tasks.push(task);
    ///     }
    /// }
    /// for task in tasks {
    ///     task.await?;
    /// }
    /// let log = log.lock().unwrap();
    /// for workflow in ["a", "b", "c"] {
    ///     let steps: Vec<_> = log.iter().filter(|(w, _)| *w == workflow).map(|(_, s)| *s).collect();
    ///     assert_eq!(steps, [0, 1, 2]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn spawn_task_keyed_async<K, F>(
        &self,
        key: &K,
        future: F,
    ) -> Result<Task<F::Output>, Error>
    where
        K: Hash + ?Sized,
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let id = self.inner.common.keys.id(key);
        let (key, shard) = self.keyed_unit_async(id).await?;
        let guard = self.inner.register(shard, ChildKind::Task).with_key(key);
        Ok(self.spawn_guarded(&handle, guard, future))
    }

    /// Spawns `future` on `handle` as the child `guard` stands for.
    #[cfg(feature = "tokio")]
    pub(super) fn spawn_guarded<F>(
        &self,
        handle: &tokio::runtime::Handle,
        mut guard: ChildGuard,
        future: F,
    ) -> Task<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        guard.task = true;
        let id = guard.id();
        let (registry, slot, free) = (id.shard(), guard.slot as usize, guard.free);
        let handle = handle.spawn(supervised(guard, future));
        self.inner.registry[registry].register_task(slot, free, handle.abort_handle());
        Task { id, handle }
    }

    /// Aborts every task started with [`spawn_task`](Self::spawn_task) or
    /// [`spawn_task_on`](Self::spawn_task_on) that is still running, and
    /// returns how many it aborted.
    ///
    /// Each is aborted as by [`Task::abort`]: its future is dropped at its
    /// next yield point (or at once if it is not running), which releases
    /// its unit (counted as completed), and awaiting its [`Task`] gives a
    /// cancelled `JoinError`. Children that are not tasks (threads from
    /// [`spawn`](Self::spawn), guards from [`reserve`](Self::reserve), even
    /// guards moved into tokio tasks) are not touched. New tasks are still
    /// admitted: call [`close`](Self::close) first to stop them, then
    /// [`wait_idle_async`](Self::wait_idle_async) to see the aborted ones
    /// gone. Every task whose `spawn_task` returned before this call began
    /// is aborted; one spawned while it runs may or may not be, and one
    /// spawned after it returns is not.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = sidejob::Supervisor::new(8)?;
    /// let guard = sup.reserve()?;
    /// let tasks: Vec<_> = (0..3)
    ///     .map(|_| sup.spawn_task(std::future::pending::<()>()))
    ///     .collect::<Result<_, _>>()?;
    /// sup.close();
    /// assert_eq!(sup.abort_all(), 3);
    /// for task in tasks {
    ///     assert!(task.await.unwrap_err().is_cancelled());
    /// }
    /// assert_eq!(sup.usage(), 1, "the reserved guard is not a task");
    /// drop(guard);
    /// sup.wait_idle_async().await;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn abort_all(&self) -> usize {
        let mut aborted = 0;
        for registry in self.inner.registry.iter() {
            registry.for_each_child(|slot, word| {
                if kind_of(word) != ChildKind::Task {
                    return;
                }
                // Taken out, and the lock let go, before aborting: the exit
                // of an aborted task then finds the cell empty.
                let handle = registry.tasks[slot].lock().take();
                if let Some(handle) = handle {
                    handle.abort();
                    aborted += 1;
                }
            });
        }
        aborted
    }
}

/// A child started by `Supervisor::spawn_task`: a tokio task.
///
/// Await it for the task's output, as a `tokio::task::JoinHandle`; dropping
/// it detaches the task, which stays counted until it ends.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct Task<T> {
    id: ChildId,
    handle: tokio::task::JoinHandle<T>,
}

#[cfg(feature = "tokio")]
impl<T> Task<T> {
    /// The child's id, as [`Supervisor::which_children`] lists it.
    pub fn id(&self) -> ChildId {
        self.id
    }

    /// Cancels the task. Its future is dropped at its next yield point (or
    /// at once if it is not running), which releases its unit; awaiting the
    /// `Task` then gives a cancelled `JoinError`.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = sidejob::Supervisor::new(1)?;
    /// let task = sup.spawn_task(std::future::pending::<()>())?;
    /// task.abort();
    /// assert!(task.await.unwrap_err().is_cancelled());
    /// assert_eq!(sup.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn abort(&self) {
        self.handle.abort();
    }

    /// True once the task has finished (completed, panicked or been
    /// cancelled).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

#[cfg(feature = "tokio")]
impl<T> std::future::Future for Task<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.get_mut().handle).poll(cx)
    }
}

#[cfg(feature = "tokio")]
impl<T> fmt::Debug for Task<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task").field("id", &self.id).finish()
    }
}

/// `future`, holding `guard` until it completes or is dropped (aborted). A
/// panic in `poll` is caught so the guard can be dropped as panicked, then
/// resumed for tokio to report through the `JoinError`: tokio catches the
/// panic outside the future and drops the future later, when
/// `thread::panicking()` no longer says so.
#[cfg(feature = "tokio")]
pub(super) async fn supervised<F: std::future::Future>(
    mut guard: ChildGuard,
    future: F,
) -> F::Output {
    use std::task::Poll;

    // Timed from the first poll, if a controller is attached.
    let started = started(&guard);
    let mut future = std::pin::pin!(future);
    let polled = std::future::poll_fn(|cx| {
        match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    })
    .await;
    match polled {
        Ok(output) => {
            let due = ended(&guard, started, true);
            drop(guard);
            if let Some((common, at)) = due {
                tick(&common, at);
            }
            output
        }
        Err(payload) => {
            guard.panicked = true;
            drop(guard);
            panic::resume_unwind(payload)
        }
    }
}

/// A child's start: the time, if a controller is attached and this child
/// is one of its sampled ones.
fn started(guard: &ChildGuard) -> Option<Instant> {
    guard.shard.common.feed.get().and_then(Feed::start)
}

/// A child's end, its guard not yet dropped: records its life if it was
/// timed (a success; a panicked child records nothing, as a pool's
/// panicked handler does). If the controller's interval has passed, the
/// supervisor's shared state and the time to tick at, for
/// [`tick`] once the unit is back.
fn ended(
    guard: &ChildGuard,
    started: Option<Instant>,
    succeeded: bool,
) -> Option<(Arc<Common>, Duration)> {
    let started = started?;
    let common = &guard.shard.common;
    let outcome = if succeeded {
        Outcome::Success
    } else {
        Outcome::Ignore
    };
    let at = common.feed.get()?.finish(started, outcome)?;
    Some((Arc::clone(common), at))
}

/// Ticks the attached controller at `at`, holding no lock: its algorithm
/// (which may be a user's) runs on the child's thread or task after the
/// child's unit is back, and a panic in it is the controller's, not the
/// child's.
#[cold]
fn tick(common: &Common, at: Duration) {
    if let Some(feed) = common.feed.get() {
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| feed.tick_at(at))) {
            drop_payload(payload);
        }
    }
}
