//! What a child is to its caller: its id, kind and description, the handle of a spawned thread ([`Child`]), and the guard whose drop is the child's exit ([`ChildGuard`]).

use super::RegistryShard;
use crate::engine::grant::Grant;
use crate::engine::keys::children::KeySlot;
use crate::sync::{os_thread, Arc};
use std::fmt;
use std::hash::Hash;
use std::mem::ManuallyDrop;
use std::time::Instant;

/// Identifies a live child of a [`Supervisor`](crate::Supervisor).
///
/// Unique among the supervisor's live children: the registry shard the
/// child was admitted on and a number that stands for its slot in that
/// shard and the slot's generation. A slot taken again gets a new id, so a
/// listing never shows a departed child under its old id; ids only come
/// back after one slot has been reused 2^21 times. Displayed like an Erlang
/// pid, `<shard.seq>`. Ids of different supervisors may be equal.
///
/// # Examples
///
/// ```
/// use sidejob::Supervisor;
///
/// let sup = Supervisor::builder().capacity(2).shards(1).build()?;
/// let (a, b) = (sup.reserve()?, sup.reserve()?);
/// assert_ne!(a.id(), b.id());
/// assert_eq!(a.id().to_string(), "<0.1>");
/// assert_eq!(a.id().shard(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChildId {
    shard: u32,
    pub(super) seq: u64,
}

impl ChildId {
    pub(super) fn new(shard: usize, seq: u64) -> ChildId {
        // Shard counts are capped at `table::MAX_SHARDS` (2^16).
        ChildId {
            shard: shard as u32,
            seq,
        }
    }

    /// The shard the child was admitted on.
    pub fn shard(&self) -> usize {
        self.shard as usize
    }
}

impl fmt::Display for ChildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{}.{}>", self.shard, self.seq)
    }
}

/// What kind of child a [`ChildInfo`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChildKind {
    /// An OS thread from [`Supervisor::spawn`](crate::Supervisor::spawn).
    Thread,
    /// A tokio task from `Supervisor::spawn_task` (feature `tokio`).
    Task,
    /// A [`ChildGuard`] from [`Supervisor::reserve`](crate::Supervisor::reserve).
    Reserved,
}

/// One live child, as listed by [`Supervisor::children`](crate::Supervisor::children).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChildInfo {
    /// The child's id.
    pub id: ChildId,
    /// The thread's name for a spawned thread (`{name}-child`); `None` for
    /// tasks and reserved guards.
    pub name: Option<String>,
    /// When the child was admitted, to the OS scheduler tick (1–4 ms on
    /// Linux, which reads the coarse monotonic clock: a precise reading
    /// would cost more than the rest of admission together), kept to about
    /// a millisecond.
    pub started: Instant,
    /// How the child was started.
    pub kind: ChildKind,
}

/// A child started by [`Supervisor::spawn`](crate::Supervisor::spawn): its OS thread's handle.
///
/// Dropping it detaches the thread, which stays counted until it ends.
pub struct Child<T> {
    pub(super) id: ChildId,
    pub(super) handle: os_thread::JoinHandle<T>,
}

impl<T> Child<T> {
    /// The child's id, as [`Supervisor::which_children`](crate::Supervisor::which_children) lists it.
    pub fn id(&self) -> ChildId {
        self.id
    }

    /// Waits for the child to end and returns what it returned, or the
    /// payload it panicked with. Its unit was released before this returns.
    ///
    /// # Errors
    ///
    /// `Err(payload)` if the child panicked, as [`std::thread::JoinHandle::join`].
    ///
    /// # Examples
    ///
    /// ```
    /// let sup = sidejob::Supervisor::new(1)?;
    /// let child = sup.spawn(|| 6 * 7)?;
    /// assert_eq!(child.join().unwrap(), 42);
    /// assert_eq!(sup.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join(self) -> os_thread::Result<T> {
        self.handle.join()
    }

    /// True once the child's function has returned or panicked (its unit
    /// may be released a moment before this turns true).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

impl<T> fmt::Debug for Child<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Child").field("id", &self.id).finish()
    }
}

/// A live child's unit of a [`Supervisor`](crate::Supervisor)'s capacity and its registration;
/// dropping it is the child's exit.
///
/// Made by [`Supervisor::reserve`](crate::Supervisor::reserve) (and [`reserve_keyed`](crate::Supervisor::reserve_keyed),
/// whose guard also holds one slot of its key, given back right after the
/// unit). It is `Send + 'static`: move it into the
/// child. Dropped while its thread panics, the exit is counted in
/// [`Stats::panicked`](crate::Stats::panicked).
#[must_use = "the child exits as soon as its guard is dropped"]
#[clippy::has_significant_drop]
pub struct ChildGuard {
    pub(super) shard: Arc<RegistryShard>,
    /// The free word the claim replaced (it carries the generation).
    pub(super) free: u64,
    /// The child's slot in its registry shard (below the shard's limit,
    /// which `MAX_CHILDREN` keeps within 32 bits).
    pub(super) slot: u32,
    /// Set when the child is known to have panicked though the guard is not
    /// dropped by unwinding (a spawned thread or task catches the panic).
    pub(super) panicked: bool,
    /// Set for the guard of a `spawn_task` task, whose exit also empties the
    /// slot's task cell. A byte of the guard itself: the drop of other
    /// guards reads nothing more.
    #[cfg(feature = "tokio")]
    pub(super) task: bool,
    /// Set for a keyed child: its exit also releases one slot of the key
    /// whose id is `key`, after the unit.
    pub(super) keyed: bool,
    pub(super) key: u64,
    /// The units a child of many holds beyond the one of its slot's shard
    /// (`reserve_many`): `None` for a child of one unit, so its exit
    /// checks a null pointer and nothing more. In a `ManuallyDrop`, taken
    /// by `Drop` itself, so the guard has no drop glue for it: as a plain
    /// `Option<Box<_>>` it cost a one-unit `try_reserve` + drop 9
    /// instructions (162 to 171, callgrind), this way 4 (166).
    pub(super) more: ManuallyDrop<Option<Box<Grant>>>,
}

impl ChildGuard {
    /// How many units of the capacity the child holds: 1, or what
    /// [`Supervisor::reserve_many`](crate::Supervisor::reserve_many) took.
    pub fn units(&self) -> usize {
        1 + self.more.as_ref().map_or(0, |more| more.units())
    }

    /// The child's id, as [`Supervisor::which_children`](crate::Supervisor::which_children) lists it.
    pub fn id(&self) -> ChildId {
        // Computed, not stored: a smaller guard is a cheaper reserve + drop.
        self.shard.id(self.slot as usize, self.free)
    }

    /// This guard, now also holding the key's slot `key` (released on
    /// exit, after the unit).
    #[inline]
    pub(super) fn with_key(mut self, key: KeySlot<'_>) -> ChildGuard {
        self.key = key.keep();
        self.keyed = true;
        self
    }
}

impl Drop for ChildGuard {
    #[inline]
    fn drop(&mut self) {
        let panicked = self.panicked || os_thread::panicking();
        // The units beyond the slot's go back first, so that the slot's
        // own release is the last, and its check for an empty shard (what
        // `wait_idle` waits for) sees them all back. A read, not a take:
        // a child of one unit writes nothing back.
        if self.more.is_some() {
            self.give_back_more(panicked);
        }
        #[cfg(feature = "tokio")]
        if self.task {
            self.shard
                .leave_task(self.slot as usize, self.free, panicked);
        } else {
            self.shard.leave(self.slot as usize, self.free, panicked);
        }
        #[cfg(not(feature = "tokio"))]
        self.shard.leave(self.slot as usize, self.free, panicked);
        // The unit went back first: a key never counts fewer live children
        // than it has. Our `Arc` of the registry shard keeps the key set
        // alive until here.
        if self.keyed {
            self.shard.common.keys.release(self.key);
        }
    }
}

impl ChildGuard {
    /// Gives back the units of a child of many beyond its slot's unit.
    #[cold]
    #[inline(never)]
    fn give_back_more(&mut self, panicked: bool) {
        let Some(more) = self.more.take() else {
            return;
        };
        let table = &self.shard.common.table;
        if more.class.gate().is_some() {
            // Every unit of the child, the slot's too, out of its class's
            // holdings, before any goes back (`Table::release_class`).
            table.release_class(more.class, more.units() + 1);
        }
        // And out of its tenant's (`Table::release_key`).
        table.release_key(more.key, more.units() + 1);
        for part in more.parts() {
            table.release_units(part.shard, part.units, panicked);
        }
    }
}

impl fmt::Debug for ChildGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildGuard")
            .field("id", &self.id())
            .finish()
    }
}
