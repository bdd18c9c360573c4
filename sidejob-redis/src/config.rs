//! The budget: one fleet-wide capacity and the timing that keeps it safe.
//!
//! [`Budget::builder`] takes every parameter of CLUSTER.md §2.2 and refuses
//! settings under which a node could still be admitting after Redis has
//! given its share away: `T(1−2ρ) − ε − H > R + renew timeout`.

use std::fmt;
use std::time::Duration;

use crate::endpoint::{Endpoint, EndpointError};

/// What a node's local capacity becomes when its lease is gone (a
/// partition, a Redis outage, learning mode after Redis lost its state).
///
/// # Examples
///
/// ```
/// use sidejob_redis::Fallback;
///
/// // Ten nodes at most, two units each that never depend on Redis: Redis
/// // then manages only capacity - 20, and those 20 never move to the load.
/// let floor = Fallback::ReservedFloor { per_node: 2, max_nodes: 10 };
/// assert_ne!(floor, Fallback::FailClosed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Local capacity 0: the bound holds; every request is refused from
    /// `T` after Redis goes away, and a node new during learning mode gets
    /// nothing. The default.
    #[default]
    FailClosed,
    /// `per_node` units per node are always local, and Redis manages only
    /// `capacity − max_nodes × per_node`. The bound holds while the fleet
    /// has at most `max_nodes` nodes; the cost is that `max_nodes ×
    /// per_node` units never move to where the load is.
    ReservedFloor {
        /// Units each node keeps whatever Redis says.
        per_node: usize,
        /// The most nodes the fleet will ever run at once.
        max_nodes: usize,
    },
}

/// A budget setting that was missing or broke a rule; names the field.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob_redis::Budget;
///
/// let err = Budget::builder()
///     .name("db").capacity(100)
///     .ttl(Duration::from_secs(3)).max_hold(Duration::from_secs(2))
///     .build().unwrap_err();
/// assert_eq!(err.field(), "ttl");
/// assert!(err.to_string().contains("renew_every"), "{err}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    problem: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, problem: impl Into<String>) -> Self {
        ConfigError {
            field,
            problem: problem.into(),
        }
    }

    /// The builder field that was wrong: `"name"`, `"capacity"`, `"ttl"`,
    /// `"renew_every"`, `"grace"`, `"clock_margin"`, `"max_hold"`,
    /// `"renew_timeout"`, `"fallback"`, `"min_block"`, `"headroom"` or
    /// `"url"` (one that did not parse, from [`build`](BudgetBuilder::build);
    /// a missing one, from [`Budget::attach`]).
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// A checked fleet-wide budget: a name in Redis, a global capacity and the
/// lease timing. Made by [`Budget::builder`]; [`Budget::attach`] starts a
/// keeper that drives a local front-end's capacity from it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob_redis::Budget;
///
/// let budget = Budget::builder()
///     .url("redis://127.0.0.1:6379/")
///     .name("orders-db")
///     .capacity(300)
///     .max_hold(Duration::from_secs(3)) // the database's statement timeout
///     .build()?;
/// assert_eq!(budget.capacity(), 300);
/// assert_eq!(budget.renew_timeout(), Duration::from_secs(1));
/// # Ok::<(), sidejob_redis::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Budget {
    pub(crate) url: Option<Endpoint>,
    pub(crate) name: String,
    pub(crate) capacity: usize,
    pub(crate) capacity_version: u64,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) grace: Duration,
    pub(crate) clock_margin: f64,
    pub(crate) pause_margin: Duration,
    pub(crate) max_hold: Duration,
    pub(crate) renew_timeout: Duration,
    pub(crate) fallback: Fallback,
    pub(crate) fresh: bool,
    pub(crate) test_mode: bool,
    pub(crate) early_grow_gap: Duration,
    pub(crate) min_block: u64,
    pub(crate) headroom: f64,
}

impl Budget {
    /// Starts a [`BudgetBuilder`] with the defaults of CLUSTER.md §2.2.
    pub fn builder() -> BudgetBuilder {
        BudgetBuilder::default()
    }

    /// The budget's name (its Redis keys are `{sj:<name>}:*`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fleet-wide capacity `C`, reserved floors included, as
    /// configured (the fleet's may be another: see
    /// [`BudgetBuilder::capacity`]).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The version of the configured capacity setting.
    pub fn capacity_version(&self) -> u64 {
        self.capacity_version
    }

    /// The part of the capacity Redis leases out: `C` less the reserved
    /// floors.
    pub fn leased_capacity(&self) -> usize {
        self.capacity - self.floor() * self.max_nodes()
    }

    /// Units a node keeps whatever Redis says (0 unless
    /// [`Fallback::ReservedFloor`]).
    pub fn floor(&self) -> usize {
        match self.fallback {
            Fallback::FailClosed => 0,
            Fallback::ReservedFloor { per_node, .. } => per_node,
        }
    }

    pub(crate) fn max_nodes(&self) -> usize {
        match self.fallback {
            Fallback::FailClosed => 0,
            Fallback::ReservedFloor { max_nodes, .. } => max_nodes,
        }
    }

    /// The per-call I/O timeout of a renewal.
    pub fn renew_timeout(&self) -> Duration {
        self.renew_timeout
    }

    /// How long after sending a successful renewal a node may keep
    /// *admitting*: `T(1−2ρ) − ε − H`.
    pub fn admit_window(&self) -> Duration {
        self.valid_window().saturating_sub(self.max_hold)
    }

    /// How long after sending a successful renewal the node's units are
    /// covered: `T(1−2ρ) − ε`.
    pub fn valid_window(&self) -> Duration {
        self.ttl
            .mul_f64(1.0 - 2.0 * self.clock_margin)
            .saturating_sub(self.pause_margin)
    }
}

/// Configures a [`Budget`]; made by [`Budget::builder`].
///
/// # Examples
///
/// The short timing the tests use: `T` = 1 s, `R` = 200 ms, `G` = 300 ms,
/// `H` = 200 ms, `ε` = 50 ms.
///
/// ```
/// use std::time::Duration;
/// use sidejob_redis::Budget;
///
/// let ms = Duration::from_millis;
/// let budget = Budget::builder()
///     .name("db").capacity(10)
///     .ttl(ms(1000)).renew_every(ms(200)).grace(ms(300))
///     .max_hold(ms(200)).pause_margin(ms(50))
///     .build()?;
/// assert_eq!(budget.admit_window(), ms(748));
/// # Ok::<(), sidejob_redis::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct BudgetBuilder {
    url: Option<Result<Endpoint, EndpointError>>,
    name: Option<String>,
    capacity: Option<usize>,
    capacity_version: u64,
    ttl: Duration,
    renew_every: Duration,
    grace: Duration,
    clock_margin: f64,
    pause_margin: Duration,
    max_hold: Option<Duration>,
    renew_timeout: Option<Duration>,
    fallback: Fallback,
    fresh: bool,
    test_mode: bool,
    early_grow_gap: Duration,
    min_block: u64,
    headroom: f64,
}

impl Default for BudgetBuilder {
    fn default() -> Self {
        BudgetBuilder {
            url: None,
            name: None,
            capacity: None,
            capacity_version: 0,
            ttl: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
            grace: Duration::from_secs(5),
            clock_margin: 1e-3,
            pause_margin: Duration::from_millis(500),
            max_hold: None,
            renew_timeout: None,
            fallback: Fallback::FailClosed,
            fresh: false,
            test_mode: false,
            early_grow_gap: Duration::from_millis(50),
            min_block: 1,
            headroom: 0.25,
        }
    }
}

impl BudgetBuilder {
    /// The Redis URL (`redis://[user[:password]@]host:port/db`,
    /// `rediss://…` for TLS with the `tls` feature, or `unix:///path`);
    /// needed by [`Budget::attach`], not by [`Budget::attach_store`]. A URL
    /// that does not parse is reported by [`build`](Self::build), naming
    /// `url`, without its password. For a password kept out of the URL or a
    /// CA of your own, use [`endpoint`](Self::endpoint).
    pub fn url(&mut self, url: impl AsRef<str>) -> &mut Self {
        self.url = Some(Endpoint::parse(url.as_ref()));
        self
    }

    /// The Redis to use, with its login and TLS settings (see
    /// [`Endpoint`]); replaces [`url`](Self::url).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sidejob_redis::{Budget, Endpoint};
    ///
    /// let redis = Endpoint::parse("rediss://redis.internal:6380/")? // feature `tls`
    ///     .username("orders") // an ACL user
    ///     .password(std::env::var("REDIS_PASSWORD")?)
    ///     .ca_file("/etc/ssl/internal-ca.pem")?; // without it: the system's roots
    /// let budget = Budget::builder()
    ///     .endpoint(redis)
    ///     .name("orders-db")
    ///     .capacity(300)
    ///     .max_hold(Duration::from_secs(3))
    ///     .build()?;
    /// assert!(!format!("{budget:?}").contains(&std::env::var("REDIS_PASSWORD")?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn endpoint(&mut self, endpoint: Endpoint) -> &mut Self {
        self.url = Some(Ok(endpoint));
        self
    }

    /// The budget's name, shared by every node of the fleet. Required,
    /// non-empty. Its keys' hash tag is `{sj:<name>}`, with the name
    /// escaped by [`escape_name`](crate::escape_name) so that no name
    /// reaches into another budget's (or pool's) keys.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// The fleet-wide capacity `C`. Required; at least 1.
    ///
    /// It is a setting with a version ([`capacity_version`](Self::capacity_version),
    /// 0 by default): a node that creates the budget writes it, and one
    /// that finds the budget replaces the fleet's capacity only if its
    /// version is higher than the budget's. So a node started with an old
    /// configuration never changes the fleet's capacity; it follows the
    /// fleet's and says so in
    /// [`KeeperStats::capacity_mismatch`](crate::KeeperStats::capacity_mismatch).
    /// Changing `C` is deliberate: [`Budget::set_fleet_capacity`], or a
    /// deploy with a higher `capacity_version`.
    pub fn capacity(&mut self, capacity: usize) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// The version of the [`capacity`](Self::capacity) setting. Default 0.
    ///
    /// The budget in Redis keeps the capacity of the highest version any
    /// node or admin has set; at equal versions the one already there
    /// stays. Raise it with the capacity to change `C` by a deploy: nodes
    /// with the new version replace the fleet's capacity, nodes still on
    /// an older one follow it. [`Budget::set_fleet_capacity`] bumps the
    /// budget's version by one, so a configured version must exceed the
    /// one it returned to take effect after it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob_redis::Budget;
    ///
    /// // Lowered from 300 (version 0) by the deploy that says so.
    /// let budget = Budget::builder()
    ///     .name("orders-db")
    ///     .capacity(200)
    ///     .capacity_version(1)
    ///     .max_hold(Duration::from_secs(3))
    ///     .build()?;
    /// assert_eq!((budget.capacity(), budget.capacity_version()), (200, 1));
    /// # Ok::<(), sidejob_redis::ConfigError>(())
    /// ```
    pub fn capacity_version(&mut self, version: u64) -> &mut Self {
        self.capacity_version = version;
        self
    }

    /// Lease TTL `T`, counted by the Redis clock from each renewal.
    /// Default 10 s. Longer tolerates a longer `max_hold` and strands a
    /// crashed node's units longer (`T + G`).
    pub fn ttl(&mut self, ttl: Duration) -> &mut Self {
        self.ttl = ttl;
        self
    }

    /// Renew period `R`. Default 2 s.
    pub fn renew_every(&mut self, period: Duration) -> &mut Self {
        self.renew_every = period;
        self
    }

    /// Grace `G`: Redis frees a lease only at expiry + `G`. Covers a Redis
    /// clock step of up to `G`. Default 5 s.
    pub fn grace(&mut self, grace: Duration) -> &mut Self {
        self.grace = grace;
        self
    }

    /// Tolerated clock-rate error `ρ` between a node and Redis. Default
    /// 1e-3; at most 0.25.
    pub fn clock_margin(&mut self, rho: f64) -> &mut Self {
        self.clock_margin = rho;
        self
    }

    /// Scheduling/pause margin `ε` on the node. Default 500 ms.
    pub fn pause_margin(&mut self, epsilon: Duration) -> &mut Self {
        self.pause_margin = epsilon;
        self
    }

    /// `H`: the longest a unit stays in flight after renewals start
    /// failing, including the work it triggers (for a database, its
    /// statement timeout). Required.
    pub fn max_hold(&mut self, hold: Duration) -> &mut Self {
        self.max_hold = Some(hold);
        self
    }

    /// Per-call I/O timeout. Default `min(R/2, 1 s)`.
    ///
    /// A call that must first reconnect spends at most a quarter of it on
    /// the connect (TCP, the TLS handshake, the login), so that the whole
    /// call ends within it. Over TLS, or to a Redis some milliseconds
    /// away, check that a handshake fits: with `renew_every` 200 ms the
    /// default leaves 25 ms, and a reconnect that never fits never
    /// succeeds.
    pub fn renew_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.renew_timeout = Some(timeout);
        self
    }

    /// What local capacity becomes without a lease. Default
    /// [`Fallback::FailClosed`].
    pub fn fallback(&mut self, fallback: Fallback) -> &mut Self {
        self.fallback = fallback;
        self
    }

    /// An admin's word that no node holds anything: a budget created by
    /// this node skips learning mode. Never set it on ordinary nodes: a
    /// Redis that restarted empty would then grant units still in use.
    pub fn fresh(&mut self, fresh: bool) -> &mut Self {
        self.fresh = fresh;
        self
    }

    /// Creates the budget in test mode, whose scripts honour the
    /// `debug_now` and `debug_offset` meta fields (clock-step tests).
    pub fn test_mode(&mut self, on: bool) -> &mut Self {
        self.test_mode = on;
        self
    }

    /// Shortest gap between early grows (a renewal made at once because
    /// the local front-end refused a request). Default 50 ms.
    pub fn early_grow_gap(&mut self, gap: Duration) -> &mut Self {
        self.early_grow_gap = gap;
        self
    }

    /// The smallest growth step. Default 1; the step doubles on windows
    /// with refusals, up to `C/8`.
    pub fn min_block(&mut self, block: u64) -> &mut Self {
        self.min_block = block;
        self
    }

    /// Headroom `h` asked for above the demand estimate. Default 0.25.
    pub fn headroom(&mut self, h: f64) -> &mut Self {
        self.headroom = h;
        self
    }

    /// Checks every field and the safety inequality.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field: a `url` that did not parse
    /// (reported before anything else); a missing `name`, `capacity` or
    /// `max_hold`; a zero `capacity`, `ttl`, `renew_every`,
    /// `renew_timeout` or `min_block`; a `clock_margin` outside [0, 0.25];
    /// a negative `headroom`; floors that take all the capacity
    /// (`fallback`); or `ttl` too long to scale by `1−2ρ`, or too short
    /// for `T(1−2ρ) − ε − H > R + renew timeout`.
    pub fn build(&self) -> Result<Budget, ConfigError> {
        // First: a URL that did not parse is what the user must hear about,
        // whatever else is missing.
        let url = match &self.url {
            None => None,
            Some(Ok(e)) => Some(e.clone()),
            Some(Err(e)) => return Err(ConfigError::new("url", e.to_string())),
        };
        let name = self
            .name
            .clone()
            .ok_or_else(|| ConfigError::new("name", "required"))?;
        if name.is_empty() {
            return Err(ConfigError::new("name", "must be non-empty"));
        }
        let capacity = self
            .capacity
            .ok_or_else(|| ConfigError::new("capacity", "required"))?;
        if capacity == 0 {
            return Err(ConfigError::new("capacity", "must be at least 1"));
        }
        let nonzero = |field, d: Duration| {
            if d.is_zero() {
                Err(ConfigError::new(field, "must be longer than zero"))
            } else {
                Ok(())
            }
        };
        nonzero("ttl", self.ttl)?;
        nonzero("renew_every", self.renew_every)?;
        if !(0.0..=0.25).contains(&self.clock_margin) {
            return Err(ConfigError::new(
                "clock_margin",
                format!("must be in [0, 0.25], not {}", self.clock_margin),
            ));
        }
        // `valid_window` scales ttl by (1 − 2ρ): refuse a ttl whose product
        // is no Duration rather than panic there.
        if Duration::try_from_secs_f64(self.ttl.as_secs_f64() * (1.0 - 2.0 * self.clock_margin))
            .is_err()
        {
            return Err(ConfigError::new("ttl", format!("too long: {:?}", self.ttl)));
        }
        let max_hold = self.max_hold.ok_or_else(|| {
            ConfigError::new(
                "max_hold",
                "required (for example the database's statement timeout)",
            )
        })?;
        let renew_timeout = self
            .renew_timeout
            .unwrap_or_else(|| (self.renew_every / 2).min(Duration::from_secs(1)));
        nonzero("renew_timeout", renew_timeout)?;
        if self.min_block == 0 {
            return Err(ConfigError::new("min_block", "must be at least 1"));
        }
        if !(self.headroom >= 0.0 && self.headroom.is_finite()) {
            return Err(ConfigError::new("headroom", "must be a finite number ≥ 0"));
        }
        if let Fallback::ReservedFloor {
            per_node,
            max_nodes,
        } = self.fallback
        {
            if per_node.saturating_mul(max_nodes) >= capacity {
                return Err(ConfigError::new(
                    "fallback",
                    format!(
                        "reserved floors ({per_node} × {max_nodes} nodes) must leave Redis some of the capacity {capacity}"
                    ),
                ));
            }
        }
        let budget = Budget {
            url,
            name,
            capacity,
            capacity_version: self.capacity_version,
            ttl: self.ttl,
            renew_every: self.renew_every,
            grace: self.grace,
            clock_margin: self.clock_margin,
            pause_margin: self.pause_margin,
            max_hold,
            renew_timeout,
            fallback: self.fallback,
            fresh: self.fresh,
            test_mode: self.test_mode,
            early_grow_gap: self.early_grow_gap,
            min_block: self.min_block,
            headroom: self.headroom,
        };
        // Saturating: a sum past Duration::MAX is longer than any window.
        let needed = self.renew_every.saturating_add(renew_timeout);
        if budget.admit_window() <= needed {
            return Err(ConfigError::new(
                "ttl",
                format!(
                    "too short: ttl·(1−2·clock_margin) − pause_margin − max_hold = {:?} must exceed renew_every + renew_timeout = {:?}; raise ttl or lower max_hold, pause_margin or renew_every",
                    budget.admit_window(),
                    needed
                ),
            ));
        }
        Ok(budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Duration::MAX` in any setting is a `ConfigError` naming a field,
    /// never a panic in `build` (hardening 3: no overflow on a build path).
    #[test]
    fn the_longest_durations_are_config_errors_not_panics() {
        let ms = Duration::from_millis;
        type Set = fn(&mut BudgetBuilder);
        let cases: [(Set, &str); 4] = [
            (
                |b| {
                    b.renew_every(Duration::MAX);
                },
                "ttl",
            ),
            (
                |b| {
                    b.renew_timeout(Duration::MAX);
                },
                "ttl",
            ),
            (
                |b| {
                    b.ttl(Duration::MAX).clock_margin(0.0);
                },
                "ttl",
            ),
            (
                |b| {
                    b.max_hold(Duration::MAX);
                },
                "ttl",
            ),
        ];
        for (set, field) in cases {
            let mut b = Budget::builder();
            b.name("x").capacity(1).max_hold(ms(200));
            set(&mut b);
            let err = b.build().unwrap_err();
            assert_eq!(err.field(), field, "{err}");
        }
    }
}
