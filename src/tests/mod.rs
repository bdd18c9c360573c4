//! Crate-private protocol tests: proptest models that drive the engine
//! through seams the public API does not expose.

mod keyed_model;
mod keyed_pool_model;
mod limiter_model;
mod pool_model;
mod spawn_refusal;
mod supervisor_model;
