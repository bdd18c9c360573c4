//! The mailbox seam: how an admitted request reaches a worker, and how a
//! worker takes its next one. The async pool touches its mailboxes only
//! through [`Mailboxes::deliver`] and [`Inbox::recv`], so a later dispatch
//! (a free worker taking work queued at another, keyed order) changes this
//! file and not the pool or the worker loop.
//!
//! Each worker has one tokio unbounded MPSC channel. Unbounded, because the
//! shard's counter is the bound: every envelope but `Wake` holds one unit of
//! the worker's shard, so a mailbox never holds more than the shard's limit.
//! A bounded channel would count the same requests a second time, on a
//! second contended word. tokio's channel is the one the actor idiom uses,
//! well tuned for tokio's wakers, and lighter than an MPMC queue; a lighter
//! one of our own would have to beat it by more than it would cost to keep.

use tokio::sync::{mpsc, oneshot};

use crate::error::Error;

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
pub(crate) struct Mailboxes<E> {
    senders: Box<[mpsc::UnboundedSender<E>]>,
}

/// One worker's receiving side.
pub(crate) struct Inbox<E> {
    receiver: mpsc::UnboundedReceiver<E>,
}

/// `count` mailboxes: the senders, and one inbox per worker.
pub(crate) fn mailboxes<E>(count: usize) -> (Mailboxes<E>, Vec<Inbox<E>>) {
    let (senders, inboxes) = (0..count)
        .map(|_| {
            let (sender, receiver) = mpsc::unbounded_channel();
            (sender, Inbox { receiver })
        })
        .unzip::<_, _, Vec<_>, Vec<_>>();
    (
        Mailboxes {
            senders: senders.into_boxed_slice(),
        },
        inboxes,
    )
}

impl<E> Mailboxes<E> {
    /// Posts `envelope` to worker `shard`; the envelope back if that
    /// worker's inbox is gone.
    #[inline]
    pub(crate) fn deliver(&self, shard: usize, envelope: E) -> Result<(), E> {
        self.senders[shard]
            .send(envelope)
            .map_err(|returned| returned.0)
    }

    /// Posts an envelope made by `make` to every worker whose inbox is
    /// still there.
    pub(crate) fn broadcast(&self, make: impl Fn() -> E) {
        for sender in self.senders.iter() {
            let _ = sender.send(make());
        }
    }
}

impl<E> Inbox<E> {
    /// The next envelope, once there is one; `None` once every sender is
    /// gone and the mailbox is empty.
    #[inline]
    pub(crate) async fn recv(&mut self) -> Option<E> {
        self.receiver.recv().await
    }

    /// Refuses later deliveries and hands back, one by one, what is still
    /// queued: for a worker dropped before it could drain its mailbox.
    pub(crate) fn close_and_drain(&mut self, mut each: impl FnMut(E)) {
        self.receiver.close();
        while let Ok(envelope) = self.receiver.try_recv() {
            each(envelope);
        }
    }
}
