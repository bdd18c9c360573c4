//! The registry of live children: one padded run of slot words per table shard, each word an occupant (its kind, generation and start time) or free; and the admission that takes a unit of the table and a slot together.

use super::{ChildGuard, ChildId, ChildKind, Common, Inner};
use crate::engine::ask::How;
use crate::engine::grant::Grant;
use crate::error::Error;
#[cfg(feature = "tokio")]
use crate::sync::Mutex;
use crate::sync::{
    yield_now, Arc, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use crate::units::Ask;
use crossbeam_utils::CachePadded;

/// The largest supervisor capacity: the registry allocates one 8-byte slot
/// per unit up front (128 MiB at this size), and ids need
/// `2^21 generations × limit` to fit in 64 bits.
pub(crate) const MAX_CHILDREN: usize = 1 << 24;

/// Slots per [`Line`]: 16 words of 8 bytes fill the 128 bytes `CachePadded`
/// aligns to on x86-64.
const PER_LINE: usize = 16;

/// A run of slots on a padded line of its own. Different shards never
/// share a line (each shard's slots are whole lines), so threads working on
/// different shards do not false-share; slots of one shard are packed,
/// since threads sharing a shard already share its table counters.
type Line = CachePadded<[AtomicU64; PER_LINE]>;

/// Bit 0 of a slot word: a child holds the slot.
pub(super) const OCCUPIED: u64 = 1;

pub(super) const KIND_SHIFT: u32 = 1;

pub(super) const GEN_SHIFT: u32 = 3;

const GEN_BITS: u32 = 21;

pub(super) const GEN_MASK: u64 = (1 << GEN_BITS) - 1;

pub(super) const START_SHIFT: u32 = GEN_SHIFT + GEN_BITS;

/// The start time is kept in units of 2^20 ns (≈1.05 ms).
pub(super) const START_UNIT_SHIFT: u32 = 20;

pub(super) const START_MAX: u64 = (1 << (64 - START_SHIFT)) - 1;

/// The bits an occupant adds to a free word (see the module docs' table).
#[inline]
pub(super) fn occupant(started_ticks: u64, kind: ChildKind) -> u64 {
    let kind = match kind {
        ChildKind::Thread => 1,
        ChildKind::Task => 2,
        ChildKind::Reserved => 3,
    };
    let started = (started_ticks >> START_UNIT_SHIFT).min(START_MAX);
    started << START_SHIFT | kind << KIND_SHIFT | OCCUPIED
}

pub(super) fn kind_of(word: u64) -> ChildKind {
    match word >> KIND_SHIFT & 0b11 {
        1 => ChildKind::Thread,
        2 => ChildKind::Task,
        _ => ChildKind::Reserved,
    }
}

/// The occupant's start, as `CoarseClock` ticks.
pub(super) fn started_of(word: u64) -> u64 {
    (word >> START_SHIFT) << START_UNIT_SHIFT
}

pub(super) fn generation_of(word: u64) -> u64 {
    word >> GEN_SHIFT & GEN_MASK
}

/// The free word that follows an occupancy of generation `generation`.
#[inline]
pub(super) fn next_free(generation: u64) -> u64 {
    ((generation + 1) & GEN_MASK) << GEN_SHIFT
}

/// One shard of the registry: `limit` slots (see the module docs), with its
/// own reference count.
///
/// A guard holds an `Arc` of its registry shard, not of the whole
/// supervisor: cloning one shared `Arc` per child would make its count a
/// hot line that every core writes (measured: 2 threads reserving took
/// 3.5× the `Limiter`'s time, against 2.5× for one thread). With a count per
/// shard, callers on different shards write different lines. Aligned to 128
/// bytes so the count (the `Arc` header) and the hint each share a line only
/// with this shard's data, not with a neighbouring allocation.
#[repr(align(128))]
pub(super) struct RegistryShard {
    /// Where the next claim looks first: the slot freed last, or the one
    /// after the slot claimed last. Always below `limit`.
    pub(super) hint: AtomicUsize,
    pub(super) lines: Box<[Line]>,
    /// The table shard's limit: how many slots there are.
    pub(super) limit: usize,
    /// Slot `i`'s task, while a task from `spawn_task` holds the slot: what
    /// `abort_all` aborts. A lock per slot, only ever contended by
    /// `abort_all`; see `register_task` for why not one shared signal.
    #[cfg(feature = "tokio")]
    pub(super) tasks: Box<[Mutex<Option<tokio::task::AbortHandle>>]>,
    index: usize,
    pub(super) common: Arc<Common>,
}

impl RegistryShard {
    pub(super) fn new(index: usize, common: Arc<Common>) -> RegistryShard {
        // One slot per unit the shard can ever hold: its cap, the even
        // share of the supervisor's `max_capacity`, which resizes respect.
        let limit = common.table.cap(index);
        let lines = (0..limit.div_ceil(PER_LINE))
            .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        RegistryShard {
            hint: AtomicUsize::new(0),
            lines,
            limit,
            index,
            common,
            #[cfg(feature = "tokio")]
            tasks: (0..limit).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Records the abort handle of the task `spawn_task_on` just started in
    /// slot `slot` (claimed with the free word `free`), unless the task has
    /// already ended.
    ///
    /// Why a cell per slot: `abort_all` must reach tasks that are pending
    /// forever, so it needs either their wakers or their abort handles. A
    /// shared cancellation signal polled by the `supervised` wrapper would
    /// still need every task to register its waker somewhere `abort_all`
    /// can find (tokio's `Notify` is one lock for all tasks), and would end
    /// them with `Ok`, not with the cancelled `JoinError` of
    /// [`Task::abort`]. The slot the task already holds gives it a cell of
    /// its own: no allocation, and a lock nobody else takes except
    /// `abort_all`. It costs the spawn one uncontended lock and the task's
    /// exit another (`leave_task`); threads and reserved guards pay
    /// nothing.
    #[cfg(feature = "tokio")]
    pub(super) fn register_task(&self, slot: usize, free: u64, handle: tokio::task::AbortHandle) {
        let mut cell = self.tasks[slot].lock();
        // Relaxed: `leave_task` frees the slot under this same lock, so the
        // lock orders its store before this load if that exit came first.
        let word = self.slot(slot).load(Relaxed);
        // Still this occupancy (the generation moves at every exit): else
        // the task has ended and its handle would only be kept alive here.
        if word & OCCUPIED != 0 && generation_of(word) == generation_of(free) {
            *cell = Some(handle);
        }
    }

    /// [`leave`](Self::leave) for a task's guard: empties the slot's task
    /// cell and frees the slot under its lock, so `register_task` either
    /// ran first (its handle is taken here) or sees the slot freed.
    #[cfg(feature = "tokio")]
    pub(super) fn leave_task(&self, slot: usize, free: u64, panicked: bool) {
        let mut cell = self.tasks[slot].lock();
        let handle = cell.take();
        self.leave(slot, free, panicked);
        drop(cell);
        // Outside the lock: the last reference to a task frees it.
        drop(handle);
    }

    #[inline]
    fn slot(&self, i: usize) -> &AtomicU64 {
        &self.lines[i / PER_LINE][i % PER_LINE]
    }

    /// The id of the child whose occupied word `word` is in slot `slot`.
    pub(super) fn id(&self, slot: usize, word: u64) -> ChildId {
        // Distinct for distinct (slot, generation) pairs: slot < limit, and
        // generation × limit stays below 2^64 (limit ≤ MAX_CHILDREN).
        let seq = generation_of(word) * self.limit as u64 + slot as u64 + 1;
        ChildId::new(self.index, seq)
    }

    /// Claims a free slot for an occupant whose unit on this shard is taken
    /// (so a free slot exists: module docs). Returns the slot and the free
    /// word it replaced.
    #[inline(always)]
    fn claim(&self, occupant: u64) -> (usize, u64) {
        // Relaxed: a hint; any start finds a free slot, and the CAS decides.
        let i = self.hint.load(Relaxed);
        match self.try_claim(i, occupant) {
            Some(free) => (i, free),
            None => self.claim_slow(i, occupant),
        }
    }

    /// One attempt on slot `i`: the free word it replaced, if it was free.
    #[inline(always)]
    fn try_claim(&self, i: usize, occupant: u64) -> Option<u64> {
        let slot = self.slot(i);
        // Relaxed: only a guess at the free word; the CAS re-checks it.
        let word = slot.load(Relaxed);
        if word & OCCUPIED != 0 {
            return None;
        }
        // Relaxed: mutual exclusion needs only that the one word's
        // modification order admits a single CAS from this free value. The
        // occupant publishes nothing beyond this word, which listers read
        // whole; and the previous occupant's exit is ordered before this
        // claim by the table (its release is read by our admission's
        // Acquire). A lister that reads this word still synchronizes with
        // the previous occupant's Release free: an RMW continues the release
        // sequence of the store it replaces.
        slot.compare_exchange(word, word | occupant, Relaxed, Relaxed)
            .ok()?;
        let next = if i + 1 == self.limit { 0 } else { i + 1 };
        // Relaxed: a hint.
        self.hint.store(next, Relaxed);
        Some(word)
    }

    /// The walk: every slot from `start`, round and round, until a claim
    /// succeeds. It ends: a free slot exists at every instant while the
    /// caller holds a unit but no slot, and a slot seen occupied or lost to
    /// a CAS was taken by a caller that made progress.
    #[cold]
    fn claim_slow(&self, start: usize, occupant: u64) -> (usize, u64) {
        let mut i = start;
        loop {
            for _ in 0..self.limit {
                i = if i + 1 == self.limit { 0 } else { i + 1 };
                if let Some(free) = self.try_claim(i, occupant) {
                    return (i, free);
                }
            }
            // Every slot was seen taken: their holders are leaving or other
            // claimers are in their window. Let them run (under loom, this
            // is the yield a wait loop must make).
            yield_now();
        }
    }

    /// Calls `f(slot, word)` for every occupied slot, one load each.
    pub(super) fn for_each_child(&self, mut f: impl FnMut(usize, u64)) {
        for i in 0..self.limit {
            // Acquire: pairs with the Release free store in `leave`: a lister
            // that reads a free word (or a later claim, which continues that
            // store's release sequence) sees everything the departed child
            // did. Coherence alone makes a free that happened-before this
            // listing visible here, so a released child is never listed.
            let word = self.slot(i).load(Acquire);
            if word & OCCUPIED != 0 {
                f(i, word);
            }
        }
    }

    /// Frees slot `slot` (claimed with the free word `free`), gives the
    /// unit back, and wakes `wait_idle` if the shard became empty while
    /// someone waits (module docs).
    #[inline(always)]
    pub(super) fn leave(&self, slot: usize, free: u64, panicked: bool) {
        // Release: pairs with the Acquire load in `for_each_child`. Also
        // sequenced before the table release below, whose Release RMW on
        // `given` the next admission on this shard reads with Acquire: so a
        // claimer admitted on our unit finds this slot free.
        self.slot(slot)
            .store(next_free(generation_of(free)), Release);
        // Relaxed: a hint.
        self.hint.store(slot, Relaxed);
        let common = &*self.common;
        common.table.release(self.index, panicked);
        // Relaxed: ordered after a waiter's bump by the RMWs on `given`
        // (the AcqRel RMW in `release` against the waiter's
        // `usage_synced`), not by this load: see the module docs.
        if common.waiters.load(Relaxed) != 0 {
            self.wake_if_empty();
        }
    }

    #[cold]
    fn wake_if_empty(&self) {
        // After our own release: every give up to ours is counted, and the
        // takes they paired with happened-before them, so an empty shard
        // reads 0. A concurrent take makes it non-zero; that child's own
        // leave will do the waking.
        if self.common.table.shard(self.index).usage() == 0 {
            self.common.wake_idle();
        }
    }
}

impl Inner {
    /// Admits and registers one child.
    // `inline(always)` here and on `claim`, `try_claim` and `leave`: with
    // plain `#[inline]` LLVM kept `enter` out of line in the bench binary
    // (though not in a small example), and reserve + drop cost ~40 ns
    // there against ~29 ns inlined (`PERFORMANCE.md`, the supervisor bench). The
    // callers are `reserve`, `reserve_at`, `spawn` and `spawn_task_on`.
    #[inline(always)]
    pub(super) fn enter(&self, how: How, kind: ChildKind) -> Result<ChildGuard, Error> {
        let shard = self.common.table.admit_one(how)?;
        Ok(self.register(shard, kind))
    }

    /// Admits a child of what `ask` describes and registers it: one unit
    /// through [`enter`](Self::enter), the hot path; any other number
    /// through the table's front door. An ask of 0 units is `TooLarge`: a
    /// child holds at least one unit (its registry slot is on the shard
    /// of one of them).
    pub(super) fn enter_with(&self, ask: Ask, kind: ChildKind) -> Result<ChildGuard, Error> {
        if ask.is_one() {
            return self.enter(ask.how, kind);
        }
        if ask.units == 0 {
            return Err(Error::TooLarge);
        }
        let grant = self.common.table.admit(&ask)?;
        Ok(self.register_many(grant, kind))
    }

    /// [`enter_with`](Self::enter_with) for a caller that waits without
    /// blocking its thread (cancel safe: nothing is registered until the
    /// units are there).
    pub(super) async fn enter_with_async(
        &self,
        ask: Ask,
        kind: ChildKind,
    ) -> Result<ChildGuard, Error> {
        if ask.units == 0 {
            return Err(Error::TooLarge);
        }
        let grant = self.common.table.admit_async(ask).await?;
        Ok(self.register_many(grant, kind))
    }

    /// Registers a child on `shard`, whose unit the caller holds. Inlined
    /// always, as `enter` is (see there).
    #[inline(always)]
    pub(super) fn register(&self, shard: usize, kind: ChildKind) -> ChildGuard {
        let occupant = occupant(self.clock.ticks(), kind);
        let registry = &self.registry[shard];
        let (slot, free) = registry.claim(occupant);
        ChildGuard {
            shard: Arc::clone(registry),
            free,
            slot: slot as u32,
            panicked: false,
            #[cfg(feature = "tokio")]
            task: false,
            keyed: false,
            key: 0,
            more: std::mem::ManuallyDrop::new(None),
        }
    }

    /// Registers a child of the units of `grant` (taken by the caller):
    /// its slot on the grant's first shard, which holds at least one of
    /// them; the rest ride in the guard.
    pub(super) fn register_many(&self, mut grant: Grant, kind: ChildKind) -> ChildGuard {
        debug_assert!(grant.here >= 1, "a grant's first shard holds a unit");
        let mut guard = self.register(grant.shard, kind);
        grant.here -= 1;
        // A gated class's or a tenant's child keeps its grant even of no
        // units more: its class and key, to count its units out of their
        // holdings at the end.
        if grant.units() > 0 || grant.class.gate().is_some() || grant.key != 0 {
            // The new guard's is `None`: nothing is overwritten.
            *guard.more = Some(Box::new(grant));
        }
        guard
    }
}
