//! [`Guarded`]: the default algorithm, Little's law with the guardrails the
//! field learned the hard way.

use std::time::Duration;

use super::noload::{Noload, Reading, DEFAULT_SAMPLES};
use super::{clamp, fraction, non_negative, saturating_secs, Algorithm, Window};
use crate::error::ConfigError;

/// The default algorithm: Little's law (the in-flight the backend serves
/// at its no-load latency) with guardrails.
///
/// Each window it compares the mean latency with the **no-load latency**:
/// the least mean of pools of uncongested windows holding
/// [`noload_samples`](GuardedBuilder::noload_samples) samples (256) each,
/// re-based from the traffic when the backend shows it is below its knee
/// (below). Pooling keeps the estimate honest when few requests are
/// timed: the least of many single windows' means, each from a dozen
/// samples, reads low by a fifth, and the limit sinks with it.
///
/// Exactly what moves the estimate: the first window sets it,
/// provisionally; until a pool fills it follows the pool's running mean
/// down (and up by the tolerance at most); after that only a full pool
/// whose mean is at or below it lowers it, and only a re-basing (the
/// Cinnamon check below) raises it, again provisionally. Nothing expires:
/// time alone never moves it.
///
/// * **Congested** (latency above no-load × (1 + [`tolerance`](GuardedBuilder::tolerance))):
///   the limit comes down to `throughput × no-load latency × (1 +
///   headroom)`, what the backend completes without queueing: by a tenth
///   at most after one such window, by half at most after two running
///   (or one three tolerances above). If the limit was not binding
///   (nobody refused), it stays above the in-flight plus three standard
///   deviations, so a slowdown under light load does not start shedding.
/// * **Not congested, binding**: the limit grows, 2 % at first and half as
///   much again each window (up to 50 %) while it stays uncongested, so a
///   cold start or a recovered backend is found in a few windows and the
///   knee is approached gently.
///   Until a knee has been found (a congested window, or a guardrail), a
///   binding window with refusals climbs at once to what the offered
///   load needs by Little's law (refused requests included) plus four
///   Poisson standard deviations, at most doubling: from a start below
///   the load, a window or two of refusals, not one per step.
/// * **Above the band, within its noise allowance**: the limit holds
///   (too unsure to cut, too high to grow on).
/// * **Not binding**: the limit stays. Light load never lowers it, so
///   load that returns meets the limit it left.
///
/// A window in which the limit refused requests closes on an eighth of
/// the controller's `min_samples`, two samples at the default
/// ([`binding_min_samples`](Algorithm::binding_min_samples)): the band
/// widens by the window's standard error (and the estimate's), so two
/// samples read a halved knee (three times the no-load latency) as
/// surely as sixteen, and a window sooner.
///
/// The guardrails:
///
/// * a floor and a ceiling (the [`Controller`](super::Controller)'s);
/// * a [`max_latency`](GuardedBuilder::max_latency): a p99 above it cuts
///   the limit in proportion, whatever the rest says;
/// * drops above [`drop_tolerance`](GuardedBuilder::drop_tolerance) of
///   the samples multiply it by 0.9;
/// * **in-flight and throughput must move together** (Uber's Cinnamon):
///   when the in-flight fell by 15 % or more and the throughput
///   followed it in proportion (an elasticity between 0.75 and 1.25, so
///   the latency held still) at a latency above the band, the backend is
///   below its knee, so the latency seen now *is* its no-load latency:
///   the estimate is re-based on it (and refined by the pools that
///   follow). A backend that became slower for every request
///   (a mix of heavier requests, a slower disk) is re-measured this way,
///   from the traffic itself, with no probe and no request dropped;
/// * **no drift**: only a new low (of a full pool) or a re-basing moves
///   the estimate, and the re-basing needs the backend to show it is
///   below its knee, so a long incident cannot teach it that congested
///   latency is normal (the limit that never comes down,
///   failsafe-go#127);
/// * **no collapse from noise**: the band widens by three standard errors
///   of the window's mean (from its samples' spread and count); a window
///   above the band cuts by a tenth at most, it takes two in a row (or
///   one far above) to cut by up to half, and a limit that was not
///   binding stays above the in-flight.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::adaptive::Guarded;
///
/// let guarded = Guarded::builder()
///     .max_latency(Duration::from_millis(200))
///     .tolerance(0.2)
///     .build()?;
/// # let _ = guarded;
/// assert_eq!(Guarded::builder().tolerance(-1.0).build().unwrap_err().field(), "tolerance");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Guarded {
    tolerance: f64,
    headroom: f64,
    max_latency: Option<Duration>,
    drop_tolerance: f64,
    min_growth: f64,
    max_growth: f64,
    limit: Option<f64>,
    /// The no-load latency, from pools of `noload_samples` samples; a
    /// provisional estimate rises by the tolerance at most.
    noload: Noload,
    growth: f64,
    /// The previous window was above the tolerance.
    suspect: bool,
    /// A congested window (or a guardrail) has been seen: the knee has
    /// been found once, and the limit no longer climbs by the demand.
    found: bool,
    /// What the previous window read.
    previous: Option<Previous>,
}

/// What [`Guarded`] keeps of the previous window: for the Cinnamon check
/// ([`Guarded::below_knee`]) and for the load a window admitted.
#[derive(Debug, Clone, Copy)]
struct Previous {
    /// Mean in-flight, by Little's law.
    in_flight: f64,
    throughput: f64,
    limit: usize,
    /// The units held at its tick: with this tick's and the window's
    /// completions, what this window admitted.
    held: usize,
}

impl Default for Guarded {
    /// Tolerance 0.1, headroom 0.05, drop tolerance 0.05, no-load pools of
    /// 256 samples, no maximum latency.
    fn default() -> Self {
        Guarded {
            tolerance: 0.1,
            headroom: 0.05,
            max_latency: None,
            drop_tolerance: 0.05,
            min_growth: 0.02,
            max_growth: 0.5,
            limit: None,
            noload: Noload::new(DEFAULT_SAMPLES, 0.1).seed_allowance(),
            growth: 0.02,
            suspect: false,
            found: false,
            previous: None,
        }
    }
}

impl Guarded {
    /// A builder, from the defaults.
    pub fn builder() -> GuardedBuilder {
        GuardedBuilder::default()
    }

    /// The current no-load latency estimate, if any window has completed
    /// anything yet.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(sidejob::adaptive::Guarded::default().noload_latency(), None);
    /// ```
    pub fn noload_latency(&self) -> Option<Duration> {
        self.noload.get().map(saturating_secs)
    }

    /// True when the change from the previous window says the backend is
    /// below its knee: in-flight fell by 15 % or more, and throughput
    /// fell in proportion (an elasticity between 0.75 and 1.25); and the
    /// fall is the load's or the limit's, not the counts' noise: the
    /// window did not bind, or its limit was cut by as much (15 %).
    ///
    /// A limit that binds in both windows holds the in-flight at itself:
    /// a fall of 15 % then is the noise of two windows' throughputs
    /// (a mean in-flight is throughput × latency, and a window of 80
    /// completions reads its throughput within ±11 %), and with the
    /// latency steady it passed the elasticity test. Seen on one seed in
    /// eight under 1.5x load a little past the knee: the estimate was
    /// re-based at the congested latency (1.14x), rose with it, and the
    /// limit then held above a halved knee for the whole phase.
    ///
    /// A fall only: when load steps up, a window that straddles the step
    /// mixes light and congested traffic, and the next (congested) window
    /// shows in-flight and throughput both up with the latency steady, a
    /// false reading of the knee that re-based the estimate at congested
    /// latency (seen at sparse sampling, whose noisy means pass the
    /// elasticity test more often). A fall past the knee lowers latency,
    /// which the test catches; a slower backend shows itself by a fall,
    /// after the cut its congestion brings.
    fn below_knee(&self, window: &Window, in_flight: f64, throughput: f64) -> bool {
        let Some(Previous {
            in_flight: before,
            throughput: rate,
            limit,
            ..
        }) = self.previous
        else {
            return false;
        };
        if window.is_binding() && window.limit() as f64 > 0.85 * limit as f64 {
            return false;
        }
        if before <= 0.0 || rate <= 0.0 || in_flight <= 0.0 || throughput <= 0.0 {
            return false;
        }
        // Below the knee the latency does not depend on the in-flight, so
        // throughput moves in proportion: an elasticity near 1. Far above
        // 1, throughput fell on its own (the backend slowed) and took the
        // in-flight with it: not a reading of the knee.
        let moved = (in_flight / before).ln();
        moved <= -0.15 && (0.75..=1.25).contains(&((throughput / rate).ln() / moved))
    }
}

impl Algorithm for Guarded {
    /// An eighth of `min_samples` (at least 1 unless it is 0; two at the
    /// default 16): the band widens by the window's standard error, so
    /// two samples read a halved knee (three times the no-load latency)
    /// as surely as 16, and a climb from a low start stops shedding after
    /// a window. Two, not one: one sample has no spread to widen by.
    /// Over 25 seeds of the bench's second table, a quarter (4) read a
    /// halved knee in 0.22 s at the median, an eighth in 0.15 s.
    fn binding_min_samples(&self, min_samples: u64) -> u64 {
        (min_samples / 8).max(min_samples.min(1))
    }

    fn update(&mut self, window: &Window) -> usize {
        let limit = self.limit.unwrap_or(window.limit() as f64);
        let Some(reading) = Reading::of(window) else {
            // Nothing completed: nothing to learn (drops aside).
            if window.dropped() > 0 {
                return self.set(window, limit * 0.9);
            }
            return limit.round() as usize;
        };
        let throughput = window.throughput();
        let in_flight = window.mean_in_flight();
        let binding = window.is_binding();
        // What the window admitted: its completions, plus the units held
        // at its end less those held at its start. For the first window,
        // as if it started with none held: a controller that joins a busy
        // target reads its first window's load high by what was held, and
        // the climb it sizes is at most a doubling.
        let before = self.previous.map_or(0, |previous| previous.held) as f64;
        let admitted = (window.completed() as f64 + window.in_flight() as f64 - before)
            .max(window.completed() as f64);

        let latency = reading.latency;
        // The noise: the standard error of the window's mean, from the
        // spread of its samples (p99 against the mean, as if normal) and
        // their count, and that of the estimate it is set against (a
        // provisional one read from the first window's three samples
        // is as unsure as a window's; a full pool's is a sixteenth of a
        // sample's spread). The band widens by three of them. Without
        // timed samples there is no spread: the band alone.
        let tolerance = self.tolerance + 3.0 * reading.noise.hypot(self.noload.noise());

        // The no-load latency: the first window's, re-based when the
        // backend shows it is below its knee, else lowered by pools of
        // uncongested windows (below).
        let below_knee = self.below_knee(window, in_flight, throughput);
        self.previous = Some(Previous {
            in_flight,
            throughput,
            limit: window.limit(),
            held: window.in_flight(),
        });
        // A re-basing needs a window above the band: one within it says
        // nothing the band does not absorb, and one sparse window's mean
        // is too rough a reading to replace an estimate by.
        let noload = match self.noload.get() {
            Some(noload) if !(below_knee && latency > noload * (1.0 + tolerance)) => noload,
            _ => {
                // One window's reading: provisional, until a pool fills.
                self.noload.rebase(&reading);
                latency
            }
        };
        let ratio = latency / noload;
        // Pooled toward the next reading unless above the band.
        self.noload.feed(&reading, ratio > 1.0 + tolerance);

        // The guardrails first.
        if let Some(max) = self.max_latency {
            let seen = window.p99_latency().unwrap_or(saturating_secs(latency));
            if seen > max {
                let cut = (max.as_secs_f64() / seen.as_secs_f64()).max(0.5);
                self.growth = self.min_growth;
                self.found = true;
                return self.set(window, (limit * cut).floor());
            }
        }
        if window.drop_rate() > self.drop_tolerance {
            self.growth = self.min_growth;
            self.found = true;
            return self.set(window, (limit * 0.9).floor());
        }

        let above = ratio > 1.0 + tolerance;
        let congested = above && (self.suspect || ratio > 1.0 + 3.0 * tolerance);
        self.suspect = above;
        // What the backend completes without queueing, by Little's law.
        // The minimum of noisy readings reads low by a few of their
        // standard errors: given back as headroom.
        let mut target = throughput * noload * (1.0 + self.headroom + 3.0 * self.noload.noise());
        if !binding {
            target = target.max(in_flight + 3.0 * in_flight.sqrt());
        }
        let next = if above {
            // Congested: down to the target, by half at most. One window
            // mildly above the band (noise, or the knee just passed): by a
            // tenth at most, and see the next. Rounded down: a cut to
            // 17.6 against a knee of 16 applies 17, not 18.
            let most = if congested { 0.5 } else { 0.9 };
            self.growth = self.min_growth;
            self.found |= congested;
            target.max(limit * most).min(limit).floor()
        } else if ratio > 1.0 + self.tolerance {
            // Above the band, within its noise allowance: too unsure to
            // cut, too high to grow on (a window straddling a fall of the
            // knee reads so, its p99 far out). Hold.
            limit
        } else if binding {
            let mut next = (limit * (1.0 + self.growth)).max(limit + 1.0);
            self.growth = (self.growth * 1.5).min(self.max_growth);
            if !self.found && window.rejected() > 0 {
                // Requests were refused at the no-load latency, and no
                // knee has been seen yet: climb to what the offered load
                // needs by Little's law (refused requests included), with
                // room for its bursts (four standard deviations of a
                // Poisson in-flight), at most doubling a window. From a
                // limit of half the in-flight needed, one or two windows
                // instead of one per +2 %..+50 % step. The load is read
                // from arrivals (admitted and refused), not completions:
                // from an empty backend, the first window completes a
                // latency's worth less than it admits, and a climb sized
                // by completions fell short and kept refusing bursts.
                let offered =
                    (admitted + window.rejected() as f64) / window.elapsed().as_secs_f64();
                // The estimate read low by its noise is given back as the
                // target gives it back: a first window of three samples
                // reads a tenth low as often as not.
                let needed = offered * noload * (1.0 + self.headroom + 3.0 * self.noload.noise());
                next = next.max((needed + 4.0 * needed.sqrt()).min(2.0 * limit));
            }
            next
        } else {
            limit
        };
        self.set(window, next)
    }
}

impl Guarded {
    fn set(&mut self, window: &Window, limit: f64) -> usize {
        let limit = clamp(window, limit);
        self.limit = Some(limit);
        limit.round() as usize
    }
}

/// Configures a [`Guarded`]; made by [`Guarded::builder`].
#[derive(Debug, Clone, Default)]
pub struct GuardedBuilder {
    tolerance: Option<f64>,
    headroom: Option<f64>,
    max_latency: Option<Duration>,
    drop_tolerance: Option<f64>,
    noload_samples: Option<u64>,
}

impl GuardedBuilder {
    /// How far above the no-load latency a window's mean may be before it
    /// counts as congested: the noise band. Defaults to 0.1; 0 or more.
    pub fn tolerance(&mut self, tolerance: f64) -> &mut Self {
        self.tolerance = Some(tolerance);
        self
    }

    /// Room above Little's law's in-flight after a cut. Defaults to 0.05;
    /// 0 or more.
    pub fn headroom(&mut self, headroom: f64) -> &mut Self {
        self.headroom = Some(headroom);
        self
    }

    /// The most a healthy p99 latency may be: above it, the limit is cut
    /// in proportion (by half at most per window). Unset by default.
    pub fn max_latency(&mut self, latency: Duration) -> &mut Self {
        self.max_latency = Some(latency);
        self
    }

    /// The share of dropped samples tolerated before the limit backs off.
    /// Defaults to 0.05; a fraction above 0 and below 1.
    pub fn drop_tolerance(&mut self, share: f64) -> &mut Self {
        self.drop_tolerance = Some(share);
        self
    }

    /// How many timed samples (completions, for a controller fed by
    /// counts alone) a pool of uncongested windows gathers before its
    /// mean may lower the no-load latency. More: an estimate that reads
    /// less low (its error falls as the root of the count) but is found
    /// later when few requests are timed. Defaults to 256; not 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::adaptive::Guarded;
    ///
    /// let guarded = Guarded::builder().noload_samples(1_024).build()?;
    /// # let _ = guarded;
    /// assert_eq!(Guarded::builder().noload_samples(0).build().unwrap_err().field(), "noload_samples");
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn noload_samples(&mut self, samples: u64) -> &mut Self {
        self.noload_samples = Some(samples);
        self
    }

    /// Builds it.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `tolerance`, `headroom`, `drop_tolerance`,
    /// `max_latency` or `noload_samples` when out of range (a zero
    /// duration or count among them).
    pub fn build(&self) -> Result<Guarded, ConfigError> {
        let default = Guarded::default();
        if self.max_latency.is_some_and(|max| max.is_zero()) {
            return Err(ConfigError::zero_duration("max_latency"));
        }
        let noload_samples = match self.noload_samples {
            Some(0) => return Err(ConfigError::zero("noload_samples")),
            Some(samples) => samples as f64,
            None => DEFAULT_SAMPLES,
        };
        let tolerance = non_negative("tolerance", self.tolerance.unwrap_or(default.tolerance))?;
        Ok(Guarded {
            tolerance,
            headroom: non_negative("headroom", self.headroom.unwrap_or(default.headroom))?,
            max_latency: self.max_latency,
            drop_tolerance: fraction(
                "drop_tolerance",
                self.drop_tolerance.unwrap_or(default.drop_tolerance),
            )?,
            noload: Noload::new(noload_samples, tolerance).seed_allowance(),
            ..default
        })
    }
}
