//! How a capacity is split over the shards: evenly, within each shard's
//! cap, and never below what a shard holds when it is resized.
//!
//! A pure function, so the rule is tested on its own (and by proptest)
//! apart from the atomics that apply it (`Table::set_capacity`).
//!
//! The even split gives shard `i` `C / M`, the first `C % M` shards one
//! more: limits that add up to exactly `C` and differ by at most one. A
//! shard may have a cap (the supervisor's registry has a fixed number of
//! slots per shard); what a cap cuts off goes to the shards with room under
//! theirs, in order.
//!
//! A resize cannot revoke units. If a shard holds more than its even share,
//! its limit is raised to what it holds and the shards with slack give up
//! the difference, so that every shard's limit is at least its holdings and
//! the limits still add up to `C`. Then `sum(max(held_i, limit_i)) = C`, and
//! since a shard admits only below its limit, nothing is admitted while `C`
//! or more units are held. That is possible exactly when the total held is
//! at most `C`; otherwise the split reports a *debt*, and the table gates
//! every admission until enough units have come back.

/// Limits for `capacity` over `held.len()` shards; `None` when more than
/// `capacity` units are held (a debt: no split can keep every limit at or
/// above its holdings).
///
/// `caps[i]`, if given, bounds shard `i`'s limit; the caps must add up to at
/// least `capacity`, and each `held[i]` must be within `caps[i]` (both hold
/// for the supervisor, whose holdings live in its slots).
pub(crate) fn split(capacity: usize, held: &[usize], caps: Option<&[usize]>) -> Option<Vec<usize>> {
    let total: usize = held.iter().sum();
    if total > capacity {
        return None;
    }
    let mut limits = even(capacity, held.len(), caps);
    // Raise the shards that hold more than their share to what they hold...
    let mut deficit = 0;
    for (limit, &held) in limits.iter_mut().zip(held) {
        if held > *limit {
            deficit += held - *limit;
            *limit = held;
        }
    }
    // ...and take the difference from the shards with slack, last first, so
    // the first shards (the ones the even split favours) keep their share.
    for (limit, &held) in limits.iter_mut().zip(held).rev() {
        if deficit == 0 {
            break;
        }
        let give = (*limit - held.min(*limit)).min(deficit);
        *limit -= give;
        deficit -= give;
    }
    debug_assert_eq!(deficit, 0, "total held <= capacity leaves enough slack");
    Some(limits)
}

/// The even split of `capacity` over `shards`, within `caps`.
pub(crate) fn even(capacity: usize, shards: usize, caps: Option<&[usize]>) -> Vec<usize> {
    let (base, extra) = (capacity / shards, capacity % shards);
    let mut limits: Vec<usize> = (0..shards).map(|i| base + usize::from(i < extra)).collect();
    if let Some(caps) = caps {
        let mut spill = 0;
        for (limit, &cap) in limits.iter_mut().zip(caps) {
            if *limit > cap {
                spill += *limit - cap;
                *limit = cap;
            }
        }
        for (limit, &cap) in limits.iter_mut().zip(caps) {
            if spill == 0 {
                break;
            }
            let take = (cap - *limit).min(spill);
            *limit += take;
            spill -= take;
        }
        debug_assert_eq!(spill, 0, "the caps add up to at least the capacity");
    }
    limits
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn even_split_differs_by_at_most_one_and_favours_the_first() {
        assert_eq!(even(10, 4, None), [3, 3, 2, 2]);
        assert_eq!(even(2, 4, None), [1, 1, 0, 0]);
        assert_eq!(even(0, 3, None), [0, 0, 0]);
    }

    #[test]
    fn caps_move_the_spill_to_shards_with_room() {
        assert_eq!(even(10, 2, Some(&[3, 10])), [3, 7]);
        assert_eq!(even(6, 3, Some(&[2, 2, 2])), [2, 2, 2]);
    }

    #[test]
    fn holdings_above_the_share_are_kept_and_paid_for_by_slack() {
        // Shrink 100 -> 10 while shard 0 holds 9: it keeps 9, shard 1 gets 1.
        assert_eq!(split(10, &[9, 0], None), Some(vec![9, 1]));
        // Slack is taken from the last shards first.
        assert_eq!(split(9, &[5, 0, 0], None), Some(vec![5, 3, 1]));
        // More held than the new capacity: a debt.
        assert_eq!(split(3, &[2, 2], None), None);
        // Exactly the capacity held: every shard full at its holdings.
        assert_eq!(split(4, &[3, 1], None), Some(vec![3, 1]));
    }

    proptest! {
        #[test]
        fn a_split_adds_up_and_covers_the_holdings(
            held in proptest::collection::vec(0usize..20, 1..9),
            extra in 0usize..40,
            short in 0usize..5,
        ) {
            let total: usize = held.iter().sum();
            let capacity = total + extra;
            let limits = split(capacity, &held, None).expect("enough capacity");
            prop_assert_eq!(limits.iter().sum::<usize>(), capacity);
            for (limit, held) in limits.iter().zip(&held) {
                prop_assert!(limit >= held);
            }
            // Without holdings, the even split.
            let zero = vec![0; held.len()];
            prop_assert_eq!(split(capacity, &zero, None).unwrap(), even(capacity, held.len(), None));
            // Less capacity than held is a debt.
            if short > 0 && short <= total {
                prop_assert_eq!(split(total - short, &held, None), None);
            }
        }

        #[test]
        fn capped_splits_stay_within_the_caps(
            caps in proptest::collection::vec(0usize..20, 1..9),
            fill in 0usize..100,
        ) {
            let room: usize = caps.iter().sum();
            let capacity = fill.min(room);
            let held: Vec<usize> = caps.iter().map(|cap| cap / 3).collect();
            let limits = split(capacity, &held, Some(&caps));
            if held.iter().sum::<usize>() > capacity {
                prop_assert_eq!(limits, None);
            } else {
                let limits = limits.unwrap();
                prop_assert_eq!(limits.iter().sum::<usize>(), capacity);
                for ((limit, cap), held) in limits.iter().zip(&caps).zip(&held) {
                    prop_assert!(limit <= cap && limit >= held);
                }
            }
        }
    }
}
