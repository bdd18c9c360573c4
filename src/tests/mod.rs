//! Crate-private protocol tests (model-based), run without loom.

mod limiter_model;
