//! A grant: the units a table admitted together, as plain data (which
//! shards, how many on each). The table makes and takes them back
//! (`table/many.rs`); the waiting room hands them to waiters
//! (`waiters/`); the front-ends' guards hold them.

/// Units on one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) shard: usize,
    pub(crate) units: usize,
}

/// The units of a grant beyond the one unit on its first shard: how many
/// it holds there, and what it holds elsewhere. Boxed behind an `Option`
/// in [`Grant`], so a grant of one unit is two words and carries nothing
/// to check but a null pointer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct More {
    /// Units on the grant's first shard (possibly 0 after a split).
    pub(crate) here: usize,
    /// Units on other shards, one part a shard.
    pub(crate) rest: Vec<Part>,
}

impl More {
    /// Every unit it holds.
    pub(crate) fn units(&self) -> usize {
        self.here + self.rest.iter().map(|p| p.units).sum::<usize>()
    }
}

/// Units a table admitted together: one unit of `shard` when `more` is
/// `None` (the common case), else what `more` says. Plain data, as a shard
/// index is: whoever holds it gives it back with
/// [`Table::release_grant`] exactly once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a grant's units stay taken until it is given back"]
pub(crate) struct Grant {
    pub(crate) shard: usize,
    pub(crate) more: Option<Box<More>>,
}

impl Grant {
    /// One unit of `shard`.
    pub(crate) fn one(shard: usize) -> Grant {
        Grant { shard, more: None }
    }

    /// How many units it holds.
    pub(crate) fn units(&self) -> usize {
        self.more.as_deref().map_or(1, More::units)
    }

    /// Each shard it holds units of, with how many (none for a grant of 0
    /// units).
    pub(crate) fn parts(&self) -> Vec<Part> {
        match self.more.as_deref() {
            None => vec![Part {
                shard: self.shard,
                units: 1,
            }],
            Some(more) => {
                let mut parts = Vec::with_capacity(1 + more.rest.len());
                if more.here > 0 {
                    parts.push(Part {
                        shard: self.shard,
                        units: more.here,
                    });
                }
                parts.extend(more.rest.iter().copied());
                parts
            }
        }
    }

    /// A grant of the units in `parts` (each on a distinct shard), first
    /// on `shard` (which need not be among them).
    pub(crate) fn from_parts(shard: usize, parts: Vec<Part>) -> Grant {
        if let [only] = parts.as_slice() {
            if only.units == 1 {
                return Grant::one(only.shard);
            }
        }
        let mut more = More::default();
        let mut first = shard;
        for part in parts {
            if part.shard == first {
                more.here += part.units;
            } else if more.here == 0 && more.rest.is_empty() {
                first = part.shard;
                more.here = part.units;
            } else {
                match more.rest.iter_mut().find(|p| p.shard == part.shard) {
                    Some(p) => p.units += part.units,
                    None => more.rest.push(part),
                }
            }
        }
        Grant {
            shard: first,
            more: Some(Box::new(more)),
        }
    }

    /// Takes `units` of its units into a grant of their own, `None` if it
    /// holds fewer. What is left may be 0 units, and so may the split off
    /// grant (as tokio's `split(0)`).
    pub(crate) fn split(&mut self, units: usize) -> Option<Grant> {
        let held = self.units();
        if units > held {
            return None;
        }
        if units == 0 {
            return Some(Grant {
                shard: self.shard,
                more: Some(Box::default()),
            });
        }
        let mut parts = self.parts();
        let mut taken = Vec::new();
        let mut wanted = units;
        // From the last parts first: the first shard keeps what it can.
        while wanted > 0 {
            let last = parts.last_mut().expect("held >= units");
            let k = last.units.min(wanted);
            taken.push(Part {
                shard: last.shard,
                units: k,
            });
            last.units -= k;
            wanted -= k;
            if last.units == 0 {
                parts.pop();
            }
        }
        *self = Grant::from_parts_keeping(self.shard, parts);
        Some(Grant::from_parts(taken[0].shard, taken))
    }

    /// As [`from_parts`](Self::from_parts), but never the one-unit form
    /// for no parts: a grant emptied by a split keeps its first shard and
    /// holds 0 units.
    fn from_parts_keeping(shard: usize, parts: Vec<Part>) -> Grant {
        if parts.is_empty() {
            return Grant {
                shard,
                more: Some(Box::default()),
            };
        }
        Grant::from_parts(shard, parts)
    }

    /// Adds `other`'s units to this grant (both of one table).
    pub(crate) fn merge(&mut self, other: Grant) {
        let mut parts = self.parts();
        parts.extend(other.parts());
        *self = Grant::from_parts_keeping(self.shard, parts);
    }
}
