//! The mailbox seam: how an admitted request reaches a worker, and how a
//! worker takes its next one. The async pool touches its mailboxes only
//! through [`Mailboxes::deliver`] and [`Inbox::recv`], so the dispatch
//! (queues any free worker takes from, or each worker its own
//! requests) is chosen here and not in the pool or the worker loop.
//!
//! Unbounded queues, because the shard's counter is the bound: every
//! envelope but `Wake` holds one unit of its shard, so the queues never
//! hold more than the capacity. A bounded channel would count the same
//! requests a second time, on a second contended word.
//!
//! * **Shared** (the default, `PoolBuilder::steal(true)`): the pool's
//!   queues (`pool/async_idle.rs`: a `VecDeque` per worker under its own
//!   lock, and a common one under the sleeping workers' lock),
//!   each envelope tagged with the shard whose unit it holds, pushed to
//!   the queue of the worker last polled on the caller's thread (to the
//!   common one while that worker's handler awaits), taken by its worker
//!   or by any free one.
//! * **Own** (`PoolBuilder::steal(false)`, for affinity): each worker has
//!   one tokio unbounded MPSC channel, so a request runs on the worker of
//!   the shard that admitted it. tokio's channel is the one the actor
//!   idiom uses, well tuned for tokio's wakers, and lighter than an MPMC
//!   queue.

use std::future::{poll_fn, Future};
use std::task::Waker;

use tokio::sync::mpsc;

use crate::engine::table::{Grant, Table};
use crate::error::Error;
use crate::pool::async_idle::{SharedQueue, Sleep};
use crate::sync::Arc;

/// The reply slot of one call.
pub(crate) type ReplySender<T> = oneshot::Sender<Result<T, Error>>;

/// What travels through a worker's mailbox. Every `Call` and `Cast` holds
/// one unit of the worker's shard, given back once the worker has handled
/// it (or, if the runtime drops the worker first, when the inbox is
/// dropped).
pub(crate) enum Envelope<Request, Reply, Message> {
    Call(Request, ReplySender<Reply>),
    Cast(Message),
    /// A request of many units (`call_with_async`, `cast_with`) with the
    /// grant of its units: boxed, so the one-unit envelopes need no room
    /// for a grant.
    Weighed(Box<Weighed<Request, Reply, Message>>),
    /// Shutdown began (or, with a mailbox per worker, a weighed request
    /// gave back units of this shard): check whether the shard is drained.
    Wake,
}

/// A request of many units: the grant of every unit it holds (on the
/// shard it was delivered for, and maybe on others), and the request.
pub(crate) struct Weighed<Request, Reply, Message> {
    pub(crate) grant: Grant,
    pub(crate) job: Heavy<Request, Reply, Message>,
}

/// A call or a cast, as a weighed request carries it.
pub(crate) enum Heavy<Request, Reply, Message> {
    Call(Request, ReplySender<Reply>),
    Cast(Message),
}

impl<Request, Reply, Message> Envelope<Request, Reply, Message> {
    /// Whether this envelope holds a unit of its shard.
    pub(crate) fn holds_unit(&self) -> bool {
        !matches!(self, Envelope::Wake)
    }

    /// Gives back what this envelope, queued for shard `shard`, holds: a
    /// unit of `shard`, a weighed request's grant, or nothing (`Wake`).
    /// For an envelope that will not be handled.
    pub(crate) fn give_back(&self, table: &Table, shard: usize) {
        match self {
            Envelope::Weighed(weighed) => table.release_grant(&weighed.grant, false),
            _ if self.holds_unit() => table.release(shard, false),
            _ => {}
        }
    }
}

/// The sending side of the pool's mailboxes.
pub(crate) enum Mailboxes<E> {
    /// One MPSC channel per worker, indexed by shard, read by that worker
    /// only.
    Own(Box<[mpsc::UnboundedSender<E>]>),
    /// The pool's queues (one per worker and a common one), read by
    /// every worker, each envelope with its shard.
    Shared(Arc<SharedQueue<E>>),
}

/// One worker's receiving side.
pub(crate) enum Inbox<E> {
    /// Its own channel.
    Own {
        index: usize,
        receiver: mpsc::UnboundedReceiver<E>,
    },
    /// The pool's queue; `index` is the worker's, `waker` its spare clone
    /// of its own waker, `sleep` whether it sleeps on the queue's
    /// stack (see [`SharedQueue::poll_next`]).
    Shared {
        index: usize,
        queue: Arc<SharedQueue<E>>,
        waker: Option<Waker>,
        sleep: Sleep,
    },
}

/// The mailboxes of `count` workers: the senders, and one inbox per
/// worker. With `steal` (and more than one worker) the shared queues,
/// growing as they fill (the table bounds them by `capacity`), serve them all:
/// per worker and common if `multi_thread` (their runtime's flavor), the
/// common one alone otherwise (`async_idle.rs`).
pub(crate) fn mailboxes<E>(
    count: usize,
    capacity: usize,
    steal: bool,
    multi_thread: bool,
) -> (Mailboxes<E>, Vec<Inbox<E>>) {
    if steal && count > 1 {
        let queue = Arc::new(SharedQueue::new(count, capacity, multi_thread));
        let inboxes = (0..count)
            .map(|index| Inbox::Shared {
                index,
                queue: Arc::clone(&queue),
                waker: None,
                sleep: Sleep::default(),
            })
            .collect();
        return (Mailboxes::Shared(queue), inboxes);
    }
    let (senders, inboxes) = (0..count)
        .map(|index| {
            let (sender, receiver) = mpsc::unbounded_channel();
            (sender, Inbox::Own { index, receiver })
        })
        .unzip::<_, _, Vec<_>, Vec<_>>();
    (Mailboxes::Own(senders.into_boxed_slice()), inboxes)
}

impl<E> Mailboxes<E> {
    /// Posts `envelope`, which holds a unit of shard `shard`: to that
    /// shard's worker, or to the shared queues. The envelope back if no
    /// worker can take it any more.
    #[inline]
    pub(crate) fn deliver(&self, shard: usize, envelope: E) -> Result<(), E> {
        match self {
            Mailboxes::Own(senders) => senders[shard].send(envelope).map_err(|returned| returned.0),
            Mailboxes::Shared(queue) => queue.push(shard, envelope),
        }
    }

    /// Each worker's own sender, if every worker has a mailbox of its own
    /// and there are several: a worker that gives back a weighed
    /// request's units on another's shard posts that one a `Wake`.
    pub(crate) fn own_senders(&self) -> Option<Box<[mpsc::UnboundedSender<E>]>> {
        match self {
            Mailboxes::Own(senders) if senders.len() > 1 => Some(senders.clone()),
            _ => None,
        }
    }

    /// Makes every worker re-check its exit rule (shutdown began): posts
    /// an envelope made by `make` to every worker whose inbox is still
    /// there, or, when workers sleep in the idle room, wakes them all.
    pub(crate) fn wake_all(&self, make: impl Fn() -> E) {
        match self {
            Mailboxes::Own(senders) => {
                for sender in senders.iter() {
                    let _ = sender.send(make());
                }
            }
            Mailboxes::Shared(queue) => queue.wake_all(),
        }
    }
}

impl<E> Inbox<E> {
    /// The next envelope, once there is one, with the shard whose unit it
    /// holds. `None` once every sender is gone and the mailbox is empty,
    /// or, with the shared queues, once `done` (the worker's exit rule)
    /// holds and the queue is empty.
    #[inline]
    pub(crate) fn recv<'a>(
        &'a mut self,
        done: impl Fn() -> bool + 'a,
    ) -> impl Future<Output = Option<(usize, E)>> + 'a {
        // A `poll_fn` rather than an `async fn`: one state machine less to
        // step through per request.
        poll_fn(move |cx| match self {
            Inbox::Own { index, receiver } => {
                let index = *index;
                receiver
                    .poll_recv(cx)
                    .map(|envelope| envelope.map(|envelope| (index, envelope)))
            }
            Inbox::Shared {
                index,
                queue,
                waker,
                sleep,
            } => queue.poll_next(cx, *index, waker, sleep, &done),
        })
    }

    /// This worker's handler returned `Pending` (it awaits): with the
    /// shared queues, what waits at this worker moves to the common queue
    /// and later pushes go there until it looks again
    /// ([`SharedQueue::away`]). Nothing with a mailbox of its own.
    pub(crate) fn away(&self) {
        if let Inbox::Shared { index, queue, .. } = self {
            queue.away(*index);
        }
    }

    /// True if this inbox reads the pool's shared queues.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Inbox::Shared { .. })
    }

    /// Refuses later deliveries (where the channel allows) and hands back,
    /// one by one with its shard, what is still queued: for a worker
    /// dropped before it could drain its mailbox (`abandoned`: the runtime
    /// dropped it). An abandoned worker of the shared queues drains them, so
    /// the last one dropped leaves nothing queued; one that ended on its
    /// own found the pool drained.
    pub(crate) fn close_and_drain(&mut self, abandoned: bool, mut each: impl FnMut(usize, E)) {
        match self {
            Inbox::Own { index, receiver } => {
                receiver.close();
                while let Ok(envelope) = receiver.try_recv() {
                    each(*index, envelope);
                }
            }
            Inbox::Shared { .. } if !abandoned => {}
            Inbox::Shared {
                index,
                queue,
                sleep,
                ..
            } => {
                queue.leave(*index, sleep);
                queue.close_and_drain(each);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The async envelope as it was before weighed requests.
    #[allow(dead_code)]
    enum Before<Request, Reply, Message> {
        Call(Request, ReplySender<Reply>),
        Cast(Message),
        Wake,
    }

    /// What the boxed `Weighed` variant costs the one-unit envelopes.
    #[test]
    fn a_weighed_variant_leaves_the_envelope_its_size() {
        use std::mem::size_of;
        assert_eq!(
            size_of::<Envelope<u64, u64, String>>(),
            size_of::<Before<u64, u64, String>>()
        );
        assert_eq!(
            size_of::<Envelope<[u64; 8], u64, u64>>(),
            size_of::<Before<[u64; 8], u64, u64>>()
        );
        assert_eq!(
            size_of::<Envelope<(), (), ()>>(),
            size_of::<Before<(), (), ()>>()
        );
    }
}
