//! What the integration tests share.

use std::time::Duration;

/// How long a blocked handler waits for its gate. Only a test that failed
/// before opening it waits this long: the handler then gives up, so the
/// pool's drop can join its workers and the test reports its failure
/// instead of hanging.
pub const GATE_PATIENCE: Duration = Duration::from_secs(60);
