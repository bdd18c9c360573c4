//! The async idle room: where the free workers of a stealing
//! [`AsyncPool`](crate::PoolBuilder::steal) await work queued at *any*
//! worker's mailbox, how a delivery wakes one of them, and the take loop
//! ([`next`]) those workers run.
//!
//! It is the thread pool's room (`pool/steal.rs`) with wakers in place of a
//! condition variable, and it lives in the engine rather than beside the
//! async pool because it needs no tokio: the loom models, which cannot
//! build tokio, drive it directly (`loom-tests/tests/loom_async_steal.rs`).
//!
//! # Taking
//!
//! Each mailbox is a multi-consumer queue (a crossbeam channel: every
//! worker holds every receiver, and the channel hands each envelope to one
//! of them). A worker looks at its own mailbox first, then once at each
//! other one, starting after its own (so two thieves do not both start at
//! mailbox 0). A task never spins: with nothing found it sleeps.
//!
//! # Sleeping and waking
//!
//! Each worker has an atomic waker slot of its own (the `atomic-waker`
//! crate: futures' `AtomicWaker`, tokio MPSC's discipline), a bit in the
//! `asleep` bitmap, and a `looking` flag, true while it is awake between
//! two requests and about to look at its own mailbox. No lock anywhere:
//!
//! * a sleeper registers its waker in its slot, sets its `asleep` bit,
//!   clears `looking`, issues a `SeqCst` fence, then re-checks every
//!   mailbox and its exit rule; it returns `Pending` only if all are empty
//!   and the rule does not hold;
//! * a producer pushes its envelope to mailbox `to`, issues a `SeqCst`
//!   fence and reads `to`'s word of the bitmap: if `to` sleeps it *claims*
//!   `to` (clears its bit with an RMW; one claimer wins) and wakes its
//!   slot; if `to` is awake and looking, nobody is woken; otherwise (or if
//!   another producer won the claim) it claims and wakes the next sleeper
//!   after `to`, if any;
//! * a worker that takes an envelope clears `looking`, issues a `SeqCst`
//!   fence, and looks again: at its own mailbox if it took from there
//!   without having slept, at every mailbox if it stole or slept (it may
//!   then hold the notification meant for another envelope). If anything
//!   is left and someone sleeps, it wakes one.
//!
//! The fences make this Dekker's pattern. Take a producer's fence `Fp` and
//! a sleeper's fence `Fs` in the single total order of `SeqCst` fences. If
//! `Fs` comes first, the producer's read sees the sleeper's bit (or the bit
//! already claimed, so the sleeper is being woken and will look again), and
//! wakes a sleeper unless the owner is looking. If `Fp` comes first, the
//! sleeper's re-check sees the envelope and it does not sleep. The same
//! holds for an owner's `looking`: a producer that reads it true had its
//! fence before the owner's next clearing fence, whose look after it sees
//! the envelope.
//!
//! A cleared bit is the notification. Whoever clears a sleeper's bit wakes
//! its slot afterwards, and a sleeper polled again registers its waker
//! *before* it reads its bit (the atomic waker's contract: a wake after a
//! registration wakes that waker), so a claim is never lost, and a sleeper
//! is done sleeping exactly when its bit is clear. A claim whose wake
//! arrives after the sleeper already left is a spurious wake-up of an
//! awake task, which the next poll absorbs. The claim is `AcqRel` against
//! the sleeper's `Release` set: the claimer's wake sees the waker
//! registered before the bit, and the sleeper that reads its bit clear
//! (`Acquire`) sees the envelope pushed before the claim.
//!
//! The cost on the plain path: a delivery pays one fence and reads one
//! word that changes only when a worker sleeps or wakes; the wake-up (an
//! RMW on that word and the slot's `wake`) only when a worker sleeps and
//! the mailbox's owner is not already about to look. A worker pays one
//! fence per request, and a sleep two RMWs on its own slot and one on the
//! bitmap.
//!
//! Shutdown changes every sleeper's exit rule rather than a mailbox: after
//! a fence, it claims and wakes every sleeper ([`AsyncIdle::wake_all`]);
//! a worker that gave back a unit of another worker's shard wakes that
//! owner the same way ([`after_release`]), which may be asleep waiting for
//! exactly that release to drain its closed shard.

use std::future::poll_fn;
use std::task::Poll;

use crossbeam_utils::CachePadded;

use crate::pool::steal::Queue;
use crate::sync::{fence, AtomicBool, AtomicUsize, AtomicWaker, Ordering};

/// Workers per word of the `asleep` bitmap.
const BITS: usize = usize::BITS as usize;

/// Worker `worker`'s bit in its word of the `asleep` bitmap.
#[inline]
fn bit(worker: usize) -> usize {
    1 << (worker % BITS)
}

/// Where a stealing async pool's free workers sleep, and how a delivery
/// wakes one.
#[derive(Debug)]
pub(crate) struct AsyncIdle {
    /// Bit `w % BITS` of word `w / BITS`: worker `w` sleeps, its waker in
    /// its slot, and nobody has claimed its wake-up yet. Set by the sleeper
    /// itself; cleared by whoever claims the wake-up (an RMW: one wins).
    asleep: Box<[CachePadded<AtomicUsize>]>,
    /// Per worker: true while it is awake between requests and will look
    /// at its own mailbox before it takes anything or sleeps. Each on its
    /// own line: its worker writes it twice per request.
    looking: Box<[CachePadded<AtomicBool>]>,
    /// Per worker: its waker while it sleeps (and perhaps after; a stale
    /// waker is only woken by a claim, which the bit rules out).
    wakers: Box<[CachePadded<AtomicWaker>]>,
}

impl AsyncIdle {
    /// A room for `workers` workers, none asleep, none looking.
    pub(crate) fn new(workers: usize) -> Self {
        AsyncIdle {
            asleep: (0..workers.div_ceil(BITS).max(1))
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            looking: (0..workers)
                .map(|_| CachePadded::new(AtomicBool::new(false)))
                .collect(),
            wakers: (0..workers)
                .map(|_| CachePadded::new(AtomicWaker::new()))
                .collect(),
        }
    }

    /// Tells the sleepers (if any) that an envelope was just queued at
    /// worker `to`. Nobody is woken if nobody sleeps, or if `to` is awake
    /// and about to look at its mailbox (if it takes another envelope
    /// first, it wakes a sleeper itself, see `took`).
    #[inline]
    pub(crate) fn work_added(&self, to: usize) {
        // SeqCst fence: pairs with the fences in `sleep_until` and `took`.
        // Either these reads see the sleeper's bit and the owner not
        // looking, or the other side's look, after its fence, sees the
        // envelope pushed before this one (Dekker; see the module docs).
        fence(Ordering::SeqCst);
        // Relaxed, here and for `looking`: ordered by the fence above; the
        // claim's RMW decides who wakes.
        let word = self.asleep[to / BITS].load(Ordering::Relaxed);
        if word & bit(to) != 0 {
            if self.claim(to) {
                return;
            }
        } else if (word == 0 && self.asleep.len() == 1) || self.looking[to].load(Ordering::Relaxed)
        {
            return;
        }
        self.wake_one(to);
    }

    /// How many workers sleep now; a reading, for the loom models.
    #[cfg(loom)]
    pub(crate) fn sleepers(&self) -> usize {
        self.asleep
            .iter()
            // Relaxed: a reading; the models wait on it with yields.
            .map(|word| word.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }

    /// Worker `me` is awake and will look at its own mailbox.
    #[inline]
    fn look(&self, me: usize) {
        // Relaxed: a producer that misses it only wakes a sleeper for
        // nothing; one that sees it is covered by the fence in `took` or
        // `sleep_until`, which comes before `me` stops looking.
        self.looking[me].store(true, Ordering::Relaxed);
    }

    /// Worker `me` took an envelope and stops looking. If envelopes remain
    /// (in its own mailbox, or with `everywhere` in any), a producer may
    /// have counted on `me`, or woken `me` for one of them: wake a sleeper.
    #[inline]
    fn took<Q: Queue>(&self, me: usize, mailboxes: &[Q], everywhere: bool) {
        // Relaxed: ordered by the fence below.
        self.looking[me].store(false, Ordering::Relaxed);
        // SeqCst fence: pairs with the one in `work_added`.
        fence(Ordering::SeqCst);
        if !self.anyone_asleep() {
            return;
        }
        let left = if everywhere {
            mailboxes.iter().any(|queue| !queue.is_empty())
        } else {
            !mailboxes[me].is_empty()
        };
        if left {
            // `me` is awake, so its bit is clear: another one is woken.
            self.wake_one(me);
        }
    }

    /// Whether any bit of the bitmap is set.
    #[inline]
    fn anyone_asleep(&self) -> bool {
        self.asleep
            .iter()
            // Relaxed: the callers' fences order it; a claim's RMW decides.
            .any(|word| word.load(Ordering::Relaxed) != 0)
    }

    /// Claims worker `worker`'s wake-up and wakes it; false if it was not
    /// asleep (or another claimer won).
    #[inline]
    fn claim(&self, worker: usize) -> bool {
        // AcqRel: Acquire pairs with the sleeper's Release set (its waker,
        // registered before, is what `wake` below finds); Release pairs
        // with the sleeper's Acquire read of its cleared bit (it sees what
        // was queued before this claim).
        let before = self.asleep[worker / BITS].fetch_and(!bit(worker), Ordering::AcqRel);
        if before & bit(worker) == 0 {
            return false;
        }
        self.wakers[worker].wake();
        true
    }

    /// Wakes one sleeper: worker `preferred` if it sleeps, else the first
    /// one after it.
    #[cold]
    fn wake_one(&self, preferred: usize) {
        let words = self.asleep.len();
        let (first, shift) = (preferred / BITS, preferred % BITS);
        // Word `first` twice: its bits from `preferred` on, and, after
        // the others, the bits before it.
        for step in 0..=words {
            let index = (first + step) % words;
            // Relaxed: a hint; the claim's RMW decides.
            let mut word = self.asleep[index].load(Ordering::Relaxed);
            if step == 0 {
                word &= !0 << shift;
            } else if step == words {
                word &= (1 << shift) - 1;
            }
            while word != 0 {
                let worker = index * BITS + word.trailing_zeros() as usize;
                if self.claim(worker) {
                    return;
                }
                word &= word - 1;
            }
        }
    }

    /// Wakes worker `worker` if it sleeps, so it re-checks its exit rule.
    pub(crate) fn wake(&self, worker: usize) {
        // SeqCst fence: pairs with the one in `sleep_until`. Either this
        // read sees the sleeper's bit, or its re-check, after its fence,
        // sees what the caller did before this call.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence; the claim decides.
        if self.asleep[worker / BITS].load(Ordering::Relaxed) & bit(worker) != 0 {
            self.claim(worker);
        }
    }

    /// Wakes every sleeper so it re-checks its exit rule: after a shutdown
    /// began.
    pub(crate) fn wake_all(&self) {
        // SeqCst fence: as in `wake`, for every sleeper.
        fence(Ordering::SeqCst);
        for (index, word) in self.asleep.iter().enumerate() {
            // Relaxed: ordered by the fence; the claims decide.
            let mut word = word.load(Ordering::Relaxed);
            while word != 0 {
                self.claim(index * BITS + word.trailing_zeros() as usize);
                word &= word - 1;
            }
        }
    }

    /// Sets `me`'s bit: it sleeps, its waker registered.
    fn fall_asleep(&self, me: usize) {
        // Release: pairs with the Acquire of a claim, whose wake then
        // finds the waker registered before this.
        self.asleep[me / BITS].fetch_or(bit(me), Ordering::Release);
    }

    /// Whether `me`'s bit is still set (nobody claimed its wake-up).
    fn still_asleep(&self, me: usize) -> bool {
        // Acquire: pairs with the Release of the claim that cleared it.
        self.asleep[me / BITS].load(Ordering::Acquire) & bit(me) != 0
    }

    /// Clears `me`'s bit itself, if nobody claimed it. A claim that won
    /// first wakes `me` for nothing, once, later.
    fn cancel(&self, me: usize) {
        // Relaxed: `me` wakes nobody here, and what it looks at next is
        // ordered by its own fence.
        self.asleep[me / BITS].fetch_and(!bit(me), Ordering::Relaxed);
    }

    /// Sleeps until woken, unless `ready` holds right after the
    /// registration (then at once). The caller re-checks what it waits
    /// for: a wake-up may find nothing left.
    async fn sleep_until(&self, me: usize, ready: impl Fn() -> bool) {
        let mut nap = Nap {
            idle: self,
            me,
            registered: false,
        };
        poll_fn(|cx| {
            if nap.registered {
                // Polled again: woken (the bit is clear), or not; then the
                // waker is registered again before a second look, so a
                // claim after the registration wakes this waker, and one
                // before it cleared the bit read after it.
                for register in [false, true] {
                    if register {
                        self.wakers[me].register(cx.waker());
                    }
                    if !self.still_asleep(me) {
                        nap.registered = false;
                        return Poll::Ready(());
                    }
                }
                return Poll::Pending;
            }
            // The waker before the bit: a claimer that sees the bit finds
            // the waker (see `fall_asleep`).
            self.wakers[me].register(cx.waker());
            self.fall_asleep(me);
            nap.registered = true;
            // Relaxed: ordered by the fence below.
            self.looking[me].store(false, Ordering::Relaxed);
            // SeqCst fence: pairs with the one in `work_added`. Either a
            // producer after it sees this sleeper's bit, or this re-check
            // sees its envelope.
            fence(Ordering::SeqCst);
            if ready() {
                // `nap` takes the bit back when dropped below.
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
        drop(nap);
    }
}

/// A registration in the room, taken back if the sleep ends without a
/// wake-up, or its future is dropped (the runtime drops the worker).
struct Nap<'a> {
    idle: &'a AsyncIdle,
    me: usize,
    registered: bool,
}

impl Drop for Nap<'_> {
    fn drop(&mut self) {
        if self.registered {
            self.idle.cancel(self.me);
        }
    }
}

/// The next envelope for worker `me`: from its own mailbox, or taken from
/// another one; with the index of the mailbox (the shard whose unit it
/// holds). Sleeps in `idle` while no mailbox has anything. `None` once
/// `done` (the worker's exit rule) holds and no mailbox has anything.
pub(crate) async fn next<Q: Queue>(
    me: usize,
    mailboxes: &[Q],
    idle: &AsyncIdle,
    done: impl Fn() -> bool,
) -> Option<(usize, Q::Item)> {
    idle.look(me);
    let mut slept = false;
    loop {
        if let Some(item) = take(&mailboxes[me]) {
            idle.took(me, mailboxes, slept);
            return Some((me, item));
        }
        if let Some(found) = steal(me, mailboxes) {
            idle.took(me, mailboxes, true);
            return Some(found);
        }
        if done() {
            return None;
        }
        idle.sleep_until(me, || {
            done() || mailboxes.iter().any(|queue| !queue.is_empty())
        })
        .await;
        slept = true;
        idle.look(me);
    }
}

/// What worker `me` does after it gave back a unit of shard `from`: if it
/// was another worker's shard, that worker may be asleep waiting for
/// exactly this release to drain it (its shutdown has begun): wake it.
///
/// Unconditional for a stolen unit (a check of "is that shard closed?"
/// would race the close). The fence in [`AsyncIdle::wake`] orders this
/// release before the owner's next re-check, or this call sees the owner's
/// bit and wakes it.
#[inline]
pub(crate) fn after_release(idle: &AsyncIdle, me: usize, from: usize) {
    if from != me {
        idle.wake(from);
    }
}

/// One look at every other mailbox, starting after `me`.
fn steal<Q: Queue>(me: usize, mailboxes: &[Q]) -> Option<(usize, Q::Item)> {
    let count = mailboxes.len();
    (1..count)
        .map(|step| (me + step) % count)
        .find_map(|other| take(&mailboxes[other]).map(|item| (other, item)))
}

/// The oldest item of `queue`, if it has one. Looks before it takes: a
/// reading is two loads, while a take (crossbeam's `try_recv`) issues a
/// `SeqCst` fence even on an empty list, and an idle worker looks at every
/// mailbox. An item pushed just after the look is found by the re-check
/// after the sleeper's fence, as one pushed just after a failed take.
#[inline]
fn take<Q: Queue>(queue: &Q) -> Option<Q::Item> {
    if queue.is_empty() {
        return None;
    }
    queue.try_take()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Wake, Waker};

    use super::AsyncIdle;
    use crate::sync::{Arc, AtomicUsize, Ordering};

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            // Relaxed: read on this thread.
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A sleeper: its nap and its waker's count.
    struct Sleeper<'a> {
        nap: Pin<Box<dyn Future<Output = ()> + 'a>>,
        count: Arc<Count>,
    }

    impl<'a> Sleeper<'a> {
        fn new(idle: &'a AsyncIdle, me: usize) -> Self {
            Sleeper {
                nap: Box::pin(idle.sleep_until(me, || false)),
                count: Arc::default(),
            }
        }

        fn poll(&mut self) -> Poll<()> {
            let waker = Waker::from(Arc::clone(&self.count));
            self.nap.as_mut().poll(&mut Context::from_waker(&waker))
        }

        fn woken(&self) -> usize {
            // Relaxed: written on this thread.
            self.count.0.load(Ordering::Relaxed)
        }
    }

    /// Over three words of the bitmap (130 workers), a delivery to a
    /// worker that neither sleeps nor looks wakes the first sleeper after
    /// it, wrapping around: 129, then 5, then 70 for deliveries to 100;
    /// then nobody. A sleeper polled again is done sleeping once woken,
    /// and only then; a delivery to a sleeper's own mailbox wakes it.
    #[test]
    fn a_delivery_wakes_the_next_sleeper_after_its_mailbox_across_words() {
        let idle = AsyncIdle::new(130);
        let mut sleepers: Vec<Sleeper> = [5, 70, 129]
            .iter()
            .map(|&me| Sleeper::new(&idle, me))
            .collect();
        for sleeper in &mut sleepers {
            assert_eq!(sleeper.poll(), Poll::Pending);
            assert_eq!(sleeper.poll(), Poll::Pending, "not woken: still asleep");
        }
        let woken = |sleepers: &[Sleeper]| sleepers.iter().map(Sleeper::woken).collect::<Vec<_>>();
        for expected in [[0, 0, 1], [1, 0, 1], [1, 1, 1], [1, 1, 1]] {
            idle.work_added(100);
            assert_eq!(woken(&sleepers), expected);
        }
        for sleeper in &mut sleepers {
            assert_eq!(sleeper.poll(), Poll::Ready(()));
        }
        let mut own = Sleeper::new(&idle, 7);
        assert_eq!(own.poll(), Poll::Pending);
        idle.work_added(7);
        assert_eq!(own.woken(), 1);
        assert_eq!(own.poll(), Poll::Ready(()));
    }
}
