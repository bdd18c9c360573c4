//! A unit of the shepherd's table as its owner holds it: one pointer to
//! its shard's *home* (the table, the shard, and whether it counts as a
//! panic's), given back when dropped, exactly once, wherever that is (the
//! state's module docs, "Where a unit goes back").

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::engine::table::Table;
use crate::sync::Arc;

/// Where a unit of one shard goes back: the table, the shard, and whether
/// it is counted as a panic's. Two per shard (the second for a final
/// attempt that panicked), each in an allocation of its own on its own
/// cache lines, so the reference count that a submit and its caller's read
/// of the outcome change is shared only by the threads that take units
/// from that shard, as the shard's own counter is (module docs, "Where a
/// unit goes back").
pub(crate) struct Home {
    table: Arc<Table>,
    shard: usize,
    panicked: bool,
}

/// The homes of a table's shards: shard `i`'s at `i`, and the one that
/// counts a panic at `shards + i`.
pub(crate) struct Homes(Box<[Arc<CachePadded<Home>>]>);

impl Homes {
    /// The homes of `table`'s shards.
    pub(crate) fn new(table: &Arc<Table>) -> Self {
        let shards = table.shard_count();
        Homes(
            [false, true]
                .into_iter()
                .flat_map(|panicked| (0..shards).map(move |shard| (shard, panicked)))
                .map(|(shard, panicked)| {
                    Arc::new(CachePadded::new(Home {
                        table: Arc::clone(table),
                        shard,
                        panicked,
                    }))
                })
                .collect(),
        )
    }

    /// A unit just taken from `shard`.
    #[inline]
    pub(crate) fn unit(&self, shard: usize) -> Unit {
        Unit {
            home: Arc::clone(&self.0[shard]),
        }
    }

    /// Counts `unit` as a panic's when it goes back: it moves to its
    /// shard's second home (a cold path: two reference counts).
    pub(crate) fn count_as_panic(&self, unit: &mut Unit) {
        if !unit.home.panicked {
            let shards = self.0.len() / 2;
            unit.home = Arc::clone(&self.0[shards + unit.home.shard]);
        }
    }
}

/// One unit of the shepherd's table, held from admission until its
/// caller has the final outcome: it goes back to its shard when it is
/// dropped, exactly once, wherever that is (module docs, "Where a unit
/// goes back").
pub(crate) struct Unit {
    home: Arc<CachePadded<Home>>,
}

// One pointer (see the module docs); loom's `Arc` is larger.
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Unit>() == std::mem::size_of::<usize>());

impl Drop for Unit {
    fn drop(&mut self) {
        self.home.table.release(self.home.shard, self.home.panicked);
    }
}

impl fmt::Debug for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unit")
            .field("shard", &self.home.shard)
            .field("panicked", &self.home.panicked)
            .finish()
    }
}
