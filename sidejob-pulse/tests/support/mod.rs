//! Test helpers of this crate's own (the Redis ones are sidejob-redis's).

pub mod sentinel;
