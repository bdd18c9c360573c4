//! Requests: `call` (and its timed, async and `try_` forms) and `cast`, each admitted on a unit of the table, then delivered to that unit's worker; `call_with` and `cast_with`, of what an [`Ask`] describes.

use super::{deadline_after, wait_reply, wait_reply_until, How, Inner, Pool, ReplyReceiver};
use crate::engine::ask::Ask;
use crate::engine::table::Grant;
use crate::error::{Error, Refused, TryCallError};
use crate::pool::worker::{Envelope, Heavy, Weighed, Worker};
use crate::pool::worker_loop::calling_worker;
use crate::sync::{now, Arc};
use std::future::Future;
use std::time::Duration;

/// Where a [`Pool::call_async`] stands when it returns its future.
enum Pending<W: Worker> {
    /// Admitted and sent: the reply is awaited.
    Reply(ReplyReceiver<W>),
    /// Every shard was full and the pool has a waiting room: the future
    /// waits for a unit, then sends the request.
    Wait(Arc<Inner<W>>, W::Request),
    /// Refused at once.
    Refused(Error),
}

impl<W: Worker> Pool<W> {
    /// Sends `request` to a worker and waits for its reply.
    ///
    /// If every shard is full, the request is refused at once, unless the
    /// pool has a waiting room ([`PoolBuilder::max_waiters`](crate::PoolBuilder::max_waiters)): then the
    /// caller waits for a unit, in the room's order, for up to
    /// [`max_wait`](crate::PoolBuilder::max_wait). Once admitted, the caller spins
    /// briefly, then sleeps until the reply comes. A worker of this pool
    /// calling it never waits for capacity.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`]: every shard was at its limit (and the waiting
    ///   room, if any, was full); the request was not sent. (Use
    ///   [`try_call`](Self::try_call) to get it back.)
    /// * [`Error::Timeout`]: it waited `max_wait` for capacity and got
    ///   none; the request was not sent.
    /// * [`Error::Shutdown`]: the pool is shut down.
    /// * [`Error::WorkerPanicked`]: the handler panicked on this request.
    /// * [`Error::CallingSelf`]: called from a handler of this very pool,
    ///   which has a single worker: the call could only be queued behind
    ///   the caller. (With more workers, a worker's call goes to another
    ///   one; a cycle through two pools, or two busy workers calling each
    ///   other, still deadlocks: use [`call_timeout`](Self::call_timeout)
    ///   there.)
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = String; type Reply = String; type Message = ();
    /// #     fn handle_call(&mut self, s: String) -> String { s }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(4).build(|_| Echo)?;
    /// assert_eq!(pool.call("hi".to_string())?, "hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call(&self, request: W::Request) -> Result<W::Reply, Error> {
        let reply = self.submit_call(How::Wait(None), request)?;
        wait_reply(reply, self.inner.spin)
    }

    /// Like [`call`](Self::call), but gives up waiting after `timeout`.
    ///
    /// As with Erlang's `gen_server:call`, a request that timed out may
    /// still run later: it was admitted and sits in (or is being handled
    /// by) its worker's queue. Its unit is released when the worker
    /// finishes it, and its reply is dropped.
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call), plus [`Error::Timeout`] when no reply came
    /// within `timeout`. The timeout covers both waits: for capacity (if the
    /// pool has a waiting room) and for the reply.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use std::sync::mpsc;
    /// use sidejob::{Error, Pool, Worker};
    ///
    /// struct Slow(mpsc::Receiver<()>);
    /// impl Worker for Slow {
    ///     type Request = (); type Reply = (); type Message = ();
    ///     fn handle_call(&mut self, _: ()) { let _ = self.0.recv(); }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let (go, gate) = mpsc::channel();
    /// let gate = std::sync::Mutex::new(Some(gate));
    /// let pool = Pool::builder().capacity(1).workers(1)
    ///     .build(move |_| Slow(gate.lock().unwrap().take().unwrap()))?;
    ///
    /// let answer = pool.call_timeout((), Duration::from_millis(10));
    /// assert_eq!(answer, Err(Error::Timeout));
    /// assert_eq!(pool.usage(), 1); // still admitted: it runs when the gate opens
    /// go.send(()).unwrap();
    /// pool.shutdown();
    /// assert_eq!(pool.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_timeout(&self, request: W::Request, timeout: Duration) -> Result<W::Reply, Error> {
        // One deadline for the wait for capacity and the wait for the reply.
        let deadline = deadline_after(now(), timeout);
        let reply = self.submit_call(How::Wait(deadline), request)?;
        let spin = self.inner.spin.min(timeout);
        match deadline {
            Some(deadline) => wait_reply_until(reply, spin, deadline),
            None => wait_reply(reply, spin),
        }
    }

    /// Sends `request` now and returns a future of its reply, for async
    /// callers: awaiting it never blocks the executor's thread.
    ///
    /// Admission happens here, when `call_async` is called, not when the
    /// future is first polled: an overloaded pool refuses at once (the
    /// future then resolves to the error immediately), and an admitted
    /// request runs even if the future is never polled. The future is
    /// `Send + 'static` and works on any executor.
    ///
    /// Made from a handler of this pool, it is admitted as
    /// [`call`](Self::call) is (never on the caller's own worker, or
    /// [`Error::CallingSelf`]): a worker that blocks on the future would
    /// otherwise wait for itself.
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not cancel a request that was sent: it
    /// will be handled, and its unit is released when it is. Only the
    /// reply is dropped. A request still waiting for capacity (a pool with
    /// a waiting room) is not sent: dropping the future gives up the wait
    /// and drops the request, and a unit handed to it meanwhile goes to the
    /// next waiter. While it waits, the future holds a handle of the pool,
    /// so the pool does not shut down from its last handle's drop until
    /// the wait ends (`max_wait` at the latest).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(64).build(|_| Echo)?;
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let replies = runtime.block_on(async {
    ///     let calls: Vec<_> = (0..8).map(|n| pool.call_async(n)).collect();
    ///     let mut replies = Vec::new();
    ///     for call in calls {
    ///         replies.push(call.await?);
    ///     }
    ///     Ok::<_, sidejob::Error>(replies)
    /// })?;
    /// assert_eq!(replies, (0..8).collect::<Vec<u8>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_async(
        &self,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        // Admission is tried now; only a caller that may wait keeps the
        // request (and a handle of the pool) in the future.
        // A worker of this pool never waits for its capacity (see
        // `admit_from_worker`).
        let can_wait = self.inner.table.has_room() && calling_worker(&self.inner.table).is_none();
        let how = if can_wait { How::Probe } else { How::Try };
        let pending = match self.submit_call(how, request) {
            Ok(reply) => Pending::Reply(reply),
            Err(refused) if can_wait && refused.error() == Error::Overload => {
                let (_, request) = refused.into_parts();
                Pending::Wait(Arc::clone(&self.inner), request)
            }
            // A refused request is dropped now, not kept in the future.
            Err(refused) => Pending::Refused(refused.error()),
        };
        async move {
            let reply = match pending {
                Pending::Reply(reply) => reply,
                Pending::Refused(error) => return Err(error),
                Pending::Wait(inner, request) => {
                    let shard = inner.table.acquire_async(None).await?;
                    let (reply, receiver) = oneshot::channel();
                    if inner
                        .deliver(shard, Envelope::Call(request, reply))
                        .is_err()
                    {
                        return Err(Error::Shutdown);
                    }
                    receiver
                }
            };
            // A dropped reply slot means the worker is gone.
            reply.await.unwrap_or(Err(Error::Shutdown))
        }
    }

    /// Sends `message` to a worker without waiting for it to be handled.
    ///
    /// Waits for capacity only under the pool's waiting policy (by default
    /// it never does), as [`call`](Self::call) does. `Ok` means admitted:
    /// the message will be handled exactly once, even if the pool shuts
    /// down first. If its handler panics, the panic is counted in
    /// [`Stats::panicked`](crate::Stats::panicked) and the worker is rebuilt; nobody else is told.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] when every shard is at its limit (and the
    /// waiting room, if any, is full), [`Error::Timeout`] when it waited
    /// `max_wait` in vain, [`Error::Shutdown`] once the pool is shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u64;
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: u64) {}
    /// # }
    /// let pool = Pool::builder().capacity(100).build(|_| Sink)?;
    /// for n in 0..10 {
    ///     pool.cast(n)?;
    /// }
    /// pool.shutdown();
    /// assert_eq!(pool.stats().completed, 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast(&self, message: W::Message) -> Result<(), Error> {
        Ok(self.submit_cast(How::Wait(None), message)?)
    }

    /// Sends `request` as what `ask` describes (its units; failing fast
    /// or waiting for them) and waits for its reply.
    ///
    /// The request holds `ask.unit_count()` units of the capacity, all or
    /// nothing, from its admission until its handler has finished (they
    /// go back before the reply, as a call's one unit does): a request
    /// that costs the pool four times the usual work can hold four units.
    /// [`call`](Self::call) is `call_with(Ask::new(), request)`, and an ask
    /// of one unit takes `call`'s path.
    ///
    /// A waiting ask (the default) waits in the pool's waiting room
    /// ([`PoolBuilder::max_waiters`](crate::PoolBuilder::max_waiters)),
    /// until its [`deadline`](Ask::wait_until) at the latest and never past
    /// [`max_wait`](crate::PoolBuilder::max_wait); how far later, smaller
    /// requests may pass it is the room's
    /// [`pass_budget`](crate::PoolBuilder::pass_budget). Without a room, or
    /// with [`fail_fast`](Ask::fail_fast), it never waits. The deadline
    /// bounds the wait for units, not the wait for the reply. A worker of
    /// this pool calling it never waits for capacity, and its request is
    /// never queued behind itself (a request of many units whose units
    /// all came from the caller's own shard is refused with `Overload`).
    ///
    /// # Errors
    ///
    /// * [`Error::TooLarge`]: the ask is of more units than the capacity in
    ///   force (it could never be admitted), or of 0 units (a request holds
    ///   at least one: the unit of the worker it is queued on).
    /// * [`Error::Overload`]: the units were not free (and the ask fails
    ///   fast, or the waiting room was full); the request was not sent.
    /// * [`Error::Timeout`]: its wait for units ran out (its deadline, or
    ///   `max_wait`); the request was not sent.
    /// * [`Error::Shutdown`], [`Error::WorkerPanicked`] and
    ///   [`Error::CallingSelf`], as for [`call`](Self::call).
    ///
    /// # Examples
    ///
    /// A bulk request costs four ordinary ones:
    ///
    /// ```
    /// use sidejob::{units::Ask, Error, Pool, Worker};
    ///
    /// struct Sum;
    /// impl Worker for Sum {
    ///     type Request = Vec<u64>; type Reply = u64; type Message = ();
    ///     fn handle_call(&mut self, batch: Vec<u64>) -> u64 { batch.iter().sum() }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let pool = Pool::builder().capacity(8).workers(2).build(|_| Sum)?;
    /// assert_eq!(pool.call_with(Ask::new().units(4), vec![1, 2, 3])?, 6);
    /// assert_eq!(pool.usage(), 0); // every unit back with the reply
    /// let too_big = pool.call_with(Ask::new().units(9), vec![]);
    /// assert_eq!(too_big, Err(Error::TooLarge));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_with(&self, ask: Ask, request: W::Request) -> Result<W::Reply, Error> {
        if ask.is_one() {
            let reply = self.submit_call(ask.how, request)?;
            return wait_reply(reply, self.inner.spin);
        }
        let reply = self.submit_weighed_call(&ask, request)?;
        wait_reply(reply, self.inner.spin)
    }

    /// Sends `message` as what `ask` describes (its units; failing fast or
    /// waiting for them), without waiting for it to be handled.
    ///
    /// The message holds `ask.unit_count()` units, all or nothing, from its
    /// admission until its handler has finished; it waits for them as
    /// [`call_with`](Self::call_with) does. [`cast`](Self::cast) is
    /// `cast_with(Ask::new(), message)`. `Ok` means admitted: the message
    /// will be handled exactly once, and every unit given back, even if the
    /// handler panics or the pool shuts down first.
    ///
    /// # Errors
    ///
    /// [`Error::TooLarge`] for an ask of 0 units or of more than the
    /// capacity in force, [`Error::Overload`] when the units were not free
    /// (and it fails fast, or the room was full), [`Error::Timeout`] when
    /// its wait ran out, [`Error::Shutdown`] once the pool is shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use sidejob::{units::Ask, Error, Pool, Worker};
    ///
    /// /// Handles each message when the example says so.
    /// struct Gate(mpsc::Receiver<()>);
    /// impl Worker for Gate {
    ///     type Request = (); type Reply = (); type Message = ();
    ///     fn handle_call(&mut self, _: ()) {}
    ///     fn handle_cast(&mut self, _: ()) { let _ = self.0.recv(); }
    /// }
    ///
    /// let (go, gate) = mpsc::channel();
    /// let gate = std::sync::Mutex::new(Some(gate));
    /// let pool = Pool::builder().capacity(4).workers(1)
    ///     .build(move |_| Gate(gate.lock().unwrap().take().unwrap()))?;
    ///
    /// pool.cast_with(Ask::new().units(3), ())?; // holds 3 until handled
    /// assert_eq!(pool.usage(), 3);
    /// let refused = pool.cast_with(Ask::new().units(2).fail_fast(), ());
    /// assert_eq!(refused, Err(Error::Overload));
    /// go.send(()).unwrap();
    /// pool.shutdown(); // handled, then the worker joined
    /// assert_eq!(pool.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast_with(&self, ask: Ask, message: W::Message) -> Result<(), Error> {
        if ask.is_one() {
            return Ok(self.submit_cast(ask.how, message)?);
        }
        let grant = self.inner.admit_weighed(&ask, None)?;
        let shard = grant.shard;
        let weighed = Box::new(Weighed {
            grant,
            job: Heavy::Cast(message),
        });
        self.inner
            .deliver_weighed(shard, weighed)
            .map_err(|_| Error::Shutdown)
    }

    /// Like [`call`](Self::call), but a request that is not admitted is
    /// handed back instead of dropped.
    ///
    /// Never waits for capacity, whatever the pool's policy: if every
    /// shard is full the request comes back at once. Once admitted, it
    /// waits for the reply as `call` does.
    ///
    /// # Errors
    ///
    /// * [`TryCallError::Refused`], holding the request: [`Error::Overload`],
    ///   [`Error::Shutdown`] or [`Error::CallingSelf`], as for `call`.
    /// * [`TryCallError::Failed`]: admitted, but no reply will come
    ///   ([`Error::WorkerPanicked`], or [`Error::Shutdown`] if the reply
    ///   can no longer be delivered).
    ///
    /// `?` turns either into an [`Error`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use sidejob::{Error, Pool, Worker};
    ///
    /// /// Handles casts one by one, each when the test says so.
    /// struct Gate(mpsc::Receiver<()>);
    /// impl Worker for Gate {
    ///     type Request = Vec<u8>; type Reply = usize; type Message = ();
    ///     fn handle_call(&mut self, bytes: Vec<u8>) -> usize { bytes.len() }
    ///     fn handle_cast(&mut self, _: ()) { let _ = self.0.recv(); }
    /// }
    ///
    /// let (go, gate) = mpsc::channel();
    /// let gate = std::sync::Mutex::new(Some(gate));
    /// let pool = Pool::builder().capacity(1).workers(1)
    ///     .build(move |_| Gate(gate.lock().unwrap().take().unwrap()))?;
    ///
    /// pool.cast(())?; // holds the only unit until the gate opens
    /// let refused = pool.try_call(vec![1, 2, 3]).unwrap_err();
    /// assert_eq!(refused.error(), Error::Overload);
    /// let request = refused.into_request().unwrap(); // not lost
    ///
    /// go.send(()).unwrap();
    /// pool.shutdown();
    /// assert_eq!(pool.try_call(request).unwrap_err().into_request(), Some(vec![1, 2, 3]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_call(&self, request: W::Request) -> Result<W::Reply, TryCallError<W::Request>> {
        let reply = self.submit_call(How::Try, request)?;
        wait_reply(reply, self.inner.spin).map_err(TryCallError::Failed)
    }

    /// Like [`cast`](Self::cast), but a message that is not admitted is
    /// handed back instead of dropped.
    ///
    /// Never waits for capacity, whatever the pool's policy.
    ///
    /// # Errors
    ///
    /// [`Refused`] holding the message: [`Error::Overload`] when every
    /// shard is at its limit, [`Error::Shutdown`] once the pool is shut
    /// down. `?` turns it into an [`Error`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Error, Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = String;
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: String) {}
    /// # }
    /// let pool = Pool::builder().capacity(4).build(|_| Sink)?;
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

    /// Like [`call`](Self::call), but never refused for capacity: the
    /// request goes to the caller's own worker even when every shard is
    /// full. It is still counted in [`usage`](Self::usage) and the stats,
    /// so the load stays visible.
    ///
    /// Erlang's sidejob offers the same escape hatch; Riak sends its
    /// statistics updates this way. Use it for small, essential requests
    /// that must not be shed: it bypasses the bound, so nothing limits how
    /// many of them queue.
    ///
    /// From a handler of this pool, the request goes to another worker's
    /// queue (never the caller's own); with a single worker it is refused
    /// with [`Error::CallingSelf`].
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::WorkerPanicked`] and
    /// [`Error::CallingSelf`], as for `call`.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(1).build(|_| Echo)?;
    /// assert_eq!(pool.call_unbounded(7)?, 7);
    /// assert_eq!(pool.stats().accepted, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_unbounded(&self, request: W::Request) -> Result<W::Reply, Error> {
        let reply = self.submit_call(How::Unbounded, request)?;
        wait_reply(reply, self.inner.spin)
    }

    /// Like [`cast`](Self::cast), but never refused for capacity; see
    /// [`call_unbounded`](Self::call_unbounded).
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] once the pool is shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u8;
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: u8) {}
    /// # }
    /// let pool = Pool::builder().capacity(1).build(|_| Sink)?;
    /// for n in 0..5 {
    ///     pool.cast_unbounded(n)?; // beyond capacity, still accepted
    /// }
    /// pool.shutdown();
    /// assert_eq!(pool.stats().completed, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast_unbounded(&self, message: W::Message) -> Result<(), Error> {
        Ok(self.submit_cast(How::Unbounded, message)?)
    }

    /// Admits one unit and posts a call; the receiver of its reply, or the
    /// request back if it was not admitted.
    ///
    /// A call waits for its reply, so one made by a worker of this pool
    /// must not be queued behind that worker (see `admit_from_worker`).
    /// The check is one thread-local read.
    pub(crate) fn submit_call(
        &self,
        how: How,
        request: W::Request,
    ) -> Result<ReplyReceiver<W>, Refused<W::Request>> {
        let admitted = match calling_worker(&self.inner.table) {
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

    /// Admits one unit and posts a cast, or hands the message back.
    pub(crate) fn submit_cast(
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

    /// Admits the units of a call of many units and posts it; the
    /// receiver of its reply. A worker of this pool calling it is admitted
    /// as in [`Inner::admit_weighed`].
    fn submit_weighed_call(
        &self,
        ask: &Ask,
        request: W::Request,
    ) -> Result<ReplyReceiver<W>, Error> {
        let me = calling_worker(&self.inner.table);
        let grant = self.inner.admit_weighed(ask, me)?;
        // The mailbox of a shard the grant holds units of, and not the
        // caller's own if it is a worker (`admit_weighed` made sure there
        // is one).
        let shard = match me {
            None => grant.shard,
            Some(me) => grant
                .parts()
                .iter()
                .map(|p| p.shard)
                .find(|&shard| shard != me)
                .unwrap_or(grant.shard),
        };
        let (reply, receiver) = oneshot::channel();
        let weighed = Box::new(Weighed {
            grant,
            job: Heavy::Call(request, reply),
        });
        match self.inner.deliver_weighed(shard, weighed) {
            Ok(()) => Ok(receiver),
            Err(_) => Err(Error::Shutdown),
        }
    }
}

impl<W: Worker> Inner<W> {
    /// Takes the units of an ask of many units (not one: that is the
    /// inlined path's): all of them, or an error. `me` is the calling
    /// worker of this pool, for a call that will wait for its reply: it
    /// never waits, its take starts past its own shard, and a grant whose
    /// units are all on its own shard (only it serves that mailbox) is
    /// given back and refused with `Overload`.
    #[cold]
    #[inline(never)]
    pub(super) fn admit_weighed(&self, ask: &Ask, me: Option<usize>) -> Result<Grant, Error> {
        debug_assert!(!ask.is_one());
        if ask.units == 0 {
            // A request holds at least one unit: the one that keeps its
            // worker from leaving while it is queued.
            return Err(Error::TooLarge);
        }
        let Some(me) = me else {
            return self.table.admit(ask);
        };
        if self.table.shard_count() == 1 {
            return Err(if self.table.is_closing() {
                Error::Shutdown
            } else {
                Error::CallingSelf
            });
        }
        let grant = self.table.admit(&Ask {
            how: How::At(me + 1),
            ..*ask
        })?;
        if grant.parts().iter().all(|p| p.shard == me) {
            self.table.release_grant(&grant, false);
            return Err(Error::Overload);
        }
        Ok(grant)
    }
}
