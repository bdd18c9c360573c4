//! The retry schedule against a model (proptest): for a random policy and
//! an operation that fails its first `k` attempts, the attempts seen are
//! exactly `1..=min(k + 1, max)`, every delay the shepherd schedules lies
//! within the policy's bounds for that failure count (on a manual clock),
//! each retry runs exactly when its delay ends, and the outcome is the
//! output iff `k < max`, else a failure carrying the last error and `max`
//! attempts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::harness::PATIENCE;
use crate::shepherd::{Handler, Jitter, ManualClock, Reason, RetryPolicy, Shepherd};

struct FailFirst {
    k: u32,
    clock: ManualClock,
    seen: Arc<Mutex<Vec<(u32, Instant)>>>,
}

impl Handler for FailFirst {
    type Op = ();
    type Output = u32;
    type Error = u32;
    fn handle(&mut self, _: &(), attempt: u32) -> Result<u32, u32> {
        self.seen.lock().unwrap().push((attempt, self.clock.now()));
        if attempt <= self.k {
            Err(attempt)
        } else {
            Ok(attempt)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn retry_schedule_matches_the_model(
        max in 1u32..6,
        k in 0u32..7,
        initial_ms in 0u64..300,
        extra_ms in 0u64..2_000,
        jitter in prop_oneof![Just(Jitter::Full), Just(Jitter::Equal), Just(Jitter::None)],
        seed in any::<u64>(),
    ) {
        let clock = ManualClock::new();
        let policy = RetryPolicy::new()
            .max_attempts(max)
            .backoff(Duration::from_millis(initial_ms), Duration::from_millis(initial_ms + extra_ms))
            .jitter(jitter)
            .budget(None);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shepherd = {
            let (clock, seen) = (clock.clone(), seen.clone());
            Shepherd::builder()
                .capacity(1)
                .workers(1)
                .shards(1)
                .retry(policy)
                .clock(clock.clone())
                .seed(seed)
                .build(move |_| FailFirst { k, clock: clock.clone(), seen: seen.clone() })
                .unwrap()
        };
        let mut done = shepherd.submit(()).unwrap();
        let mut scheduled = Vec::new();
        let outcome = loop {
            prop_assert!(shepherd.wait_idle(PATIENCE));
            match done.try_wait() {
                Ok(outcome) => break outcome,
                Err(pending) => done = pending,
            }
            let stats = shepherd.stats();
            prop_assert_eq!((stats.delayed, stats.due, stats.running), (1, 0, 0));
            let failures = stats.attempts as u32;
            let delay = stats.next_due.unwrap() - clock.now();
            let (low, high) = policy.delay_bounds(failures);
            prop_assert!(low <= delay && delay <= high, "{:?} not in [{:?}, {:?}]", delay, low, high);
            scheduled.push((failures, delay));
            clock.advance(delay);
        };
        let seen = seen.lock().unwrap().clone();
        let expected = (k + 1).min(max);
        let attempts: Vec<u32> = seen.iter().map(|s| s.0).collect();
        prop_assert_eq!(attempts, (1..=expected).collect::<Vec<_>>());
        // A retry whose delay was drawn as zero runs at once (never
        // delayed); every delayed one ran exactly at its due time.
        for (failures, delay) in &scheduled {
            let i = *failures as usize;
            prop_assert_eq!(seen[i].1 - seen[i - 1].1, *delay);
        }
        if k < max {
            prop_assert_eq!(outcome, Ok(k + 1));
        } else {
            let failure = outcome.unwrap_err();
            prop_assert_eq!(failure.reason(), Reason::Exhausted);
            prop_assert_eq!(failure.attempts(), max);
            prop_assert_eq!(failure.last_error(), Some(&max));
        }
        let stats = shepherd.stats();
        prop_assert_eq!(stats.retries, u64::from(expected - 1));
        prop_assert_eq!(shepherd.usage(), 0);
    }
}
