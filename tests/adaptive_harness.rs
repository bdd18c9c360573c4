//! The adaptive harness's simulation (`benches/adaptive.rs`), run short as
//! a test: the default algorithm sheds nothing at half load after a warm-up
//! at full load.
//!
//! Deterministic: a seeded discrete-event model on a virtual clock, the
//! controller fed with `record_at`, a real `Limiter` admitting.

#[path = "../benches/common/adaptive_sim.rs"]
mod adaptive_sim;

use adaptive_sim::{simulate, Ours, Phase, INITIAL, KNEE, SEC, WORK};
use sidejob::adaptive::Guarded;

#[test]
fn guarded_sheds_nothing_at_half_load_after_a_warm_up() {
    let phase = |load, length| Phase {
        load,
        knee: KNEE,
        work: WORK,
        length,
    };
    // The controller's default sampling, one request in 16 timed.
    let mut ours = Ours::new(Guarded::default());
    let measured = simulate(&mut ours, &[phase(1.0, 4 * SEC), phase(0.5, 6 * SEC)]);
    let half = &measured[1];
    // Half load: the backend's best throughput (100 / 10 ms) halved, for 6 s.
    assert!(half.arrived > 25_000, "{} arrived", half.arrived);
    assert_eq!(
        half.shed,
        0,
        "refused at half load once the warm-up's backlog drained (limit now {})",
        ours.limiter.capacity()
    );
    // The warm-up did bind: the controller moved the limit well above its
    // cold start, so the half-load phase met a limit that a broken
    // algorithm could have lowered.
    assert!(
        measured[0].shed > 0 && ours.limiter.capacity() > 3 * INITIAL,
        "warm-up sheds {}, limit {}",
        measured[0].shed,
        ours.limiter.capacity()
    );
}

#[test]
fn guarded_sheds_nothing_at_half_load_when_few_requests_are_timed() {
    // One request in 16, 32 or 64 timed: a window holds a dozen samples,
    // and an algorithm that takes the least of such windows' means as the
    // no-load latency reads it a fifth low and sheds at half load.
    for every in [16, 32, 64] {
        // On a fresh thread each: the sampling countdown is per thread.
        let (shed, limit) = std::thread::spawn(move || {
            let phase = |load, length| Phase {
                load,
                knee: KNEE,
                work: WORK,
                length,
            };
            let mut ours = Ours::sampled(Guarded::default(), every);
            let measured = simulate(&mut ours, &[phase(1.0, 4 * SEC), phase(0.5, 6 * SEC)]);
            (measured[1].shed, ours.limiter.capacity())
        })
        .join()
        .unwrap();
        assert_eq!(shed, 0, "1/{every}: shed at half load (limit {limit})");
    }
}
