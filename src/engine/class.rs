//! Priority classes: how important a request is ([`Class`]), and the
//! headroom each class may fill, split over the shards as *lines* the
//! table's takes of that class stop at (`table/classed.rs`).
//!
//! **The rule.** A request of class `c` is admitted only while the units
//! held (every class counted, on the shard it takes from) leave room under
//! the fraction of the capacity in force that `c` may fill, its
//! *headroom*.
//! The two top classes may fill the whole capacity; the two sheddable
//! classes stop short of it, so that under overload the last units go to
//! the classes above them, and refusals fall on the sheddable classes
//! first. Headroom is a fraction of the capacity *in force*: when an
//! adaptive controller or a user lowers the capacity, the lines fall with
//! it, and the lowest class feels it first.
//!
//! **Why the default class is never gated.** `Critical`, the class of a
//! request that names none, may always fill the whole capacity, and so may
//! `CriticalPlus` (which differs from it only in the waiting room's order:
//! it is served first). That keeps the one-unit, default-class path the
//! hot path it was, with not one instruction more: every gate lives on
//! the paths of the classes that asked for one.
//!
//! **Per shard, and what it guarantees in total.** A class's headroom `f`
//! over a capacity `C` is `L = floor(f × C)` units, split over the shards
//! in proportion to their limits: each shard's *line* at most its limit
//! and at most the line of the class above, the lines adding up to `L`
//! (short of it only where the class above's lines leave no room). A take
//! of class `c` succeeds on a shard only if the shard's usage after it,
//! every class counted, is within the shard's line: one CAS, as for any
//! take, and the line read again after it (a resize stores lines and
//! limits together while the shards are gated). So:
//!
//! * the units held by class `c` and every class below it are at most the
//!   sum of their lines, `floor(f × C)`, at every instant (with min shares,
//!   plus those: see "A min share" below): on each shard, the last of
//!   them admitted under its line found the shard's usage within it, and
//!   every other one still held was held then;
//! * on each shard, the units between its line and its limit are taken by
//!   the classes above `c` alone (but for `c`'s min share, if any): at
//!   least `C − floor(f × C)` units are kept from `c` for them;
//! * `c` is refused when every shard it walks is at or over its line: with
//!   one shard, exactly when the usage is at `floor(f × C)`. With several,
//!   `c` may be admitted on a shard below its line while the total usage
//!   is above `f × C` (the other shards fuller than theirs): the first two
//!   points hold, a refusal "when the total reaches the share" does not;
//! * after a shrink, a shard may hold more of `c`'s units than its new
//!   line, as a shard may hold more than its new limit: `c` takes nothing
//!   more on that shard until its usage is back under the line, and until
//!   those units come back the first point's bound is the larger of the
//!   new share and what was held at the shrink.
//!
//! A class may be refused while some shard has room under its line only if
//! a release came after the walk passed that shard, as for `Overload`.
//!
//! **A min share.** A gated class may also have a min share `m`: `M =
//! floor(m × C)` units it may hold whatever its line. The units a gated
//! class holds are counted (`ClassCount::held` in `table/classed.rs`):
//! its grants carry their class to the give-back, which counts them out
//! before it gives them back. A take refused by its lines tries the share:
//! it claims its units in the count with one CAS, only if the count stays
//! within `M`, and then takes them against the limits, giving the claim
//! back if that fails. So the units the class holds above its lines are
//! at most `M`: the class and every class below it hold at most
//! `floor(f × C)` plus their min shares. The room serves a waiter under
//! its class's min share first (`waiters/queue.rs`, `Queue::serve`).
//! Nothing is kept free for a min share: the classes above take what is
//! free, and the class gets its floor from the units released while it
//! waits.

use crate::engine::split;
use crate::error::ConfigError;

/// How important a request is: under overload, the least important work
/// is refused first, and a waiting room serves the most important first.
///
/// The four classes of Google's SRE book ("Handling Overload"), from the
/// most important down. A request that names none is [`Critical`](Class::Critical).
///
/// | class | may fill (default) | meant for |
/// |---|---|---|
/// | `CriticalPlus` | the whole capacity; served first when waiting | health probes, replication, repair: what keeps the service itself up |
/// | `Critical` (default) | the whole capacity | a user waits for it: checkout, a page load |
/// | `SheddablePlus` | 90 % | work a user may see late: a report, a batch a person started |
/// | `Sheddable` | 80 % | nobody waits: prefetch, speculative work, background export |
///
/// Set a sheddable class's fraction with `headroom(class, fraction)` on
/// any builder ([`LimiterBuilder::headroom`](crate::LimiterBuilder::headroom)
/// and its siblings). The guide page [`guide::priority`](crate::guide::priority)
/// says how to pick classes and fractions.
///
/// # Examples
///
/// ```
/// use sidejob::{units::Ask, Class, Error, Limiter};
///
/// let limiter = Limiter::new(10)?;
/// // Prefetches may fill 80 % of the capacity: 8 of 10.
/// let prefetches: Vec<_> = (0..8)
///     .map(|_| limiter.acquire_with(Ask::new().class(Class::Sheddable).fail_fast()))
///     .collect::<Result<_, _>>()?;
/// let ninth = limiter.acquire_with(Ask::new().class(Class::Sheddable).fail_fast());
/// assert_eq!(ninth.unwrap_err(), Error::Overload);
/// // The last two units are kept for the classes above.
/// let checkout = limiter.try_acquire()?;
/// # drop((prefetches, checkout));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Class {
    /// Keeps the service itself up (health probes, replication, repair):
    /// may fill the whole capacity, and waits ahead of every other class.
    CriticalPlus,
    /// A user waits for it: may fill the whole capacity. The class of a
    /// request that names none.
    #[default]
    Critical,
    /// Work a user may see late: may fill 90 % of the capacity by default.
    SheddablePlus,
    /// Nobody waits for it: may fill 80 % of the capacity by default, and
    /// is refused first.
    Sheddable,
}

impl Class {
    /// Every class, the most important first.
    pub const ALL: [Class; 4] = [
        Class::CriticalPlus,
        Class::Critical,
        Class::SheddablePlus,
        Class::Sheddable,
    ];

    /// How many classes there are.
    pub(crate) const COUNT: usize = 4;

    /// Its rank, 0 for the most important; the index into per-class
    /// tables.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Class;
    ///
    /// assert_eq!(Class::CriticalPlus.rank(), 0);
    /// assert!(Class::Critical.rank() < Class::Sheddable.rank());
    /// ```
    pub const fn rank(self) -> usize {
        self as usize
    }

    /// The class of rank `rank` (see [`rank`](Self::rank)), if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Class;
    ///
    /// assert_eq!(Class::from_rank(3), Some(Class::Sheddable));
    /// assert_eq!(Class::from_rank(4), None);
    /// ```
    pub const fn from_rank(rank: usize) -> Option<Class> {
        match rank {
            0 => Some(Class::CriticalPlus),
            1 => Some(Class::Critical),
            2 => Some(Class::SheddablePlus),
            3 => Some(Class::Sheddable),
            _ => None,
        }
    }

    /// Its name in snake case, as a metrics label and an `x-priority`
    /// header value say it: `critical_plus`, `critical`,
    /// `sheddable_plus`, `sheddable`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(sidejob::Class::SheddablePlus.as_str(), "sheddable_plus");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Class::CriticalPlus => "critical_plus",
            Class::Critical => "critical",
            Class::SheddablePlus => "sheddable_plus",
            Class::Sheddable => "sheddable",
        }
    }

    /// The class a header value names, by the one documented mapping:
    /// a class's [`as_str`](Self::as_str) name, in any ASCII case, with
    /// `-` for `_` allowed, surrounding blanks ignored; anything else
    /// (unknown, empty, not text) is the default,
    /// [`Critical`](Class::Critical). Never an error: a client cannot get
    /// ahead by sending a value we do not know, nor make a request fail by
    /// it. The tower layer's `classify_by_header` uses it.
    ///
    /// Note that `critical_plus` is a class a client could claim for
    /// itself: map untrusted clients' headers through a closure of your
    /// own (the tower layer's `classify`) if they must not reach it.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Class;
    ///
    /// assert_eq!(Class::from_header(b"Sheddable"), Class::Sheddable);
    /// assert_eq!(Class::from_header(b" critical-plus "), Class::CriticalPlus);
    /// assert_eq!(Class::from_header(b"urgent!!"), Class::Critical);
    /// ```
    pub fn from_header(value: &[u8]) -> Class {
        // Blanks trimmed by hand: `<[u8]>::trim_ascii` is newer than the
        // crate's minimum Rust.
        let start = value
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(value.len());
        let end = value
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(start, |last| last + 1);
        let value = &value[start..end];
        Class::ALL
            .into_iter()
            .find(|class| {
                let name = class.as_str().as_bytes();
                name.len() == value.len()
                    && name
                        .iter()
                        .zip(value)
                        .all(|(&n, &v)| n == v.to_ascii_lowercase() || (n == b'_' && v == b'-'))
            })
            .unwrap_or_default()
    }

    /// The index of a gated class among the gated ones (`SheddablePlus`
    /// 0, `Sheddable` 1); `None` for the two top classes, which may fill
    /// the whole capacity.
    #[inline(always)]
    pub(crate) const fn gate(self) -> Option<usize> {
        match self {
            Class::CriticalPlus | Class::Critical => None,
            Class::SheddablePlus => Some(0),
            Class::Sheddable => Some(1),
        }
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many classes have a line below the limit.
pub(crate) const GATED: usize = 2;

/// What a builder collects: the headroom a user set for each class, if
/// any. Checked and turned into [`Headroom`] at build.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct HeadroomSettings {
    set: [Option<f64>; Class::COUNT],
    /// The min share a user set for each class, if any.
    min: [Option<f64>; Class::COUNT],
}

impl HeadroomSettings {
    /// Records `class`'s fraction (checked at build).
    pub(crate) fn set(&mut self, class: Class, fraction: f64) {
        self.set[class.rank()] = Some(fraction);
    }

    /// Records `class`'s min share (checked at build).
    pub(crate) fn set_min_share(&mut self, class: Class, fraction: f64) {
        self.min[class.rank()] = Some(fraction);
    }

    /// The checked min shares, for the headroom's `fractions`: a
    /// [`ConfigError`] naming `min_share` for a fraction that is not a
    /// number in `[0, 1]`, one set for a top class (which no line holds
    /// back), one above its class's headroom, or shares adding up to more
    /// than the whole capacity.
    fn check_min(&self, fractions: &[f64; GATED]) -> Result<[f64; GATED], ConfigError> {
        let mut min = [0.0_f64; GATED];
        for (rank, share) in self.min.iter().enumerate() {
            let Some(share) = *share else { continue };
            if !(0.0..=1.0).contains(&share) {
                return Err(ConfigError::out_of_range(
                    "min_share",
                    "a fraction of the capacity from 0 to 1",
                ));
            }
            let Some(g) = Class::from_rank(rank).and_then(Class::gate) else {
                if share == 0.0 {
                    continue;
                }
                return Err(ConfigError::out_of_range(
                    "min_share",
                    "0 for CriticalPlus and Critical, which no line holds back \
                     (a min share is for SheddablePlus or Sheddable)",
                ));
            };
            if share > fractions[g] {
                return Err(ConfigError::out_of_range(
                    "min_share",
                    "a fraction no higher than the class's headroom",
                ));
            }
            min[g] = share;
        }
        if min.iter().sum::<f64>() > 1.0 {
            return Err(ConfigError::out_of_range(
                "min_share",
                "shares that add up to at most the whole capacity",
            ));
        }
        Ok(min)
    }

    /// The checked headroom: a [`ConfigError`] naming `headroom` for a
    /// fraction that is not a number in `[0, 1]`, a top class set below
    /// 1, or fractions that rise from one class to the one below it. A
    /// sheddable class left unset takes its default (90 %, 80 %), or the
    /// fraction of the class above it if that is lower.
    pub(crate) fn check(&self) -> Result<Headroom, ConfigError> {
        const DEFAULTS: [f64; GATED] = [0.9, 0.8];
        for fraction in self.set.iter().flatten() {
            if !(0.0..=1.0).contains(fraction) {
                return Err(ConfigError::out_of_range(
                    "headroom",
                    "a fraction of the capacity from 0 to 1",
                ));
            }
        }
        for top in &self.set[..Class::COUNT - GATED] {
            if top.is_some_and(|fraction| fraction < 1.0) {
                return Err(ConfigError::out_of_range(
                    "headroom",
                    "1 for CriticalPlus and Critical, which may always fill the whole capacity \
                     (mark the work to hold back SheddablePlus or Sheddable)",
                ));
            }
        }
        let mut above = 1.0_f64;
        let mut fractions = [0.0_f64; GATED];
        for (g, part) in fractions.iter_mut().enumerate() {
            let fraction =
                match self.set[Class::COUNT - GATED + g] {
                    Some(fraction) if fraction > above => return Err(ConfigError::out_of_range(
                        "headroom",
                        "a fraction no higher than the class above's (SheddablePlus >= Sheddable)",
                    )),
                    Some(fraction) => fraction,
                    None => DEFAULTS[g].min(above),
                };
            above = fraction;
            *part = fraction;
        }
        let min = self.check_min(&fractions)?;
        let counted = min.iter().any(|&share| share > 0.0);
        Ok(Headroom {
            fractions,
            min,
            counted,
        })
    }
}

/// The checked headroom of the gated classes: fractions of the capacity,
/// each in `[0, 1]`, not rising from one class to the next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Headroom {
    fractions: [f64; GATED],
    /// Each gated class's min share (0: none), at most its fraction.
    min: [f64; GATED],
    /// Some min share is above 0.
    counted: bool,
}

impl Default for Headroom {
    fn default() -> Self {
        HeadroomSettings::default()
            .check()
            .expect("the defaults are valid")
    }
}

impl Headroom {
    /// The units gated class `g` may fill of `capacity`: `floor(f × C)`
    /// ([`fraction_of`]).
    pub(crate) fn units(&self, g: usize, capacity: usize) -> usize {
        fraction_of(self.fractions[g], capacity)
    }

    /// The units gated class `g` holds on its min share of `capacity`,
    /// rounded as [`units`](Self::units) is: 0 when it has none.
    pub(crate) fn min_units(&self, g: usize, capacity: usize) -> usize {
        fraction_of(self.min[g], capacity)
    }

    /// True if some gated class has a min share: only then are the gated
    /// classes' units counted (`Table::hold_class`), their grants stamped
    /// with their class, and a refused take of a gated class tried on its
    /// share. A table without one pays none of it.
    #[inline(always)]
    pub(crate) fn has_min_share(&self) -> bool {
        self.counted
    }

    /// The fraction gated class `g` may fill.
    pub(crate) fn fraction(&self, g: usize) -> f64 {
        self.fractions[g]
    }

    /// The min share of gated class `g` (0: none).
    pub(crate) fn min_fraction(&self, g: usize) -> f64 {
        self.min[g]
    }

    /// Each gated class's line on each shard, for shards of `limits`
    /// (adding up to `capacity`) holding `held`: `lines[g][i]`. See the
    /// module docs.
    pub(crate) fn lines(
        &self,
        capacity: usize,
        limits: &[usize],
        held: &[usize],
    ) -> [Vec<usize>; GATED] {
        let mut above: Vec<usize> = limits.to_vec();
        std::array::from_fn(|g| {
            let total = self.units(g, capacity);
            let lines = over_holdings(total, capacity, limits, &above, held);
            above.clone_from(&lines);
            lines
        })
    }
}

/// `floor(fraction × capacity)`, with the product nudged up by a part in
/// 10^12 first, so that a fraction written in decimal (0.7, which binary
/// cannot hold) gives the whole number a user means (7 of 10, not 6).
/// Never above `capacity`.
fn fraction_of(fraction: f64, capacity: usize) -> usize {
    let exact = fraction * capacity as f64;
    ((exact + exact * 1e-12).floor() as usize).min(capacity)
}

/// `total` units of a class's share split over shards of `limits` (adding
/// up to `capacity`) holding `held`, each line at most `ceiling[i]` (the
/// line of the class above, or the limit). As the capacity is split
/// (`split.rs`): each line at least what its shard holds (within its
/// ceiling), so that the class takes no unit more than `total` in all
/// while the units held (of every class) are within it; if they are not,
/// no split can: the lines follow the limits ([`split_line`]), and the
/// class is refused on each shard until its usage is under its line.
fn over_holdings(
    total: usize,
    capacity: usize,
    limits: &[usize],
    ceiling: &[usize],
    held: &[usize],
) -> Vec<usize> {
    let held: Vec<usize> = held.iter().zip(ceiling).map(|(&h, &c)| h.min(c)).collect();
    if held.iter().sum::<usize>() <= total && ceiling.iter().sum::<usize>() >= total {
        if let Some(lines) = split::split(total, &held, Some(ceiling)) {
            return lines;
        }
    }
    split_line(total, capacity, limits, ceiling)
}

/// `total` units split over shards of `limits` (adding up to `capacity`)
/// in proportion to them, each at most `ceiling[i]`: the floors first,
/// then one more each, in shard order, while the total is short and the
/// shard's ceiling allows. Adds up to at most `total`.
fn split_line(total: usize, capacity: usize, limits: &[usize], ceiling: &[usize]) -> Vec<usize> {
    if capacity == 0 {
        return vec![0; limits.len()];
    }
    let mut lines: Vec<usize> = limits
        .iter()
        .zip(ceiling)
        .map(|(&limit, &ceiling)| {
            let share = (limit as u128 * total as u128 / capacity as u128) as usize;
            share.min(ceiling)
        })
        .collect();
    let mut short = total.saturating_sub(lines.iter().sum());
    for (line, &ceiling) in lines.iter_mut().zip(ceiling) {
        if short == 0 {
            break;
        }
        if *line < ceiling {
            *line += 1;
            short -= 1;
        }
    }
    lines
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn lines_add_up_to_the_headroom_and_stay_under_the_limits_and_the_class_above() {
        let headroom = {
            let mut settings = HeadroomSettings::default();
            settings.set(Class::SheddablePlus, 0.7);
            settings.set(Class::Sheddable, 0.3);
            settings.check().unwrap()
        };
        for (capacity, limits) in [
            (64, vec![32, 32]),
            (8, vec![1; 8]),
            (10, vec![4, 3, 3]),
            (3, vec![1, 1, 1, 0, 0]),
            (0, vec![0, 0]),
            (100, vec![97, 3]),
        ] {
            let lines = headroom.lines(capacity, &limits, &vec![0; limits.len()]);
            for (g, fraction) in [(0, 0.7), (1, 0.3)] {
                let want = (capacity as f64 * fraction).floor() as usize;
                assert_eq!(
                    lines[g].iter().sum::<usize>(),
                    want,
                    "{capacity} {limits:?}"
                );
            }
            for i in 0..limits.len() {
                assert!(lines[0][i] <= limits[i]);
                assert!(lines[1][i] <= lines[0][i]);
            }
        }
    }

    #[test]
    fn bad_headroom_names_the_field() {
        let cases: [(Class, f64); 5] = [
            (Class::Sheddable, -0.1),
            (Class::Sheddable, 1.5),
            (Class::Sheddable, f64::NAN),
            (Class::Critical, 0.5),
            (Class::CriticalPlus, 0.99),
        ];
        for (class, fraction) in cases {
            let mut settings = HeadroomSettings::default();
            settings.set(class, fraction);
            let error = settings.check().unwrap_err();
            assert!(error.to_string().contains("headroom"), "{error}");
        }
        let mut rising = HeadroomSettings::default();
        rising.set(Class::SheddablePlus, 0.5);
        rising.set(Class::Sheddable, 0.6);
        assert!(rising.check().unwrap_err().to_string().contains("headroom"));
        // An unset class below a low one follows it down.
        let mut low = HeadroomSettings::default();
        low.set(Class::SheddablePlus, 0.5);
        let headroom = low.check().unwrap();
        assert_eq!((headroom.fraction(0), headroom.fraction(1)), (0.5, 0.5));
        // The top classes may be set to 1, which they are anyway.
        let mut top = HeadroomSettings::default();
        top.set(Class::Critical, 1.0);
        assert!(top.check().is_ok());
    }

    #[test]
    fn header_values_map_to_a_class_or_the_default() {
        for class in Class::ALL {
            assert_eq!(Class::from_header(class.as_str().as_bytes()), class);
            let shouted = class.as_str().to_ascii_uppercase().replace('_', "-");
            assert_eq!(Class::from_header(shouted.as_bytes()), class);
        }
        for junk in [
            &b""[..],
            b"critical_plus_",
            b"\xff\xfe",
            b"0",
            b"sheddable plus",
        ] {
            assert_eq!(Class::from_header(junk), Class::Critical);
        }
    }
}
