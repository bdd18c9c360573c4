//! The retry policy: how many attempts, how long to wait between them
//! (capped exponential backoff with jitter), and the retry budget that
//! keeps retries from multiplying the load on a resource that is down.
//!
//! # Backoff and jitter
//!
//! After the `n`-th failed attempt the ceiling is
//! `min(max_backoff, initial_backoff × 2^(n-1))`, and the delay is drawn
//! under it as [`Jitter`] says. The default is *full jitter*, from Marc
//! Brooker's "Exponential Backoff and Jitter" (AWS Architecture Blog,
//! 2015): a delay uniform in `[0, ceiling]`. Of the schemes that article
//! simulates (none, full, equal, decorrelated), full jitter did the least
//! total work (fewest calls) against a contended resource: clients that
//! failed together (an outage, a lock) come back spread over the whole
//! window instead of in synchronized waves. Its cost is that some retries
//! come almost at once; [`Jitter::Equal`] keeps at least half the ceiling
//! for callers who need a floor.
//!
//! # Budget
//!
//! Per-operation limits do not bound the *total* retry rate: when the
//! resource is down every operation fails, and each one retries up to
//! `max_attempts - 1` times, multiplying the load on the resource just when
//! it can least take it. A [`RetryBudget`] caps retries at a percentage of
//! first attempts over a sliding window, plus a small reserve so that a
//! quiet shepherd can still retry: tower's `TpsBudget` (itself Finagle's
//! `RetryBudget`). A retry the budget refuses is a final failure
//! ([`Reason::BudgetExhausted`](crate::shepherd::Reason::BudgetExhausted)).

use std::time::{Duration, Instant};

use crate::error::ConfigError;

/// How the delay before a retry is drawn under the backoff ceiling; see
/// [`RetryPolicy::jitter`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::shepherd::{Jitter, RetryPolicy};
///
/// let policy = RetryPolicy::new()
///     .backoff(Duration::from_millis(100), Duration::from_secs(1))
///     .jitter(Jitter::Equal);
/// // After the third failure the ceiling is 400 ms; equal jitter waits 200–400 ms.
/// assert_eq!(
///     policy.delay_bounds(3),
///     (Duration::from_millis(200), Duration::from_millis(400))
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// Uniform in `[0, ceiling]` (the default; see the module docs for
    /// why).
    #[default]
    Full,
    /// `ceiling / 2` plus uniform in `[0, ceiling / 2]`: never sooner than
    /// half the ceiling.
    Equal,
    /// Exactly the ceiling: plain exponential backoff. Clients that failed
    /// together retry together.
    None,
}

/// A retry budget: retries may be at most `percent` % of first attempts
/// over the last `ttl`, plus `min_per_sec` retries a second whatever the
/// traffic (tower's `TpsBudget`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::shepherd::{RetryBudget, RetryPolicy};
///
/// // Retries at most 10 % of the traffic, with a reserve of 1 retry/s
/// // averaged over 10 s.
/// let policy = RetryPolicy::new()
///     .budget(Some(RetryBudget::new(Duration::from_secs(10), 1, 10)));
/// assert_eq!(policy.retry_budget().unwrap().percent(), 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    ttl: Duration,
    min_per_sec: u32,
    percent: u32,
}

impl RetryBudget {
    /// The largest `percent` a budget accepts: retries ten times the
    /// first attempts is no budget at all.
    pub const MAX_PERCENT: u32 = 1000;

    /// A budget over a window of `ttl` (at least a millisecond), with a
    /// reserve of `min_per_sec` retries a second and `percent` % of first
    /// attempts (at most [`MAX_PERCENT`](Self::MAX_PERCENT)). Checked by
    /// [`ShepherdBuilder::build`](crate::shepherd::ShepherdBuilder::build).
    pub const fn new(ttl: Duration, min_per_sec: u32, percent: u32) -> Self {
        RetryBudget {
            ttl,
            min_per_sec,
            percent,
        }
    }

    /// The window deposits and withdrawals are remembered for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Retries a second allowed whatever the traffic.
    pub fn min_per_sec(&self) -> u32 {
        self.min_per_sec
    }

    /// Retries allowed per hundred first attempts.
    pub fn percent(&self) -> u32 {
        self.percent
    }
}

impl Default for RetryBudget {
    /// tower's defaults: a 10 s window, 10 retries a second in reserve,
    /// and 20 % of first attempts.
    fn default() -> Self {
        RetryBudget::new(Duration::from_secs(10), 10, 20)
    }
}

/// When and how often a [`Shepherd`](crate::shepherd::Shepherd) retries a failed
/// operation.
///
/// Defaults: 3 attempts in all, backoff from 100 ms capped at 10 s with
/// [full jitter](Jitter::Full), panics and attempt timeouts retried like
/// errors, and the default [`RetryBudget`]. Which errors are retried is the
/// handler's call ([`Handler::is_retryable`](crate::shepherd::Handler::is_retryable)).
/// The setters take and return the policy by value (it is a small `Copy`
/// value, like [`QueueOrder`](crate::QueueOrder)); the shepherd's builder
/// checks it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::shepherd::RetryPolicy;
///
/// let policy = RetryPolicy::new()
///     .max_attempts(5)
///     .backoff(Duration::from_millis(10), Duration::from_secs(2));
/// // Full jitter: anywhere from 0 up to the ceiling, which doubles.
/// assert_eq!(policy.delay_bounds(1), (Duration::ZERO, Duration::from_millis(10)));
/// assert_eq!(policy.delay_bounds(4), (Duration::ZERO, Duration::from_millis(80)));
/// assert_eq!(policy.delay_bounds(20), (Duration::ZERO, Duration::from_secs(2)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    jitter: Jitter,
    retry_panics: bool,
    retry_timeouts: bool,
    budget: Option<RetryBudget>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            jitter: Jitter::Full,
            retry_panics: true,
            retry_timeouts: true,
            budget: Some(RetryBudget::default()),
        }
    }
}

impl RetryPolicy {
    /// The default policy.
    pub fn new() -> Self {
        RetryPolicy::default()
    }

    /// Attempts in all, the first included; at least 1 (1: never retry).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The ceiling after the first failure, and the most any delay may be.
    /// `initial` must not exceed `max`; zero for both retries at once.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// How the delay is drawn under the ceiling; [`Jitter::Full`] by default.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Whether an attempt that panicked is retried (`true` by default). The
    /// worker is rebuilt either way.
    pub fn retry_panics(mut self, retry: bool) -> Self {
        self.retry_panics = retry;
        self
    }

    /// Whether an attempt that outlived the shepherd's
    /// [`attempt_timeout`](crate::shepherd::ShepherdBuilder::attempt_timeout) is
    /// retried (`true` by default).
    pub fn retry_timeouts(mut self, retry: bool) -> Self {
        self.retry_timeouts = retry;
        self
    }

    /// The retry budget, or `None` for none (every retry the other rules
    /// allow happens). [`RetryBudget::default`] by default.
    pub fn budget(mut self, budget: Option<RetryBudget>) -> Self {
        self.budget = budget;
        self
    }

    /// Attempts in all.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The retry budget, if any.
    pub fn retry_budget(&self) -> Option<RetryBudget> {
        self.budget
    }

    /// Whether panics are retried.
    pub fn retries_panics(&self) -> bool {
        self.retry_panics
    }

    /// Whether timed-out attempts are retried.
    pub fn retries_timeouts(&self) -> bool {
        self.retry_timeouts
    }

    /// The backoff ceiling after `failures` failed attempts (at least 1):
    /// `min(max, initial × 2^(failures-1))`, without overflow.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(63);
        let factor = 1u64 << doublings;
        let nanos = self
            .initial_backoff
            .as_nanos()
            .saturating_mul(u128::from(factor));
        let cap = self.max_backoff.as_nanos();
        duration_from_nanos(nanos.min(cap))
    }

    /// The shortest and longest delay before the retry that follows
    /// `failures` failed attempts.
    pub fn delay_bounds(&self, failures: u32) -> (Duration, Duration) {
        let ceiling = self.ceiling(failures);
        match self.jitter {
            Jitter::Full => (Duration::ZERO, ceiling),
            Jitter::Equal => (ceiling / 2, ceiling),
            Jitter::None => (ceiling, ceiling),
        }
    }

    /// A delay within [`delay_bounds`](Self::delay_bounds), drawn from `rng`.
    pub(crate) fn delay(&self, failures: u32, rng: &mut Rng) -> Duration {
        let (low, high) = self.delay_bounds(failures);
        let span = (high - low).as_nanos() as u64;
        low + Duration::from_nanos(rng.below_inclusive(span))
    }

    /// Checks every field; the error names the first one that is wrong.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::zero("max_attempts"));
        }
        if self.initial_backoff > self.max_backoff {
            return Err(ConfigError::too_long("backoff", self.max_backoff));
        }
        if let Some(budget) = self.budget {
            if budget.ttl < Duration::from_millis(1) {
                return Err(ConfigError::zero_duration("budget"));
            }
            if budget.percent > RetryBudget::MAX_PERCENT {
                return Err(ConfigError::too_large(
                    "budget",
                    RetryBudget::MAX_PERCENT as usize,
                ));
            }
        }
        Ok(())
    }
}

/// A `Duration` of `nanos` (saturating at `u64::MAX` nanoseconds, 584
/// years).
fn duration_from_nanos(nanos: u128) -> Duration {
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// The jitter source: SplitMix64 (Steele, Lea, Flood, "Fast splittable
/// pseudorandom number generators", OOPSLA 2014). Jitter needs spread, not
/// secrecy; a dozen lines beat a dependency, and a seed makes tests exact
/// ([`ShepherdBuilder::seed`](crate::shepherd::ShepherdBuilder::seed)).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, bound]` (Lemire's multiply-shift; the bias is below
    /// 2^-64 per draw, far under what jitter can notice).
    pub(crate) fn below_inclusive(&mut self, bound: u64) -> u64 {
        if bound == u64::MAX {
            return self.next_u64();
        }
        ((u128::from(self.next_u64()) * u128::from(bound + 1)) >> 64) as u64
    }
}

/// Slots of the budget's sliding window.
const SLOTS: usize = 10;
/// Tokens are counted in thousandths, so a percentage deposit is exact.
const MILLI: u64 = 1000;

/// A [`RetryBudget`]'s running state: deposits (first attempts) and
/// withdrawals (retries) in a window of [`SLOTS`] time slots, the oldest
/// forgotten as time moves on. Kept under the shepherd's lock.
#[derive(Debug)]
pub(crate) struct Budget {
    slot_len: Duration,
    /// `min_per_sec × ttl`, in thousandths of a retry.
    reserve: u64,
    deposit: u64,
    deposits: [u64; SLOTS],
    withdrawals: [u64; SLOTS],
    /// The slot now being filled, and when it began.
    current: usize,
    began: Instant,
}

impl Budget {
    pub(crate) fn new(config: RetryBudget, now: Instant) -> Self {
        let reserve = (u128::from(config.min_per_sec) * config.ttl.as_millis())
            .min(u128::from(u64::MAX / 2)) as u64;
        Budget {
            slot_len: (config.ttl / SLOTS as u32).max(Duration::from_nanos(1)),
            reserve,
            deposit: u64::from(config.percent) * MILLI / 100,
            deposits: [0; SLOTS],
            withdrawals: [0; SLOTS],
            current: 0,
            began: now,
        }
    }

    /// Moves the window to `now`, forgetting the slots that fell out.
    fn advance(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.began);
        if elapsed < self.slot_len {
            // The common case, on every submit: no 128-bit division.
            return;
        }
        let steps = (elapsed.as_nanos() / self.slot_len.as_nanos()).min(SLOTS as u128 + 1) as usize;
        for _ in 0..steps {
            self.current = (self.current + 1) % SLOTS;
            self.deposits[self.current] = 0;
            self.withdrawals[self.current] = 0;
            self.began += self.slot_len;
        }
        if steps > SLOTS {
            // Far behind (an idle spell): restart the window at `now`.
            self.began = now;
        }
    }

    /// A first attempt: adds `percent` % of a retry.
    pub(crate) fn deposit(&mut self, now: Instant) {
        self.advance(now);
        self.deposits[self.current] += self.deposit;
    }

    /// A retry: true (and withdrawn) if the window has a whole retry left.
    pub(crate) fn withdraw(&mut self, now: Instant) -> bool {
        self.advance(now);
        let deposited: u64 = self.deposits.iter().sum();
        let withdrawn: u64 = self.withdrawals.iter().sum();
        if self.reserve + deposited >= withdrawn + MILLI {
            self.withdrawals[self.current] += MILLI;
            true
        } else {
            false
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Rng;
    use super::*;
    use proptest::prelude::*;

    fn policy(initial_ms: u64, max_ms: u64, jitter: Jitter) -> RetryPolicy {
        RetryPolicy::new()
            .backoff(
                Duration::from_millis(initial_ms),
                Duration::from_millis(max_ms),
            )
            .jitter(jitter)
    }

    #[test]
    fn ceiling_doubles_then_caps_without_overflow() {
        let p = policy(10, 1000, Jitter::None);
        let ceilings: Vec<u64> = (1..=9).map(|n| p.ceiling(n).as_millis() as u64).collect();
        assert_eq!(ceilings, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(p.ceiling(u32::MAX), Duration::from_millis(1000));
        let huge = RetryPolicy::new().backoff(Duration::MAX, Duration::MAX);
        assert_eq!(huge.ceiling(64), duration_from_nanos(u128::MAX));
    }

    #[test]
    fn check_names_the_field() {
        let err = RetryPolicy::new().max_attempts(0).check().unwrap_err();
        assert_eq!(err.field(), "max_attempts");
        let err = policy(2, 1, Jitter::Full).check().unwrap_err();
        assert_eq!(err.field(), "backoff");
        let err = RetryPolicy::new()
            .budget(Some(RetryBudget::new(Duration::from_secs(1), 0, 1001)))
            .check()
            .unwrap_err();
        assert_eq!(err.to_string(), "invalid `budget`: must be at most 1000");
        assert!(RetryPolicy::new().check().is_ok());
    }

    #[test]
    fn budget_allows_reserve_plus_percent_and_forgets_old_slots() {
        let t0 = Instant::now();
        // No reserve, 50 %: two first attempts pay for one retry.
        let mut budget = Budget::new(RetryBudget::new(Duration::from_secs(10), 0, 50), t0);
        assert!(!budget.withdraw(t0));
        budget.deposit(t0);
        assert!(!budget.withdraw(t0));
        budget.deposit(t0);
        assert!(budget.withdraw(t0));
        assert!(!budget.withdraw(t0));
        // Ten seconds on, the deposits (and the withdrawal) are forgotten.
        for _ in 0..4 {
            budget.deposit(t0 + Duration::from_secs(5));
        }
        let later = t0 + Duration::from_secs(11);
        assert!(
            budget.withdraw(later),
            "the deposits at 5 s are still in the window"
        );
        assert!(budget.withdraw(later));
        assert!(!budget.withdraw(later));
        let much_later = t0 + Duration::from_secs(100);
        assert!(!budget.withdraw(much_later));
        // A reserve of 1/s over 10 s: ten retries with no traffic at all.
        let mut budget = Budget::new(RetryBudget::new(Duration::from_secs(10), 1, 0), t0);
        assert_eq!((0..20).filter(|_| budget.withdraw(t0)).count(), 10);
    }

    proptest! {
        /// Every drawn delay lies within the bounds, the bounds within the
        /// ceiling, and the ceiling is min(max, initial × 2^(n-1)).
        #[test]
        fn delays_within_bounds(
            initial in 0u64..5_000,
            extra in 0u64..100_000,
            failures in 1u32..80,
            seed in any::<u64>(),
            jitter in prop_oneof![Just(Jitter::Full), Just(Jitter::Equal), Just(Jitter::None)],
        ) {
            let p = policy(initial, initial + extra, jitter);
            let mut rng = Rng::new(seed);
            let (low, high) = p.delay_bounds(failures);
            let ceiling = p.ceiling(failures);
            prop_assert_eq!(high, ceiling);
            let model = (u128::from(initial) << failures.saturating_sub(1).min(100))
                .min(u128::from(initial + extra));
            prop_assert_eq!(ceiling.as_millis(), model);
            for _ in 0..8 {
                let delay = p.delay(failures, &mut rng);
                prop_assert!(low <= delay && delay <= high, "{delay:?} not in [{low:?}, {high:?}]");
            }
        }

        /// The draw is uniform enough to use the whole window: over many
        /// draws of full jitter, both the bottom and the top tenth occur.
        #[test]
        fn full_jitter_spreads(seed in any::<u64>()) {
            let p = policy(1000, 1000, Jitter::Full);
            let mut rng = Rng::new(seed);
            let draws: Vec<Duration> = (0..200).map(|_| p.delay(1, &mut rng)).collect();
            prop_assert!(draws.iter().any(|d| *d < Duration::from_millis(100)));
            prop_assert!(draws.iter().any(|d| *d > Duration::from_millis(900)));
        }
    }
}
