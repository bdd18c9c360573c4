//! [`Alarm`]: a health watch that is raised when a figure stays above a
//! threshold for too long, and cleared when it comes back down.
//!
//! The seed case is the shepherd's queue: it "must routinely drop below the
//! number of workers, and alarms can be set to detect when the count
//! remains above that threshold for too long". An alarm is a small state
//! machine fed samples by a [`Reporter`](crate::observe::Reporter) on its tick (never
//! by the admission path), each with the time it was taken. Time only comes
//! in through [`Alarm::observe`]'s `now`, so tests drive an alarm with
//! instants they make up, and the reporter is the one place that reads the
//! clock.
//!
//! ```text
//!              value > threshold            held for raise_after
//!   Clear ───────────────────────▶ (rising) ───────────────────▶ Raised
//!     ▲    ◀─────────────────────                                  │
//!     │      value <= threshold                                    │
//!     │                                                            │
//!     └──────────────────────── (falling) ◀────────────────────────┘
//!        held for clear_after           value <= threshold
//! ```
//!
//! The figure is *sampled*: a dip that starts and ends between two samples
//! is not seen, so "stayed above" means "was above at every sample".

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::ConfigError;
use crate::shepherd::{Handler, Shepherd};
use crate::sync::{Arc, Mutex};

/// Which figure of a front-end an [`Alarm`] watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Watched {
    /// Units admitted and not yet released ([`Stats::usage`](crate::Stats::usage)).
    #[default]
    Usage,
    /// Callers waiting for a unit ([`Stats::waiting`](crate::Stats::waiting)):
    /// with a waiting room, usage sits at the capacity whenever anyone
    /// waits, so the queue is the figure that tells a burst from a
    /// standing overload. Always 0 without a waiting room.
    ///
    /// # Examples
    ///
    /// Raised when requests have been queueing for a minute:
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::observe::{Alarm, Watched};
    ///
    /// let alarm = Alarm::builder()
    ///     .watch(Watched::Waiting)
    ///     .threshold(0)
    ///     .raise_after(Duration::from_secs(60))
    ///     .build()?;
    /// assert_eq!(alarm.name(), "waiting");
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    Waiting,
}

/// An alarm's state; see [`Alarm::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmState {
    /// The figure is at or below the threshold, or has not been above it
    /// for long enough.
    Clear,
    /// The figure has been above the threshold for at least `raise_after`,
    /// and has not since been at or below it for `clear_after`.
    Raised,
}

/// A change of an [`Alarm`]'s state, handed to its callback and returned
/// by [`Alarm::observe`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AlarmEvent {
    /// The alarm's [name](Alarm::name), so one callback can serve several
    /// alarms.
    pub name: Arc<str>,
    /// The state the alarm is now in.
    pub state: AlarmState,
    /// The sample that changed it.
    pub value: usize,
    /// The alarm's threshold.
    pub threshold: usize,
    /// When the figure crossed the threshold (upward for `Raised`,
    /// downward for `Clear`): the start of the stretch that changed the
    /// state.
    pub since: Instant,
    /// The time of the sample that changed it.
    pub at: Instant,
}

type Callback = Arc<dyn Fn(&AlarmEvent) + Send + Sync>;

/// A health watch over one figure of a front-end (its usage, or how many
/// wait: [`Watched`]): raised when
/// the figure stays above `threshold` for longer than `raise_after`,
/// cleared when it stays at or below it for `clear_after` (0 by default:
/// the first sample back down clears it).
///
/// Attach it to a [`Reporter`](crate::observe::Reporter) with
/// [`ReporterBuilder::alarm`](crate::observe::ReporterBuilder::alarm): on every tick
/// the reporter feeds it the figure, and with the `metrics` feature
/// publishes its state as the gauge `sidejob_alarm{name, kind, alarm}`.
/// Each change calls the callback (on the reporter's thread: keep it
/// short) and shows in [`state`](Self::state). `Alarm` is a handle: keep a
/// clone to read the state.
///
/// # Examples
///
/// Driven by hand, with made-up instants:
///
/// ```
/// use std::time::{Duration, Instant};
/// use sidejob::observe::{Alarm, AlarmState};
///
/// let alarm = Alarm::builder()
///     .name("busy")
///     .threshold(8)
///     .raise_after(Duration::from_secs(10))
///     .build()?;
/// let t0 = Instant::now();
/// let at = |s| t0 + Duration::from_secs(s);
///
/// assert_eq!(alarm.observe(9, at(0)), None); // above: the clock starts
/// assert_eq!(alarm.observe(12, at(9)), None); // not long enough yet
/// let raised = alarm.observe(9, at(10)).unwrap();
/// assert_eq!((raised.state, raised.since), (AlarmState::Raised, at(0)));
/// assert_eq!(&*raised.name, "busy");
/// assert!(alarm.is_raised());
///
/// let cleared = alarm.observe(8, at(11)).unwrap(); // at the threshold: clear
/// assert_eq!(cleared.state, AlarmState::Clear);
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Alarm {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    watched: Watched,
    threshold: usize,
    raise_after: Duration,
    clear_after: Duration,
    callback: Option<Callback>,
    machine: Mutex<Machine>,
}

/// The state machine. Only reporters touch it, once a tick; the lock is
/// never on an admission path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Machine {
    /// Clear; `above_since` once the figure went above the threshold.
    Clear { above_since: Option<Instant> },
    /// Raised; `below_since` once the figure came back down.
    Raised { below_since: Option<Instant> },
}

impl Alarm {
    /// A builder; `threshold` and `raise_after` are required.
    pub fn builder() -> AlarmBuilder {
        AlarmBuilder::default()
    }

    /// Feeds one sample, taken at `now`; returns the change it caused, if
    /// any, after calling the callback with it.
    ///
    /// Samples should come in time order; a sample older than the stretch
    /// it continues counts as taken at the stretch's start.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// # use sidejob::observe::Alarm;
    /// let alarm = Alarm::builder().threshold(0).raise_after(Duration::ZERO).build()?;
    /// let now = Instant::now();
    /// assert!(alarm.observe(1, now).is_some()); // raise_after 0: at once
    /// assert!(alarm.observe(1, now).is_none()); // already raised
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn observe(&self, value: usize, now: Instant) -> Option<AlarmEvent> {
        let inner = &*self.inner;
        let above = value > inner.threshold;
        let event = {
            let mut machine = inner.machine.lock();
            let (next, changed) = step(*machine, above, now, inner.raise_after, inner.clear_after);
            *machine = next;
            changed.map(|(state, since)| AlarmEvent {
                name: Arc::clone(&inner.name),
                state,
                value,
                threshold: inner.threshold,
                since,
                at: now,
            })
        };
        // The callback runs outside the lock, so it may read the state.
        if let (Some(event), Some(callback)) = (&event, &inner.callback) {
            callback(event);
        }
        event
    }

    /// The current state.
    pub fn state(&self) -> AlarmState {
        match *self.inner.machine.lock() {
            Machine::Clear { .. } => AlarmState::Clear,
            Machine::Raised { .. } => AlarmState::Raised,
        }
    }

    /// True while raised.
    pub fn is_raised(&self) -> bool {
        self.state() == AlarmState::Raised
    }

    /// The alarm's name (the `alarm` label of its gauge).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The figure it watches.
    pub fn watched(&self) -> Watched {
        self.inner.watched
    }

    /// The threshold the figure must stay above to raise it.
    pub fn threshold(&self) -> usize {
        self.inner.threshold
    }
}

/// One step of the machine: the next state, and `(new state, since)` if it
/// changed. Kept apart from the lock so the rule reads in one place.
fn step(
    machine: Machine,
    above: bool,
    now: Instant,
    raise_after: Duration,
    clear_after: Duration,
) -> (Machine, Option<(AlarmState, Instant)>) {
    // A sample older than its stretch's start counts as taken at the start.
    let held = |since: Instant| now.saturating_duration_since(since);
    match (machine, above) {
        (Machine::Clear { above_since }, true) => {
            let since = above_since.unwrap_or(now);
            if held(since) >= raise_after {
                (
                    Machine::Raised { below_since: None },
                    Some((AlarmState::Raised, since)),
                )
            } else {
                (
                    Machine::Clear {
                        above_since: Some(since),
                    },
                    None,
                )
            }
        }
        (Machine::Clear { .. }, false) => (Machine::Clear { above_since: None }, None),
        (Machine::Raised { below_since }, false) => {
            let since = below_since.unwrap_or(now);
            if held(since) >= clear_after {
                (
                    Machine::Clear { above_since: None },
                    Some((AlarmState::Clear, since)),
                )
            } else {
                (
                    Machine::Raised {
                        below_since: Some(since),
                    },
                    None,
                )
            }
        }
        (Machine::Raised { .. }, true) => (Machine::Raised { below_since: None }, None),
    }
}

/// A shepherd's own health figure: its operations due and waiting for a
/// worker. Here, beside the alarm, so the shepherd needs nothing of this
/// module.
impl<H: Handler> Shepherd<H> {
    /// Feeds `alarm` the [`due`](Self::due) count, at the shepherd's clock
    /// time; the change it caused, if any. Call it on a timer (a
    /// [`Reporter`](crate::observe::Reporter) feeds only the [`Stats`](crate::Stats)
    /// figures; this is the shepherd's own). See the example on
    /// [`Shepherd`].
    pub fn observe_due(&self, alarm: &Alarm) -> Option<AlarmEvent> {
        alarm.observe(self.due(), self.now())
    }
}

impl fmt::Debug for Alarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("Alarm")
            .field("name", &inner.name)
            .field("watched", &inner.watched)
            .field("threshold", &inner.threshold)
            .field("raise_after", &inner.raise_after)
            .field("clear_after", &inner.clear_after)
            .field("state", &self.state())
            .finish()
    }
}

/// Configures an [`Alarm`]; made by [`Alarm::builder`].
///
/// # Examples
///
/// The shepherd's alarm: raised when usage stays above the worker count
/// for a minute, told to a callback.
///
/// ```
/// use std::time::Duration;
/// use sidejob::observe::{Alarm, AlarmState};
///
/// let workers = 8;
/// let alarm = Alarm::builder()
///     .name("above_workers")
///     .threshold(workers)
///     .raise_after(Duration::from_secs(60))
///     .clear_after(Duration::from_secs(5))
///     .on_change(|event| match event.state {
///         AlarmState::Raised => eprintln!(
///             "{}: usage {} above {} since {:?}",
///             event.name, event.value, event.threshold, event.since
///         ),
///         AlarmState::Clear => eprintln!("{}: usage back to {}", event.name, event.value),
///     })
///     .build()?;
/// assert_eq!(alarm.state(), AlarmState::Clear);
///
/// let err = Alarm::builder().threshold(1).build().unwrap_err();
/// assert_eq!(err.field(), "raise_after");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Clone, Default)]
pub struct AlarmBuilder {
    name: Option<String>,
    watched: Watched,
    threshold: Option<usize>,
    raise_after: Option<Duration>,
    clear_after: Duration,
    callback: Option<Callback>,
}

impl AlarmBuilder {
    /// The alarm's name, for its gauge's `alarm` label. Defaults to the
    /// watched figure: `usage` or `waiting`.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// The figure to watch; [`Watched::Usage`] by default.
    pub fn watch(&mut self, watched: Watched) -> &mut Self {
        self.watched = watched;
        self
    }

    /// The figure raises the alarm while it is strictly above this.
    /// Required.
    pub fn threshold(&mut self, threshold: usize) -> &mut Self {
        self.threshold = Some(threshold);
        self
    }

    /// How long the figure must stay above the threshold before the alarm
    /// is raised. Required; zero raises on the first sample above.
    pub fn raise_after(&mut self, duration: Duration) -> &mut Self {
        self.raise_after = Some(duration);
        self
    }

    /// How long the figure must stay at or below the threshold before a
    /// raised alarm clears; zero (the default) clears on the first sample
    /// back down.
    pub fn clear_after(&mut self, duration: Duration) -> &mut Self {
        self.clear_after = duration;
        self
    }

    /// Called with every change of state, on the thread that fed the
    /// sample (a reporter's). It must not block or panic.
    pub fn on_change(
        &mut self,
        callback: impl Fn(&AlarmEvent) + Send + Sync + 'static,
    ) -> &mut Self {
        self.callback = Some(Arc::new(callback));
        self
    }

    /// Builds the alarm, clear.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `threshold` or `raise_after` when unset, or
    /// `name` when it contains a NUL byte.
    pub fn build(&self) -> Result<Alarm, ConfigError> {
        let threshold = self.threshold.ok_or(ConfigError::missing("threshold"))?;
        let raise_after = self
            .raise_after
            .ok_or(ConfigError::missing("raise_after"))?;
        let name: Arc<str> = match (&self.name, self.watched) {
            (Some(name), _) => name.as_str().into(),
            (None, Watched::Usage) => "usage".into(),
            (None, Watched::Waiting) => "waiting".into(),
        };
        if name.contains('\0') {
            return Err(ConfigError::nul("name"));
        }
        Ok(Alarm {
            inner: Arc::new(Inner {
                name,
                watched: self.watched,
                threshold,
                raise_after,
                clear_after: self.clear_after,
                callback: self.callback.clone(),
                machine: Mutex::new(Machine::Clear { above_since: None }),
            }),
        })
    }
}

impl fmt::Debug for AlarmBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlarmBuilder")
            .field("name", &self.name)
            .field("watched", &self.watched)
            .field("threshold", &self.threshold)
            .field("raise_after", &self.raise_after)
            .field("clear_after", &self.clear_after)
            .field("callback", &self.callback.as_ref().map(|_| ".."))
            .finish()
    }
}
