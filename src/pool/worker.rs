//! The [`Worker`] trait, and what travels from a caller to a worker: the
//! envelope (a call with its reply's sender, a cast, a keyed request of an
//! ordered pool) and the factory that builds a worker's state.

use crate::engine::table::Grant;
use crate::error::Error;

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

/// The reply slot of a blocking keyed call of an ordered pool: the reply,
/// and whether the caller is to pass its key's turn on (see
/// [`Job::CallPassing`]).
pub(crate) type PassingSender<W> = oneshot::Sender<(Result<<W as Worker>::Reply, Error>, bool)>;

/// What travels through a worker's mailbox. Every `Call` and `Cast` holds
/// one unit of the worker's shard, which the worker gives back once it has
/// handled it; a `Weighed` request holds its grant.
pub(crate) enum Envelope<W: Worker> {
    Call(W::Request, ReplySender<W>),
    Cast(W::Message),
    /// A keyed request of an ordered pool, out for its key (see
    /// `ordered.rs`): once handled, its key's next request goes out.
    Keyed(Keyed<W>),
    /// A request of many units (`Pool::call_with`, `cast_with`), with the
    /// grant of its units: boxed, so the one-unit envelopes stay the size
    /// they were (the box is one word beside `Keyed`'s two and a job).
    Weighed(Box<Weighed<W>>),
    /// Shutdown began (or, in a pool whose workers wait on their own
    /// mailboxes, a weighed request gave back units of this shard): check
    /// whether the shard is drained.
    Wake,
}

impl<W: Worker> Envelope<W> {
    /// The shard whose unit this envelope holds, when it came from
    /// mailbox `from`: that mailbox's shard, except for a keyed request,
    /// which carries its own (it may sit in any worker's mailbox).
    pub(crate) fn shard(&self, from: usize) -> usize {
        match self {
            Envelope::Keyed(keyed) => keyed.shard,
            _ => from,
        }
    }
}

/// A request of many units: the [`Grant`] of every unit it holds (on
/// the shard of the mailbox it was posted to, and maybe on others), and
/// the request. The worker that handles it gives back the whole grant.
pub(crate) struct Weighed<W: Worker> {
    pub(crate) grant: Grant,
    pub(crate) job: Heavy<W>,
}

/// A call or a cast, as a weighed request carries it.
pub(crate) enum Heavy<W: Worker> {
    Call(W::Request, ReplySender<W>),
    Cast(W::Message),
}

/// A keyed request of an ordered pool: the key's hash, the shard holding
/// its unit, and the request.
pub(crate) struct Keyed<W: Worker> {
    pub(crate) id: u64,
    pub(crate) shard: usize,
    pub(crate) job: Job<W>,
}

/// A call or a cast, as a keyed request carries it.
pub(crate) enum Job<W: Worker> {
    Call(W::Request, ReplySender<W>),
    /// A call whose caller blocks until it reads the reply (`call_keyed`
    /// of an ordered pool), so it can pass its key's turn on itself: the
    /// worker leaves the turn to it when nobody is queued on the key's
    /// stripe, and the stripe's line then stays on the caller's core
    /// (`ordered.rs`, "Who passes the turn").
    CallPassing(W::Request, PassingSender<W>),
    Cast(W::Message),
}

/// Builds a worker's state; shared by every worker thread of a pool.
pub(crate) type Factory<W> = dyn Fn(usize) -> W + Send + Sync;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The envelope as it was before weighed requests: the same variants
    /// but `Weighed`.
    #[allow(dead_code)]
    enum Before<W: Worker> {
        Call(W::Request, ReplySender<W>),
        Cast(W::Message),
        Keyed(Keyed<W>),
        Wake,
    }

    struct Small;
    impl Worker for Small {
        type Request = ();
        type Reply = ();
        type Message = ();
        fn handle_call(&mut self, (): ()) {}
        fn handle_cast(&mut self, (): ()) {}
    }

    struct Wide;
    impl Worker for Wide {
        type Request = [u64; 8];
        type Reply = u64;
        type Message = String;
        fn handle_call(&mut self, _: [u64; 8]) -> u64 {
            0
        }
        fn handle_cast(&mut self, _: String) {}
    }

    /// The boxed `Weighed` variant adds no byte to the one-unit envelopes
    /// (the mailbox ring is sized in envelopes of this size).
    #[test]
    fn a_weighed_variant_leaves_the_envelope_its_size() {
        use std::mem::size_of;
        assert_eq!(size_of::<Envelope<Small>>(), size_of::<Before<Small>>());
        assert_eq!(size_of::<Envelope<Wide>>(), size_of::<Before<Wide>>());
    }
}
