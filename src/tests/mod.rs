//! Crate-private protocol tests: proptest models that drive the engine
//! through seams the public API does not expose.

mod supervisor_model;
