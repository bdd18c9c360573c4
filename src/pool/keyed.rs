//! Keyed requests: `call_keyed` and `cast_keyed`, routed by the pool's keyed mode (pinned to a worker by jump hash, or ordered per key).

use super::{
    deadline_after, post, wait_passing, wait_reply, wait_reply_until, How, Inner, KeyedMode, Pool,
    ReplyReceiver,
};
use crate::error::{Error, Refused};
use crate::pool::jump::jump_hash;
use crate::pool::worker::{Envelope, Job, Worker};
use crate::pool::worker_loop::{calling_key, calling_worker};
use crate::sync::{now, Arc};
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

/// Where a [`Pool::call_keyed_async`] stands when it returns its future.
enum KeyedPending<W: Worker> {
    /// Admitted: the reply is awaited.
    Reply(ReplyReceiver<W>),
    /// Every shard was full (ordered mode, with a waiting room): the
    /// future waits for a unit, then queues the request behind its key.
    Wait(Arc<Inner<W>>, W::Request),
    /// Refused at once.
    Refused(Error),
}

impl<W: Worker> Pool<W> {
    /// Sends `request` for `key` and waits for its reply: requests with the
    /// same key are handled one at a time, in the order they were admitted;
    /// requests with different keys run in parallel.
    ///
    /// How the order is kept is the pool's [`KeyedMode`] (see there for
    /// which to choose):
    ///
    /// * [`KeyedMode::Pinned`] (the default): the request goes to the
    ///   key's worker, `jump_hash(hash(key), workers)`, and takes its unit
    ///   on that worker's shard only, never waiting for it: a full shard
    ///   is `Overload` at once, whatever room the others have. It is never
    ///   stolen, although plain requests are by default
    ///   ([`steal`](crate::PoolBuilder::steal)).
    /// * [`KeyedMode::Ordered`]: the request takes its unit as
    ///   [`call`](Self::call) does (any shard, waiting under the pool's
    ///   waiting policy), then queues behind the key's earlier requests;
    ///   whichever worker is free runs it when its turn comes.
    ///
    /// Everything [`call`](Self::call) promises holds: the exact bound
    /// (a queued request holds its unit), the unit given back before the
    /// reply, panics, shutdown (every admitted request is handled,
    /// including those queued behind their key). In the ordered mode the
    /// key's turn is passed on before `call_keyed` returns: by the worker
    /// before the reply when another request waits on the key's stripe,
    /// else by this caller once it has the reply (its stripe's cache line
    /// then stays on the caller's core: about 1.05× a plain `call`'s round
    /// trip instead of 1.26×, `PERFORMANCE.md`). A key is known by its hash (64 bits,
    /// seeded per pool; the ordered mode's queues use 62 of them): two keys
    /// whose hashes agree are serialized together, which is safe and only
    /// costs parallelism.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`]: no unit (pinned: on the key's shard).
    /// * [`Error::KeyBusy`] (ordered): the key already has
    ///   [`max_queued_per_key`](crate::PoolBuilder::max_queued_per_key) requests
    ///   admitted; the unit was given back and nothing was sent (not
    ///   counted in [`Stats::rejected`](crate::Stats::rejected) or `accepted`).
    /// * [`Error::Timeout`], [`Error::Shutdown`], [`Error::WorkerPanicked`]:
    ///   as for `call`.
    /// * [`Error::CallingSelf`]: called from a handler of this pool that
    ///   would wait for itself: pinned, the key's worker is the caller;
    ///   ordered, the caller is handling a request of the same key, or the
    ///   pool has one worker.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use sidejob::{Pool, Worker};
    ///
    /// /// Appends to a per-account log: an account's entries must stay in order.
    /// #[derive(Default)]
    /// struct Ledger(HashMap<String, Vec<i64>>);
    ///
    /// impl Worker for Ledger {
    ///     type Request = (String, i64); // (account, amount): answers the balance
    ///     type Reply = i64;
    ///     type Message = ();
    ///     fn handle_call(&mut self, (account, amount): (String, i64)) -> i64 {
    ///         let log = self.0.entry(account).or_default();
    ///         log.push(amount);
    ///         log.iter().sum()
    ///     }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// // Pinned: an account always goes to the same worker, which keeps its log.
    /// let pool = Pool::builder().capacity(64).workers(4).build(|_| Ledger::default())?;
    /// for amount in [10, -3, 5] {
    ///     let account = "alice".to_string();
    ///     pool.call_keyed(&account, (account.clone(), amount))?;
    /// }
    /// assert_eq!(pool.call_keyed("alice", ("alice".to_string(), 0))?, 12);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_keyed<K: Hash + ?Sized>(
        &self,
        key: &K,
        request: W::Request,
    ) -> Result<W::Reply, Error> {
        let id = self.key_id(key);
        let Some(ordered) = &self.inner.routing.ordered else {
            let reply = self.submit_keyed_call(How::Wait(None), id, request)?;
            return wait_reply(reply, self.inner.spin);
        };
        // Ordered: this caller reads its reply whatever happens, so the
        // worker may leave it the key's turn (`ordered.rs`, "Who passes
        // the turn").
        let (reply, receiver) = oneshot::channel();
        if let Err((error, _)) =
            self.submit_keyed(How::Wait(None), id, Job::CallPassing(request, reply))
        {
            return Err(error);
        }
        let (outcome, pass) = wait_passing(receiver, self.inner.spin);
        if pass {
            ordered.finish(id);
        }
        outcome
    }

    /// Like [`call_keyed`](Self::call_keyed), but gives up waiting after
    /// `timeout`, as [`call_timeout`](Self::call_timeout) does: a request
    /// that timed out may still run later, in its key's turn.
    ///
    /// # Errors
    ///
    /// As [`call_keyed`](Self::call_keyed), plus [`Error::Timeout`] when no
    /// reply came within `timeout` (which covers the wait for capacity,
    /// the wait behind the key's earlier requests and the handling).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # use sidejob::{KeyedMode, Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(8).keyed(KeyedMode::Ordered).build(|_| Echo)?;
    /// assert_eq!(pool.call_keyed_timeout(&7_u64, 3, Duration::from_secs(5))?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_keyed_timeout<K: Hash + ?Sized>(
        &self,
        key: &K,
        request: W::Request,
        timeout: Duration,
    ) -> Result<W::Reply, Error> {
        let deadline = deadline_after(now(), timeout);
        let reply = self.submit_keyed_call(How::Wait(deadline), self.key_id(key), request)?;
        let spin = self.inner.spin.min(timeout);
        match deadline {
            Some(deadline) => wait_reply_until(reply, spin, deadline),
            None => wait_reply(reply, spin),
        }
    }

    /// Sends `request` for `key` now and returns a future of its reply:
    /// [`call_keyed`](Self::call_keyed) for async callers, as
    /// [`call_async`](Self::call_async) is [`call`](Self::call)'s.
    ///
    /// Admission happens here, as for `call_async`: the unit (and the
    /// key's place in line) is taken when `call_keyed_async` is called. In
    /// the ordered mode, a pool with a waiting room lets the future wait
    /// for a unit; the pinned mode never waits.
    ///
    /// # Errors
    ///
    /// As [`call_keyed`](Self::call_keyed).
    ///
    /// # Cancel safety
    ///
    /// As [`call_async`](Self::call_async): dropping the future does not
    /// cancel a request that was admitted; it runs in its key's turn and
    /// only the reply is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{KeyedMode, Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(64).keyed(KeyedMode::Ordered).build(|_| Echo)?;
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let replies = runtime.block_on(async {
    ///     // Sent in this order for the one key, so handled in this order.
    ///     let calls: Vec<_> = (0..8).map(|n| pool.call_keyed_async("tenant-1", n)).collect();
    ///     let mut replies = Vec::new();
    ///     for call in calls {
    ///         replies.push(call.await?);
    ///     }
    ///     Ok::<_, sidejob::Error>(replies)
    /// })?;
    /// assert_eq!(replies, (0..8).collect::<Vec<u8>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_keyed_async<K: Hash + ?Sized>(
        &self,
        key: &K,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        let id = self.key_id(key);
        // Only the ordered mode waits for capacity, and never a worker of
        // this pool (see `admit_from_worker`).
        let can_wait = self.inner.routing.ordered.is_some()
            && self.inner.table.has_room()
            && calling_worker(&self.inner.table).is_none();
        let how = if can_wait { How::Probe } else { How::Try };
        let pending = match self.submit_keyed_call(how, id, request) {
            Ok(reply) => KeyedPending::Reply(reply),
            Err(refused) if can_wait && refused.error() == Error::Overload => {
                let (_, request) = refused.into_parts();
                KeyedPending::Wait(Arc::clone(&self.inner), request)
            }
            Err(refused) => KeyedPending::Refused(refused.error()),
        };
        async move {
            let reply = match pending {
                KeyedPending::Reply(reply) => reply,
                KeyedPending::Refused(error) => return Err(error),
                KeyedPending::Wait(inner, request) => {
                    let shard = inner.table.acquire_async(None).await?;
                    let (reply, receiver) = oneshot::channel();
                    inner
                        .submit_keyed_on(shard, id, Job::Call(request, reply))
                        .map_err(|(error, _)| error)?;
                    receiver
                }
            };
            reply.await.unwrap_or(Err(Error::Shutdown))
        }
    }

    /// Sends `message` for `key` without waiting for it to be handled: as
    /// [`cast`](Self::cast), with [`call_keyed`](Self::call_keyed)'s order
    /// (messages and requests of one key are handled one at a time, in the
    /// order they were admitted).
    ///
    /// # Errors
    ///
    /// [`Error::Overload`], [`Error::KeyBusy`] (ordered), [`Error::Timeout`]
    /// and [`Error::Shutdown`], as for [`call_keyed`](Self::call_keyed).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Error, KeyedMode, Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u32;
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: u32) {}
    /// # }
    /// let pool = Pool::builder()
    ///     .capacity(64)
    ///     .keyed(KeyedMode::Ordered)
    ///     .max_queued_per_key(100)
    ///     .build(|_| Sink)?;
    /// for n in 0..10 {
    ///     pool.cast_keyed(&"session-9", n)?;
    /// }
    /// pool.shutdown(); // handles all ten, in order, first
    /// assert_eq!(pool.stats().completed, 10);
    /// assert_eq!(pool.busy_keys(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast_keyed<K: Hash + ?Sized>(&self, key: &K, message: W::Message) -> Result<(), Error> {
        self.submit_keyed(How::Wait(None), self.key_id(key), Job::Cast(message))
            .map_err(|(error, _)| error)
    }

    /// How many keys have a request admitted and unfinished now, in the
    /// ordered keyed mode (0 in the pinned mode, which keeps no key set).
    /// A reading; it is 0 again once their requests are handled.
    pub fn busy_keys(&self) -> usize {
        self.inner
            .routing
            .ordered
            .as_ref()
            .map_or(0, |o| o.busy_keys())
    }

    /// The pool's keyed mode, from [`PoolBuilder::keyed`](crate::PoolBuilder::keyed).
    pub fn keyed_mode(&self) -> KeyedMode {
        if self.inner.routing.ordered.is_some() {
            KeyedMode::Ordered
        } else {
            KeyedMode::Pinned
        }
    }

    /// Requests of `key` admitted and unfinished in an ordered pool (the
    /// one out and those queued behind it): for the model tests.
    #[cfg(test)]
    pub(crate) fn key_load<K: Hash + ?Sized>(&self, key: &K) -> usize {
        let id = self.key_id(key);
        self.inner
            .routing
            .ordered
            .as_ref()
            .map_or(0, |o| o.key_load(id))
    }

    /// A key's 64-bit id.
    #[inline]
    pub(crate) fn key_id<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        self.inner.hasher.hash_one(key)
    }

    /// Admits a keyed call; the receiver of its reply.
    pub(crate) fn submit_keyed_call(
        &self,
        how: How,
        id: u64,
        request: W::Request,
    ) -> Result<ReplyReceiver<W>, Refused<W::Request>> {
        let (reply, receiver) = oneshot::channel();
        match self.submit_keyed(how, id, Job::Call(request, reply)) {
            Ok(()) => Ok(receiver),
            Err((error, Job::Call(request, _))) => Err(Refused::new(error, request)),
            Err(_) => unreachable!("a keyed submit hands back the job it was given"),
        }
    }

    /// Admits a keyed request: its unit, then (ordered) its key's place in
    /// line; the job back if refused.
    pub(crate) fn submit_keyed(
        &self,
        how: How,
        id: u64,
        job: Job<W>,
    ) -> Result<(), (Error, Job<W>)> {
        let inner = &*self.inner;
        let waits = matches!(job, Job::Call(..) | Job::CallPassing(..));
        let me = calling_worker(&inner.table);
        let shards = inner.table.shard_count();
        let refused_self = || {
            if inner.table.is_closing() {
                Error::Shutdown
            } else {
                Error::CallingSelf
            }
        };
        if inner.routing.ordered.is_none() {
            // Pinned: the key's worker and shard, nothing else.
            let target = jump_hash(id, shards as u32) as usize;
            if waits && me == Some(target) {
                return Err((refused_self(), job));
            }
            let shard = match inner.table.acquire_only(target) {
                Ok(shard) => shard,
                Err(error) => return Err((error, job)),
            };
            let envelope = match job {
                Job::Call(request, reply) => Envelope::Call(request, reply),
                Job::Cast(message) => Envelope::Cast(message),
                Job::CallPassing(..) => unreachable!("only an ordered pool passes turns"),
            };
            return inner
                .deliver_pinned(shard, envelope)
                .map_err(|envelope| match envelope {
                    Envelope::Call(request, reply) => (Error::Shutdown, Job::Call(request, reply)),
                    Envelope::Cast(message) => (Error::Shutdown, Job::Cast(message)),
                    _ => unreachable!("a mailbox hands back the envelope it was given"),
                });
        }
        // Ordered. A worker handling this key would wait for itself.
        if waits && me.is_some() && calling_key() == Some(id) {
            return Err((refused_self(), job));
        }
        let admitted = match me {
            Some(worker) if waits => inner.table.admit_from_worker(how, worker),
            _ => inner.table.admit_one(how),
        };
        match admitted {
            Ok(shard) => inner.submit_keyed_on(shard, id, job),
            Err(error) => Err((error, job)),
        }
    }
}

impl<W: Worker> Inner<W> {
    /// Queues an ordered keyed job whose unit of `shard` is taken.
    pub(super) fn submit_keyed_on(
        &self,
        shard: usize,
        id: u64,
        job: Job<W>,
    ) -> Result<(), (Error, Job<W>)> {
        match &self.routing.ordered {
            Some(ordered) => ordered.submit(shard, id, job),
            None => {
                // Only the ordered mode gets here.
                self.table.release(shard, false);
                Err((Error::Shutdown, job))
            }
        }
    }

    /// Posts a pinned keyed envelope holding a unit of `shard` to that
    /// shard's worker: its private mailbox in a stealing pool, else its
    /// own mailbox (which no other worker takes from).
    pub(super) fn deliver_pinned(
        &self,
        shard: usize,
        envelope: Envelope<W>,
    ) -> Result<(), Envelope<W>> {
        let (Some(private), Some(idle)) = (&self.routing.pinned, &self.routing.idle) else {
            return self.deliver(shard, envelope);
        };
        post(&private[shard], &self.table, shard, envelope, || {
            idle.private_added(shard)
        })
    }
}
