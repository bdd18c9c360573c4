//! The lease store: the four calls a keeper makes, and their answers.
//!
//! [`LeaseStore`] is what the keeper talks to. [`RedisStore`](crate::RedisStore)
//! runs the Lua scripts on a real Redis; [`MemoryStore`](crate::MemoryStore)
//! runs [`Model`](crate::Model), the same state machine in Rust, for tests and
//! the simulation. Times in the store are milliseconds of the store's clock.

use std::fmt;

/// A fleet capacity and the version of the setting that chose it.
///
/// The budget in Redis carries one; a setting replaces it only if its
/// version is higher, so a node configured with an older setting never
/// overrides a newer one, and a deliberate change (an admin's
/// [`set_fleet_capacity`](LeaseStore::set_fleet_capacity), or a deploy with
/// a higher [`capacity_version`](crate::BudgetBuilder::capacity_version))
/// does.
///
/// # Examples
///
/// ```
/// use sidejob_redis::FleetCapacity;
///
/// let configured = FleetCapacity { capacity: 30, version: 0 };
/// let in_force = FleetCapacity { capacity: 15, version: 1 };
/// assert!(in_force.replaces(&configured));
/// assert!(!configured.replaces(&in_force));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FleetCapacity {
    /// Units Redis leases to the whole fleet (the capacity less any
    /// reserved floors).
    pub capacity: u64,
    /// The setting's version: a higher one replaces a lower one.
    pub version: u64,
}

impl FleetCapacity {
    /// Whether this setting replaces `other` in the store: only if its
    /// version is higher (at equal versions the store keeps what it has).
    pub fn replaces(&self, other: &FleetCapacity) -> bool {
        self.version > other.version
    }
}

/// Arguments of `init`: creates the budget if it is missing, else updates
/// its TTL and grace, and its capacity only if `capacity_version` is higher
/// than the budget's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitArgs {
    /// The global capacity Redis manages (after any reserved floor).
    pub capacity: u64,
    /// The version of that capacity setting: it replaces the budget's only
    /// if higher (see [`FleetCapacity`]).
    pub capacity_version: u64,
    /// Lease TTL `T` in milliseconds of the store's clock.
    pub ttl_ms: u64,
    /// Grace `G` in milliseconds: a lease is reaped only at expiry + `G`.
    pub grace_ms: u64,
    /// The epoch to write if the budget is created.
    pub epoch: String,
    /// "I know no node holds anything": skip learning mode on creation.
    pub fresh: bool,
    /// Test mode: honour `debug_now` / `debug_offset` in the budget's meta.
    pub test: bool,
    /// Test mode only: pin the store's clock to this many milliseconds.
    pub debug_now: Option<i64>,
}

/// Arguments of `renew`, the heartbeat that also grows and shrinks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewArgs {
    /// The node's id (unique per process start).
    pub node: String,
    /// Request number: increases on every call the node makes.
    pub req: u64,
    /// The epoch the node last saw (empty before its first grant).
    pub epoch_seen: String,
    /// The `ver` of the node's last grant (0 before its first).
    pub ver_seen: u64,
    /// The most units the node may hold now: `max(limit, usage)` after any
    /// local shrink.
    pub has: u64,
    /// The node's demand estimate.
    pub need: u64,
    /// `need` plus headroom: what the node asks for.
    pub want: u64,
    /// The highest fleet capacity setting the node knows (its configured
    /// one or one it learned from the store): the store adopts it if its
    /// version is higher than the budget's, so a budget re-created after a
    /// state loss gets the fleet's setting back.
    pub capacity: FleetCapacity,
}

/// What `init` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitReply {
    /// The budget was created with this epoch.
    Created(String),
    /// The budget existed (its capacity, TTL and grace were updated); its epoch.
    Exists(String),
}

impl InitReply {
    /// The budget's epoch, created or found.
    pub fn epoch(&self) -> &str {
        match self {
            InitReply::Created(e) | InitReply::Exists(e) => e,
        }
    }
}

/// A grant, as recorded by the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Units the store records for this node.
    pub grant: u64,
    /// The lease TTL in store milliseconds, counted from this call.
    pub ttl_ms: u64,
    /// The grant's version (the budget's grant counter).
    pub ver: u64,
    /// The budget's epoch.
    pub epoch: String,
    /// A request to shrink to this many units (another node is starved).
    pub target: Option<u64>,
    /// Milliseconds of learning mode left (no grant grows meanwhile).
    pub learn_remaining_ms: u64,
    /// The store's clock when it ran the call.
    pub now_ms: i64,
    /// Store milliseconds until the earliest *other* lease can be reaped
    /// (its expiry + grace), if there is one: a node held below what it
    /// wants renews then, so a crashed node's share comes back at once.
    pub reap_in_ms: Option<u64>,
    /// The fleet capacity in force after this call, and its version.
    pub capacity: FleetCapacity,
}

/// What `renew` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewReply {
    /// The grant was renewed (and maybe grown or shrunk).
    Ok(Grant),
    /// The request number was not newer than one already seen: nothing
    /// changed, and the lease was not renewed.
    Stale(Grant),
    /// The budget does not exist (a store that lost its state): call `init`.
    NoBudget,
}

/// One node's lease in a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLease {
    /// The node id.
    pub node: String,
    /// Units granted.
    pub held: u64,
    /// Expiry in store milliseconds.
    pub expires_ms: i64,
    /// What it last asked for.
    pub want: u64,
    /// Its last demand estimate.
    pub need: u64,
}

/// The whole budget as the store sees it; from `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Global capacity.
    pub capacity: u64,
    /// The version of the capacity setting (see [`FleetCapacity`]).
    pub capacity_version: u64,
    /// Sum of all grants.
    pub granted: u64,
    /// Milliseconds of learning mode left.
    pub learn_remaining_ms: u64,
    /// How many state losses the budget has seen.
    pub losses: u64,
    /// The budget's epoch.
    pub epoch: String,
    /// The grant counter.
    pub seq: u64,
    /// The store's clock when it answered.
    pub now_ms: i64,
    /// Every recorded lease, by expiry then id (lapsed ones not yet reaped too).
    pub nodes: Vec<NodeLease>,
}

/// A store call that did not complete. The keeper treats every error the
/// same way: no renewal happened, so its local deadline stands.
#[derive(Debug)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease store call failed: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// The four calls of the lease protocol (CLUSTER.md §2.4).
///
/// Implemented by [`RedisStore`](crate::RedisStore) and
/// [`MemoryStore`](crate::MemoryStore); a user may plug in another client.
///
/// # Examples
///
/// ```
/// use sidejob_redis::{FleetCapacity, InitArgs, LeaseStore, MemoryStore, RenewArgs, RenewReply};
///
/// let mut store = MemoryStore::new();
/// let epoch = store.init(&InitArgs {
///     capacity: 10, capacity_version: 0, ttl_ms: 1000, grace_ms: 500, epoch: "e1".into(),
///     fresh: true, test: false, debug_now: None,
/// })?.epoch().to_string();
/// let mut args = RenewArgs {
///     node: "a".into(), req: 1, epoch_seen: epoch, ver_seen: 0, has: 0, need: 4, want: 6,
///     capacity: FleetCapacity { capacity: 10, version: 0 },
/// };
/// match store.renew(&args)? {
///     RenewReply::Ok(grant) => assert_eq!(grant.grant, 6),
///     other => panic!("unexpected {other:?}"),
/// }
/// // An admin lowers the fleet's capacity: a new version of the setting.
/// let lowered = store.set_fleet_capacity(4)?.expect("the budget exists");
/// assert_eq!(lowered, FleetCapacity { capacity: 4, version: 1 });
/// // The node still reports its old setting: it does not override the new one,
/// // and it is asked to shrink to its share of the new capacity.
/// args.req = 2;
/// args.has = 6;
/// match store.renew(&args)? {
///     RenewReply::Ok(grant) => {
///         assert_eq!(grant.capacity, lowered);
///         assert_eq!(grant.target, Some(4));
///     }
///     other => panic!("unexpected {other:?}"),
/// }
/// # Ok::<(), sidejob_redis::StoreError>(())
/// ```
pub trait LeaseStore: Send {
    /// Creates the budget or updates its settings.
    fn init(&mut self, args: &InitArgs) -> Result<InitReply, StoreError>;
    /// Renews, grows or shrinks a node's lease.
    fn renew(&mut self, args: &RenewArgs) -> Result<RenewReply, StoreError>;
    /// Gives a node's grant back; returns the units released.
    fn release(&mut self, node: &str, req: u64) -> Result<u64, StoreError>;
    /// Reads the whole budget; `None` if it does not exist.
    fn status(&mut self) -> Result<Option<Status>, StoreError>;

    /// An admin's deliberate change of the fleet capacity: sets it to
    /// `capacity` with a version one above the budget's, in one atomic
    /// step, so no node configured with an older setting overrides it.
    /// Returns the new setting, or `None` if the budget does not exist.
    ///
    /// A lowered capacity is in force at once for grants: no grant grows
    /// while the fleet holds more, and every node above its share of the
    /// new capacity is asked to shrink to it.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] if the call did not complete; the default
    /// implementation, for stores that do not support it, always returns
    /// one saying so.
    fn set_fleet_capacity(&mut self, capacity: u64) -> Result<Option<FleetCapacity>, StoreError> {
        let _ = capacity;
        Err(StoreError(
            "this lease store does not implement set_fleet_capacity".into(),
        ))
    }
}
