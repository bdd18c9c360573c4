//! The pool's Redis side: one blocking connection, the Lua scripts, and
//! their replies as Rust values.
//!
//! Every script runs with `EVALSHA` (redis-rs `Script`, which reloads it
//! after `NOSCRIPT`). KEYS[1] is the pool's prefix; ARGV[1] the `run_id`
//! of the Redis process, fetched once per connection: a script that sees
//! another `run_id` than the pool's last writer knows Redis restarted or
//! failed over, and enters learning mode. Any error drops the connection;
//! the next call reconnects.

use std::time::{Duration, Instant};

use redis::{Client, Connection, Script, Value};
use sidejob_redis::Endpoint;

use crate::error::RedisError;

const PRELUDE: &str = include_str!("../lua/prelude.lua");

macro_rules! scripts {
    ($($name:ident),*) => {
        /// The pool's scripts, their SHA computed once.
        pub(crate) struct Scripts { $(pub(crate) $name: Script,)* }
        impl Scripts {
            pub(crate) fn new() -> Self {
                Scripts { $($name: Script::new(&format!(
                    "{PRELUDE}\n{}",
                    include_str!(concat!("../lua/", stringify!($name), ".lua"))
                )),)* }
            }

            /// Every script's own text (without the prelude).
            #[cfg(test)]
            pub(crate) fn sources() -> Vec<&'static str> {
                vec![$(include_str!(concat!("../lua/", stringify!($name), ".lua")),)*]
            }
        }
    };
}

scripts!(
    join, register, heartbeat, due, place, dispatch, take, moved, done, stop, notify, adopt, leave,
    view, shutdown, handback
);

/// One argument of a script.
pub(crate) enum Arg<'a> {
    S(&'a str),
    B(&'a [u8]),
    N(u64),
}

/// One lazily opened connection, with its server's `run_id`.
pub(crate) struct Conn {
    client: Client,
    shown: String,
    conn: Option<(Connection, String)>,
    timeout: Duration,
    /// [`Durability::Fsync`](crate::Durability::Fsync): every new
    /// connection checks the server's AOF settings.
    require_fsync: bool,
}

impl Conn {
    pub(crate) fn new(endpoint: &Endpoint, timeout: Duration) -> Result<Self, RedisError> {
        Ok(Conn {
            client: endpoint.client().map_err(|e| RedisError(e.to_string()))?,
            shown: endpoint.to_string(),
            conn: None,
            timeout,
            require_fsync: false,
        })
    }

    /// Every connection opened from now on checks that the server fsyncs
    /// its AOF before it replies ([`Durability::Fsync`](crate::Durability::Fsync)).
    pub(crate) fn require_fsync(&mut self) {
        self.require_fsync = true;
        self.conn = None;
    }

    fn err(&self, what: &str, e: redis::RedisError) -> RedisError {
        // redis-rs's errors name the address at most, never the password
        // (it sent it, it does not echo it); the endpoint is ours to show.
        RedisError(format!("redis {} ({what}): {e}", self.shown))
    }

    /// The connection (opened if need be), its timeouts set for a call
    /// that may block up to `block` more than the usual timeout.
    fn connection(&mut self, block: Duration) -> Result<&mut (Connection, String), RedisError> {
        if self.conn.is_none() {
            let mut conn = self
                .client
                .get_connection_with_timeout(self.timeout)
                .map_err(|e| self.err("connect", e))?;
            conn.set_read_timeout(Some(self.timeout))
                .map_err(|e| self.err("connect", e))?;
            conn.set_write_timeout(Some(self.timeout))
                .map_err(|e| self.err("connect", e))?;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query(&mut conn)
                .map_err(|e| self.err("INFO", e))?;
            if info.lines().any(|l| l.trim() == "redis_mode:sentinel") {
                return Err(RedisError(format!(
                    "redis {} is a Redis Sentinel, not a Redis primary: ask it for the primary's address (SENTINEL get-master-addr-by-name) and connect there",
                    self.shown
                )));
            }
            let run_id = info
                .lines()
                .find_map(|l| l.strip_prefix("run_id:"))
                .map(|s| s.trim().to_string())
                .ok_or_else(|| RedisError(format!("redis {}: INFO has no run_id", self.shown)))?;
            if self.require_fsync {
                if let Some(problem) =
                    fsync_problem_of(&mut conn).map_err(|e| self.err("CONFIG GET", e))?
                {
                    return Err(RedisError(format!("redis {}: {problem}", self.shown)));
                }
            }
            self.conn = Some((conn, run_id));
        }
        let t = self.timeout + block;
        let c = self.conn.as_mut().expect("just opened");
        if c.0.set_read_timeout(Some(t)).is_err() {
            self.conn = None;
            return Err(RedisError(format!("redis {}: socket closed", self.shown)));
        }
        Ok(self.conn.as_mut().expect("still open"))
    }

    /// Runs `script` for pool `prefix` with `args` after the `run_id`.
    pub(crate) fn run(
        &mut self,
        script: &Script,
        prefix: &str,
        args: &[Arg<'_>],
    ) -> Result<Vec<Value>, RedisError> {
        let (conn, run_id) = self.connection(Duration::ZERO)?;
        let mut inv = script.prepare_invoke();
        inv.key(prefix).arg(run_id.as_str());
        for a in args {
            match a {
                Arg::S(s) => inv.arg(*s),
                Arg::B(b) => inv.arg(*b),
                Arg::N(n) => inv.arg(*n),
            };
        }
        let r = inv.invoke::<Value>(conn);
        match r {
            Ok(Value::Array(a)) => Ok(a),
            Ok(other) => Err(RedisError(format!("unexpected script reply {other:?}"))),
            Err(e) => {
                let e = self.err("script", e);
                self.conn = None;
                Err(e)
            }
        }
    }

    /// What the server's persistence settings lack for
    /// [`Durability::Fsync`](crate::Durability::Fsync) (`None`: nothing).
    pub(crate) fn fsync_problem(&mut self) -> Result<Option<String>, RedisError> {
        let (conn, _) = self.connection(Duration::ZERO)?;
        match fsync_problem_of(conn) {
            Ok(p) => Ok(p),
            Err(e) => {
                let e = self.err("CONFIG GET", e);
                self.conn = None;
                Err(e)
            }
        }
    }

    /// `WAIT replicas timeout` on the connection the last script ran on:
    /// how many replicas acknowledged every write this connection made.
    /// An error if no connection is open (the writes' connection was lost,
    /// so nothing can be said of them).
    pub(crate) fn wait_replicas(
        &mut self,
        replicas: usize,
        timeout: Duration,
    ) -> Result<usize, RedisError> {
        if self.conn.is_none() {
            return Err(RedisError(format!(
                "redis {}: the connection that recorded the job was lost before WAIT",
                self.shown
            )));
        }
        let (conn, _) = self.connection(timeout)?;
        let r = redis::cmd("WAIT")
            .arg(replicas)
            .arg(ms(timeout).max(1))
            .query::<u64>(conn);
        match r {
            Ok(n) => Ok(n as usize),
            Err(e) => {
                let e = self.err("WAIT", e);
                self.conn = None;
                Err(e)
            }
        }
    }

    /// One Redis command (PING in the bench, XTRIM, XADD wake-ups).
    pub(crate) fn cmd(&mut self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        let (conn, _) = self.connection(Duration::ZERO)?;
        let r = cmd.query::<Value>(conn);
        r.map_err(|e| {
            let e = self.err("command", e);
            self.conn = None;
            e
        })
    }

    /// `XREAD COUNT 100 BLOCK <block> STREAMS <stream> <last>`: the
    /// messages after `last`, waiting up to `block` for the first.
    pub(crate) fn xread(
        &mut self,
        stream: &str,
        last: &str,
        block: Duration,
    ) -> Result<Vec<Msg>, RedisError> {
        let ms = block.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        let (conn, _) = self.connection(block)?;
        let r = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(100)
            .arg("BLOCK")
            .arg(ms)
            .arg("STREAMS")
            .arg(stream)
            .arg(last)
            .query::<Value>(conn);
        let v = match r {
            Ok(v) => v,
            Err(e) => {
                let e = self.err("XREAD", e);
                self.conn = None;
                return Err(e);
            }
        };
        parse_xread(v)
    }
}

/// `CONFIG GET appendonly` and `appendfsync`, judged for
/// [`Durability::Fsync`](crate::Durability::Fsync).
fn fsync_problem_of(conn: &mut Connection) -> redis::RedisResult<Option<String>> {
    let mut get = |name: &str| -> redis::RedisResult<String> {
        let m: std::collections::HashMap<String, String> =
            redis::cmd("CONFIG").arg("GET").arg(name).query(conn)?;
        Ok(m.get(name).cloned().unwrap_or_else(|| "(unset)".into()))
    };
    let appendonly = get("appendonly")?;
    let appendfsync = get("appendfsync")?;
    Ok(crate::durability::fsync_problem(&appendonly, &appendfsync))
}

/// One message of a worker's stream.
#[derive(Debug, Default)]
pub(crate) struct Msg {
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) payload: Vec<u8>,
    pub(crate) ver: u64,
}

fn parse_xread(v: Value) -> Result<Vec<Msg>, RedisError> {
    let mut out = Vec::new();
    let streams = match v {
        Value::Nil => return Ok(out),
        Value::Array(a) => a,
        Value::Map(m) => m
            .into_iter()
            .map(|(k, v)| Value::Array(vec![k, v]))
            .collect(),
        other => return Err(RedisError(format!("unexpected XREAD reply {other:?}"))),
    };
    for s in streams {
        let Value::Array(mut kv) = s else { continue };
        let Some(Value::Array(entries)) = kv.pop() else {
            continue;
        };
        for e in entries {
            let Value::Array(e) = e else { continue };
            let mut m = Msg {
                id: e.first().map(text).unwrap_or_default(),
                ..Msg::default()
            };
            if let Some(Value::Array(fields)) = e.get(1) {
                for pair in fields.chunks(2) {
                    let [k, v] = pair else { continue };
                    match text(k).as_str() {
                        "t" => m.kind = text(v),
                        "k" => m.key = text(v),
                        "tok" => m.token = text(v).parse().unwrap_or(0),
                        "v" => m.ver = text(v).parse().unwrap_or(0),
                        "p" => m.payload = bytes(v),
                        _ => {}
                    }
                }
            }
            out.push(m);
        }
    }
    Ok(out)
}

/// A reply item as text (lossy for bytes that are not UTF-8).
pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Okay => "OK".into(),
        _ => String::new(),
    }
}

/// A reply item as bytes.
pub(crate) fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        other => text(other).into_bytes(),
    }
}

/// A reply item as a number (0 if it is none).
pub(crate) fn num(v: &Value) -> u64 {
    match v {
        Value::Int(i) => (*i).max(0) as u64,
        other => text(other).parse().unwrap_or(0),
    }
}

/// The tag a script's reply starts with (`{'OK', ...}`): every tag the
/// scripts answer, parsed here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    /// `OK`: done (what follows depends on the script).
    Ok,
    /// `STALE`: routed over an old membership; the new one follows.
    Stale,
    /// `FULL`: `max_queued_jobs` reached.
    Full,
    /// `EXISTS`: the key is in the pool.
    Exists,
    /// `SHUTDOWN`: the pool is shutting down.
    ShuttingDown,
    /// `NOPOOL`: the pool is missing (Redis lost it).
    NoPool,
    /// `CLOSED`: the pool was shut down for good.
    Closed,
    /// `NOTFOUND`: no such job.
    NotFound,
    /// `LOST`: the job is no longer this worker's.
    Lost,
    /// `WAIT`: learning mode; try again later.
    Wait,
    /// `GONE`: the worker is not a member (register first).
    Gone,
    /// `STOP`: another run of the job wins; stop this one.
    Stop,
}

impl Tag {
    const ALL: [(&'static str, Tag); 12] = [
        ("OK", Tag::Ok),
        ("STALE", Tag::Stale),
        ("FULL", Tag::Full),
        ("EXISTS", Tag::Exists),
        ("SHUTDOWN", Tag::ShuttingDown),
        ("NOPOOL", Tag::NoPool),
        ("CLOSED", Tag::Closed),
        ("NOTFOUND", Tag::NotFound),
        ("LOST", Tag::Lost),
        ("WAIT", Tag::Wait),
        ("GONE", Tag::Gone),
        ("STOP", Tag::Stop),
    ];

    /// The tag of `reply` (`None`: no reply, or not a tag: an unexpected
    /// reply, which callers report).
    pub(crate) fn of(reply: &[Value]) -> Option<Tag> {
        let first = text(reply.first()?);
        Tag::ALL
            .iter()
            .find(|(name, _)| *name == first)
            .map(|&(_, t)| t)
    }
}

/// Items from `from` on, as slot names.
pub(crate) fn slots_from(a: &[Value], from: usize) -> Vec<String> {
    a.iter().skip(from).map(text).collect()
}

/// Milliseconds for a script argument.
pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

/// Now, on the monotonic clock.
pub(crate) fn now() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tag a script can answer (`{'TAG'` or `'TAG' or 'TAG'`), read
    /// from the scripts' text.
    fn tags_in_scripts() -> Vec<String> {
        let mut out = Vec::new();
        for src in Scripts::sources() {
            for (i, _) in src.match_indices('\'') {
                let rest = &src[i + 1..];
                let Some(end) = rest.find('\'') else { continue };
                let word = &rest[..end];
                let before = src[..i].trim_end();
                let is_tag = word.len() > 1
                    && word.chars().all(|c| c.is_ascii_uppercase())
                    && (before.ends_with('{')
                        || before.ends_with(" and")
                        || before.ends_with(" or"));
                if is_tag && !out.iter().any(|w: &String| w == word) {
                    out.push(word.to_string());
                }
            }
        }
        out
    }

    #[test]
    fn every_tag_the_scripts_answer_parses() {
        let tags = tags_in_scripts();
        assert!(tags.len() >= 12, "{tags:?}");
        for t in &tags {
            let reply = [Value::BulkString(t.as_bytes().to_vec())];
            assert!(Tag::of(&reply).is_some(), "{t} does not parse");
        }
        for (name, tag) in Tag::ALL {
            assert!(
                tags.iter().any(|t| t == name),
                "{name} is answered by no script"
            );
            let reply = [Value::SimpleString(name.into()), Value::Int(1)];
            assert_eq!(Tag::of(&reply), Some(tag));
        }
        assert_eq!(Tag::of(&[]), None);
        assert_eq!(Tag::of(&[Value::Int(3)]), None);
    }
}
