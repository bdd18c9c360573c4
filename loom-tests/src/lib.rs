//! Loom models of sidejob live in `tests/`; run them with `RUSTFLAGS="--cfg loom"`.
