//! Which worker owns a key: jump consistent hash over the pool's slots,
//! with free slots skipped by re-hashing.
//!
//! The slots are the membership list that Redis keeps (`slots`, versioned
//! by `meta.ver`): a joining worker takes the first free slot or a new one
//! at the end; a leaving one frees its slot (`""`) and nobody moves into
//! its place. Lamping and Veach's jump hash ([arXiv:1406.2294]) maps a key
//! to one of `n` buckets and, when `n` grows by one, moves only keys into
//! the new bucket, about `1/(n+1)` of them. Removing a bucket other than
//! the last is what plain jump hash cannot do without moving other keys, so
//! a free slot is skipped: the key is hashed again (a fixed sequence of
//! hashes per key) until it lands on a taken slot, as memento hashing does.
//! Then:
//!
//! * a worker that leaves moves only its own keys (every other key's
//!   sequence reaches its taken slot before the freed one);
//! * a worker that joins takes keys only for itself: the keys whose
//!   sequence reaches its slot first; with no free slot that is jump
//!   hash's `1/(n+1)`.
//!
//! Every node must compute the same answer: the key hash (FNV-1a, then
//! the splitmix64 finalizer) and this walk are part of the wire format.
//!
//! [arXiv:1406.2294]: https://arxiv.org/abs/1406.2294

/// FNV-1a over the key's bytes, finished with splitmix64 so that nearby
/// keys land far apart.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Jump consistent hash: a bucket in `0..buckets` (`buckets` ≥ 1), the
/// paper's code.
pub(crate) fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// How many re-hashes before the walk gives up hashing and takes the
/// first taken slot at or after the last probe: only when nearly every
/// slot is free, and the same on every node.
const MAX_PROBES: usize = 64;

/// The slot index that owns `key` among `slots` (`""` = free), or `None`
/// if every slot is free.
pub(crate) fn route_index(key: &[u8], slots: &[String]) -> Option<usize> {
    let n = u32::try_from(slots.len()).ok()?;
    if n == 0 || slots.iter().all(String::is_empty) {
        return None;
    }
    let mut h = key_hash(key);
    let mut b = 0;
    for _ in 0..MAX_PROBES {
        b = jump(h, n) as usize;
        if !slots[b].is_empty() {
            return Some(b);
        }
        h = mix(h);
    }
    (0..slots.len())
        .map(|i| (b + i) % slots.len())
        .find(|&i| !slots[i].is_empty())
}

/// The worker that owns `key`, if any slot is taken.
pub(crate) fn route<'a>(key: &[u8], slots: &'a [String]) -> Option<&'a str> {
    route_index(key, slots).map(|i| slots[i].as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn keys() -> Vec<String> {
        (0..20_000).map(|i| format!("tenant-{i}")).collect()
    }

    #[test]
    fn jump_stays_in_range_and_moves_keys_only_into_the_new_bucket() {
        assert_eq!(jump(0, 1), 0);
        assert_eq!(jump(0, 100), 0);
        for n in 1..200u32 {
            for k in [1u64, 42, u64::MAX, 0xdead_beef] {
                let b = jump(k, n);
                assert!(b < n);
                // Monotone: growing by one either keeps the bucket or moves
                // the key into the new one.
                let c = jump(k, n + 1);
                assert!(c == b || c == n, "key {k}: {b} -> {c} at n={n}");
            }
        }
    }

    #[test]
    fn adding_a_worker_moves_about_one_in_n_plus_one_only_to_it() {
        let before = slots(&["a", "b", "c", "d"]);
        let after = slots(&["a", "b", "c", "d", "e"]);
        let ks = keys();
        let mut moved: usize = 0;
        for k in &ks {
            let (x, y) = (route(k.as_bytes(), &before), route(k.as_bytes(), &after));
            if x != y {
                assert_eq!(y, Some("e"), "{k} moved {x:?} -> {y:?}");
                moved += 1;
            }
        }
        let expected = ks.len() / 5;
        assert!(
            moved.abs_diff(expected) < expected / 10,
            "moved {moved}, expected about {expected}"
        );
    }

    #[test]
    fn removing_a_worker_moves_only_its_keys_and_spreads_them() {
        let before = slots(&["a", "b", "c", "d", "e"]);
        let after = slots(&["a", "", "c", "d", "e"]);
        let ks = keys();
        let mut got = std::collections::HashMap::new();
        for k in &ks {
            let (x, y) = (route(k.as_bytes(), &before), route(k.as_bytes(), &after));
            if x != y {
                assert_eq!(x, Some("b"), "{k} moved {x:?} -> {y:?}");
                *got.entry(y.unwrap()).or_insert(0) += 1;
            }
            assert_ne!(y, Some(""));
        }
        // b's keys spread over the four others, none getting all.
        assert_eq!(got.len(), 4, "{got:?}");
    }

    #[test]
    fn a_joiner_fills_a_free_slot_and_takes_keys_only_for_itself() {
        let before = slots(&["a", "", "c", "d", "e"]);
        let after = slots(&["a", "f", "c", "d", "e"]);
        let ks = keys();
        let mut moved: usize = 0;
        for k in &ks {
            let (x, y) = (route(k.as_bytes(), &before), route(k.as_bytes(), &after));
            if x != y {
                assert_eq!(y, Some("f"));
                moved += 1;
            }
        }
        let expected = ks.len() / 5;
        assert!(moved.abs_diff(expected) < expected / 10, "moved {moved}");
    }

    #[test]
    fn no_taken_slot_no_owner_and_a_lone_slot_owns_everything() {
        assert_eq!(route(b"k", &[]), None);
        assert_eq!(route(b"k", &slots(&["", ""])), None);
        let mostly_free = {
            let mut s = vec![String::new(); 1000];
            s[999] = "z".into();
            s
        };
        for k in keys().iter().take(100) {
            assert_eq!(route(k.as_bytes(), &mostly_free), Some("z"));
        }
    }
}
