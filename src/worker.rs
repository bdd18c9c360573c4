//! The [`Worker`] trait and the loop each pool worker thread runs: receive,
//! handle under `catch_unwind`, release the unit, reply; rebuild after a
//! panic; drain and `terminate` on shutdown.

use std::panic::{catch_unwind, AssertUnwindSafe};

use std::time::Duration;

use crossbeam_channel::{Receiver, TryRecvError};

use crate::error::Error;
use crate::sync::{spin_poll, Arc};
use crate::table::Table;

/// The state and handlers of one pool worker, like an Erlang `gen_server`.
///
/// A [`Pool`](crate::Pool) runs one worker per shard, each on its own
/// thread, each owning its `Worker` value: handlers take `&mut self` and
/// never need a lock. Requests come from [`Pool::call`](crate::Pool::call)
/// (and its timed and async forms) and messages from
/// [`Pool::cast`](crate::Pool::cast).
///
/// If a handler panics, the panic is caught: that request's caller gets
/// [`Error::WorkerPanicked`], the worker is rebuilt by the pool's factory
/// (a restart, with fresh state), and the requests queued behind it are
/// handled by the new value. `terminate` runs once when the pool shuts down.
///
/// # Examples
///
/// ```
/// use sidejob::{Pool, Worker};
///
/// /// Counts what it is told, answers with the running total.
/// struct Counter(u64);
///
/// impl Worker for Counter {
///     type Request = u64;
///     type Reply = u64;
///     type Message = u64;
///
///     fn handle_call(&mut self, add: u64) -> u64 {
///         self.0 += add;
///         self.0
///     }
///
///     fn handle_cast(&mut self, add: u64) {
///         self.0 += add;
///     }
/// }
///
/// let pool = Pool::builder().capacity(8).workers(1).build(|_index| Counter(0))?;
/// pool.cast(5)?;
/// assert_eq!(pool.call(1)?, 6); // one worker: the cast was handled first
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A panic fails only the request that caused it; the worker restarts from
/// the factory, with fresh state:
///
/// ```
/// use sidejob::{Error, Pool, Worker};
///
/// struct Divider(u32);
///
/// impl Worker for Divider {
///     type Request = u32;
///     type Reply = u32;
///     type Message = ();
///     fn handle_call(&mut self, by: u32) -> u32 {
///         self.0 += 1;
///         100 / by // panics on 0
///     }
///     fn handle_cast(&mut self, _: ()) {}
/// }
///
/// let pool = Pool::builder().capacity(4).workers(1).build(|_| Divider(0))?;
/// assert_eq!(pool.call(0), Err(Error::WorkerPanicked));
/// assert_eq!(pool.call(5)?, 20); // served by the rebuilt worker
/// assert_eq!(pool.stats().panicked, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Worker: Send + 'static {
    /// What [`Pool::call`](crate::Pool::call) sends.
    type Request: Send + 'static;
    /// What `handle_call` answers.
    type Reply: Send + 'static;
    /// What [`Pool::cast`](crate::Pool::cast) sends (no answer).
    type Message: Send + 'static;

    /// Handles one call and returns its reply.
    fn handle_call(&mut self, request: Self::Request) -> Self::Reply;

    /// Handles one cast.
    fn handle_cast(&mut self, message: Self::Message);

    /// Runs once when the pool shuts down, after the worker has handled
    /// every request admitted before the shutdown. A panic here is caught.
    fn terminate(&mut self) {}
}

/// The reply slot of one call.
pub(crate) type ReplySender<W> = oneshot::Sender<Result<<W as Worker>::Reply, Error>>;

/// What travels through a worker's mailbox. Every `Call` and `Cast` holds
/// one unit of the worker's shard, which the worker gives back once it has
/// handled it.
pub(crate) enum Envelope<W: Worker> {
    Call(W::Request, ReplySender<W>),
    Cast(W::Message),
    /// Shutdown began: check whether the shard is drained.
    Wake,
}

/// Builds a worker's state; shared by every worker thread of a pool.
pub(crate) type Factory<W> = dyn Fn(usize) -> W + Send + Sync;

/// One worker thread's loop.
pub(crate) struct WorkerLoop<W: Worker> {
    pub(crate) index: usize,
    pub(crate) table: Arc<Table>,
    pub(crate) mailbox: Receiver<Envelope<W>>,
    pub(crate) factory: Arc<Factory<W>>,
    pub(crate) core: Option<core_affinity::CoreId>,
    /// How long to poll an empty mailbox before parking.
    pub(crate) spin: Duration,
}

impl<W: Worker> WorkerLoop<W> {
    pub(crate) fn run(self) {
        if let Some(core) = self.core {
            // Best effort: pinning is a performance hint, not a promise.
            let _ = core_affinity::set_for_current(core);
        }
        let mut state = self.build();
        let shard = self.table.shard(self.index);
        while let Some(envelope) = self.next_envelope() {
            match envelope {
                Envelope::Call(request, reply) => {
                    let outcome = self.handle(&mut state, |worker| worker.handle_call(request));
                    // The unit goes back before the reply is delivered: a
                    // caller that gets its answer and calls again at once
                    // never meets its own stale unit.
                    self.table.release(self.index, outcome.is_err());
                    // A caller that timed out or dropped its future is gone;
                    // the request still ran, and that is all it is owed.
                    let _ = reply.send(outcome);
                }
                Envelope::Cast(message) => {
                    let outcome = self.handle(&mut state, |worker| worker.handle_cast(message));
                    self.table.release(self.index, outcome.is_err());
                }
                Envelope::Wake => {}
            }
            if drained(shard) {
                break;
            }
        }
        if let Some(mut worker) = state {
            let _ = catch_unwind(AssertUnwindSafe(|| worker.terminate()));
        }
    }

    /// The next envelope: polled for up to `spin`, so a busy worker takes
    /// its next request without a futex round trip, then waited for, so an
    /// idle worker costs no CPU. `None` once every sender is gone.
    fn next_envelope(&self) -> Option<Envelope<W>> {
        let polled = spin_poll(self.spin, || match self.mailbox.try_recv() {
            Ok(envelope) => Some(Some(envelope)),
            Err(TryRecvError::Disconnected) => Some(None),
            Err(TryRecvError::Empty) => None,
        });
        match polled {
            Some(next) => next,
            None => self.mailbox.recv().ok(),
        }
    }

    /// Runs one handler. On a panic the state is dropped, to be rebuilt by
    /// the factory, and the caller is told `WorkerPanicked`.
    fn handle<R>(
        &self,
        state: &mut Option<W>,
        handler: impl FnOnce(&mut W) -> R,
    ) -> Result<R, Error> {
        if state.is_none() {
            *state = self.build();
        }
        let Some(worker) = state.as_mut() else {
            // The factory itself panicked: this request cannot be served.
            return Err(Error::WorkerPanicked);
        };
        match catch_unwind(AssertUnwindSafe(|| handler(worker))) {
            Ok(result) => Ok(result),
            Err(_) => {
                // A restart: the half-updated state is dropped, not reused.
                // Dropping it may itself panic; that must not kill the loop.
                let broken = state.take();
                let _ = catch_unwind(AssertUnwindSafe(move || drop(broken)));
                *state = self.build();
                Err(Error::WorkerPanicked)
            }
        }
    }

    /// Calls the factory; `None` if it panicked (retried on the next
    /// request).
    fn build(&self) -> Option<W> {
        catch_unwind(AssertUnwindSafe(|| (self.factory)(self.index))).ok()
    }
}

/// True once the worker may exit: its shard is closed, so nothing more can
/// be admitted to it, and every unit admitted before is back, so its mailbox
/// holds no request.
///
/// The closed bit and the counts live in the shard's own `taken` word: a
/// take that beat the close is already in the count this reads, and one that
/// did not was refused. `loom-tests/tests/loom_pool_shutdown.rs` checks it.
pub(crate) fn drained(shard: &crate::table::Shard) -> bool {
    shard.is_closed() && shard.usage() == 0
}
