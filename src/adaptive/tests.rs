//! The algorithms against a fluid model of a backend, on a virtual clock.
//!
//! The backend serves `knee` requests at once at its no-load latency; past
//! the knee every request slows by `(n / knee)^1.5`, so throughput falls
//! (retrograde scaling, as a contended lock or a thrashing cache does).
//! Offered load is a rate; each 50 ms window the model settles at the
//! in-flight the load and the limit allow and hands the algorithm that
//! window's figures, with deterministic noise if asked. No threads, no
//! clock, no sleeps: each test is a loop over windows.
//!
//! The properties, each a test that a broken algorithm fails:
//!
//! * the limit comes down after the backend slows, and stays down through
//!   a long incident (no drift of the no-load latency);
//! * re-measuring the no-load latency sheds nothing at load below the
//!   knee (a probing algorithm, brpc's, does);
//! * noise does not collapse the limit;
//! * a backend slower for every request (a mix shift) is re-measured from
//!   the traffic: the limit returns to the knee.

use std::time::Duration;

use super::*;

const WINDOW: Duration = Duration::from_millis(50);

/// The fluid backend and the load on it.
#[derive(Debug, Clone)]
struct Model {
    /// In-flight requests served at the no-load latency.
    knee: f64,
    /// The no-load latency, in seconds.
    service: f64,
    /// Offered load, requests per second.
    rate: f64,
    /// Each request's latency varies by this much, relative (uniform);
    /// a window's mean by that over the root of its count. 0: none.
    noise: f64,
    /// Relative noise on each window's mean as a whole, as a pause or a
    /// noisy neighbour gives (0: none).
    jolt: f64,
    /// One completion in `every` is a timed sample (1: all).
    every: f64,
    /// A deterministic generator for the noise.
    seed: u64,
    now: Duration,
}

/// What one window of the model did.
#[derive(Debug, Clone, Copy)]
struct Seen {
    limit: usize,
    rejected: f64,
}

impl Model {
    fn new(knee: f64, service: Duration, rate_share: f64) -> Self {
        let service = service.as_secs_f64();
        Model {
            knee,
            service,
            rate: rate_share * knee / service,
            noise: 0.0,
            jolt: 0.0,
            every: 1.0,
            seed: 0x2545_f491_4f6c_dd1d,
            now: Duration::ZERO,
        }
    }

    /// The latency with `n` in flight.
    fn latency(&self, n: f64) -> f64 {
        self.service * (n / self.knee).max(1.0).powf(1.5)
    }

    /// The best throughput: at the knee.
    fn best(&self) -> f64 {
        self.knee / self.service
    }

    /// A uniform draw in [-1, 1) (xorshift).
    fn draw(&mut self) -> f64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        (self.seed >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// One window under `limit`: the window the algorithm sees.
    fn window(&mut self, limit: usize) -> (Window, Seen) {
        self.now += WINDOW;
        let cap = limit as f64;
        // Below the knee and the limit the load settles at rate × service;
        // otherwise the queue grows to the limit.
        let unbound = self.rate * self.service;
        let (in_flight, binding) = if unbound <= self.knee && unbound <= cap {
            (unbound, false)
        } else {
            (cap, true)
        };
        let latency = self.latency(in_flight);
        let throughput = in_flight / latency;
        let rejected = if binding {
            (self.rate - throughput).max(0.0) * WINDOW.as_secs_f64()
        } else {
            0.0
        };
        let completed = (throughput * WINDOW.as_secs_f64()).round() as u64;
        let samples = (completed as f64 / self.every).round() as u64;
        // A uniform draw on [-1, 1) has a deviation of 1/sqrt(3).
        let spread = self.noise / 3f64.sqrt();
        let error = spread / (samples.max(1) as f64).sqrt();
        let noisy = latency * (1.0 + 3f64.sqrt() * error * self.draw() + self.jolt * self.draw());
        let window = Window {
            now: self.now,
            elapsed: WINDOW,
            limit,
            floor: 1,
            ceiling: 10_000,
            samples,
            dropped: 0,
            mean_latency: (completed > 0).then(|| Duration::from_secs_f64(noisy)),
            min_latency: (completed > 0).then(|| Duration::from_secs_f64(noisy * 0.9)),
            p99_latency: (completed > 0)
                .then(|| Duration::from_secs_f64(noisy * (1.0 + 2.33 * spread).max(1.5))),
            completed,
            rejected: rejected.round() as u64,
            waited: 0,
            in_flight: in_flight.round() as usize,
        };
        let seen = Seen { limit, rejected };
        (window, seen)
    }

    /// Runs `algorithm` for `windows` windows from `limit`; every window's
    /// figures.
    fn run(
        &mut self,
        algorithm: &mut dyn Algorithm,
        limit: &mut usize,
        windows: usize,
    ) -> Vec<Seen> {
        (0..windows)
            .map(|_| {
                let (window, seen) = self.window(*limit);
                *limit = algorithm.update(&window).clamp(1, 10_000);
                seen
            })
            .collect()
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every algorithm, with its name.
fn all() -> Vec<(&'static str, Box<dyn Algorithm>)> {
    vec![
        ("guarded", Box::new(Guarded::default())),
        (
            "aimd",
            Box::new(Aimd::builder().latency_threshold(ms(25)).build().unwrap()),
        ),
        // Netflix's probe drifts (see `a_probing_vegas_drifts_...`).
        (
            "vegas",
            Box::new(Vegas::builder().probe_multiplier(0.0).build().unwrap()),
        ),
        ("littles", Box::new(LittlesLaw::default())),
    ]
}

#[test]
fn every_algorithm_brings_the_limit_down_when_the_backend_slows() {
    // Gradient2 is left out: its long average takes in the slow latency
    // (`a_long_average_drifts_where_guarded_does_not`).
    for (name, mut algorithm) in all() {
        // 4x overload on a knee of 100 at 10 ms, from a limit of 100.
        let mut model = Model::new(100.0, ms(10), 4.0);
        let mut limit = 100;
        model.run(&mut *algorithm, &mut limit, 200);
        let before = limit;
        // The backend loses three quarters of its capacity.
        model.knee = 25.0;
        model.run(&mut *algorithm, &mut limit, 400);
        assert!(
            limit <= 40 && limit * 2 < before.max(50),
            "{name}: limit {limit} (was {before}) after the knee fell to 25"
        );
    }
}

#[test]
fn guarded_reaches_the_knee_from_cold_and_after_a_halving() {
    let mut model = Model::new(100.0, ms(10), 4.0);
    let mut guarded = Guarded::default();
    let mut limit = 10;
    let cold = model.run(&mut guarded, &mut limit, 40);
    // Within ±10 % of the knee after at most 20 windows (1 s).
    let first = cold
        .iter()
        .position(|s| (90..=110).contains(&s.limit))
        .unwrap();
    assert!(
        first <= 20,
        "reached the knee after {first} windows: {:?}",
        limits(&cold)
    );
    let settled = model.run(&mut guarded, &mut limit, 100);
    assert_steady(&settled[50..], 100.0, "before the halving");

    model.knee = 50.0;
    let halved = model.run(&mut guarded, &mut limit, 100);
    let first = halved
        .iter()
        .position(|s| (45..=55).contains(&s.limit))
        .unwrap();
    assert!(
        first <= 20,
        "reached the halved knee after {first} windows: {:?}",
        limits(&halved)
    );
    assert_steady(&halved[50..], 50.0, "after the halving");

    model.knee = 100.0;
    let recovered = model.run(&mut guarded, &mut limit, 100);
    let first = recovered
        .iter()
        .position(|s| (90..=110).contains(&s.limit))
        .unwrap();
    assert!(
        first <= 20,
        "recovered after {first} windows: {:?}",
        limits(&recovered)
    );
}

#[test]
fn guarded_limit_never_drifts_up_during_a_long_incident() {
    let mut model = Model::new(100.0, ms(10), 4.0);
    model.noise = 0.3;
    let mut guarded = Guarded::default();
    let mut limit = 100;
    model.run(&mut guarded, &mut limit, 100);
    let before = guarded.noload_latency().unwrap().as_secs_f64();
    model.knee = 30.0;
    // 50 s of incident, past the knee all along: congested latency the
    // whole time, which must not become the no-load latency.
    let incident = model.run(&mut guarded, &mut limit, 1000);
    assert_steady(&incident[100..], 30.0, "through the incident");
    let after = guarded.noload_latency().unwrap().as_secs_f64();
    assert!(
        after <= before * 1.1 && (after / 0.010 - 1.0).abs() <= 0.1,
        "no-load estimate {:.2} ms after the incident, {:.2} ms before",
        after * 1e3,
        before * 1e3
    );
}

#[test]
fn a_probing_vegas_drifts_where_guarded_does_not() {
    // The scenario above catches the drift: Netflix's probe re-measures
    // the no-load latency under load, and the limit stops coming down.
    let mut model = Model::new(100.0, ms(10), 4.0);
    let mut vegas = Vegas::default();
    let mut limit = 100;
    model.run(&mut vegas, &mut limit, 100);
    model.knee = 30.0;
    let incident = model.run(&mut vegas, &mut limit, 1000);
    let late = incident[900..].iter().map(|s| s.limit).max().unwrap();
    assert!(
        late > 45,
        "vegas settled at {late}: the probe no longer drifts?"
    );
}

#[test]
fn a_long_average_drifts_where_guarded_does_not() {
    // Gradient2's long-term latency follows a sustained slowdown, so the
    // gradient returns to 1 and the limit stops coming down.
    let mut model = Model::new(100.0, ms(10), 4.0);
    let mut gradient = Gradient2::default();
    let mut limit = 100;
    model.run(&mut gradient, &mut limit, 100);
    model.knee = 25.0;
    let incident = model.run(&mut gradient, &mut limit, 400);
    let late = incident[300..].iter().map(|s| s.limit).min().unwrap();
    assert!(
        late > 50,
        "gradient2 came down to {late}: no longer drifts?"
    );
}

#[test]
fn guarded_remeasures_without_shedding_below_the_knee() {
    // 80 % of the knee; then every request twice as slow (a heavier mix)
    // with the load at 80 % of what the backend now serves, so the
    // latency doubles with the backend still below its knee. No probe:
    // nothing is refused, before or after.
    let mut model = Model::new(100.0, ms(10), 0.8);
    let mut guarded = Guarded::default();
    let mut limit = 120;
    let mut seen = model.run(&mut guarded, &mut limit, 200);
    model.service *= 2.0;
    model.rate = 0.8 * model.best();
    seen.extend(model.run(&mut guarded, &mut limit, 200));
    let shed: f64 = seen.iter().map(|s| s.rejected).sum();
    assert_eq!(shed, 0.0, "guarded shed {shed} at 0.8x");
    assert!(seen.iter().all(|s| s.limit >= 100), "{:?}", limits(&seen));
    // Then 4x: the slower mix is measured from the traffic (in-flight and
    // throughput falling together after the first cut), and the limit
    // finds the knee rather than sinking to half of it.
    model.rate = 4.0 * model.best();
    let loaded = model.run(&mut guarded, &mut limit, 100);
    let first = loaded.iter().position(|s| (90..=110).contains(&s.limit));
    assert!(matches!(first, Some(w) if w <= 20), "{:?}", limits(&loaded));
    assert_steady(&loaded[50..], 100.0, "at 4x after the mix shift");
    let noload = guarded.noload_latency().unwrap().as_secs_f64();
    assert!(
        (noload / 0.020 - 1.0).abs() <= 0.1,
        "no-load estimate {:.2} ms against 20 ms",
        noload * 1e3
    );
}

#[test]
fn a_probing_brpc_sheds_where_guarded_does_not() {
    // brpc's re-measure window holds the limit at 90 % of its estimate:
    // with load at 95 % of the knee, that sheds.
    let mut model = Model::new(100.0, ms(10), 0.95);
    let mut brpc = LittlesLaw::builder()
        .remeasure_every(Some(Duration::from_secs(2)))
        .build()
        .unwrap();
    let mut limit = 120;
    let seen = model.run(&mut brpc, &mut limit, 400);
    let shed: f64 = seen.iter().map(|s| s.rejected).sum();
    assert!(shed > 0.0, "brpc's re-measure shed nothing");
}

#[test]
fn noise_does_not_collapse_the_limit() {
    for (noise, jolt) in [(0.3, 0.0), (1.0, 0.0), (0.3, 0.05)] {
        let mut model = Model::new(100.0, ms(10), 4.0);
        model.noise = noise;
        model.jolt = jolt;
        let mut guarded = Guarded::default();
        let mut limit = 100;
        let seen = model.run(&mut guarded, &mut limit, 2000);
        let low = seen[100..].iter().map(|s| s.limit).min().unwrap();
        assert!(low >= 60, "noise {noise}: the limit fell to {low}");
        let mean = seen[100..].iter().map(|s| s.limit as f64).sum::<f64>() / 1900.0;
        assert!(mean >= 85.0, "noise {noise}: mean limit {mean}");
    }
    // And under light load noise never sheds.
    let mut model = Model::new(100.0, ms(10), 0.5);
    model.noise = 1.0;
    model.jolt = 0.05;
    let mut guarded = Guarded::default();
    let mut limit = 100;
    let seen = model.run(&mut guarded, &mut limit, 2000);
    assert_eq!(seen.iter().map(|s| s.rejected).sum::<f64>(), 0.0);
}

#[test]
fn sparse_sampling_does_not_sink_the_noload_estimate() {
    // Half load for a minute, each request's latency ±50 % (uniform),
    // one in 16 timed: 16 samples a window, each window's mean off by 7 %
    // (one standard error). The least of 1,200 such means is an eighth
    // below the truth; an estimate that takes it brings the limit down
    // with it.
    let mut model = Model::new(100.0, ms(10), 0.5);
    model.noise = 0.5;
    model.every = 16.0;
    let mut guarded = Guarded::default();
    let mut limit = 120;
    let light = model.run(&mut guarded, &mut limit, 1_200);
    assert!(light.iter().all(|s| s.rejected == 0.0), "shed at half load");
    let noload = guarded.noload_latency().unwrap().as_secs_f64();
    assert!(
        (noload / 0.010 - 1.0).abs() <= 0.05,
        "no-load estimate {:.2} ms against 10 ms",
        noload * 1e3
    );
    // Then 1.5x: the limit settles about the knee, not below it (the
    // band is wider with 16 samples a window, so it sits a little above).
    model.rate = 1.5 * model.best();
    let loaded = model.run(&mut guarded, &mut limit, 200);
    let mean = loaded[100..].iter().map(|s| s.limit as f64).sum::<f64>() / 100.0;
    assert!(
        (95.0..=115.0).contains(&mean),
        "mean limit {mean} at 1.5x: {:?}",
        limits(&loaded)
    );
}

#[test]
fn sparse_sampling_does_not_sink_brpcs_estimate() {
    // The scenario above for LittlesLaw (its re-measure off): brpc's
    // average of lower window latencies read low at one in 16 timed and
    // held the limit under the knee; the shared pooled estimate does not.
    let mut model = Model::new(100.0, ms(10), 0.5);
    model.noise = 0.5;
    model.every = 16.0;
    let mut brpc = LittlesLaw::builder().remeasure_every(None).build().unwrap();
    let mut limit = 120;
    model.run(&mut brpc, &mut limit, 1_200);
    model.rate = 1.5 * model.best();
    let loaded = model.run(&mut brpc, &mut limit, 200);
    let low = loaded[100..].iter().map(|s| s.limit).min().unwrap();
    assert!(
        low >= 95,
        "the limit fell to {low} at 1.5x: {:?}",
        limits(&loaded)
    );
}

#[test]
fn guarded_re_measures_a_slower_mix_from_the_traffic() {
    // Every request becomes twice as slow (a mix of heavier requests): the
    // knee is still 100 in flight. A no-load latency stuck at the old
    // value would hold the limit near half the knee.
    let mut model = Model::new(100.0, ms(10), 4.0);
    let mut guarded = Guarded::default();
    let mut limit = 100;
    model.run(&mut guarded, &mut limit, 100);
    model.service *= 2.0;
    model.rate = 4.0 * model.best();
    let shifted = model.run(&mut guarded, &mut limit, 100);
    let first = shifted.iter().position(|s| (90..=110).contains(&s.limit));
    assert!(
        matches!(first, Some(w) if w <= 20),
        "{:?}",
        limits(&shifted)
    );
    assert_steady(&shifted[50..], 100.0, "after the mix shift");
}

#[test]
fn guarded_honours_max_latency_and_drops() {
    let mut model = Model::new(100.0, ms(10), 4.0);
    let mut guarded = Guarded::builder().max_latency(ms(12)).build().unwrap();
    let mut limit = 300;
    let seen = model.run(&mut guarded, &mut limit, 100);
    // p99 is 1.5x the mean in the model: 12 ms holds the mean at 8 ms,
    // below the knee's 10 ms, so the limit stays under the knee.
    assert!(
        seen[50..].iter().all(|s| s.limit <= 100),
        "{:?}",
        limits(&seen)
    );

    let mut guarded = Guarded::default();
    let (mut window, _) = Model::new(100.0, ms(10), 4.0).window(100);
    window.dropped = window.samples; // half of everything dropped
    assert_eq!(guarded.update(&window), 90);
}

#[test]
fn the_limit_stays_in_the_bounds() {
    for (name, mut algorithm) in all() {
        let (mut window, _) = Model::new(100.0, ms(10), 4.0).window(100);
        window.floor = 95;
        window.ceiling = 96;
        for _ in 0..50 {
            let limit = algorithm.update(&window);
            assert!((95..=96).contains(&limit), "{name}: {limit}");
            window.limit = limit;
            window.now += WINDOW;
        }
    }
}

#[test]
fn builders_name_the_bad_field() {
    assert_eq!(
        Aimd::builder()
            .increase(f64::NAN)
            .build()
            .unwrap_err()
            .field(),
        "increase"
    );
    assert_eq!(
        Vegas::builder().alpha(-1.0).build().unwrap_err().field(),
        "alpha"
    );
    assert_eq!(
        Gradient2::builder()
            .smoothing(1.0)
            .build()
            .unwrap_err()
            .field(),
        "smoothing"
    );
    assert_eq!(
        Gradient2::builder()
            .long_window(0.0)
            .build()
            .unwrap_err()
            .field(),
        "long_window"
    );
    assert_eq!(
        LittlesLaw::builder()
            .min_explore(0.5)
            .max_explore(0.2)
            .build()
            .unwrap_err()
            .field(),
        "max_explore"
    );
    assert_eq!(
        LittlesLaw::builder()
            .remeasure_every(Some(Duration::ZERO))
            .build()
            .unwrap_err()
            .field(),
        "remeasure_every"
    );
    assert_eq!(
        Guarded::builder()
            .drop_tolerance(0.0)
            .build()
            .unwrap_err()
            .field(),
        "drop_tolerance"
    );
    assert_eq!(
        Guarded::builder()
            .max_latency(Duration::ZERO)
            .build()
            .unwrap_err()
            .field(),
        "max_latency"
    );
    let err = Guarded::builder()
        .headroom(f64::INFINITY)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid `headroom`: must be a finite number, 0 or more"
    );
}

fn limits(seen: &[Seen]) -> Vec<usize> {
    seen.iter().map(|s| s.limit).collect()
}

/// Every limit within ±15 % of `knee` (±20 % for a knee below 50, where
/// one unit is 2 % or more), and the mean within ±10 %.
fn assert_steady(seen: &[Seen], knee: f64, when: &str) {
    let band = if knee < 50.0 { 0.2 } else { 0.15 };
    let mean = seen.iter().map(|s| s.limit as f64).sum::<f64>() / seen.len() as f64;
    assert!(
        (mean - knee).abs() <= 0.1 * knee,
        "{when}: mean limit {mean} against a knee of {knee}: {:?}",
        limits(seen)
    );
    assert!(
        seen.iter()
            .all(|s| (s.limit as f64 - knee).abs() <= band * knee),
        "{when}: the limit left ±{band} of {knee}: {:?}",
        limits(seen)
    );
}

#[test]
fn timed_permits_are_sampled_about_one_in_n() {
    use std::sync::Arc;

    use crate::limiter::Limiter;

    // On a fresh thread: the sampling state is the thread's own.
    let counts = std::thread::spawn(|| {
        let limiter = Arc::new(Limiter::new(4).unwrap());
        let mut counts = Vec::new();
        for every in [1, 8, 64] {
            let controller = Controller::builder()
                .sample_every(every)
                .min_samples(0)
                .interval(Duration::from_secs(3_600))
                .build(Arc::clone(&limiter), Guarded::default())
                .unwrap();
            for _ in 0..6_400 {
                drop(controller.timed(limiter.try_acquire().unwrap()));
            }
            let window = controller.tick_at(ms(1)).unwrap();
            // Every completion is counted, timed or not.
            assert_eq!(window.completed(), 6_400);
            counts.push(window.samples());
        }
        counts
    })
    .join()
    .unwrap();
    assert_eq!(counts[0], 6_400, "sample_every(1) times every permit");
    // Random gaps averaging n: within a fifth of 6,400 / n.
    assert!((640..=960).contains(&counts[1]), "1 in 8: {}", counts[1]);
    assert!((80..=120).contains(&counts[2]), "1 in 64: {}", counts[2]);
}

#[test]
fn two_controllers_taking_turns_on_one_thread_are_both_sampled() {
    use std::sync::Arc;

    use crate::limiter::Limiter;

    let limiter = Arc::new(Limiter::new(4).unwrap());
    let build = || {
        Controller::builder()
            .sample_every(2)
            .min_samples(0)
            .interval(Duration::from_secs(3_600))
            .build(Arc::clone(&limiter), Guarded::default())
            .unwrap()
    };
    let (a, b) = (build(), build());
    for _ in 0..1_000 {
        drop(a.timed(limiter.try_acquire().unwrap()));
        drop(b.timed(limiter.try_acquire().unwrap()));
    }
    // A plain countdown of 2 would time every one of a's and none of b's.
    let (a, b) = (a.tick_at(ms(1)).unwrap(), b.tick_at(ms(1)).unwrap());
    assert!(
        a.samples() > 300 && b.samples() > 300,
        "{} {}",
        a.samples(),
        b.samples()
    );
}

#[test]
fn the_longest_interval_ticks_without_panicking() {
    use std::sync::Arc;

    use crate::limiter::Limiter;

    let limiter = Arc::new(Limiter::new(4).unwrap());
    let controller = Controller::builder()
        .interval(Duration::MAX)
        .build(Arc::clone(&limiter), Guarded::default())
        .unwrap();
    // No samples, no completions: too few for a window, and ten intervals
    // of `Duration::MAX` have not passed (they saturate, not overflow)...
    assert!(controller.tick().is_none());
    // ... until the end of time, which is as far as they saturate.
    let window = controller.tick_at(Duration::MAX).unwrap();
    assert_eq!((window.completed(), window.limit()), (0, 4));
    assert_eq!(limiter.capacity(), 4);
}

#[test]
fn a_tick_at_the_end_of_time_reads_a_saturated_latency() {
    use std::sync::Arc;

    use crate::limiter::Limiter;

    let limiter = Arc::new(Limiter::new(4).unwrap());
    let guarded = Guarded::builder()
        .max_latency(Duration::from_secs(1))
        .build()
        .unwrap();
    let controller = Controller::builder()
        .min_samples(0)
        .build(Arc::clone(&limiter), guarded)
        .unwrap();
    drop(limiter.try_acquire().unwrap());
    let held: Vec<_> = (0..3).map(|_| limiter.try_acquire().unwrap()).collect();
    // One completion in `Duration::MAX` with three in flight: Little's law
    // gives a latency beyond `Duration::MAX`, which saturates.
    let window = controller.tick_at(Duration::MAX).unwrap();
    assert_eq!(window.latency(), Some(Duration::MAX));
    assert!((1..=4).contains(&limiter.capacity()));
    drop(held);
}

#[test]
fn a_ticker_on_the_longest_interval_lives_until_stopped() {
    use std::sync::Arc;

    use crate::limiter::Limiter;

    let limiter = Arc::new(Limiter::new(4).unwrap());
    let controller = Arc::new(
        Controller::builder()
            .interval(Duration::MAX)
            .build(limiter, Guarded::default())
            .unwrap(),
    );
    let mut ticker = Controller::spawn_ticker(&controller).unwrap();
    // The thread computes its first deadline before it looks at the stop
    // flag: a deadline that overflowed would have killed it.
    assert!(ticker.stop(), "the ticker thread died");
}

#[test]
fn a_window_of_zero_latencies_is_not_taken_as_the_noload_latency() {
    for remeasure in [Some(Duration::from_secs(50)), None] {
        let mut brpc = LittlesLaw::builder()
            .remeasure_every(remeasure)
            .build()
            .unwrap();
        let mut model = Model::new(64.0, ms(20), 0.5);
        let mut limit = 64;
        // A first window whose every sample read zero (a clock too coarse,
        // a mock): it measures nothing.
        let (mut window, _) = model.window(limit);
        window.mean_latency = Some(Duration::ZERO);
        window.min_latency = Some(Duration::ZERO);
        window.p99_latency = Some(Duration::ZERO);
        limit = brpc.update(&window).clamp(1, 10_000);
        let seen = model.run(&mut brpc, &mut limit, 40);
        // Half load: 32 in flight, and the limit above them within 2 s.
        assert!(
            limit >= 32,
            "{remeasure:?}: the limit sits at {limit}: {:?}",
            limits(&seen)
        );
    }
}

#[test]
fn vegas_backs_off_on_drops_without_timed_samples() {
    let mut vegas = Vegas::default();
    let window = Window {
        now: ms(50),
        elapsed: ms(50),
        limit: 100,
        floor: 1,
        ceiling: 1_000,
        samples: 0,
        dropped: 10,
        mean_latency: None,
        min_latency: None,
        p99_latency: None,
        completed: 0,
        rejected: 0,
        waited: 0,
        in_flight: 0,
    };
    assert!(vegas.update(&window) < 100);
}

#[test]
fn huge_steps_are_refused_and_an_infinite_limit_is_the_ceiling() {
    assert_eq!(
        Aimd::builder()
            .increase(f64::MAX)
            .build()
            .unwrap_err()
            .field(),
        "increase"
    );
    assert_eq!(
        Vegas::builder()
            .alpha(f64::MAX)
            .beta(f64::MAX)
            .build()
            .unwrap_err()
            .field(),
        "alpha"
    );
    assert_eq!(
        Vegas::builder().beta(f64::MAX).build().unwrap_err().field(),
        "beta"
    );
    // The largest step accepted grows the limit to the ceiling, not the
    // floor.
    let largest = crate::engine::table::MAX_CAPACITY as f64;
    let mut aimd = Aimd::builder().increase(largest).build().unwrap();
    let mut model = Model::new(64.0, ms(20), 2.0);
    let (window, _) = model.window(10);
    assert_eq!(aimd.update(&window), 10_000);
    let (window, _) = model.window(10);
    assert_eq!(clamp(&window, f64::INFINITY), 10_000.0);
    assert_eq!(clamp(&window, f64::NEG_INFINITY), 1.0);
}

#[test]
fn the_ceiling_is_checked_against_a_supervisors_maximum() {
    use crate::supervisor::Supervisor;

    let sup = Supervisor::builder().capacity(4).build().unwrap();
    // Its default maximum is its capacity: a default ceiling of 1,000
    // would be a limit it can never take.
    let controller = Controller::builder()
        .build(sup.clone(), Guarded::default())
        .unwrap();
    assert_eq!(controller.ceiling(), 4);
    let err = Controller::builder()
        .ceiling(100)
        .build(sup.clone(), Guarded::default())
        .unwrap_err();
    assert_eq!(err.field(), "ceiling");
    assert_eq!(err.to_string(), "invalid `ceiling`: must be at most 4");
    let err = Controller::builder()
        .floor(5)
        .build(sup, Guarded::default())
        .unwrap_err();
    assert_eq!(err.field(), "floor");
    let grows = Supervisor::builder()
        .capacity(4)
        .max_capacity(64)
        .build()
        .unwrap();
    let controller = Controller::builder()
        .build(grows, Guarded::default())
        .unwrap();
    assert_eq!(controller.ceiling(), 64);
}

#[test]
fn brpc_takes_the_longest_remeasure_and_the_end_of_time() {
    let mut brpc = LittlesLaw::builder()
        .remeasure_every(Some(Duration::MAX))
        .build()
        .unwrap();
    let mut model = Model::new(64.0, ms(20), 0.5);
    let mut limit = 64;
    let seen = model.run(&mut brpc, &mut limit, 10);
    assert!(limit >= 32, "{:?}", limits(&seen));
    // A window at the end of time: the next re-measure saturates.
    let mut brpc = LittlesLaw::default();
    let (mut window, _) = model.window(limit);
    window.now = Duration::MAX;
    assert!(brpc.update(&window) >= 1);
}
