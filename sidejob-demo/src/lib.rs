//! The package of the README's demo, `examples/demo.rs`: a flood against a
//! sidejob pool, beside an unbounded queue. It is a package of its own so
//! that `cargo run --release --example demo -p sidejob-demo` builds sidejob
//! and its few dependencies, not the root package's dev-dependencies.
