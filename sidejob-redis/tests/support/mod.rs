//! Test support: a real redis-server per test, a freezable TCP proxy, and
//! the in-flight oracle.
#![allow(dead_code)]

pub mod oracle;
pub mod proxy;
pub mod redis;
pub mod sim;
