//! The pool's generation: which incarnation of its state in Redis an
//! acknowledgement was given by.

use std::fmt;

/// The generation of a pool's state in Redis: set when the pool is
/// created, and changed whenever Redis may have lost some of it.
///
/// It changes when the pool is re-created after Redis lost its state (a
/// restart without persistence, a failover to a replica that had nothing
/// of it): then every job that was queued and not yet started is gone
/// (the running ones are re-asserted or handed back by their workers). It
/// also changes when a script first runs on another Redis process than
/// the pool's last writer (a restart from an AOF or RDB, a failover):
/// such a Redis may have lost the last writes before it went down.
///
/// [`Node::dispatch_acked`](crate::Node::dispatch_acked) returns the
/// generation that acknowledged the job; [`Node::generation`](crate::Node::generation)
/// reads the current one and [`Node::watch_generation`](crate::Node::watch_generation)
/// tells of each change. A producer that keeps, for each job it wants, the
/// generation it was acknowledged under dispatches again, after a change,
/// every job acknowledged under an older one: a job the pool still holds
/// answers [`Error::Exists`](crate::Error::Exists), so nothing runs twice.
///
/// Generations are compared for equality only (they are not ordered);
/// the text is opaque.
///
/// # Examples
///
/// The producer's side of it, with the pool's answers written out (the
/// methods of [`Node`](crate::Node) give them; see
/// [`Node::watch_generation`](crate::Node::watch_generation)):
///
/// ```
/// use std::collections::HashMap;
/// use sidejob_pulse::Generation;
///
/// /// The jobs a producer wants, each with the generation that acked it.
/// fn to_dispatch_again<'a>(
///     acked: &'a HashMap<String, Generation>,
///     now: &Generation,
/// ) -> Vec<&'a str> {
///     let mut keys: Vec<&str> = acked
///         .iter()
///         .filter(|(_, g)| *g != now)
///         .map(|(k, _)| k.as_str())
///         .collect();
///     keys.sort();
///     keys
/// }
///
/// let (old, new) = (Generation::for_test("a"), Generation::for_test("b"));
/// let acked = HashMap::from([
///     ("tenant-1".to_string(), old.clone()),
///     ("tenant-2".to_string(), new.clone()),
/// ]);
/// assert_eq!(to_dispatch_again(&acked, &new), ["tenant-1"]);
/// assert!(to_dispatch_again(&acked, &old).contains(&"tenant-2"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Generation(pub(crate) String);

impl Generation {
    /// The generation's text, as Redis stores it (opaque).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A generation with the given text, for testing a producer's
    /// bookkeeping without a pool.
    pub fn for_test(text: &str) -> Generation {
        Generation(text.to_string())
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
