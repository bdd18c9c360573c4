//! The sharded admission table: the one engine behind [`Limiter`], [`Pool`]
//! and [`Supervisor`].
//!
//! [`Limiter`]: crate::Limiter
//! [`Pool`]: crate::Pool
//! [`Supervisor`]: crate::Supervisor
//!
//! One protocol a file, the hot path first:
//!
//! * `admission.rs`: the front door: `admit(&Ask)` and its async twin,
//!   every front-end's way in; one unit goes on to the hot path.
//! * `admit.rs`: **the hot path.** Admission (`acquire`, `try_at`: the
//!   caller's own shard, the walk, the refusal) and release (`release_shard`,
//!   `give_back_many`), down to the shard's CAS (`Shard::take_fast`,
//!   `Shard::try_take`) and RMW; the common case inline, the rest out of
//!   line. What `Overload` promises.
//! * `full.rs`: the full set, a bitmap of shards marked full, and the
//!   protocol that keeps it from ever *staying* wrong in the harmful
//!   direction.
//! * `readings.rs`: usage and stats, read without stopping anyone.
//! * `resize.rs`: `set_capacity`: gate, read, split, un-gate; the debt of a
//!   shrink below the holdings.
//! * `room.rs`: the waiting room's side of the table: queueing, hand-off,
//!   wake-up, cancellation (the queue itself is `waiters.rs`).
//! * `many.rs`: requests of many units: `n` at once, from one shard or,
//!   under the control lock, from several; the [`Grant`] that says where.
//!
//! This file holds the types they share, the constants of the shard words,
//! construction, and shutdown.
//!
//! # Layout
//!
//! Capacity `C` is split over `M` shards. Shard `i` may hold
//! `limit_i` units; the limits are `C / M`, the first `C % M` one more, and
//! add up to exactly `C` (with `C < M` the last shards' limit is 0: they
//! are marked full from the start, and kept so that a resize can grow into
//! them). Each shard is one 128-byte
//! padded line holding two counters:
//!
//! | word    | bits                     | changed by                        |
//! |---------|--------------------------|-----------------------------------|
//! | `taken` | `4 × units ever taken`, bit 0 = CLOSED, bit 1 = GATED | CAS in [`Shard::try_take`], `fetch_or` in [`Shard::close`] and in a resize's gate |
//! | `given` | `4 × units ever given back` | `fetch_add` in [`Shard::give_back_many`] |
//!
//! so `usage = (taken - given) / 4` (wrapping), and a shard's *accepted* and
//! *released* counts are free. Admission is one CAS on `taken`, release one
//! RMW on `given`: the floor of two locked instructions per unit. CLOSED
//! lives in the `taken` word, so admission versus shutdown is decided by that
//! one word's modification order: a take either precedes the close (and is
//! admitted, so the pool drains it) or sees CLOSED and is refused.

use crossbeam_utils::CachePadded;

use crate::engine::class::{Class, Headroom, GATED as GATED_CLASSES};
use crate::engine::keys::Ledger;
use crate::engine::probe::Probe;
use crate::engine::split;
use crate::engine::waiters::{Queue, Room, Woken};
use crate::error::ConfigError;
use crate::stats::RejectCounter;
use crate::sync::{
    Arc, AtomicBool, AtomicUsize, Mutex,
    Ordering::{AcqRel, Acquire, Relaxed},
};

mod admission;
mod admit;
mod classed;
mod full;
mod keyed;
mod many;
mod readings;
mod resize;
mod room;
mod unit;

pub(crate) use crate::engine::grant::{Grant, Part};
#[cfg(not(loom))]
use room::RoomAlarm;
pub(crate) use unit::{Batch, Held, Unit};
#[cfg(all(test, not(loom)))]
mod tests;

/// Bit 0 of `taken`: the shard admits nothing more.
const CLOSED: usize = 1;
/// Bit 1 of `taken`: takes go through [`Table::acquire_gated`]: a resize is
/// in progress, or the table is in debt (see the module docs).
const GATED: usize = 2;
/// The flag bits of `taken`.
const FLAGS: usize = CLOSED | GATED;
/// One unit in `taken` and `given`.
const UNIT: usize = 4;
/// Bits per word of the full set.
const BITS: usize = usize::BITS as usize;
/// How often [`Shard::counts`] retries for an exact reading before it falls
/// back to a lower bound. One under loom, so models reach the fallback.
#[cfg(not(loom))]
const CONSISTENT_READ_TRIES: usize = 8;
#[cfg(loom)]
const CONSISTENT_READ_TRIES: usize = 1;

/// The largest capacity a table accepts: usage is kept in units of four in
/// a `usize`, with one bit to spare.
pub(crate) const MAX_CAPACITY: usize = usize::MAX >> 4;
/// The largest shard count: far beyond any core count, and it keeps the
/// fast modulo within 32 bits.
pub(crate) const MAX_SHARDS: usize = 1 << 16;
/// What one attempt on one shard found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// A unit was taken; `now_full` if it was the shard's last.
    Taken { now_full: bool },
    /// The shard was at its limit.
    Full,
    /// The shard is closed.
    Closed,
    /// The shard is gated: take through [`Table::acquire_gated`].
    Gated,
    /// A unit was taken above a limit that a racing resize lowered: give
    /// it back with [`Table::undo`] and treat the shard as full.
    Over,
}

/// What a take is bounded by: the shard's limit (every class but the
/// gated ones), or the line of gated class `g` (`engine/class.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    Limit,
    Line(usize),
}

impl Bound {
    /// The bound of a take of `class`.
    #[inline(always)]
    pub(crate) fn of(class: Class) -> Bound {
        match class.gate() {
            None => Bound::Limit,
            Some(g) => Bound::Line(g),
        }
    }
}

/// One shard: its limit and its two counters, on a line of its own.
#[derive(Debug)]
pub(crate) struct Shard {
    /// Its index in the table.
    index: usize,
    /// Its bit in its word of the full set, `1 << (index % 64)`: a release
    /// holding the shard tests the full set with it, from the line it is
    /// about to write, with no index arithmetic (`Table::release_shard`).
    bit: usize,
    /// `4 × units ever taken`, plus [`CLOSED`] in bit 0 and [`GATED`] in
    /// bit 1.
    taken: AtomicUsize,
    /// `4 × units ever given back`.
    given: AtomicUsize,
    /// How many units this shard may hold at once. Changed only by a
    /// resize, while the shard is gated.
    limit: AtomicUsize,
    /// The most units ever held at once.
    peak: AtomicUsize,
    /// Units given back by a panic.
    panicked: AtomicUsize,
    /// Units whose holder gave them up for good (`Permit::forget`).
    forgotten: AtomicUsize,
    /// Each gated class's line: the most units this shard may hold after a
    /// take of that class (`engine/class.rs`). Changed only by a resize,
    /// with `limit`, while the shard is gated.
    lines: [AtomicUsize; GATED_CLASSES],
    /// Units that nobody held: takes undone because a racing resize
    /// lowered the limit under them, and units taken for a waiter that left
    /// meanwhile. Each is counted once in `taken` and once in `given`, and
    /// left out of the stats.
    phantom: AtomicUsize,
    /// Raised while this shard's consumer polls for its next request: a
    /// stealing pool's worker (`pool/steal.rs`); no other front-end uses
    /// it. It lives here, beside the counters, because the producer that
    /// reads it has just taken a unit on this line, so the read costs no
    /// cache miss, and the worker writes it beside its release. On a line
    /// of its own it was one more miss per request: a stealing pool's
    /// round trip read a median of 1.18x the plain pool's, against
    /// 1.07-1.10x here (`PERFORMANCE.md`, the dispatch bench).
    attended: AtomicBool,
    /// `Overload`s answered on the fast path to the thread whose index is
    /// this shard's (`thread_home`): that thread is its only writer, as it
    /// is of its slot in the table's `RejectCounter`, which counts every
    /// other refusal. Here, the refusal's count needs no bound on the
    /// thread's slot: the shard was bounded to find it, and the caller
    /// has just read its first line.
    refused_home: AtomicUsize,
}

/// Which shards are at their limit, one bit each (see the module docs).
#[derive(Debug)]
struct FullSet {
    /// Word 0, inline: with up to 64 shards (the usual case) every probe
    /// and release reads it, and one load beats a pointer and a load.
    first: CachePadded<AtomicUsize>,
    /// Words 1 and up, for tables of more than 64 shards.
    rest: Box<[CachePadded<AtomicUsize>]>,
}

/// What the control lock guards.
#[derive(Debug, Default)]
struct Control {
    /// More units are held than the capacity in force: every shard stays
    /// gated, and `acquire_gated` admits nothing until `settle` ends it.
    /// No unit is handed to a waiter meanwhile.
    debt: bool,
    /// The waiters, if the table has a waiting room (`waiters.rs`).
    queue: Queue,
    /// Per shard, the units handed from a release straight to a waiter
    /// (see `Shard::stats`). Empty until the first hand-off.
    handed: Vec<usize>,
}

impl Control {
    /// Units the room has handed from releases straight to waiters, over
    /// every shard (wrapping, as the table's counts do): admissions
    /// without a take, which the pass budget counts with the takes.
    fn handed_total(&self) -> usize {
        self.handed
            .iter()
            .fold(0usize, |sum, &h| sum.wrapping_add(h))
    }
}

/// The admission table shared by every front-end.
#[derive(Debug)]
pub(crate) struct Table {
    shards: Box<[CachePadded<Shard>]>,
    full: FullSet,
    /// `shards - 1` when the shard count is a power of two (the common
    /// case: one shard per CPU), else 0 and [`Table::reduce`] uses `magic`.
    mask: usize,
    /// `u64::MAX / shards + 1`, for Lemire's fast modulo in [`Table::reduce`].
    magic: u64,
    /// The full set's value when every shard is full, if it fits one word
    /// (up to 64 shards); otherwise 0, and `full_count` says it.
    all_full: usize,
    /// With more shards than one word of the full set holds: how many bits
    /// are set, so that a refusal is one load whatever the shard count.
    /// Kept only then (`counted`); with one word, the word is the summary.
    full_count: CachePadded<AtomicUsize>,
    counted: bool,
    /// The capacity in force: the sum of the shard limits.
    capacity: AtomicUsize,
    /// Each shard's largest limit, if bounded (the supervisor's slots).
    caps: Option<Box<[usize]>>,
    /// The fraction of the capacity each gated class may fill, which a
    /// resize splits into the shards' lines.
    headroom: Headroom,
    /// The per-class figures of the classed paths (`classed.rs`).
    classes: classed::ClassTally,
    /// The tenant keys' units, weights and caps (`keyed.rs`); the room's
    /// fair order reads it too (`waiters/fair.rs`).
    keys: Arc<Ledger>,
    /// The fraction of the capacity a key over its fair share may take
    /// a fail-fast ask's units under (`keyed.rs`, "The fair line").
    fair_line: f64,
    /// Serializes resizes, the gated path and the waiting room. In an
    /// `Arc` so that the room's alarm can reach it.
    control: Arc<Mutex<Control>>,
    /// The waiting room, if the front-end's builder asked for one.
    room: Option<Arc<Room>>,
    /// What the deadline watcher rings for this room's async waiters; the
    /// watcher holds it weakly.
    #[cfg(not(loom))]
    alarm: Option<Arc<RoomAlarm>>,
    probe: Probe,
    /// [`Probe::Thread`] and at most 64 shards: admission starts at the
    /// thread's index as stored when it is below the shard count, and a
    /// refusal reads the full set's first word alone (`Table::acquire_shard`).
    thread_home: bool,
    /// At most 64 shards: the full set is one word, and a release tests
    /// it with its shard's bit alone (`Table::release_shard`).
    one_word: bool,
    rejected: RejectCounter,
    /// Set once shutdown begins; read only to tell `Shutdown` from
    /// `Overload` on the cold path.
    closed: AtomicBool,
}

impl Table {
    /// A table of `capacity` units over `shards` shards. Every shard is
    /// kept whatever the capacity (a shard whose limit is 0 is full), so the
    /// table can grow into all of them.
    pub(crate) fn new(capacity: usize, shards: usize, probe: Probe) -> Result<Self, ConfigError> {
        Table::with_caps(capacity, shards, probe, None)
    }

    /// As [`new`](Self::new), with each shard's limit bounded by the even
    /// split of `max_capacity` (whatever later resizes ask for): for the
    /// supervisor, whose registry has that many slots per shard.
    pub(crate) fn with_max(
        capacity: usize,
        max_capacity: usize,
        shards: usize,
        probe: Probe,
    ) -> Result<Self, ConfigError> {
        if capacity > max_capacity {
            return Err(ConfigError::too_large("capacity", max_capacity));
        }
        if shards == 0 {
            return Err(ConfigError::zero("shards"));
        }
        let caps = split::even(max_capacity, shards, None).into_boxed_slice();
        Table::with_caps(capacity, shards, probe, Some(caps))
    }

    fn with_caps(
        capacity: usize,
        count: usize,
        probe: Probe,
        caps: Option<Box<[usize]>>,
    ) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::zero("capacity"));
        }
        if capacity > MAX_CAPACITY {
            return Err(ConfigError::too_large("capacity", MAX_CAPACITY));
        }
        if count == 0 {
            return Err(ConfigError::zero("shards"));
        }
        if count > MAX_SHARDS {
            return Err(ConfigError::too_large("shards", MAX_SHARDS));
        }
        let shards: Box<[_]> = split::even(capacity, count, caps.as_deref())
            .into_iter()
            .enumerate()
            .map(|(index, limit)| CachePadded::new(Shard::new(index, limit)))
            .collect();
        let slots = (2 * count.max(num_cpus::get())).clamp(16, 256);
        let keys = Arc::new(Ledger::new(count));
        let table = Table {
            full: FullSet::new(count),
            mask: if count.is_power_of_two() {
                count - 1
            } else {
                0
            },
            magic: (u64::MAX / count as u64).wrapping_add(1),
            all_full: if count <= BITS {
                usize::MAX >> (BITS - count)
            } else {
                0
            },
            full_count: CachePadded::new(AtomicUsize::new(0)),
            counted: count > BITS,
            shards,
            capacity: AtomicUsize::new(capacity),
            caps,
            headroom: Headroom::default(),
            classes: classed::ClassTally::default(),
            keys: Arc::clone(&keys),
            fair_line: keyed::DEFAULT_FAIR_LINE,
            control: Arc::new(Mutex::new(Control {
                queue: Queue::with_ledger(Arc::clone(&keys)),
                ..Control::default()
            })),
            room: None,
            #[cfg(not(loom))]
            alarm: None,
            probe,
            thread_home: probe == Probe::Thread && count <= BITS,
            one_word: count <= BITS,
            rejected: RejectCounter::new(slots),
            closed: AtomicBool::new(false),
        };
        let limits: Vec<usize> = table.shards.iter().map(|s| s.limit()).collect();
        table.store_lines(&limits, &vec![0; count], capacity);
        // Shards whose limit is 0 are full from the start.
        for i in 0..count {
            if table.shards[i].limit() == 0 {
                table.mark_full(i);
            }
        }
        Ok(table)
    }

    /// Keeps the count of marked shards even with few shards, so loom
    /// models can check the protocol that tables of more than 64 shards use
    /// without building 65 of them.
    #[cfg(loom)]
    pub(crate) fn force_counted(&mut self) {
        self.counted = true;
    }

    /// The capacity in force.
    pub(crate) fn capacity(&self) -> usize {
        // Relaxed: a reading; the limits themselves decide admission.
        self.capacity.load(Relaxed)
    }

    /// Units free now: the capacity less the usage (0 while units above a
    /// shrunk capacity drain). A reading, not a reservation.
    pub(crate) fn available(&self) -> usize {
        self.capacity().saturating_sub(self.usage())
    }

    /// The largest capacity [`set_capacity`](Self::set_capacity) takes:
    /// the sum of the caps, or `MAX_CAPACITY` in a table without them.
    pub(crate) fn max_capacity(&self) -> usize {
        match &self.caps {
            Some(caps) => caps.iter().sum(),
            None => MAX_CAPACITY,
        }
    }

    /// The most units shard `i` can ever hold: its cap, or its limit in a
    /// table without caps.
    pub(crate) fn cap(&self, i: usize) -> usize {
        match &self.caps {
            Some(caps) => caps[i],
            None => self.shards[i].limit(),
        }
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn shard(&self, i: usize) -> &Shard {
        &self.shards[i]
    }

    /// Refuses all later admissions; units already taken stay counted.
    pub(crate) fn close(&self) {
        // Relaxed: the flag only chooses between two refusals (see
        // `refuse`); the shard words carry the real decision.
        self.closed.store(true, Relaxed);
        for shard in self.shards.iter() {
            shard.close();
        }
        if let Some(room) = &self.room {
            let mut woken = Woken::default();
            let mut control = self.control.lock();
            control.queue.close_all(room, &mut woken);
            drop(control);
            woken.wake_all(room);
        }
    }

    /// True once [`close`](Self::close) has begun: to tell `Shutdown` from
    /// another refusal. A take may still be admitted on a shard the close
    /// has not reached yet.
    pub(crate) fn is_closing(&self) -> bool {
        // Relaxed: informational; callers that act on it read the shard word.
        self.closed.load(Relaxed)
    }

    /// True once [`close`](Self::close) has closed every shard: a take
    /// that begins after this answered true is refused, whatever its
    /// shard. (While the close runs, [`is_closing`](Self::is_closing) is
    /// true and this is not yet.)
    pub(crate) fn is_closed(&self) -> bool {
        // The last shard: a closer closes the shards in order, so whoever
        // closed it closed every other one before. Its Acquire load
        // (`Shard::is_closed`) pairs with that closer's AcqRel `fetch_or`,
        // so each earlier close happens-before this read, and a take that
        // follows it reads its shard's word at or after the close: CLOSED.
        self.shards.last().is_some_and(|shard| shard.is_closed())
    }
}

impl Shard {
    pub(super) fn new(index: usize, limit: usize) -> Self {
        Shard {
            index,
            bit: 1 << (index % BITS),
            taken: AtomicUsize::new(0),
            given: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            panicked: AtomicUsize::new(0),
            forgotten: AtomicUsize::new(0),
            phantom: AtomicUsize::new(0),
            limit: AtomicUsize::new(limit),
            lines: std::array::from_fn(|_| AtomicUsize::new(limit)),
            attended: AtomicBool::new(false),
            refused_home: AtomicUsize::new(0),
        }
    }

    /// Its index in the table.
    #[inline]
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The flag a stealing pool's worker raises while it polls this
    /// shard's mailbox; why it lives here is on the field.
    #[inline]
    pub(crate) fn attended(&self) -> &AtomicBool {
        &self.attended
    }

    /// How many units this shard may hold at once.
    #[inline]
    pub(crate) fn limit(&self) -> usize {
        // Relaxed: a take re-reads it after its CAS, which synchronizes with
        // the resize's un-gating RMW (see `try_take_masked`; `take_fast`
        // does the same).
        self.limit.load(Relaxed)
    }

    /// The most units a take against `bound` may leave the shard holding:
    /// its limit, or a gated class's line (at most the limit).
    #[inline(always)]
    pub(crate) fn bound(&self, bound: Bound) -> usize {
        match bound {
            Bound::Limit => self.limit(),
            // Relaxed: as the limit's, stored with it under the gate; a
            // take re-reads it after its CAS (`try_take_n`).
            Bound::Line(g) => self.lines[g].load(Relaxed),
        }
    }

    /// Refuses every later take. Takes that came first stay counted.
    pub(crate) fn close(&self) {
        // AcqRel: the close is ordered against every take by `taken`'s
        // modification order (all are RMWs on it); Release/Acquire lets a
        // drainer that reads CLOSED also see what the closer did before.
        self.taken.fetch_or(CLOSED, AcqRel);
    }

    /// True once [`close`](Self::close) has run.
    pub(crate) fn is_closed(&self) -> bool {
        // Acquire: pairs with the AcqRel `fetch_or` in `close`.
        self.taken.load(Acquire) & CLOSED != 0
    }
}
