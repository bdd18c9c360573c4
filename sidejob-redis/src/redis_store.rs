//! The lease store on Redis: the Lua scripts over one blocking connection.
//!
//! Each call runs one script with `EVALSHA` (redis-rs `Script`, which
//! reloads it after `NOSCRIPT`, so a `SCRIPT FLUSH` or a restart costs one
//! extra round trip). Each call, connecting included, ends within the
//! renew timeout (the socket timeouts are what is left of it); any error
//! drops the connection, and the next call reconnects and fetches the
//! server's `run_id` once, which the scripts compare with the one that last
//! wrote the budget (a restart or failover enters learning mode).

use std::time::Duration;

use redis::{Client, Connection, Script, Value};

use crate::endpoint::{escape_name, Endpoint};

use crate::store::{
    FleetCapacity, Grant, InitArgs, InitReply, LeaseStore, NodeLease, RenewArgs, RenewReply,
    Status, StoreError,
};
use crate::sync::Instant;

const PRELUDE: &str = include_str!("../lua/prelude.lua");

/// The scripts' source, prelude included, for reading or for loading as a
/// Redis Function library by hand: `"init"`, `"renew"`, `"release"`,
/// `"status"` or `"capacity"` (the admin's
/// [`set_fleet_capacity`](LeaseStore::set_fleet_capacity)).
pub fn script_source(name: &str) -> Option<String> {
    let body = match name {
        "init" => include_str!("../lua/init.lua"),
        "renew" => include_str!("../lua/renew.lua"),
        "release" => include_str!("../lua/release.lua"),
        "status" => include_str!("../lua/status.lua"),
        "capacity" => include_str!("../lua/capacity.lua"),
        _ => return None,
    };
    Some(format!("{PRELUDE}\n{body}"))
}

/// A [`LeaseStore`] on one Redis (or Valkey) server, one budget.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use sidejob_redis::{LeaseStore, RedisStore};
///
/// let mut store = RedisStore::new("redis://127.0.0.1:6379/", "orders-db", Duration::from_secs(1))?;
/// if let Some(status) = store.status()? {
///     println!("{} of {} granted", status.granted, status.capacity);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisStore {
    conn: RedisConn,
    budget: BudgetScripts,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("budget", &self.budget.keys[0])
            .field("connected", &self.conn.conn.is_some())
            .finish()
    }
}

/// One lazily opened connection to one Redis, with the server's `run_id`;
/// the keeper thread of a Redis address shares it across budgets.
pub(crate) struct RedisConn {
    client: Client,
    conn: Option<(Connection, String)>,
    timeout: Duration,
}

/// One budget's keys and scripts.
#[derive(Clone)]
pub(crate) struct BudgetScripts {
    keys: [String; 5],
    init: Script,
    renew: Script,
    release: Script,
    status: Script,
    capacity: Script,
}

impl RedisConn {
    pub(crate) fn new(endpoint: &Endpoint, timeout: Duration) -> Result<Self, StoreError> {
        // `Endpoint` skips `CLIENT SETINFO` on connecting: two more replies
        // to wait for (see `connection`), for a label in `CLIENT LIST`.
        let client: Client = endpoint.client().map_err(|e| StoreError(e.to_string()))?;
        Ok(RedisConn {
            client,
            conn: None,
            timeout,
        })
    }

    /// The store of one budget over this connection; each of its calls,
    /// connecting included, ends within `timeout`.
    pub(crate) fn bind<'a>(
        &'a mut self,
        budget: &'a BudgetScripts,
        timeout: Duration,
    ) -> Bound<'a> {
        self.timeout = timeout;
        Bound { conn: self, budget }
    }
}

impl BudgetScripts {
    pub(crate) fn new(name: &str) -> Self {
        let tag = format!("{{sj:{}}}", escape_name(name));
        let script = |n| Script::new(&script_source(n).expect("known script"));
        BudgetScripts {
            keys: ["meta", "held", "exp", "info", "starve"].map(|k| format!("{tag}:{k}")),
            init: script("init"),
            renew: script("renew"),
            release: script("release"),
            status: script("status"),
            capacity: script("capacity"),
        }
    }
}

/// A budget's scripts over a (shared) connection: a [`LeaseStore`].
pub(crate) struct Bound<'a> {
    conn: &'a mut RedisConn,
    budget: &'a BudgetScripts,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl RedisStore {
    /// A store for budget `name` at `url`; connects lazily, with `timeout`
    /// on connecting, reading and writing.
    ///
    /// # Errors
    ///
    /// If the URL does not parse (the message leaves its password out).
    pub fn new(url: &str, name: &str, timeout: Duration) -> Result<Self, StoreError> {
        let endpoint = Endpoint::parse(url).map_err(|e| StoreError(e.to_string()))?;
        Self::with_endpoint(&endpoint, name, timeout)
    }

    /// A store for budget `name` at `endpoint` (its login and TLS
    /// settings included).
    ///
    /// # Errors
    ///
    /// A `rediss://` endpoint without the `tls` feature, or a CA that does
    /// not parse.
    pub fn with_endpoint(
        endpoint: &Endpoint,
        name: &str,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        Ok(RedisStore {
            conn: RedisConn::new(endpoint, timeout)?,
            budget: BudgetScripts::new(name),
        })
    }

    /// The budget's five keys: meta, held, exp, info, starve.
    pub fn keys(&self) -> &[String; 5] {
        &self.budget.keys
    }

    fn bound(&mut self) -> Bound<'_> {
        Bound {
            conn: &mut self.conn,
            budget: &self.budget,
        }
    }
}

impl RedisConn {
    /// The connection for one call (opened if need be, with the server's
    /// `run_id`), its read and write timeouts set to what is left of the
    /// call's timeout, so that the whole call, connecting included, ends
    /// within it: the keeper drops a lease's capacity before a call only
    /// if its admission window could end within one timeout.
    fn connection(&mut self) -> Result<&mut (Connection, String), StoreError> {
        let deadline = Instant::now() + self.timeout;
        // A socket timeout of zero means none: at least 1 ms.
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        if let Some((conn, _)) = &self.conn {
            if conn.set_read_timeout(Some(left())).is_err()
                || conn.set_write_timeout(Some(left())).is_err()
            {
                self.conn = None;
            }
        }
        if self.conn.is_none() {
            // redis-rs's connect waits up to its timeout for the TCP
            // connect, then again for *each* reply of its set-up pipeline
            // (AUTH or HELLO, SELECT: two at most without CLIENT SETINFO),
            // even after one timed out. A quarter of the call's timeout
            // bounds the connect by half of it, and leaves `INFO` and the
            // script the rest. (With the whole timeout, a frozen Redis held
            // a reconnecting call for three timeouts.)
            let mut conn = self
                .client
                .get_connection_with_timeout(self.timeout / 4)
                .map_err(err)?;
            conn.set_read_timeout(Some(left())).map_err(err)?;
            conn.set_write_timeout(Some(left())).map_err(err)?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query(&mut conn)
                .map_err(err)?;
            let run_id = info
                .lines()
                .find_map(|l| l.strip_prefix("run_id:"))
                .map(|s| s.trim().to_string())
                .ok_or_else(|| StoreError("INFO server has no run_id".into()))?;
            conn.set_read_timeout(Some(left())).map_err(err)?;
            conn.set_write_timeout(Some(left())).map_err(err)?;
            self.conn = Some((conn, run_id));
        }
        Ok(self.conn.as_mut().expect("just set"))
    }

    /// Runs one script with `args`; a renewal's get the connection's
    /// `run_id` and then `tail` appended.
    fn run(
        &mut self,
        budget: &BudgetScripts,
        which: Which,
        args: Vec<String>,
        tail: Vec<String>,
    ) -> Result<Value, StoreError> {
        let keys = &budget.keys;
        let script = match which {
            Which::Renew => &budget.renew,
            Which::Release => &budget.release,
            Which::Status => &budget.status,
            Which::Capacity => &budget.capacity,
        };
        let (conn, run_id) = self.connection()?;
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in &args {
            inv.arg(a);
        }
        if matches!(which, Which::Renew) {
            inv.arg(run_id.as_str());
        }
        for a in &tail {
            inv.arg(a);
        }
        let result = inv.invoke::<Value>(conn);
        if result.is_err() {
            self.conn = None; // reconnect (and re-read run_id) next time
        }
        result.map_err(err)
    }
}

#[derive(Clone, Copy)]
enum Which {
    Renew,
    Release,
    Status,
    Capacity,
}

fn items(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(a) => Ok(a),
        other => Err(StoreError(format!("unexpected script reply {other:?}"))),
    }
}

fn text(v: &Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        other => Err(StoreError(format!("expected a string, got {other:?}"))),
    }
}

fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => text(other)?
            .parse()
            .map_err(|_| StoreError(format!("expected an integer, got {other:?}"))),
    }
}

fn grant(a: &[Value]) -> Result<Grant, StoreError> {
    if a.len() < 11 {
        return Err(StoreError(format!("short renew reply {a:?}")));
    }
    let target = int(&a[5])?;
    let reap_in = int(&a[8])?;
    Ok(Grant {
        grant: int(&a[1])?.max(0) as u64,
        ttl_ms: int(&a[2])?.max(0) as u64,
        ver: int(&a[3])?.max(0) as u64,
        epoch: text(&a[4])?,
        target: (target >= 0).then_some(target as u64),
        learn_remaining_ms: int(&a[6])?.max(0) as u64,
        now_ms: int(&a[7])?,
        reap_in_ms: (reap_in >= 0).then_some(reap_in as u64),
        capacity: FleetCapacity {
            capacity: int(&a[9])?.max(0) as u64,
            version: int(&a[10])?.max(0) as u64,
        },
    })
}

impl LeaseStore for RedisStore {
    fn init(&mut self, a: &InitArgs) -> Result<InitReply, StoreError> {
        self.bound().init(a)
    }

    fn renew(&mut self, a: &RenewArgs) -> Result<RenewReply, StoreError> {
        self.bound().renew(a)
    }

    fn release(&mut self, node: &str, req: u64) -> Result<u64, StoreError> {
        self.bound().release(node, req)
    }

    fn status(&mut self) -> Result<Option<Status>, StoreError> {
        self.bound().status()
    }

    fn set_fleet_capacity(&mut self, capacity: u64) -> Result<Option<FleetCapacity>, StoreError> {
        self.bound().set_fleet_capacity(capacity)
    }
}

impl LeaseStore for Bound<'_> {
    fn init(&mut self, a: &InitArgs) -> Result<InitReply, StoreError> {
        let args = vec![
            a.capacity.to_string(),
            a.ttl_ms.to_string(),
            a.grace_ms.to_string(),
            a.epoch.clone(),
            if a.fresh { "1" } else { "0" }.to_string(),
        ];
        self.conn.run_init(self.budget, args, a)
    }

    fn renew(&mut self, a: &RenewArgs) -> Result<RenewReply, StoreError> {
        let args = vec![
            a.node.clone(),
            a.req.to_string(),
            a.epoch_seen.clone(),
            a.ver_seen.to_string(),
            a.has.to_string(),
            a.need.to_string(),
            a.want.to_string(),
        ];
        let tail = vec![
            a.capacity.capacity.to_string(),
            a.capacity.version.to_string(),
        ];
        let reply = items(self.conn.run(self.budget, Which::Renew, args, tail)?)?;
        match reply.first().map(text).transpose()?.as_deref() {
            Some("OK") => Ok(RenewReply::Ok(grant(&reply)?)),
            Some("STALE") => Ok(RenewReply::Stale(grant(&reply)?)),
            Some("NOBUDGET") => Ok(RenewReply::NoBudget),
            _ => Err(StoreError(format!("unexpected renew reply {reply:?}"))),
        }
    }

    fn release(&mut self, node: &str, req: u64) -> Result<u64, StoreError> {
        let v = self.conn.run(
            self.budget,
            Which::Release,
            vec![node.to_string(), req.to_string()],
            Vec::new(),
        )?;
        Ok(int(&v)?.max(0) as u64)
    }

    fn status(&mut self) -> Result<Option<Status>, StoreError> {
        let a = items(
            self.conn
                .run(self.budget, Which::Status, Vec::new(), Vec::new())?,
        )?;
        if a.first().map(text).transpose()?.as_deref() == Some("NOBUDGET") {
            return Ok(None);
        }
        if a.len() < 10 {
            return Err(StoreError(format!("short status reply {a:?}")));
        }
        let mut nodes = Vec::new();
        for n in items(a[8].clone())? {
            let n = items(n)?;
            if n.len() < 5 {
                return Err(StoreError(format!("short lease entry {n:?}")));
            }
            nodes.push(NodeLease {
                node: text(&n[0])?,
                held: int(&n[1])?.max(0) as u64,
                expires_ms: int(&n[2])?,
                want: int(&n[3])?.max(0) as u64,
                need: int(&n[4])?.max(0) as u64,
            });
        }
        Ok(Some(Status {
            capacity: int(&a[1])?.max(0) as u64,
            capacity_version: int(&a[9])?.max(0) as u64,
            granted: int(&a[2])?.max(0) as u64,
            learn_remaining_ms: int(&a[3])?.max(0) as u64,
            losses: int(&a[4])?.max(0) as u64,
            epoch: text(&a[5])?,
            seq: int(&a[6])?.max(0) as u64,
            now_ms: int(&a[7])?,
            nodes,
        }))
    }

    fn set_fleet_capacity(&mut self, capacity: u64) -> Result<Option<FleetCapacity>, StoreError> {
        let a = items(self.conn.run(
            self.budget,
            Which::Capacity,
            vec![capacity.to_string()],
            Vec::new(),
        )?)?;
        match a.first().map(text).transpose()?.as_deref() {
            Some("NOBUDGET") => Ok(None),
            Some("OK") if a.len() >= 3 => Ok(Some(FleetCapacity {
                capacity: int(&a[1])?.max(0) as u64,
                version: int(&a[2])?.max(0) as u64,
            })),
            _ => Err(StoreError(format!(
                "unexpected set_fleet_capacity reply {a:?}"
            ))),
        }
    }
}

impl RedisConn {
    fn run_init(
        &mut self,
        budget: &BudgetScripts,
        args: Vec<String>,
        a: &InitArgs,
    ) -> Result<InitReply, StoreError> {
        // ARGV: capacity, ttl, grace, epoch, fresh, run_id, test, debug_now, cap_ver.
        let keys = &budget.keys;
        let script = &budget.init;
        let (conn, run_id) = self.connection()?;
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for x in &args {
            inv.arg(x);
        }
        inv.arg(run_id.as_str())
            .arg(if a.test { "1" } else { "0" })
            .arg(a.debug_now.map(|n| n.to_string()).unwrap_or_default())
            .arg(a.capacity_version.to_string());
        let result = inv.invoke::<Value>(conn);
        if result.is_err() {
            self.conn = None;
        }
        let v = items(result.map_err(err)?)?;
        let epoch = v.get(1).map(text).transpose()?.unwrap_or_default();
        match v.first().map(text).transpose()?.as_deref() {
            Some("CREATED") => Ok(InitReply::Created(epoch)),
            Some("EXISTS") => Ok(InitReply::Exists(epoch)),
            _ => Err(StoreError(format!("unexpected init reply {v:?}"))),
        }
    }
}
