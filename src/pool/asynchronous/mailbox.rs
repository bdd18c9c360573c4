//! The mailbox seam: how an admitted request reaches a worker, and how a
//! worker takes its next one. The async pool touches its mailboxes only
//! through [`Mailboxes::deliver`] and [`Inbox::recv`], so the dispatch
//! (each worker its own requests, or a free worker taking work queued at
//! another) is chosen here and not in the pool or the worker loop.
//!
//! Unbounded queues, because the shard's counter is the bound: every
//! envelope but `Wake` holds one unit of its shard, so a mailbox never
//! holds more than the shard's limit. A bounded channel would count the
//! same requests a second time, on a second contended word.
//!
//! * **Own** (the default): each worker has one tokio unbounded MPSC
//!   channel. tokio's channel is the one the actor idiom uses, well tuned
//!   for tokio's wakers, and lighter than an MPMC queue; a lighter one of
//!   our own would have to beat it by more than it would cost to keep.
//! * **Shared** (`PoolBuilder::steal(true)`): each worker has one crossbeam
//!   unbounded channel, and every worker holds every receiver (MPMC: each
//!   envelope is taken once, by its owner or a thief). A task cannot await
//!   a crossbeam channel, and should not: a free worker must be woken for
//!   work at *any* mailbox, so it sleeps in the pool's
//!   [`AsyncIdle`] room instead, and every delivery rings it
//!   (`pool/async_idle.rs` has the protocol and its argument).
//!   crossbeam's channel rather than `async-channel` or a `SegQueue`: it is
//!   already a dependency, and only its `try_recv`, `send` and `is_empty`
//!   are used, which is all an MPMC queue offers.

use tokio::sync::{mpsc, oneshot};

use crate::error::Error;
use crate::pool::async_idle::{self, AsyncIdle};
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
    /// Shutdown began: check whether the shard is drained.
    Wake,
}

impl<Request, Reply, Message> Envelope<Request, Reply, Message> {
    /// Whether this envelope holds a unit of its shard.
    pub(crate) fn holds_unit(&self) -> bool {
        !matches!(self, Envelope::Wake)
    }
}

/// The sending side of every worker's mailbox, indexed by shard.
pub(crate) enum Mailboxes<E> {
    /// One MPSC channel per worker, read by that worker only.
    Own(Box<[mpsc::UnboundedSender<E>]>),
    /// One MPMC channel per worker, read by every worker, and the room
    /// where free workers sleep.
    Shared {
        senders: Box<[crossbeam_channel::Sender<E>]>,
        idle: Arc<AsyncIdle>,
    },
}

/// One worker's receiving side.
pub(crate) enum Inbox<E> {
    /// Its own channel.
    Own {
        index: usize,
        receiver: mpsc::UnboundedReceiver<E>,
    },
    /// Every worker's channel (its own at `index`) and the idle room.
    Shared {
        index: usize,
        receivers: Arc<[crossbeam_channel::Receiver<E>]>,
        idle: Arc<AsyncIdle>,
    },
}

/// `count` mailboxes: the senders, and one inbox per worker. With `steal`
/// (and more than one worker) every worker may take from every mailbox.
pub(crate) fn mailboxes<E>(count: usize, steal: bool) -> (Mailboxes<E>, Vec<Inbox<E>>) {
    if steal && count > 1 {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..count).map(|_| crossbeam_channel::unbounded()).unzip();
        let receivers: Arc<[_]> = receivers.into();
        let idle = Arc::new(AsyncIdle::new(count));
        let inboxes = (0..count)
            .map(|index| Inbox::Shared {
                index,
                receivers: Arc::clone(&receivers),
                idle: Arc::clone(&idle),
            })
            .collect();
        let mailboxes = Mailboxes::Shared {
            senders: senders.into_boxed_slice(),
            idle,
        };
        return (mailboxes, inboxes);
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
    /// Posts `envelope` to worker `shard`; the envelope back if no worker
    /// can take it any more.
    #[inline]
    pub(crate) fn deliver(&self, shard: usize, envelope: E) -> Result<(), E> {
        match self {
            Mailboxes::Own(senders) => senders[shard].send(envelope).map_err(|returned| returned.0),
            Mailboxes::Shared { senders, idle } => {
                senders[shard]
                    .send(envelope)
                    .map_err(|returned| returned.into_inner())?;
                idle.work_added(shard);
                Ok(())
            }
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
            Mailboxes::Shared { idle, .. } => idle.wake_all(),
        }
    }
}

impl<E> Inbox<E> {
    /// The next envelope, once there is one, with the shard whose mailbox
    /// it came from (the shard whose unit it holds). `None` once every
    /// sender is gone and the mailbox is empty, or, when stealing, once
    /// `done` (the worker's exit rule) holds and no mailbox has anything.
    #[inline]
    pub(crate) async fn recv(&mut self, done: impl Fn() -> bool) -> Option<(usize, E)> {
        match self {
            Inbox::Own { index, receiver } => {
                let index = *index;
                receiver.recv().await.map(|envelope| (index, envelope))
            }
            Inbox::Shared {
                index,
                receivers,
                idle,
            } => async_idle::next(*index, receivers, idle, done).await,
        }
    }

    /// What the worker does after it gave back a unit of shard `from`:
    /// when stealing, a stolen unit's owner may be waiting for it.
    #[inline]
    pub(crate) fn after_release(&self, from: usize) {
        if let Inbox::Shared { index, idle, .. } = self {
            async_idle::after_release(idle, *index, from);
        }
    }

    /// Refuses later deliveries (where the channel allows) and hands back,
    /// one by one with its shard, what is still queued: for a worker
    /// dropped before it could drain its mailbox (`abandoned`: the runtime
    /// dropped it). An abandoned stealing worker drains every mailbox, so
    /// the last one dropped leaves nothing queued; one that ended on its
    /// own leaves the other mailboxes to their workers, which still serve
    /// them.
    pub(crate) fn close_and_drain(&mut self, abandoned: bool, mut each: impl FnMut(usize, E)) {
        match self {
            Inbox::Own { index, receiver } => {
                receiver.close();
                while let Ok(envelope) = receiver.try_recv() {
                    each(*index, envelope);
                }
            }
            Inbox::Shared { .. } if !abandoned => {}
            Inbox::Shared { receivers, .. } => {
                for (shard, receiver) in receivers.iter().enumerate() {
                    while let Ok(envelope) = receiver.try_recv() {
                        each(shard, envelope);
                    }
                }
            }
        }
    }
}
