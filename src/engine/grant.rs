//! A grant: the units a table admitted together, as plain data (which
//! shards, how many on each). The table makes and takes them back
//! (`table/many.rs`); the waiting room hands them to waiters
//! (`waiters/`); the front-ends' guards hold them.
//!
//! The units on the grant's first shard are a number in the grant; only
//! units on other shards (a take across shards, a merge) go in a `Vec`,
//! so a grant of `n` units from one shard allocates nothing.

use crate::engine::class::Class;

/// Units on one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) shard: usize,
    pub(crate) units: usize,
}

/// Units a table admitted together: `here` units of `shard`, and the
/// units of `rest` (each part on another shard). Plain data, as a shard
/// index is: whoever holds it gives it back with `Table::release_grant`
/// exactly once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a grant's units stay taken until it is given back"]
pub(crate) struct Grant {
    pub(crate) shard: usize,
    /// Units on `shard` (possibly 0, after a split).
    pub(crate) here: usize,
    /// Units on other shards, one part a shard.
    pub(crate) rest: Vec<Part>,
    /// The class they were admitted to, in a table with a min share:
    /// there a gated class's units are counted as its own while held
    /// (`Table::hold_class`), so their give-back counts them out, the one
    /// reason a grant carries its class. Elsewhere `Critical`, whatever
    /// the class (nothing is counted).
    pub(crate) class: Class,
    /// The tenant key they are counted to (`engine/keys/`), or 0: their
    /// give-back counts them out of the key's units.
    pub(crate) key: u64,
}

impl Grant {
    /// `units` units of `shard`.
    pub(crate) fn on(shard: usize, units: usize) -> Grant {
        Grant {
            shard,
            here: units,
            rest: Vec::new(),
            class: Class::Critical,
            key: 0,
        }
    }

    /// The same units, admitted to `class`.
    pub(crate) fn of_class(mut self, class: Class) -> Grant {
        self.class = class;
        self
    }

    /// One unit of `shard`.
    pub(crate) fn one(shard: usize) -> Grant {
        Grant::on(shard, 1)
    }

    /// How many units it holds.
    pub(crate) fn units(&self) -> usize {
        self.here + self.rest.iter().map(|p| p.units).sum::<usize>()
    }

    /// Each shard it holds units of, with how many (none for a grant of 0
    /// units).
    pub(crate) fn parts(&self) -> Vec<Part> {
        let mut parts = Vec::with_capacity(1 + self.rest.len());
        if self.here > 0 {
            parts.push(Part {
                shard: self.shard,
                units: self.here,
            });
        }
        parts.extend(self.rest.iter().copied());
        parts
    }

    /// A grant of the units in `parts`, first on `shard` if it is among
    /// them (else on the first part's shard); 0 units on `shard` for no
    /// parts.
    pub(crate) fn from_parts(shard: usize, parts: Vec<Part>) -> Grant {
        let first = if parts.iter().any(|p| p.shard == shard) {
            shard
        } else {
            parts.first().map_or(shard, |p| p.shard)
        };
        let mut grant = Grant::on(first, 0);
        for part in parts {
            if part.shard == first {
                grant.here += part.units;
            } else {
                match grant.rest.iter_mut().find(|p| p.shard == part.shard) {
                    Some(p) => p.units += part.units,
                    None => grant.rest.push(part),
                }
            }
        }
        grant
    }

    /// Takes `units` of its units into a grant of their own, `None` if it
    /// holds fewer. What is left may be 0 units, and so may the split off
    /// grant (as tokio's `split(0)`). The other shards give theirs first,
    /// so the first shard keeps what it can.
    pub(crate) fn split(&mut self, units: usize) -> Option<Grant> {
        if units > self.units() {
            return None;
        }
        let mut taken = Vec::new();
        let mut wanted = units;
        while wanted > 0 {
            let from_rest = self.rest.last_mut();
            let (shard, held) = match from_rest {
                Some(last) => (last.shard, &mut last.units),
                None => (self.shard, &mut self.here),
            };
            let k = (*held).min(wanted);
            *held -= k;
            wanted -= k;
            taken.push(Part { shard, units: k });
            if self.rest.last().is_some_and(|p| p.units == 0) {
                self.rest.pop();
            }
        }
        let mut split = Grant::from_parts(taken.first().map_or(self.shard, |p| p.shard), taken)
            .of_class(self.class);
        split.key = self.key;
        Some(split)
    }

    /// Adds `other`'s units to this grant (both of one table), as units
    /// of this grant's class and key: the caller moves a gated class's
    /// count (`Table::reclass`) when the classes differ, and a key's when
    /// the keys do.
    pub(crate) fn merge(&mut self, other: Grant) {
        let mut parts = self.parts();
        parts.extend(other.parts());
        let key = self.key;
        *self = Grant::from_parts(self.shard, parts).of_class(self.class);
        self.key = key;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn split_and_merge_keep_every_unit_once() {
        let mut grant = Grant::from_parts(
            2,
            vec![
                Part { shard: 2, units: 3 },
                Part { shard: 0, units: 2 },
                Part { shard: 5, units: 1 },
            ],
        );
        assert_eq!((grant.shard, grant.here, grant.units()), (2, 3, 6));
        let a = grant.split(2).unwrap();
        assert_eq!((a.units(), grant.units()), (2, 4));
        assert!(grant.split(5).is_none());
        let b = grant.split(4).unwrap();
        assert_eq!(grant.units(), 0);
        assert_eq!(grant.shard, 2, "an emptied grant keeps its first shard");
        let zero = b.clone_parts_for_test();
        assert_eq!(zero.iter().map(|p| p.units).sum::<usize>(), 4);
        grant.merge(a);
        grant.merge(b);
        assert_eq!(grant.units(), 6);
        let mut per_shard = grant.parts();
        per_shard.sort_by_key(|p| p.shard);
        assert_eq!(
            per_shard,
            [
                Part { shard: 0, units: 2 },
                Part { shard: 2, units: 3 },
                Part { shard: 5, units: 1 },
            ]
        );
        assert_eq!(grant.split(0).map(|g| g.units()), Some(0));
    }

    impl Grant {
        fn clone_parts_for_test(&self) -> Vec<Part> {
            self.parts()
        }
    }
}
