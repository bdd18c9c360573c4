//! `PoolBuilder::build_async` and `build_async_init`: an async pool, its workers spawned as tasks on the current tokio runtime (or the one named), their state made by a factory or awaited from an async init.

use super::mailbox::mailboxes;
use super::worker::{AsyncFactory, AsyncInit, AsyncWorker, Maker, TaskLoop};
use super::{AsyncPool, Inner, MAX_DEFAULT_ASYNC_WORKERS};
use super::{PoolBuilder, DEFAULT_STEAL};
use crate::engine::foreign::{drop_quietly, each_quietly};
use crate::engine::table::Table;
use crate::error::{BuildError, ConfigError};
use crate::sync::Arc;
use std::future::Future;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::watch;
use tokio::task::JoinSet;

impl PoolBuilder {
    /// Starts an [`AsyncPool`] on the current tokio runtime: one task per
    /// worker, each with the state `factory(index)` returns (built on the
    /// worker's task, at start and after every panic).
    ///
    /// The settings are the thread pool's, except two: `workers` defaults
    /// to the capacity, up to [`MAX_DEFAULT_ASYNC_WORKERS`](Self::MAX_DEFAULT_ASYNC_WORKERS) (see there why
    /// not the CPU count), and `spin_wait` and `pin_workers` do not apply
    /// (a task never spins; the runtime places it). By default a free
    /// worker takes from any worker's queue; [`steal(false)`](Self::steal) gives
    /// each its own mailbox (see [`AsyncPool`]'s "Dispatch"). To open a
    /// connection (or anything async) per worker when it starts, use
    /// [`build_async_init`](Self::build_async_init).
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
        let plan = self.plan()?;
        let factory: Arc<AsyncFactory<W>> = Arc::new(factory);
        let initial = (0..plan.table.shard_count()).map(|_| None).collect();
        Ok(plan.start(handle, Maker::Sync(factory), initial))
    }

    /// Starts an [`AsyncPool`] whose workers' state is made by an async
    /// `init`: each worker's `init(index)` is awaited (all of them at once,
    /// each on a task of its own) before any worker starts, so a worker can
    /// open its connection, log in or warm its cache before it takes a
    /// request. The pool is built once every init has answered `Ok`.
    ///
    /// The settings are [`build_async`](Self::build_async)'s, read when
    /// this is called; the workers (and their inits) run on the runtime
    /// that polls the returned future.
    ///
    /// # Errors
    ///
    /// [`BuildError::Config`] for a refused setting or no runtime, as
    /// [`build_async`](Self::build_async); [`BuildError::Init`] if a
    /// worker's init answered `Err`: it names the worker and carries the
    /// error (the first to fail, in the order they failed). Then no pool is
    /// built: the inits still running are cancelled (dropped at their next
    /// `.await`) and waited for, every worker already made is dropped, and
    /// no task of the pool is left running when the error is returned.
    /// Dropping the returned future before it answers cancels the inits the
    /// same way.
    ///
    /// # Panics
    ///
    /// If an init panics, the panic is resumed in the task awaiting this
    /// future, once the other inits are cancelled and the workers made are
    /// dropped (as [`std::thread::scope`] resumes a scoped thread's panic):
    /// a panic is a bug, not a failure to start, and no pool is built.
    ///
    /// # After a panic
    ///
    /// A worker whose handler panics drops its state and awaits `init`
    /// again (on its own task, after the panicking request's caller has
    /// been told [`Error::WorkerPanicked`](crate::Error::WorkerPanicked)).
    /// If that init fails or panics, its error is dropped, and the worker
    /// tries once more for each request it then takes; a request it takes
    /// without state is answered [`Error::WorkerPanicked`](crate::Error::WorkerPanicked).
    /// The other workers serve on meanwhile (by default every free worker
    /// takes queued requests; see [`steal`](Self::steal)).
    ///
    /// # Examples
    ///
    /// Each worker owns a connection, opened when the pool starts:
    ///
    /// ```
    /// use sidejob::{AsyncWorker, BuildError, Pool};
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// use tokio::net::{TcpListener, TcpStream};
    ///
    /// struct Conn(TcpStream);
    ///
    /// impl AsyncWorker for Conn {
    ///     type Request = u8;
    ///     type Reply = std::io::Result<u8>;
    ///     type Message = ();
    ///     async fn handle_call(&mut self, byte: u8) -> std::io::Result<u8> {
    ///         self.0.write_all(&[byte]).await?;
    ///         self.0.read_u8().await
    ///     }
    ///     async fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// runtime.block_on(async {
    ///     // An echo server on 127.0.0.1.
    ///     let listener = TcpListener::bind("127.0.0.1:0").await?;
    ///     let addr = listener.local_addr()?;
    ///     tokio::spawn(async move {
    ///         while let Ok((mut stream, _)) = listener.accept().await {
    ///             tokio::spawn(async move {
    ///                 let (mut read, mut write) = stream.split();
    ///                 let _ = tokio::io::copy(&mut read, &mut write).await;
    ///             });
    ///         }
    ///     });
    ///
    ///     let pool = Pool::builder()
    ///         .capacity(16)
    ///         .workers(4)
    ///         .build_async_init(move |_index| async move {
    ///             Ok::<_, std::io::Error>(Conn(TcpStream::connect(addr).await?))
    ///         })
    ///         .await?;
    ///     assert_eq!(pool.call_async(7).await??, 7);
    ///     pool.shutdown_async().await;
    ///
    ///     // Nobody listens there any more: the build fails, naming a worker.
    ///     drop(pool);
    ///     let closed = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    ///     let failed = Pool::builder()
    ///         .capacity(4)
    ///         .workers(2)
    ///         .build_async_init(move |_| async move {
    ///             Ok::<_, std::io::Error>(Conn(TcpStream::connect(closed).await?))
    ///         })
    ///         .await;
    ///     match failed {
    ///         Err(BuildError::Init { worker, error }) => {
    ///             assert!(worker < 2);
    ///             assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
    ///         }
    ///         other => panic!("expected a failed init, got {:?}", other.map(|_| ())),
    ///     }
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn build_async_init<W, F, Fut, E>(
        &self,
        init: F,
    ) -> impl Future<Output = Result<AsyncPool<W>, BuildError<E>>> + Send + 'static
    where
        W: AsyncWorker,
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<W, E>> + Send + 'static,
        E: Send + 'static,
    {
        let plan = self.plan();
        async move {
            let plan = plan?;
            let handle = Handle::try_current().map_err(|_| ConfigError::no_runtime("workers"))?;
            let init = Arc::new(init);
            let initial = init_all(&handle, &init, plan.table.shard_count()).await?;
            // After a panic, a worker awaits its init again; its error has
            // nobody to go to, and is dropped (`worker.rs`).
            let reinit: Arc<AsyncInit<W>> = Arc::new(move |index| {
                let made = init(index);
                Box::pin(async move {
                    match made.await {
                        Ok(worker) => Some(worker),
                        Err(error) => {
                            drop_quietly(error);
                            None
                        }
                    }
                })
            });
            let initial = initial.into_iter().map(Some).collect();
            Ok(plan.start(&handle, Maker::Async(reinit), initial))
        }
    }

    /// Checks the settings and makes the table.
    fn plan(&self) -> Result<Plan, ConfigError> {
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
            .with_policy(&self.policy)?
            .with_keys(&self.keys)?;
        Ok(Plan {
            name,
            named: self.name.is_some(),
            table: Arc::new(table),
            capacity,
            steal: self.steal.unwrap_or(DEFAULT_STEAL),
        })
    }
}

/// A pool's checked settings and its table, before any worker starts.
struct Plan {
    name: Arc<str>,
    named: bool,
    table: Arc<Table>,
    capacity: usize,
    steal: bool,
}

impl Plan {
    /// Spawns the workers on `handle`, worker `index` starting with
    /// `initial[index]` (or, if `None`, making its state first thing).
    fn start<W: AsyncWorker>(
        self,
        handle: &Handle,
        maker: Maker<W>,
        initial: Vec<Option<W>>,
    ) -> AsyncPool<W> {
        let Plan {
            name,
            named,
            table,
            capacity,
            steal,
        } = self;
        let multi_thread = handle.runtime_flavor() == RuntimeFlavor::MultiThread;
        let (mailboxes, inboxes) = mailboxes(table.shard_count(), capacity, steal, multi_thread);
        let (done, alive) = watch::channel(());
        let feed: std::sync::Arc<crate::adaptive::FeedSlot> = Default::default();
        for ((index, inbox), initial) in inboxes.into_iter().enumerate().zip(initial) {
            let worker = TaskLoop {
                index,
                table: Arc::clone(&table),
                inbox,
                maker: maker.clone(),
                initial,
                _alive: alive.clone(),
                ended: false,
                feed: std::sync::Arc::clone(&feed),
                owners: mailboxes.own_senders(),
            };
            // Detached: `done` says when it ends.
            drop(handle.spawn(worker.run()));
        }
        drop(alive);
        AsyncPool {
            inner: Arc::new(Inner {
                table,
                mailboxes,
                name,
                named,
                done,
                feed,
            }),
        }
    }
}

/// Awaits `init(index)` for every worker, each on a task of its own; every
/// worker's state, in index order. On the first failure (or panic), the
/// other inits are cancelled and waited for and the states made so far
/// dropped, then the error is returned (or the panic resumed).
async fn init_all<W, F, Fut, E>(
    handle: &Handle,
    init: &Arc<F>,
    workers: usize,
) -> Result<Vec<W>, BuildError<E>>
where
    W: AsyncWorker,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<W, E>> + Send + 'static,
    E: Send + 'static,
{
    let mut inits = JoinSet::new();
    for index in 0..workers {
        let init = Arc::clone(init);
        // Calling `init` is user code: on the task, where a panic is caught.
        inits.spawn_on(async move { (index, init(index).await) }, handle);
    }
    let mut made: Vec<Option<W>> = (0..workers).map(|_| None).collect();
    let failure = loop {
        match inits.join_next().await {
            None => break None,
            Some(Ok((index, Ok(worker)))) => made[index] = Some(worker),
            Some(Ok((index, Err(error)))) => {
                break Some(Err(BuildError::Init {
                    worker: index,
                    error,
                }))
            }
            Some(Err(joined)) => break Some(Ok(joined)),
        }
    };
    let Some(failure) = failure else {
        // Every init answered `Ok`: every slot is filled.
        return Ok(made.into_iter().flatten().collect());
    };
    // Cancel the rest and wait for them: no init outlives the build. What
    // they made, and what was made before, is dropped here, in no lock;
    // a `Drop` that panics does not stop the others being dropped.
    inits.abort_all();
    while let Some(joined) = inits.join_next().await {
        drop_quietly(joined);
    }
    each_quietly(made, drop);
    match failure {
        Err(error) => Err(error),
        Ok(joined) => match joined.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            // Cancelled, not by us: the runtime is shutting down.
            Err(_) => Err(BuildError::Config(ConfigError::no_runtime("workers"))),
        },
    }
}
