//! Memory in use, as a share: the process's cgroup (v2, then v1) when it
//! has a memory limit, else the machine's (`/proc/meminfo`).
//!
//! A container's limit is what the OOM killer enforces, so it comes first;
//! the machine's figure stands in when the cgroup has none. For a cgroup,
//! "in use" leaves out the inactive file cache (the working set, as the
//! kubelet counts it): the kernel reclaims that before it kills anyone.
//! The parsers are pure functions over the files' text, tested on samples.

use std::fs;

/// The share of memory in use now (0 to 1), or `None` where it cannot be
/// read (not Linux, or files missing).
///
/// Reads a few small files under `/proc` and `/sys/fs/cgroup` on each
/// call: call it once per claim, not per request.
///
/// # Examples
///
/// ```
/// if let Some(used) = sidejob::claim::memory_in_use() {
///     assert!((0.0..=1.0).contains(&used));
/// }
/// ```
pub fn memory_in_use() -> Option<f64> {
    let cgroups = fs::read_to_string("/proc/self/cgroup").ok();
    if let Some(cgroups) = cgroups.as_deref() {
        if let Some(used) = cgroup_v2(cgroups) {
            return Some(used);
        }
        if let Some(used) = cgroup_v1(cgroups) {
            return Some(used);
        }
    }
    meminfo(&fs::read_to_string("/proc/meminfo").ok()?)
}

/// The unified hierarchy: `0::/path` in `/proc/self/cgroup`.
fn cgroup_v2(cgroups: &str) -> Option<f64> {
    let path = cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
    let dir = format!("/sys/fs/cgroup{}", path.trim_end());
    let max = fs::read_to_string(format!("{dir}/memory.max")).ok()?;
    let current = fs::read_to_string(format!("{dir}/memory.current")).ok()?;
    let stat = fs::read_to_string(format!("{dir}/memory.stat")).ok();
    share_v2(&max, &current, stat.as_deref())
}

/// `memory.max` ("max": no limit), `memory.current`, and `memory.stat`'s
/// `inactive_file`.
pub(crate) fn share_v2(max: &str, current: &str, stat: Option<&str>) -> Option<f64> {
    let max: u64 = max.trim().parse().ok()?; // "max" does not parse: no limit
    let current: u64 = current.trim().parse().ok()?;
    let inactive = stat
        .and_then(|stat| field(stat, "inactive_file"))
        .unwrap_or(0);
    share(current.saturating_sub(inactive), max)
}

/// The v1 memory controller: `N:memory:/path` (or `N:...,memory,...:/path`).
fn cgroup_v1(cgroups: &str) -> Option<f64> {
    let path = cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })?;
    let dir = format!("/sys/fs/cgroup/memory{}", path.trim_end());
    let limit = fs::read_to_string(format!("{dir}/memory.limit_in_bytes")).ok()?;
    let usage = fs::read_to_string(format!("{dir}/memory.usage_in_bytes")).ok()?;
    let stat = fs::read_to_string(format!("{dir}/memory.stat")).ok();
    share_v1(&limit, &usage, stat.as_deref())
}

/// `memory.limit_in_bytes` (a page-rounded `i64::MAX` or more: no limit),
/// `memory.usage_in_bytes`, and `memory.stat`'s `total_inactive_file`.
pub(crate) fn share_v1(limit: &str, usage: &str, stat: Option<&str>) -> Option<f64> {
    let limit: u64 = limit.trim().parse().ok()?;
    if limit >= 1 << 62 {
        return None;
    }
    let usage: u64 = usage.trim().parse().ok()?;
    let inactive = stat
        .and_then(|stat| field(stat, "total_inactive_file"))
        .unwrap_or(0);
    share(usage.saturating_sub(inactive), limit)
}

/// `1 - MemAvailable / MemTotal`.
pub(crate) fn meminfo(text: &str) -> Option<f64> {
    let kib = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
    };
    let total = kib("MemTotal")?;
    let available = kib("MemAvailable")?;
    share(total.saturating_sub(available), total)
}

/// `name value` from a `memory.stat`.
fn field(stat: &str, name: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok())?
    })
}

fn share(used: u64, total: u64) -> Option<f64> {
    (total > 0).then(|| (used as f64 / total as f64).clamp(0.0, 1.0))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v2_counts_the_working_set() {
        let stat = "anon 100\nfile 500\ninactive_file 200\nactive_file 300\n";
        assert_eq!(share_v2("1000\n", "900\n", Some(stat)), Some(0.7));
        assert_eq!(share_v2("1000\n", "900\n", None), Some(0.9));
        assert_eq!(share_v2("max\n", "900\n", Some(stat)), None, "no limit");
    }

    #[test]
    fn cgroup_v1_ignores_the_unlimited_value() {
        let stat = "cache 10\ntotal_inactive_file 100\n";
        assert_eq!(share_v1("400\n", "300\n", Some(stat)), Some(0.5));
        assert_eq!(share_v1("9223372036854771712\n", "300\n", None), None);
    }

    #[test]
    fn meminfo_uses_available() {
        let text = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n";
        assert_eq!(meminfo(text), Some(0.75));
        assert_eq!(meminfo("MemTotal: 10 kB\n"), None);
    }

    #[test]
    fn this_machine_reads_as_a_share() {
        // Linux CI has /proc: a reading, in range.
        if cfg!(target_os = "linux") {
            let used = memory_in_use().expect("readable on Linux");
            assert!((0.0..=1.0).contains(&used), "{used}");
        }
    }
}
