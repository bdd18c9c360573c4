//! Builder settings read from environment variables: [`Env`], the lookup
//! (a prefix of the user's choice, fallbacks, renamed variables), and
//! [`Setting`], what it reads. The builders read an `Env` with
//! [`LimiterBuilder::from_env`], [`PoolBuilder::from_env`] and
//! [`SupervisorBuilder::from_env`] (inherent impls kept here, beside the
//! reader, so the builders' own files hold no environment code).

use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;
use crate::limiter::LimiterBuilder;
use crate::pool::PoolBuilder;
use crate::supervisor::SupervisorBuilder;
use crate::sync::Arc;

/// Sets a builder's waiting room from `env`'s `MaxWaiters` and `MaxWait`
/// where they are set: one text for the three builders' `from_env`
/// (their setters share names, not a trait).
macro_rules! waiting_from_env {
    ($env:expr, $builder:expr) => {{
        let (waiters, wait) = $env.waiting()?;
        if let Some(waiters) = waiters {
            $builder.max_waiters(waiters);
        }
        if let Some(wait) = wait {
            $builder.max_wait(wait);
        }
    }};
}

/// [`waiting_from_env!`], and the shard count from `Shards` first, for
/// the builders that take one (the limiter's and the supervisor's).
macro_rules! shards_and_waiting_from_env {
    ($env:expr, $builder:expr) => {{
        let shards = crate::engine::table::MAX_SHARDS;
        if let Some(shards) = $env.count(Setting::Shards, false, shards, Err(NO_UNLIMITED))? {
            $builder.shards(shards);
        }
        waiting_from_env!($env, $builder);
    }};
}

/// A setting an [`Env`] reads, each under a suffix of its own (the
/// default suffix is the builder field's name in capitals, renamed with
/// [`Env::rename`]).
///
/// # Examples
///
/// ```
/// use sidejob::env::{Env, Setting};
///
/// let env = Env::new("API_").rename(Setting::MaxWaiters, "QUEUE");
/// assert_eq!(env.variables(Setting::Capacity), ["API_CAPACITY"]);
/// assert_eq!(env.variables(Setting::MaxWaiters), ["API_QUEUE"]);
/// assert_eq!(env.variables(Setting::SingleThread), ["API_SINGLE_THREAD"]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Setting {
    /// `NAME`: the front-end's name (its threads' names, its metric
    /// series' `name` label).
    Name,
    /// `CAPACITY`: units at once, a whole number, or `null` for no limit
    /// (see [`Env`] for what that means for each builder).
    /// Missing in every layer, the builder is skipped (`Ok(None)`).
    Capacity,
    /// `SHARDS`: shards of a limiter or supervisor, a whole number.
    Shards,
    /// `WORKERS`: worker threads of a pool, a whole number.
    Workers,
    /// `SINGLE_THREAD`: `true` runs a pool on one worker thread whatever
    /// [`Workers`](Setting::Workers) says (`true`, `false`, `1` or `0`).
    SingleThread,
    /// `MAX_WAITERS`: the waiting room's size, a whole number or `null`.
    MaxWaiters,
    /// `MAX_WAIT`: how long one caller may wait, in whole milliseconds or
    /// seconds (`250ms`, `2s`), or `null` for as long as it takes.
    MaxWait,
}

impl Setting {
    /// Every setting, in the order of the docs.
    const ALL: [Setting; 7] = [
        Setting::Name,
        Setting::Capacity,
        Setting::Shards,
        Setting::Workers,
        Setting::SingleThread,
        Setting::MaxWaiters,
        Setting::MaxWait,
    ];

    /// The builder field it sets (the [`ConfigError::field`] of its errors).
    fn field(self) -> &'static str {
        match self {
            Setting::Name => "name",
            Setting::Capacity => "capacity",
            Setting::Shards => "shards",
            Setting::Workers => "workers",
            Setting::SingleThread => "single_thread",
            Setting::MaxWaiters => "max_waiters",
            Setting::MaxWait => "max_wait",
        }
    }

    fn default_suffix(self) -> &'static str {
        match self {
            Setting::Name => "NAME",
            Setting::Capacity => "CAPACITY",
            Setting::Shards => "SHARDS",
            Setting::Workers => "WORKERS",
            Setting::SingleThread => "SINGLE_THREAD",
            Setting::MaxWaiters => "MAX_WAITERS",
            Setting::MaxWait => "MAX_WAIT",
        }
    }
}

type Lookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// One prefix and where its variables are read.
#[derive(Clone)]
struct Layer {
    prefix: String,
    /// `None`: the process environment.
    lookup: Option<Lookup>,
}

impl Layer {
    fn get(&self, variable: &str) -> Option<String> {
        match &self.lookup {
            Some(lookup) => lookup(variable),
            // Not UTF-8: read lossily, so the error shows what it can.
            None => std::env::var_os(variable).map(|v| v.to_string_lossy().into_owned()),
        }
    }
}

/// Where builders read their settings: environment variables under a
/// prefix, with fallback prefixes, as `{prefix}{suffix}`.
///
/// The pattern comes from an HTTP worker configured per tenant: each
/// setting is read from the tenant's variables (`WORKER_REQUEST_CONCURRENCY`,
/// `WORKER_MAX_QUEUE_LENGTH`, `WORKER_USE_SINGLE_THREAD`), falls back to
/// the worker's defaults (`WORKER_DEFAULT_*`) when missing, `null` means
/// unlimited, and a concurrency missing everywhere means no limit at all:
/// the middleware is skipped. An `Env` is that lookup: a list of
/// prefixes, each read in turn until one has the variable, and a suffix
/// per [`Setting`] (renamable, so existing variable names keep working).
/// The builders read it with [`LimiterBuilder::from_env`],
/// [`PoolBuilder::from_env`] and [`SupervisorBuilder::from_env`], which
/// answer `Ok(None)` when the capacity is missing ("skip"), and a
/// [`ConfigError`] naming the variable and its value when a value does
/// not read.
///
/// For each setting, the layers are read in order and the first that has
/// the variable wins; `null` found in a layer is a value (unlimited), not
/// a miss, so it overrides the fallbacks. A value that is empty (or only
/// spaces) counts as missing: `VAR=` in a shell or a compose file unsets
/// it. The prefix is prepended as it is: `Env::new("WORKER_")` reads
/// `WORKER_CAPACITY`.
///
/// # What `null` (unlimited) means in a bounded crate
///
/// Every front-end has a capacity; "unlimited" is the largest one its
/// builder takes, where that costs nothing up front, so the front-end
/// never refuses for capacity but still counts (its stats and metrics
/// keep flowing):
///
/// | setting | `null` gives |
/// |---|---|
/// | capacity, of a limiter or a pool | [`LimiterBuilder::MAX_CAPACITY`] (2^60 − 1 on 64-bit): never full |
/// | capacity, of a supervisor | refused: it allocates a slot per unit up front |
/// | max_waiters | [`LimiterBuilder::MAX_WAITERS`] (2^20) |
/// | max_wait | `Duration::MAX`: wait as long as it takes |
/// | shards, workers, single_thread, name | refused: no unlimited value |
///
/// # Examples
///
/// The worker of the pattern above: the tenant's variables, then the
/// worker's defaults, under the names it already uses.
///
/// ```
/// use sidejob::env::{Env, Setting};
/// use sidejob::LimiterBuilder;
///
/// // (Set here for the example; a deployment sets them.)
/// std::env::set_var("WORKER_DEFAULT_REQUEST_CONCURRENCY", "10");
/// std::env::set_var("WORKER_DEFAULT_MAX_QUEUE_LENGTH", "20");
///
/// let env = Env::new("WORKER_")
///     .fallback("WORKER_DEFAULT_")
///     .rename(Setting::Capacity, "REQUEST_CONCURRENCY")
///     .rename(Setting::MaxWaiters, "MAX_QUEUE_LENGTH");
/// let limiter = match LimiterBuilder::from_env(&env)? {
///     Some(builder) => Some(builder.build()?),
///     None => None, // no concurrency anywhere: skip the middleware
/// };
/// let limiter = limiter.expect("the default says 10");
/// assert_eq!(limiter.capacity(), 10); // the worker's default
///
/// // `null`: unlimited, even over a default.
/// std::env::set_var("WORKER_REQUEST_CONCURRENCY", "null");
/// let unlimited = LimiterBuilder::from_env(&env)?.expect("null is a value").build()?;
/// assert_eq!(unlimited.capacity(), LimiterBuilder::MAX_CAPACITY);
///
/// // A value that does not read: the variable and the value, named.
/// std::env::set_var("WORKER_REQUEST_CONCURRENCY", "lots");
/// let err = LimiterBuilder::from_env(&env).unwrap_err();
/// assert_eq!(err.variable(), Some("WORKER_REQUEST_CONCURRENCY"));
/// assert_eq!(
///     err.to_string(),
///     "invalid `capacity` from WORKER_REQUEST_CONCURRENCY=\"lots\": must be a whole number, or `null` for no limit"
/// );
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
///
/// Variables from somewhere else than the process (a tenant's map, a
/// config file), with the process's as the fallback:
///
/// ```
/// use std::collections::HashMap;
/// use sidejob::env::Env;
/// use sidejob::PoolBuilder;
///
/// let tenant: HashMap<String, String> =
///     [("APP_CAPACITY", "64"), ("APP_SINGLE_THREAD", "true")]
///         .into_iter()
///         .map(|(k, v)| (k.to_string(), v.to_string()))
///         .collect();
/// let env = Env::with_lookup("APP_", move |var| tenant.get(var).cloned()).fallback("APP_DEFAULT_");
/// let builder = PoolBuilder::from_env(&env)?.expect("the tenant sets a capacity");
/// # struct Echo;
/// # impl sidejob::Worker for Echo {
/// #     type Request = u32; type Reply = u32; type Message = ();
/// #     fn handle_call(&mut self, n: u32) -> u32 { n }
/// #     fn handle_cast(&mut self, _: ()) {}
/// # }
/// let pool = builder.build(|_| Echo)?;
/// assert_eq!((pool.capacity(), pool.workers()), (64, 1));
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Env {
    /// Read in order; never empty.
    layers: Vec<Layer>,
    /// Suffixes other than the defaults.
    renamed: Vec<(Setting, String)>,
}

/// One variable found: its name and its value.
struct Found {
    variable: String,
    value: String,
}

/// A count read: a number, or `null`.
enum Count {
    At(usize),
    Unlimited,
}

impl Env {
    /// Reads the process environment under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Env {
        Env {
            layers: vec![Layer {
                prefix: prefix.into(),
                lookup: None,
            }],
            renamed: Vec::new(),
        }
    }

    /// Reads variables under `prefix` from `lookup` instead of the process
    /// environment: it is given the variable's full name and returns its
    /// value, if set.
    pub fn with_lookup(
        prefix: impl Into<String>,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Env {
        Env {
            layers: vec![Layer {
                prefix: prefix.into(),
                lookup: Some(Arc::new(lookup)),
            }],
            renamed: Vec::new(),
        }
    }

    /// Adds a fallback: a setting missing under every prefix so far is read
    /// from the process environment under `prefix`.
    pub fn fallback(mut self, prefix: impl Into<String>) -> Env {
        self.layers.push(Layer {
            prefix: prefix.into(),
            lookup: None,
        });
        self
    }

    /// Reads `setting` under `suffix` instead of its default (in every
    /// layer): `rename(Setting::Capacity, "REQUEST_CONCURRENCY")`.
    pub fn rename(mut self, setting: Setting, suffix: impl Into<String>) -> Env {
        self.renamed.retain(|(s, _)| *s != setting);
        self.renamed.push((setting, suffix.into()));
        self
    }

    /// The variables `setting` is read from, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::env::{Env, Setting};
    ///
    /// let env = Env::new("W_").fallback("W_DEFAULT_").rename(Setting::Capacity, "CONCURRENCY");
    /// assert_eq!(env.variables(Setting::Capacity), ["W_CONCURRENCY", "W_DEFAULT_CONCURRENCY"]);
    /// assert_eq!(env.variables(Setting::MaxWait), ["W_MAX_WAIT", "W_DEFAULT_MAX_WAIT"]);
    /// ```
    pub fn variables(&self, setting: Setting) -> Vec<String> {
        let suffix = self.suffix(setting);
        self.layers
            .iter()
            .map(|layer| format!("{}{suffix}", layer.prefix))
            .collect()
    }

    fn suffix(&self, setting: Setting) -> &str {
        self.renamed
            .iter()
            .find(|(s, _)| *s == setting)
            .map_or(setting.default_suffix(), |(_, suffix)| suffix.as_str())
    }

    /// The first layer's variable for `setting` that is set and not blank.
    fn find(&self, setting: Setting) -> Option<Found> {
        let suffix = self.suffix(setting);
        self.layers.iter().find_map(|layer| {
            let variable = format!("{}{suffix}", layer.prefix);
            let value = layer.get(&variable)?;
            (!value.trim().is_empty()).then_some(Found { variable, value })
        })
    }

    /// The name, refused here (naming its variable) if it holds a NUL
    /// byte, which the builder would refuse without saying where it came
    /// from.
    fn name(&self) -> Result<Option<String>, ConfigError> {
        let Some(found) = self.find(Setting::Name) else {
            return Ok(None);
        };
        if found.value.contains('\0') {
            return Err(
                ConfigError::nul(Setting::Name.field()).read_from(&found.variable, &found.value)
            );
        }
        Ok(Some(found.value))
    }

    /// A count: a whole number in `1..=max` (`0..=max` with `zero_ok`), or
    /// `null` where `unlimited` says what it means (`Err` with the reason
    /// where it has no meaning).
    fn count(
        &self,
        setting: Setting,
        zero_ok: bool,
        max: usize,
        unlimited: Result<usize, &'static str>,
    ) -> Result<Option<usize>, ConfigError> {
        let Some(found) = self.find(setting) else {
            return Ok(None);
        };
        let field = setting.field();
        let blame = |err: ConfigError| err.read_from(&found.variable, &found.value);
        let expected = match unlimited {
            Ok(_) => "a whole number, or `null` for no limit",
            Err(_) => "a whole number",
        };
        let count = match read_count(&found.value) {
            Some(count) => count,
            None => return Err(blame(ConfigError::unreadable(field, expected))),
        };
        match count {
            Count::Unlimited => match unlimited {
                Ok(n) => Ok(Some(n)),
                Err(why) => Err(blame(ConfigError::no_unlimited(field, why))),
            },
            Count::At(0) if !zero_ok => Err(blame(ConfigError::zero(field))),
            Count::At(n) if n > max => Err(blame(ConfigError::too_large(field, max))),
            Count::At(n) => Ok(Some(n)),
        }
    }

    fn flag(&self, setting: Setting) -> Result<Option<bool>, ConfigError> {
        let Some(found) = self.find(setting) else {
            return Ok(None);
        };
        match found.value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(Some(true)),
            "false" | "0" => Ok(Some(false)),
            _ => Err(
                ConfigError::unreadable(setting.field(), "`true` or `false` (or `1`, `0`)")
                    .read_from(&found.variable, &found.value),
            ),
        }
    }

    fn duration(&self, setting: Setting) -> Result<Option<Duration>, ConfigError> {
        let Some(found) = self.find(setting) else {
            return Ok(None);
        };
        read_duration(&found.value).map(Some).ok_or_else(|| {
            ConfigError::unreadable(
                setting.field(),
                "a duration in whole `ms` or `s` (`250ms`, `2s`), or `null` for no limit",
            )
            .read_from(&found.variable, &found.value)
        })
    }

    /// The waiting room's two settings, as every builder takes them.
    fn waiting(&self) -> Result<(Option<usize>, Option<Duration>), ConfigError> {
        let max = crate::engine::waiters::MAX_WAITERS;
        let waiters = self.count(Setting::MaxWaiters, true, max, Ok(max))?;
        Ok((waiters, self.duration(Setting::MaxWait)?))
    }
}

/// A whole number, or `null` (any case); surrounding spaces are ignored.
fn read_count(value: &str) -> Option<Count> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("null") {
        return Some(Count::Unlimited);
    }
    // `parse` takes a leading `+`; a count is digits only.
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok().map(Count::At)
}

/// `{n}ms`, `{n}s` or `null`.
fn read_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("null") {
        return Some(Duration::MAX);
    }
    let (digits, unit): (&str, fn(u64) -> Duration) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, Duration::from_millis)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, Duration::from_secs)
    } else {
        return None;
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(unit)
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Variables<'a>(&'a Env);
        impl fmt::Debug for Variables<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_map()
                    .entries(
                        Setting::ALL
                            .iter()
                            .map(|&setting| (setting, self.0.variables(setting))),
                    )
                    .finish()
            }
        }
        f.debug_struct("Env")
            .field(
                "sources",
                &self
                    .layers
                    .iter()
                    .map(|layer| match layer.lookup {
                        Some(_) => "lookup",
                        None => "process",
                    })
                    .collect::<Vec<_>>(),
            )
            .field("variables", &Variables(self))
            .finish()
    }
}

/// The largest capacity of a limiter or pool: a table's.
const TABLE_MAX_CAPACITY: usize = crate::engine::table::MAX_CAPACITY;
/// The largest capacity of a supervisor (its registry's slots:
/// `supervisor/registry.rs`, where this is private; a test keeps the two
/// equal).
const SUPERVISOR_MAX_CAPACITY: usize = 1 << 24;

/// A limiter's largest capacity, and what `null` means for its
/// [`Setting::Capacity`] read from an [`Env`].
impl LimiterBuilder {
    /// The largest [`capacity`](Self::capacity) a limiter takes: 2^60 − 1
    /// on 64-bit targets. A limiter this large never refuses for
    /// capacity; it is what `null` means in an [`Env`].
    pub const MAX_CAPACITY: usize = TABLE_MAX_CAPACITY;

    /// A builder set from `env`: [`Setting::Name`], [`Capacity`](Setting::Capacity)
    /// (`null`: [`MAX_CAPACITY`](Self::MAX_CAPACITY)), [`Shards`](Setting::Shards),
    /// [`MaxWaiters`](Setting::MaxWaiters) and [`MaxWait`](Setting::MaxWait),
    /// each where set; `None` when the capacity is missing in every layer
    /// (no limit asked for: skip the limiter). Settings that are not set
    /// keep the builder's defaults; the others are read only when the
    /// capacity is there.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field, the variable and its value
    /// ([`variable`](ConfigError::variable), [`value`](ConfigError::value))
    /// when a value does not read as its setting's type, is 0 where
    /// that is refused (capacity, shards), is above the builder's
    /// maximum, or is a name holding a NUL byte. A value longer than 64
    /// bytes is cut in the error. See the example on [`Env`].
    pub fn from_env(env: &Env) -> Result<Option<LimiterBuilder>, ConfigError> {
        let max = TABLE_MAX_CAPACITY;
        let Some(capacity) = env.count(Setting::Capacity, false, max, Ok(max))? else {
            return Ok(None);
        };
        let mut builder = LimiterBuilder::default();
        builder.capacity(capacity);
        if let Some(name) = env.name()? {
            builder.name(name);
        }
        shards_and_waiting_from_env!(env, builder);
        Ok(Some(builder))
    }
}

/// Why shards and workers cannot be `null`.
const NO_UNLIMITED: &str = "it has no unlimited value";

/// A pool read from an [`Env`].
impl PoolBuilder {
    /// A builder set from `env`: [`Setting::Name`], [`Capacity`](Setting::Capacity)
    /// (`null`: the largest capacity, [`LimiterBuilder::MAX_CAPACITY`]:
    /// never full, an unbounded queue), [`Workers`](Setting::Workers),
    /// [`SingleThread`](Setting::SingleThread) (`true`: one worker,
    /// whatever `Workers` says), [`MaxWaiters`](Setting::MaxWaiters) and
    /// [`MaxWait`](Setting::MaxWait), each where set; `None` when the
    /// capacity is missing in every layer.
    ///
    /// # Errors
    ///
    /// As [`LimiterBuilder::from_env`]; `workers` is refused at 0, above
    /// [`MAX_WORKERS`](Self::MAX_WORKERS), or `null`.
    pub fn from_env(env: &Env) -> Result<Option<PoolBuilder>, ConfigError> {
        let max = TABLE_MAX_CAPACITY;
        let Some(capacity) = env.count(Setting::Capacity, false, max, Ok(max))? else {
            return Ok(None);
        };
        let mut builder = PoolBuilder::default();
        builder.capacity(capacity);
        if let Some(name) = env.name()? {
            builder.name(name);
        }
        if env.flag(Setting::SingleThread)? == Some(true) {
            builder.workers(1);
        } else if let Some(workers) = env.count(
            Setting::Workers,
            false,
            PoolBuilder::MAX_WORKERS,
            Err(NO_UNLIMITED),
        )? {
            builder.workers(workers);
        }
        waiting_from_env!(env, builder);
        Ok(Some(builder))
    }
}

/// A supervisor read from an [`Env`].
impl SupervisorBuilder {
    /// A builder set from `env`: [`Setting::Name`], [`Capacity`](Setting::Capacity)
    /// (never `null`: a supervisor allocates a slot per unit up front),
    /// [`Shards`](Setting::Shards), [`MaxWaiters`](Setting::MaxWaiters)
    /// and [`MaxWait`](Setting::MaxWait), each where set; `None` when the
    /// capacity is missing in every layer.
    ///
    /// # Errors
    ///
    /// As [`LimiterBuilder::from_env`]; the capacity is refused above 2^24
    /// or `null`.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::env::Env;
    /// use sidejob::SupervisorBuilder;
    ///
    /// let env = Env::with_lookup("JOBS_", |var| (var == "JOBS_CAPACITY").then(|| "null".into()));
    /// let err = SupervisorBuilder::from_env(&env).unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid `capacity` from JOBS_CAPACITY=\"null\": cannot be `null` (unlimited): \
    ///      a supervisor allocates a slot per unit up front"
    /// );
    /// ```
    pub fn from_env(env: &Env) -> Result<Option<SupervisorBuilder>, ConfigError> {
        let Some(capacity) = env.count(
            Setting::Capacity,
            false,
            SUPERVISOR_MAX_CAPACITY,
            Err("a supervisor allocates a slot per unit up front"),
        )?
        else {
            return Ok(None);
        };
        let mut builder = SupervisorBuilder::default();
        builder.capacity(capacity);
        if let Some(name) = env.name()? {
            builder.name(name);
        }
        shards_and_waiting_from_env!(env, builder);
        Ok(Some(builder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_durations_read_strictly() {
        assert!(matches!(read_count(" 12 "), Some(Count::At(12))));
        assert!(matches!(read_count("NULL"), Some(Count::Unlimited)));
        for bad in [
            "+3",
            "-1",
            "1.5",
            "ten",
            "1e3",
            "0x10",
            "99999999999999999999999",
        ] {
            assert!(read_count(bad).is_none(), "{bad}");
        }
        assert_eq!(read_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(read_duration(" 2s"), Some(Duration::from_secs(2)));
        assert_eq!(read_duration("null"), Some(Duration::MAX));
        for bad in ["250", "ms", "s", "1.5s", "2m", "-1s", "+1s", "1 s"] {
            assert_eq!(read_duration(bad), None, "{bad}");
        }
    }

    /// An env of `APP_` whose variables are `vars`.
    fn lookup(vars: &'static [(&'static str, &'static str)]) -> Env {
        Env::with_lookup("APP_", move |var| {
            vars.iter()
                .find(|(name, _)| *name == var)
                .map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn a_nul_in_a_name_names_its_variable() {
        let env = lookup(&[("APP_CAPACITY", "4"), ("APP_NAME", "api\0v2")]);
        let errors = [
            LimiterBuilder::from_env(&env).unwrap_err(),
            PoolBuilder::from_env(&env).unwrap_err(),
            SupervisorBuilder::from_env(&env).unwrap_err(),
        ];
        for err in errors {
            assert_eq!(
                (err.field(), err.variable(), err.value()),
                ("name", Some("APP_NAME"), Some("api\0v2"))
            );
            assert_eq!(
                err.to_string(),
                "invalid `name` from APP_NAME=\"api\\0v2\": must not contain a NUL byte"
            );
        }
    }

    #[test]
    fn a_huge_value_is_truncated_in_the_error() {
        let huge: &'static str = Box::leak("9".repeat(1 << 20).into_boxed_str());
        let vars: &'static [(&'static str, &'static str)] =
            Box::leak(Box::new([("APP_CAPACITY", huge)]));
        let err = LimiterBuilder::from_env(&lookup(vars)).unwrap_err();
        assert_eq!(err.field(), "capacity");
        let value = err.value().unwrap();
        assert!(value.len() < 100, "{} bytes", value.len());
        assert!(value.starts_with("9999") && value.ends_with('…'), "{value}");
        assert!(err.to_string().len() < 200, "{err}");
        // A value cut inside a character is cut before it.
        let wide: &'static str = Box::leak("é".repeat(1 << 10).into_boxed_str());
        let vars: &'static [(&'static str, &'static str)] =
            Box::leak(Box::new([("APP_CAPACITY", wide)]));
        let err = LimiterBuilder::from_env(&lookup(vars)).unwrap_err();
        let value = err.value().unwrap();
        assert!(
            value.trim_end_matches('…').chars().all(|c| c == 'é'),
            "{value}"
        );
        // A short value is kept whole.
        let err = LimiterBuilder::from_env(&lookup(&[("APP_CAPACITY", "ten")])).unwrap_err();
        assert_eq!(err.value(), Some("ten"));
    }

    #[test]
    fn the_supervisor_maximum_is_the_registrys() {
        let err = SupervisorBuilder::default()
            .capacity(SUPERVISOR_MAX_CAPACITY + 1)
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            ConfigError::too_large("capacity", SUPERVISOR_MAX_CAPACITY)
        );
    }
}
