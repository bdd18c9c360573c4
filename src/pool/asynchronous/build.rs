//! `PoolBuilder::build_async`: an async pool, its workers spawned as tasks on the current tokio runtime (or the one named).

use super::current::as_worker;
use super::mailbox::mailboxes;
use super::worker::{AsyncFactory, AsyncWorker, TaskLoop};
use super::{AsyncPool, Inner, MAX_DEFAULT_ASYNC_WORKERS};
use super::{PoolBuilder, DEFAULT_STEAL};
use crate::engine::table::Table;
use crate::error::ConfigError;
use crate::sync::Arc;
use tokio::runtime::Handle;
use tokio::sync::watch;

impl PoolBuilder {
    /// Starts an [`AsyncPool`] on the current tokio runtime: one task per
    /// worker, each with the state `factory(index)` returns (built on the
    /// worker's task, at start and after every panic).
    ///
    /// The settings are the thread pool's, except two: `workers` defaults
    /// to the capacity, up to [`MAX_DEFAULT_ASYNC_WORKERS`](Self::MAX_DEFAULT_ASYNC_WORKERS) (see there why
    /// not the CPU count), and `spin_wait` and `pin_workers` do not apply
    /// (a task never spins; the runtime places it). [`steal`](Self::steal)
    /// applies (see [`AsyncPool`]'s "Stealing"); a free worker looks at
    /// every mailbox before it sleeps, so with stealing on, name a worker
    /// count nearer the concurrency you need than the default 256.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or too
    /// large, `workers` is 0 or too large, or `name` contains a NUL byte;
    /// naming `workers` when called outside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// # struct Sink;
    /// # impl AsyncWorker for Sink {
    /// #     type Request = (); type Reply = (); type Message = ();
    /// #     async fn handle_call(&mut self, _: ()) {}
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let err = Pool::builder().capacity(8).build_async(|_| Sink).unwrap_err();
    /// assert_eq!(err.field(), "workers"); // no runtime here
    ///
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let _guard = runtime.enter();
    /// let pool = Pool::builder().capacity(8).build_async(|_| Sink)?;
    /// assert_eq!(pool.workers(), 8); // one per unit, for I/O-bound handlers
    /// let err = Pool::builder().capacity(0).build_async(|_| Sink).unwrap_err();
    /// assert_eq!(err.to_string(), "invalid `capacity`: must be at least 1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn build_async<W, F>(&self, factory: F) -> Result<AsyncPool<W>, ConfigError>
    where
        W: AsyncWorker,
        F: Fn(usize) -> W + Send + Sync + 'static,
    {
        let handle = Handle::try_current().map_err(|_| ConfigError::no_runtime("workers"))?;
        self.build_async_on(&handle, factory)
    }

    /// Like [`build_async`](Self::build_async), with the workers on the
    /// runtime `handle` names; callable from any thread.
    ///
    /// # Errors
    ///
    /// As [`build_async`](Self::build_async), except that there is always
    /// a runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// # struct Echo;
    /// # impl AsyncWorker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     async fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let pool = Pool::builder().capacity(4).build_async_on(runtime.handle(), |_| Echo)?;
    /// assert_eq!(runtime.block_on(pool.call_async(7))?, 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn build_async_on<W, F>(
        &self,
        handle: &Handle,
        factory: F,
    ) -> Result<AsyncPool<W>, ConfigError>
    where
        W: AsyncWorker,
        F: Fn(usize) -> W + Send + Sync + 'static,
    {
        let name: Arc<str> = Arc::from(ConfigError::check_name(self.name.as_deref())?);
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        let workers = self
            .workers
            .unwrap_or_else(|| capacity.clamp(1, MAX_DEFAULT_ASYNC_WORKERS));
        let table = Table::new(capacity, workers, self.probe)
            .map_err(|err| {
                if err.field() == "shards" {
                    err.with_field("workers")
                } else {
                    err
                }
            })?
            .with_policy(&self.policy)?;
        let table = Arc::new(table);
        let factory: Arc<AsyncFactory<W>> = Arc::new(factory);
        let steal = self.steal.unwrap_or(DEFAULT_STEAL);
        let (mailboxes, inboxes) = mailboxes(table.shard_count(), steal);
        let (done, alive) = watch::channel(());
        let feed: std::sync::Arc<crate::adaptive::FeedSlot> = Default::default();
        for (index, inbox) in inboxes.into_iter().enumerate() {
            let worker = TaskLoop {
                index,
                table: Arc::clone(&table),
                inbox,
                factory: Arc::clone(&factory),
                _alive: alive.clone(),
                ended: false,
                feed: std::sync::Arc::clone(&feed),
            };
            // Detached: `done` says when it ends.
            drop(handle.spawn(as_worker(&table, index, worker.run())));
        }
        drop(alive);
        Ok(AsyncPool {
            inner: Arc::new(Inner {
                table,
                mailboxes,
                name,
                done,
                feed,
            }),
        })
    }
}
