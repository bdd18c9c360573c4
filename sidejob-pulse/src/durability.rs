//! Durable acknowledgements: what [`Node::dispatch`](crate::Node::dispatch)
//! waits for before it answers.

use std::time::Duration;

use crate::error::ConfigError;

/// The longest a replica acknowledgement may be waited for: past it a
/// dispatch would hold the node's connection (and every other call of the
/// node) for longer than any caller expects.
pub(crate) const MAX_REPLICA_WAIT: Duration = Duration::from_secs(60);

/// What a [`dispatch`](crate::Node::dispatch) (and a
/// [`stop`](crate::Node::stop)) waits for before it is acknowledged: set
/// with [`NodeBuilder::durability`](crate::NodeBuilder::durability).
///
/// * [`Durability::Primary`] (the default): the primary holds the job in
///   memory. A primary that dies before a replica or its AOF has the job
///   loses it, though the dispatch was acknowledged.
/// * [`Durability::Replicas`]: after the script that records the job,
///   Redis' `WAIT replicas timeout` on the same connection; the dispatch is
///   acknowledged only if at least `replicas` replicas confirmed they hold
///   it, and answers [`Error::NotDurable`](crate::Error::NotDurable) (with
///   how many did) otherwise. A failover to one of those replicas (Redis
///   Sentinel promotes the most up-to-date) keeps the job.
/// * [`Durability::Fsync`]: the primary writes every command to its AOF and
///   fsyncs it before it replies (`appendonly yes`, `appendfsync always`).
///   [`join`](crate::NodeBuilder::join) checks both settings (`CONFIG GET`)
///   and answers [`Error::Config`](crate::Error::Config) naming
///   `durability`, and the setting that is wrong, on a Redis configured
///   otherwise; every new connection checks again (a failover may land on
///   a Redis configured otherwise), failing the call. A restart of that
///   Redis from its AOF keeps the job; a failover to a replica does not
///   (use `Replicas`).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use sidejob_pulse::{Durability, Error, Node};
///
/// let node = Node::builder()
///     .name("tenants")
///     .url("redis://127.0.0.1:6379/")
///     .durability(Durability::Replicas { replicas: 1, timeout: Duration::from_millis(500) })
///     .join()?;
/// match node.dispatch("tenant-1", b"{}") {
///     Ok(()) => {} // on the primary and on a replica
///     Err(Error::NotDurable { replicas_acked, replicas_asked, .. }) => {
///         // Recorded on the primary, copied to too few replicas in time:
///         // dispatching it again answers Exists while the primary lives.
///         eprintln!("{replicas_acked} of {replicas_asked} replicas have it");
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Acknowledged once the primary holds the job (in memory).
    #[default]
    Primary,
    /// Acknowledged once `replicas` replicas hold the job (Redis `WAIT`),
    /// waiting at most `timeout` (above zero, at most a minute).
    Replicas {
        /// How many replicas must confirm (at least 1).
        replicas: usize,
        /// How long to wait for them.
        timeout: Duration,
    },
    /// Acknowledged once the primary fsynced its AOF (`appendonly yes`,
    /// `appendfsync always`, checked when a connection opens).
    Fsync,
}

impl Durability {
    /// Checks the settings (the builder's `durability` field).
    pub(crate) fn check(self) -> Result<(), ConfigError> {
        if let Durability::Replicas { replicas, timeout } = self {
            if replicas == 0 {
                return Err(ConfigError::new(
                    "durability",
                    "Durability::Replicas needs at least 1 replica (Durability::Primary asks for none)",
                ));
            }
            if timeout.is_zero() || timeout > MAX_REPLICA_WAIT {
                return Err(ConfigError::new(
                    "durability",
                    format!(
                        "the replicas' timeout must be above zero (WAIT 0 would block forever) and at most {MAX_REPLICA_WAIT:?}, not {timeout:?}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What a Redis' persistence settings lack for [`Durability::Fsync`]
/// (`None`: nothing), from `CONFIG GET appendonly` and `appendfsync`.
pub(crate) fn fsync_problem(appendonly: &str, appendfsync: &str) -> Option<String> {
    if !appendonly.eq_ignore_ascii_case("yes") {
        return Some(format!(
            "Durability::Fsync needs the AOF: the server runs with `appendonly {appendonly}`, not `appendonly yes` (and `appendfsync always`)"
        ));
    }
    if !appendfsync.eq_ignore_ascii_case("always") {
        return Some(format!(
            "Durability::Fsync needs an fsync before every reply: the server runs with `appendfsync {appendfsync}`, not `appendfsync always`"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_and_problems_name_the_setting() {
        assert!(Durability::Primary.check().is_ok());
        assert!(Durability::Fsync.check().is_ok());
        let ok = Durability::Replicas {
            replicas: 1,
            timeout: Duration::from_millis(1),
        };
        assert!(ok.check().is_ok());
        for bad in [
            Durability::Replicas {
                replicas: 0,
                timeout: Duration::from_secs(1),
            },
            Durability::Replicas {
                replicas: 1,
                timeout: Duration::ZERO,
            },
            Durability::Replicas {
                replicas: 1,
                timeout: Duration::from_secs(61),
            },
        ] {
            let e = bad.check().unwrap_err();
            assert_eq!(e.field(), "durability", "{e}");
        }
        assert_eq!(fsync_problem("yes", "always"), None);
        assert_eq!(fsync_problem("YES", "Always"), None);
        let p = fsync_problem("no", "always").unwrap();
        assert!(p.contains("appendonly no"), "{p}");
        let p = fsync_problem("yes", "everysec").unwrap();
        assert!(p.contains("appendfsync everysec"), "{p}");
    }
}
