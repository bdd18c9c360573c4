//! [`Ticker`]: a thread that ticks a [`Controller`] every interval, for a
//! controller fed by counts alone (or by samples too rare to tick it).

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Controller;
use crate::engine::foreign::drop_payload;
use crate::sync::os_thread::{Builder, JoinHandle};
use crate::sync::{now, Condvar, Mutex};

/// A thread ticking a [`Controller`] every interval; made by
/// [`Controller::spawn_ticker`]. Dropping it stops the thread and joins
/// it.
///
/// Without it, a controller ticks when a sample finds its interval
/// passed (from [`Controller::timed`] permits, an attached pool's
/// workers, the tower layer, [`Controller::record`]), or when you call
/// [`Controller::tick`]. A controller driven by counts only (untimed
/// permits, whose completions, refusals and in-flight the front-end
/// counts anyway) has no samples to tick it: give it a ticker, or tick
/// it from a timer of yours.
///
/// The thread holds the controller weakly: it ends by itself once the
/// controller is dropped. Each tick runs the algorithm on this thread,
/// under no lock.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use sidejob::Limiter;
/// use sidejob::adaptive::{Controller, Guarded};
///
/// let limiter = Arc::new(Limiter::new(16)?);
/// let controller = Arc::new(
///     Controller::builder()
///         .interval(Duration::from_millis(20))
///         .build(Arc::clone(&limiter), Guarded::default())?,
/// );
/// let ticker = Controller::spawn_ticker(&controller)?;
/// // ... untimed permits; the ticker moves the limit from their counts ...
/// drop(limiter.try_acquire()?);
/// drop(ticker); // stopped and joined
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the ticker stops when dropped"]
pub struct Ticker {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    pub(crate) fn spawn(controller: &Arc<Controller>) -> std::io::Result<Ticker> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let weak = Arc::downgrade(controller);
        let interval = controller.interval();
        let thread = Builder::new().name("sidejob-ticker".into()).spawn({
            let stop = Arc::clone(&stop);
            move || run(&weak, interval, &stop)
        })?;
        Ok(Ticker {
            stop,
            thread: Some(thread),
        })
    }
}

/// The thread: wait an interval (or the stop), tick, again.
fn run(controller: &Weak<Controller>, interval: Duration, stop: &(Mutex<bool>, Condvar)) {
    let (stopped, wake) = stop;
    loop {
        {
            // The lock guards the flag alone, and is let go before the tick.
            // No deadline when the interval reaches past the clock's end
            // (`Duration::MAX`): then it waits for the stop alone.
            let deadline = now().checked_add(interval);
            let mut guard = stopped.lock();
            loop {
                if *guard {
                    return;
                }
                let Some(deadline) = deadline else {
                    guard = wake.wait(guard);
                    continue;
                };
                let timed_out;
                (guard, timed_out) = wake.wait_until(guard, deadline);
                if timed_out && !*guard {
                    break;
                }
            }
        }
        let Some(controller) = controller.upgrade() else {
            return;
        };
        // A panicking algorithm loses its window (the controller keeps its
        // state); the ticker goes on.
        if let Err(payload) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| controller.tick()))
        {
            drop_payload(payload);
        }
    }
}

impl Ticker {
    /// Stops the thread and joins it; true if it ended by itself (not by
    /// a panic). Once stopped, again is a no-op that returns true.
    pub(crate) fn stop(&mut self) -> bool {
        let (stopped, wake) = &*self.stop;
        *stopped.lock() = true;
        wake.notify_all();
        match self.thread.take() {
            Some(thread) => thread.join().is_ok(),
            None => true,
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        // The algorithm's panics are caught inside; a join error has
        // nothing more to say.
        let _ = self.stop();
    }
}

impl fmt::Debug for Ticker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticker").finish_non_exhaustive()
    }
}
