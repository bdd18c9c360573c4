//! Where a caller starts probing the shard table: [`Probe`], an advanced
//! knob of every builder (`probe`), which only affects speed, never
//! whether a request is admitted.
//!
//! The type lives in the engine (`engine/probe.rs`, beside the thread
//! index it reads); this module is its public path.

pub use crate::engine::probe::Probe;
