//! Loom models of sidejob live in `tests/`; run them with `RUSTFLAGS="--cfg loom"`.
//! What several models share lives here.

/// A count threads can wait on: a loom mutex and condition variable, never
/// `park` (loom does not let an `unpark` reach a thread blocked on a lock,
/// which a pool's worker in its idle room may be). A wake-up that never
/// comes is a deadlock loom reports.
#[cfg(loom)]
#[derive(Default)]
pub struct Count {
    value: loom::sync::Mutex<usize>,
    changed: loom::sync::Condvar,
}

#[cfg(loom)]
impl Count {
    /// Adds one and wakes every waiter.
    pub fn bump(&self) {
        *self.value.lock().unwrap() += 1;
        self.changed.notify_all();
    }

    /// The count now.
    pub fn get(&self) -> usize {
        *self.value.lock().unwrap()
    }

    /// Blocks until the count is at least `n`.
    pub fn wait_for(&self, n: usize) {
        let mut value = self.value.lock().unwrap();
        while *value < n {
            value = self.changed.wait(value).unwrap();
        }
    }
}
