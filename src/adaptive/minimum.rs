//! A windowed minimum: the least value pushed within the last `horizon`,
//! for a no-load latency that forgets old lows without any probing.
//!
//! A monotonic queue: values kept in increasing order, each with its time;
//! a push drops the values above it (they can never be the minimum again),
//! a read drops those older than the horizon, except the newest: when
//! every value has expired, the newest stands. Forgetting must not leave
//! the estimate empty, and whoever pushes decides what may raise it.

use std::collections::VecDeque;
use std::time::Duration;

/// The least value of a sliding time window.
#[derive(Debug, Clone)]
pub(crate) struct WindowedMin {
    horizon: Duration,
    queue: VecDeque<(Duration, f64)>,
}

impl WindowedMin {
    pub(crate) fn new(horizon: Duration) -> Self {
        WindowedMin {
            horizon,
            queue: VecDeque::new(),
        }
    }

    /// Adds `value`, seen at `now`.
    pub(crate) fn push(&mut self, now: Duration, value: f64) {
        while self.queue.back().is_some_and(|&(_, back)| back >= value) {
            self.queue.pop_back();
        }
        self.queue.push_back((now, value));
        self.expire(now);
    }

    /// Forgets everything and starts again from `value`.
    pub(crate) fn reset(&mut self, now: Duration, value: f64) {
        self.queue.clear();
        self.push(now, value);
    }

    /// The least value pushed within the horizon, else the newest.
    pub(crate) fn get(&mut self, now: Duration) -> Option<f64> {
        self.expire(now);
        self.queue.front().map(|&(_, value)| value)
    }

    fn expire(&mut self, now: Duration) {
        while self.queue.len() > 1
            && self
                .queue
                .front()
                .is_some_and(|&(at, _)| now.saturating_sub(at) > self.horizon)
        {
            self.queue.pop_front();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn forgets_old_lows_keeps_the_last() {
        let s = Duration::from_secs;
        let mut min = WindowedMin::new(s(10));
        assert_eq!(min.get(s(0)), None);
        min.push(s(0), 5.0);
        min.push(s(1), 7.0);
        min.push(s(2), 6.0);
        assert_eq!(min.get(s(5)), Some(5.0));
        // 5.0 expires; 6.0 (pushed after 7.0, and lower) is next.
        assert_eq!(min.get(s(11)), Some(6.0));
        // Everything but the newest has expired: the newest stays.
        assert_eq!(min.get(s(100)), Some(6.0));
        min.reset(s(100), 9.0);
        assert_eq!(min.get(s(100)), Some(9.0));
    }
}
