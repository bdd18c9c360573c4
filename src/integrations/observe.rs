//! Watching a front-end from off its admission path: a [`Reporter`] reads
//! the [`Stats`](crate::Stats) of a limiter, pool, supervisor or shepherd
//! on a tick (its own thread, or your runtime's timer), exports them
//! through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`; the names are in `sidejob::metrics`), and feeds health
//! [`Alarm`]s that are raised when a figure stays above a threshold for too
//! long.
//!
//! # Examples
//!
//! An alarm on a supervisor's usage, fed by a reporter ticked by hand:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use sidejob::observe::{Alarm, AlarmState, Reporter, Watched};
//! use sidejob::Supervisor;
//!
//! let sup = Supervisor::new(4)?;
//! let busy = Alarm::builder()
//!     .name("children")
//!     .watch(Watched::Usage)
//!     .threshold(2)
//!     .raise_after(Duration::ZERO)
//!     .build()?;
//! let mut reporter = Reporter::builder().alarm(busy.clone()).build(&sup)?;
//! let held: Vec<_> = (0..3).map(|_| sup.try_reserve()).collect::<Result<_, _>>()?;
//! let now = Instant::now();
//! reporter.tick(now);
//! reporter.tick(now + Duration::from_millis(1));
//! assert_eq!(busy.state(), AlarmState::Raised);
//! drop(held);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use super::health::{Alarm, AlarmBuilder, AlarmEvent, AlarmState, Watched};
pub use super::reporter::{Observe, Reporter, ReporterBuilder, ReporterHandle};
