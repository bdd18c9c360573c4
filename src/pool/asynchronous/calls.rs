//! Requests to an async pool: `call_async` (and its timed and `try_` forms) and `cast`, each admitted on a unit of the table, then sent to that unit's worker task.

use super::current::calling_worker;
use super::deadline_after;
use super::mailbox::Envelope;
use super::worker::AsyncWorker;
use super::{AsyncPool, How, Inner, ReplyReceiver};
use crate::engine::ask::Ask;
use crate::error::{Error, Refused, TryCallError};
use crate::sync::{now, Arc};
use std::future::Future;
use std::time::{Duration, Instant};

/// How far past a timer's deadline tokio looks: it rounds the deadline up
/// to its next millisecond by adding 999,999 ns, unchecked
/// (`TimeSource::deadline_to_tick`, `tokio/src/runtime/time/source.rs`).
const TIMER_ROUNDING: Duration = Duration::from_millis(1);

/// The deadline of a call that waits `timeout` from `now`: `None` (no
/// deadline) when it is past the largest `Instant`, or so close to it that
/// tokio's rounding would overflow and panic in the caller's task. A wait
/// that long never ends anyway.
fn call_deadline(now: Instant, timeout: Duration) -> Option<Instant> {
    deadline_after(now, timeout).filter(|deadline| deadline.checked_add(TIMER_ROUNDING).is_some())
}

/// Where a call stands when its future is returned.
enum Pending<W: AsyncWorker, T> {
    /// Admitted and sent: the reply (or nothing, for a cast) is awaited.
    Sent(T),
    /// Every shard was full and the pool has a waiting room: the future
    /// waits for a unit, then sends.
    Wait(Arc<Inner<W>>, Unsent<W>),
    /// Refused at once.
    Refused(Error),
}

/// A request or message waiting for a unit.
pub(super) enum Unsent<W: AsyncWorker> {
    Call(W::Request),
    Cast(W::Message),
}

impl<W: AsyncWorker> AsyncPool<W> {
    /// Sends `request` now and returns a future of its reply.
    ///
    /// Admission happens here, when `call_async` is called, not when the
    /// future is first polled: a full pool refuses at once (the future then
    /// resolves to the error immediately), and an admitted request runs even
    /// if the future is never polled. With a waiting room
    /// ([`PoolBuilder::max_waiters`](crate::PoolBuilder::max_waiters)) a refused caller's future waits for a
    /// unit, in the room's order, for up to
    /// [`max_wait`](crate::PoolBuilder::max_wait). A worker of this pool never
    /// waits for its capacity.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`]: every shard was at its limit (and the waiting
    ///   room, if any, was full).
    /// * [`Error::Timeout`]: it waited `max_wait` for capacity in vain.
    /// * [`Error::Shutdown`]: the pool is shut down.
    /// * [`Error::WorkerPanicked`]: the handler panicked on this request.
    /// * [`Error::CallingSelf`]: called from a handler of this pool, which
    ///   has one worker: the call could only queue behind its caller.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not cancel a request that was sent: it will
    /// be handled, and its unit released when it is; only the reply is
    /// dropped. A request still waiting for capacity is not sent: dropping
    /// the future gives up the wait and drops the request, and a unit
    /// handed to it meanwhile goes to the next waiter.
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
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let replies = runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(64).build_async(|_| Echo)?;
    ///     let calls: Vec<_> = (0..8).map(|n| pool.call_async(n)).collect();
    ///     let mut replies = Vec::new();
    ///     for call in calls {
    ///         replies.push(call.await?);
    ///     }
    ///     Ok::<_, Box<dyn std::error::Error>>(replies)
    /// })?;
    /// assert_eq!(replies, (0..8).collect::<Vec<u8>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_async(
        &self,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        let pending = self.start_call(request);
        async move {
            let reply = match pending {
                Pending::Sent(reply) => reply,
                Pending::Refused(error) => return Err(error),
                Pending::Wait(inner, job) => inner.wait_and_call(job, None).await?,
            };
            // A dropped reply slot means the worker is gone.
            reply.await.unwrap_or(Err(Error::Shutdown))
        }
    }

    /// Like [`call_async`](Self::call_async), but the future gives up after
    /// `timeout` with [`Error::Timeout`].
    ///
    /// The timeout covers both waits, for capacity (with a waiting room)
    /// and for the reply. As with Erlang's `gen_server:call`, a request
    /// that timed out may still run: it was admitted. Its unit is released
    /// when the worker finishes it, and its reply is dropped. A timeout
    /// that ends within a millisecond of the largest `Instant`, or past it,
    /// is no timeout: the call waits as long as it takes.
    ///
    /// # Errors
    ///
    /// As [`call_async`](Self::call_async), plus [`Error::Timeout`].
    ///
    /// # Panics
    ///
    /// The future panics when polled outside a tokio runtime with timers
    /// enabled (`enable_time`, or `enable_all`), as `tokio::time::timeout`
    /// does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::{AsyncWorker, Error, Pool};
    ///
    /// /// Never answers until told to.
    /// struct Stuck(std::sync::Arc<tokio::sync::Notify>);
    /// impl AsyncWorker for Stuck {
    ///     type Request = (); type Reply = (); type Message = ();
    ///     async fn handle_call(&mut self, _: ()) { self.0.notified().await }
    ///     async fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    /// runtime.block_on(async {
    ///     let go = std::sync::Arc::new(tokio::sync::Notify::new());
    ///     let pool = {
    ///         let go = go.clone();
    ///         Pool::builder().capacity(1).workers(1).build_async(move |_| Stuck(go.clone()))?
    ///     };
    ///     let answer = pool.call_timeout((), Duration::from_millis(10)).await;
    ///     assert_eq!(answer, Err(Error::Timeout));
    ///     assert_eq!(pool.usage(), 1); // still admitted: it ends when told
    ///     go.notify_one();
    ///     pool.shutdown_async().await;
    ///     assert_eq!(pool.usage(), 0);
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_timeout(
        &self,
        request: W::Request,
        timeout: Duration,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        // One deadline for the wait for capacity and the wait for the reply.
        let deadline = call_deadline(now(), timeout);
        let pending = self.start_call(request);
        async move {
            let reply = match pending {
                Pending::Sent(reply) => reply,
                Pending::Refused(error) => return Err(error),
                Pending::Wait(inner, job) => inner.wait_and_call(job, deadline).await?,
            };
            let Some(deadline) = deadline else {
                return reply.await.unwrap_or(Err(Error::Shutdown));
            };
            match tokio::time::timeout_at(deadline.into(), reply).await {
                Ok(outcome) => outcome.unwrap_or(Err(Error::Shutdown)),
                Err(_elapsed) => Err(Error::Timeout),
            }
        }
    }

    /// Sends `message` to a worker, without waiting for it to be handled;
    /// the future answers once it is admitted.
    ///
    /// As with [`call_async`](Self::call_async), admission is tried when
    /// `cast` is called: without a waiting room the future is ready at
    /// once, and a message admitted is handled even if the future is never
    /// polled. With a waiting room, a refused message waits for a unit in
    /// the future (a worker of this pool never waits). `Ok` means admitted:
    /// the message will be handled exactly once, even if the pool shuts
    /// down first. A panic in its handler is counted in
    /// [`Stats::panicked`](crate::Stats::panicked); nobody else is told.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] when every shard is at its limit (and the room,
    /// if any, is full), [`Error::Timeout`] when it waited `max_wait` in
    /// vain, [`Error::Shutdown`] once the pool is shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// # struct Sink;
    /// # impl AsyncWorker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u64;
    /// #     async fn handle_call(&mut self, _: ()) {}
    /// #     async fn handle_cast(&mut self, _: u64) {}
    /// # }
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(100).build_async(|_| Sink)?;
    ///     for n in 0..10 {
    ///         pool.cast(n).await?;
    ///     }
    ///     pool.shutdown_async().await;
    ///     assert_eq!(pool.stats().completed, 10);
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast(
        &self,
        message: W::Message,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        let can_wait = self.inner.table.has_room() && self.calling_worker().is_none();
        let how = if can_wait { How::Probe } else { How::Try };
        let pending = match self.submit_cast(how, message) {
            Ok(()) => Pending::Sent(()),
            Err(refused) if can_wait && refused.error() == Error::Overload => {
                let (_, message) = refused.into_parts();
                Pending::Wait(Arc::clone(&self.inner), Unsent::Cast(message))
            }
            Err(refused) => Pending::Refused(refused.error()),
        };
        async move {
            match pending {
                Pending::Sent(()) => Ok(()),
                Pending::Refused(error) => Err(error),
                Pending::Wait(inner, job) => inner.wait_and_send(job, None).await.map(drop),
            }
        }
    }

    /// Sends `request` as what `ask` describes (its units; failing fast or
    /// waiting for them) and returns a future of its reply: the async
    /// pool's [`Pool::call_with`](crate::Pool::call_with).
    ///
    /// The request holds `ask.unit_count()` units, all or nothing, from its
    /// admission until its handler's future has finished (they go back
    /// before the reply). [`call_async`](Self::call_async) is
    /// `call_with_async(Ask::new(), request)`, and an ask of one unit takes
    /// its path. Admission is tried when this is called, as for
    /// `call_async`; a waiting ask that finds its units taken waits in the
    /// future, in the pool's waiting room
    /// ([`PoolBuilder::max_waiters`](crate::PoolBuilder::max_waiters)),
    /// until its [`deadline`](Ask::wait_until) at the latest and never past
    /// [`max_wait`](crate::PoolBuilder::max_wait); smaller requests pass it
    /// as far as the room's [`pass_budget`](crate::PoolBuilder::pass_budget)
    /// allows. The deadline bounds the wait for units, not for the reply.
    ///
    /// # Errors
    ///
    /// * [`Error::TooLarge`]: an ask of 0 units, or of more than the
    ///   capacity in force.
    /// * [`Error::Overload`]: the units were not free (and the ask fails
    ///   fast, or the room was full).
    /// * [`Error::Timeout`]: its wait for units ran out.
    /// * [`Error::Shutdown`], [`Error::WorkerPanicked`],
    ///   [`Error::CallingSelf`]: as for [`call_async`](Self::call_async).
    ///
    /// # Cancel safety
    ///
    /// As [`call_async`](Self::call_async): a request that was sent is
    /// handled and gives every unit back when it is, whether or not the
    /// future is still there; dropping a future that still waits for its
    /// units drops the request, and units handed to it meanwhile go to the
    /// next waiter or back to the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Error, Pool};
    /// use sidejob::units::Ask;
    /// # struct Len;
    /// # impl AsyncWorker for Len {
    /// #     type Request = Vec<u8>; type Reply = usize; type Message = ();
    /// #     async fn handle_call(&mut self, bytes: Vec<u8>) -> usize { bytes.len() }
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(8).build_async(|_| Len)?;
    ///     let upload = pool.call_with_async(Ask::new().units(6), vec![0; 100]);
    ///     assert_eq!(pool.usage(), 6); // admitted when called
    ///     let refused = pool.call_with_async(Ask::new().units(3).fail_fast(), vec![]);
    ///     assert_eq!(refused.await, Err(Error::Overload));
    ///     assert_eq!(upload.await?, 100);
    ///     assert_eq!(pool.usage(), 0);
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_with_async(
        &self,
        ask: Ask,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        let me = self.calling_worker();
        let pending = self.start_with(ask, Unsent::Call(request), me);
        async move {
            let reply = match pending {
                Pending::Sent(reply) => reply,
                Pending::Refused(error) => return Err(error),
                Pending::Wait(inner, job) => inner.wait_with(ask, job, me).await?,
            };
            let Some(reply) = reply else {
                // A call's job always gives a receiver.
                return Err(Error::Shutdown);
            };
            reply.await.unwrap_or(Err(Error::Shutdown))
        }
    }

    /// Sends `message` as what `ask` describes, without waiting for it to
    /// be handled; the future answers once it is admitted: the async
    /// pool's [`Pool::cast_with`](crate::Pool::cast_with).
    ///
    /// The message holds `ask.unit_count()` units, all or nothing, from its
    /// admission until its handler's future has finished; it waits for
    /// them as [`call_with_async`](Self::call_with_async) does (a worker of
    /// this pool never waits). [`cast`](Self::cast) is
    /// `cast_with(Ask::new(), message)`. `Ok` means admitted: handled
    /// exactly once, every unit given back, even if the handler panics.
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`] for 0 units or more than the capacity in force,
    /// [`Error::Overload`] when the units were not free (and it fails fast,
    /// or the room was full), [`Error::Timeout`] when its wait ran out,
    /// [`Error::Shutdown`] once the pool is shut down.
    ///
    /// # Cancel safety
    ///
    /// A message admitted when `cast_with` was called is handled whatever
    /// becomes of the future; dropping a future that still waits for its
    /// units drops the message and returns whatever was handed to it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// use sidejob::units::Ask;
    /// # struct Sink;
    /// # impl AsyncWorker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u64;
    /// #     async fn handle_call(&mut self, _: ()) {}
    /// #     async fn handle_cast(&mut self, _: u64) {}
    /// # }
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(8).build_async(|_| Sink)?;
    ///     pool.cast_with(Ask::new().units(5), 1).await?;
    ///     pool.cast_with(Ask::new().units(3), 2).await?;
    ///     pool.shutdown_async().await;
    ///     assert_eq!(pool.usage(), 0);
    ///     assert_eq!(pool.stats().completed, 8); // counted in units
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast_with(
        &self,
        ask: Ask,
        message: W::Message,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        // A worker's cast needs no reply: it may go to any shard, as
        // `cast`'s does, and waits as anyone's.
        let pending = self.start_with(ask, Unsent::Cast(message), None);
        async move {
            match pending {
                Pending::Sent(_) => Ok(()),
                Pending::Refused(error) => Err(error),
                Pending::Wait(inner, job) => inner.wait_with(ask, job, None).await.map(drop),
            }
        }
    }

    /// Like [`call_async`](Self::call_async), but never waits for capacity,
    /// and a request that is not admitted is handed back in the error.
    ///
    /// # Errors
    ///
    /// * [`TryCallError::Refused`], holding the request: [`Error::Overload`],
    ///   [`Error::Shutdown`] or [`Error::CallingSelf`].
    /// * [`TryCallError::Failed`]: admitted, but no reply will come
    ///   ([`Error::WorkerPanicked`], or [`Error::Shutdown`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Error, Pool};
    /// # struct Len;
    /// # impl AsyncWorker for Len {
    /// #     type Request = Vec<u8>; type Reply = usize; type Message = ();
    /// #     async fn handle_call(&mut self, bytes: Vec<u8>) -> usize { bytes.len() }
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(4).build_async(|_| Len)?;
    ///     assert_eq!(pool.try_call(vec![1, 2, 3]).await?, 3);
    ///     pool.shutdown();
    ///     let refused = pool.try_call(vec![4]).await.unwrap_err();
    ///     assert_eq!(refused.error(), Error::Shutdown);
    ///     assert_eq!(refused.into_request(), Some(vec![4])); // not lost
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_call(
        &self,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, TryCallError<W::Request>>> + Send + 'static {
        let submitted = self.submit_call(How::Try, request);
        async move {
            let reply = submitted?;
            reply
                .await
                .unwrap_or(Err(Error::Shutdown))
                .map_err(TryCallError::Failed)
        }
    }

    /// Like [`cast`](Self::cast), but never waits, and a message that is
    /// not admitted is handed back. Not async: it answers at once.
    ///
    /// # Errors
    ///
    /// [`Refused`] holding the message: [`Error::Overload`] when every
    /// shard is at its limit, [`Error::Shutdown`] once the pool is shut
    /// down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// # struct Sink;
    /// # impl AsyncWorker for Sink {
    /// #     type Request = (); type Reply = (); type Message = String;
    /// #     async fn handle_call(&mut self, _: ()) {}
    /// #     async fn handle_cast(&mut self, _: String) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let _guard = runtime.enter();
    /// let pool = Pool::builder().capacity(4).build_async(|_| Sink)?;
    /// pool.try_cast("kept".to_string())?;
    /// pool.shutdown();
    /// let refused = pool.try_cast("returned".to_string()).unwrap_err();
    /// assert!(refused.is_shutdown());
    /// assert_eq!(refused.into_inner(), "returned");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_cast(&self, message: W::Message) -> Result<(), Refused<W::Message>> {
        self.submit_cast(How::Try, message)
    }

    #[inline]
    pub(super) fn calling_worker(&self) -> Option<usize> {
        calling_worker(&self.inner.table)
    }

    /// Tries admission for a call and sends it; or says how its future
    /// waits.
    fn start_call(&self, request: W::Request) -> Pending<W, ReplyReceiver<W>> {
        // A worker of this pool never waits for its capacity (a unit handed
        // over could be its own shard's, which only it serves).
        let can_wait = self.inner.table.has_room() && self.calling_worker().is_none();
        let how = if can_wait { How::Probe } else { How::Try };
        match self.submit_call(how, request) {
            Ok(reply) => Pending::Sent(reply),
            Err(refused) if can_wait && refused.error() == Error::Overload => {
                let (_, request) = refused.into_parts();
                Pending::Wait(Arc::clone(&self.inner), Unsent::Call(request))
            }
            // A refused request is dropped now, not kept in the future.
            Err(refused) => Pending::Refused(refused.error()),
        }
    }

    /// Admits one unit and posts a call; the receiver of its reply, or the
    /// request back.
    #[inline]
    pub(super) fn submit_call(
        &self,
        how: How,
        request: W::Request,
    ) -> Result<ReplyReceiver<W>, Refused<W::Request>> {
        let admitted = match self.calling_worker() {
            None => self.inner.table.admit_one(how),
            Some(worker) => self.inner.table.admit_from_worker(how, worker),
        };
        let shard = match admitted {
            Ok(shard) => shard,
            Err(error) => return Err(Refused::new(error, request)),
        };
        let (reply, receiver) = oneshot::channel();
        match self.inner.deliver(shard, Envelope::Call(request, reply)) {
            Ok(()) => Ok(receiver),
            Err(Envelope::Call(request, _)) => Err(Refused::new(Error::Shutdown, request)),
            Err(_) => unreachable!("a mailbox hands back the envelope it was given"),
        }
    }

    /// Admits one unit and posts a cast, or hands the message back. A
    /// worker's cast needs no reply, so it may go to any shard, its own
    /// included.
    #[inline]
    pub(super) fn submit_cast(
        &self,
        how: How,
        message: W::Message,
    ) -> Result<(), Refused<W::Message>> {
        let shard = match self.inner.table.admit_one(how) {
            Ok(shard) => shard,
            Err(error) => return Err(Refused::new(error, message)),
        };
        match self.inner.deliver(shard, Envelope::Cast(message)) {
            Ok(()) => Ok(()),
            Err(Envelope::Cast(message)) => Err(Refused::new(Error::Shutdown, message)),
            Err(_) => unreachable!("a mailbox hands back the envelope it was given"),
        }
    }

    /// Tries admission for `job` as `ask` describes and sends it; or says
    /// how its future waits. `me` is the calling worker, for a call.
    fn start_with(
        &self,
        ask: Ask,
        job: Unsent<W>,
        me: Option<usize>,
    ) -> Pending<W, Option<ReplyReceiver<W>>> {
        let can_wait = !ask.is_fail_fast() && self.inner.table.has_room() && me.is_none();
        if ask.is_one() {
            // The one-unit path: `call_async`'s and `cast`'s envelopes.
            let how = if can_wait { How::Probe } else { How::Try };
            let sent = match job {
                Unsent::Call(request) => self
                    .submit_call(how, request)
                    .map(Some)
                    .map_err(|refused| (refused.error(), Unsent::Call(refused.into_inner()))),
                Unsent::Cast(message) => self
                    .submit_cast(how, message)
                    .map(|()| None)
                    .map_err(|refused| (refused.error(), Unsent::Cast(refused.into_inner()))),
            };
            return match sent {
                Ok(reply) => Pending::Sent(reply),
                Err((Error::Overload, job)) if can_wait => {
                    Pending::Wait(Arc::clone(&self.inner), job)
                }
                // A refused request is dropped now, not kept in the future.
                Err((error, _)) => Pending::Refused(error),
            };
        }
        if ask.units == 0 {
            return Pending::Refused(Error::TooLarge);
        }
        // First a take that does not wait (uncounted if a wait follows:
        // the wait counts its own outcome), then, refused, the future
        // waits.
        let first = match me {
            Some(me) => self.inner.admit_weighed_from_worker(&ask, me),
            None => {
                let how = if can_wait { How::Probe } else { How::Try };
                self.inner.table.admit(&Ask { how, ..ask })
            }
        };
        match first {
            Ok(grant) => match self.inner.deliver_weighed(grant, job, me) {
                Ok(reply) => Pending::Sent(reply),
                Err(error) => Pending::Refused(error),
            },
            Err(Error::Overload) if can_wait => Pending::Wait(Arc::clone(&self.inner), job),
            Err(error) => Pending::Refused(error),
        }
    }
}
