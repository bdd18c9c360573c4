//! Where users meet the crate beyond its own front-ends: tower middleware
//! (feature `tower`), the metrics export (feature `metrics`), the reporter
//! that reads the stats off the request path, and health alarms.

pub(crate) mod health;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod observe;
pub(crate) mod reporter;
#[cfg(feature = "tower")]
pub mod tower;
