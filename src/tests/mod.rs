//! Crate-private protocol tests: proptest models that drive the engine
//! through seams the public API does not expose, on one harness
//! (`harness.rs`: the split and walk they predict with, the counters they
//! check, the gated pool they drive). `weighted_model.rs` checks takes of
//! many units against a ledger, `class_model.rs` priority classes against
//! their shares and the room's class order, `fair_model.rs` keyed takes
//! against a ledger of keys.

mod class_model;
mod fair_model;
mod harness;
mod keyed_model;
mod keyed_pool_model;
mod limiter_model;
mod pool_model;
mod shepherd_model;
mod spawn_refusal;
mod supervisor_model;
mod weighted_model;
