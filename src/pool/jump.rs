//! The jump consistent hash (Lamping & Veach, "A Fast, Minimal Memory,
//! Consistent Hash Algorithm", 2014): a 64-bit key to one of `n` buckets,
//! such that going from `n` to `n + 1` buckets moves only the keys that
//! land in the new bucket, about `1 / (n + 1)` of them.
//!
//! It needs no table and no memory: a loop of expected `ln n` steps, each a
//! step of a 64-bit linear congruential generator seeded with the key. The
//! buckets are numbered `0..n`, so it suits workers that are added and
//! removed at the end (a pool's pinned mode: its workers are numbered),
//! not arbitrary removals.
//!
//! Crate-private for now: the pool's pinned mode is its one user. Users who
//! route keys to shards of their own have well-kept crates for this (and
//! the twenty lines below); exporting it would add API to keep stable for
//! no feature of ours.

/// The paper's multiplier for its 64-bit linear congruential generator
/// (Figure 1).
const LCG_MULTIPLIER: u64 = 2_862_933_555_777_941_757;

/// The bucket in `0..buckets` that `key` goes to; `buckets == 0` answers 0
/// (there is no bucket to go to; callers never ask).
///
/// The paper's Figure 1, step for step: `b` is the last bucket the key
/// jumped to, `j` the next one; the LCG draws a uniform number in (0, 1]
/// from the top 31 bits of its state, and the key jumps to
/// `(b + 1) / r`. In floating point, as in the paper, so the answers match
/// its reference implementation bit for bit (the tests check values
/// computed with it). The one departure: `buckets` is a `u32`, not an
/// `int32_t`; above 2^31 the jump's product can exceed `i64`, where the
/// C++ is undefined and Rust's saturating cast ends the loop, which is the
/// right answer (a jump past the last bucket).
pub(crate) fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    let buckets = i64::from(buckets);
    let (mut b, mut j) = (-1i64, 0i64);
    while j < buckets {
        b = j;
        key = key.wrapping_mul(LCG_MULTIPLIER).wrapping_add(1);
        let r = (1u64 << 31) as f64 / ((key >> 33) + 1) as f64;
        j = ((b + 1) as f64 * r) as i64;
    }
    // `b` is in `-1..buckets`: -1 only when there are no buckets.
    u32::try_from(b).unwrap_or(0)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::jump_hash;

    /// Computed by the paper's Figure 1 code, compiled verbatim with g++
    /// (`int32_t JumpConsistentHash(uint64_t key, int32_t num_buckets)`).
    /// Two of them, (42, 57) → 43 and (0xDEAD10CC, 666) → 361, are also
    /// the test vectors of the widely used Go port (dgryski/go-jump).
    const REFERENCE: &[(u64, u32, u32)] = &[
        (0, 1, 0),
        (0, 3, 0),
        (0, 100_000, 0),
        (0, 2_147_483_647, 0),
        (1, 3, 0),
        (1, 10, 6),
        (1, 57, 55),
        (1, 666, 549),
        (1, 1024, 549),
        (1, 2_147_483_647, 262_355_607),
        (2, 10, 6),
        (2, 57, 46),
        (2, 100_000, 80_343),
        (42, 1, 0),
        (42, 3, 2),
        (42, 10, 2),
        (42, 57, 43),
        (42, 666, 571),
        (42, 1024, 571),
        (42, 2_147_483_647, 1_603_940_301),
        (256, 57, 16),
        (256, 100_000, 86_422),
        (0xDEAD_BEEF, 2, 1),
        (0xDEAD_BEEF, 3, 2),
        (0xDEAD_BEEF, 666, 285),
        (0xDEAD_BEEF, 100_000, 64_244),
        (0xDEAD_10CC, 10, 5),
        (0xDEAD_10CC, 57, 13),
        (0xDEAD_10CC, 128, 94),
        (0xDEAD_10CC, 666, 361),
        (0xDEAD_10CC, 100_000, 6591),
        (0xDEAD_10CC, 2_147_483_647, 1_321_988_195),
        (0x0DDC_0FFE_EBAD_F00D, 3, 2),
        (0x0DDC_0FFE_EBAD_F00D, 666, 113),
        (0x0DDC_0FFE_EBAD_F00D, 2_147_483_647, 848_029_737),
        (u64::MAX, 1, 0),
        (u64::MAX, 10, 9),
        (u64::MAX, 57, 10),
        (u64::MAX, 666, 313),
        (u64::MAX, 2_147_483_647, 699_554_662),
        (123_456_789, 10, 7),
        (123_456_789, 57, 34),
        (123_456_789, 666, 294),
        (123_456_789, 2_147_483_647, 1_234_790_967),
    ];

    #[test]
    fn matches_the_papers_reference_implementation() {
        for &(key, buckets, expected) in REFERENCE {
            assert_eq!(
                jump_hash(key, buckets),
                expected,
                "jump_hash({key:#x}, {buckets})"
            );
        }
    }

    #[test]
    fn edge_bucket_counts() {
        assert_eq!(jump_hash(42, 0), 0, "no bucket: 0, not a panic");
        for key in [0, 1, u64::MAX] {
            assert!(jump_hash(key, u32::MAX) < u32::MAX);
        }
    }

    /// SplitMix64: distinct, well-spread keys without a dependency.
    fn keys(n: usize) -> impl Iterator<Item = u64> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        (0..n).map(move |_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        })
    }

    /// Going from `n` to `n + 1` buckets, a key either stays or moves to
    /// the new bucket `n`, and about `1 / (n + 1)` of them move.
    #[test]
    fn growing_moves_a_fair_share_and_only_to_the_new_bucket() {
        const KEYS: usize = 20_000;
        let keys: Vec<u64> = keys(KEYS).collect();
        for n in 1..=64u32 {
            let mut moved = 0usize;
            for &key in &keys {
                let before = jump_hash(key, n);
                let after = jump_hash(key, n + 1);
                assert!(before < n && after <= n);
                if before != after {
                    assert_eq!(after, n, "key {key:#x} moved between old buckets");
                    moved += 1;
                }
            }
            // Binomial(KEYS, 1/(n+1)): within 5 standard deviations
            // (these keys are fixed, so the test is deterministic).
            let p = 1.0 / f64::from(n + 1);
            let mean = KEYS as f64 * p;
            let sd = (KEYS as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (moved as f64 - mean).abs() < 5.0 * sd,
                "{n} -> {}: {moved} keys moved, expected about {mean:.0}",
                n + 1
            );
        }
    }

    #[test]
    fn buckets_are_balanced() {
        const KEYS: usize = 100_000;
        let n = 10u32;
        let mut counts = [0usize; 10];
        for key in keys(KEYS) {
            counts[jump_hash(key, n) as usize] += 1;
        }
        for (bucket, &count) in counts.iter().enumerate() {
            // Expected 10,000 each, standard deviation about 95.
            assert!(
                (9_500..=10_500).contains(&count),
                "bucket {bucket} got {count} of {KEYS}"
            );
        }
    }
}
