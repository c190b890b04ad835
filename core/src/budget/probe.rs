//! Reading how much memory the daemon may still use: the whole machine (`/proc/meminfo`,
//! `/proc/pressure/memory`) and the daemon's memory cgroup with its ancestors (v1 or v2).
//!
//! Every figure becomes a *headroom*: bytes that programs (the cache included) may still
//! allocate before the source's reserve is reached. Negative headroom is a deficit the cache
//! should give back. The parsers are pure functions so they are tested on captured file text.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use thiserror::Error;

const MIB: u64 = 1 << 20;

/// Limits at or above this are "no limit" (v1 writes 2^63 rounded down to a page).
const UNLIMITED: u64 = 1 << 62;

/// Share of elapsed time in memory stalls (PSI "some") above which the memory is considered
/// contended and the cache does not grow back. 10 %: the kernel's own `psi` examples use
/// 150 ms per second as "memory pressure"; an idle machine here reads 0.
pub const STALL_SHARE: f64 = 0.10;

/// What the probe calls contended; [`Default`] is [`STALL_SHARE`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeConfig {
    /// Share of elapsed time in memory stalls above which a reading is `stalled`
    /// ([`STALL_SHARE`]).
    pub stall_share: f64,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            stall_share: STALL_SHARE,
        }
    }
}

/// A memory source could not be read.
#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} has no {key}")]
    Missing { path: PathBuf, key: &'static str },
}

/// One look at the memory sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Bytes that may still be allocated before the tightest source's reserve is reached;
    /// negative: that much should be given back.
    pub headroom: i64,
    /// The tightest source's reserve (the space hysteresis: the cache grows back only while the
    /// headroom stays above it).
    pub reserve: u64,
    /// Memory stalls (PSI) above [`STALL_SHARE`] since the last reading: do not grow.
    pub stalled: bool,
    /// The kernel reported reclaim trouble in the daemon's cgroup (v2 `memory.events` counted
    /// `high`, `max` or `oom`; v1 `memory.pressure_level` "medium", set by the watcher).
    pub kernel_event: bool,
}

/// The reserve kept free in a source of `limit` bytes (a cgroup's limit or the machine's RAM):
/// a sixteenth, between 128 MiB and 512 MiB.
///
/// The reserve must cover what other programs allocate between the moment the usage crosses
/// into it and the moment the evicted chunks are unmapped: 128 MiB is twice what a loaded
/// machine needed, and a sixteenth of RAM absorbs a poll period of fast allocation where no
/// kernel event wakes the watcher
/// ([measured](../../../docs/PERFORMANCE.md#memory-pressure-governor)).
pub fn reserve_for(limit: u64) -> u64 {
    (limit / 16).clamp(128 * MIB, 512 * MIB)
}

/// The system-wide source.
#[derive(Debug)]
struct System {
    total: u64,
    psi: Option<Psi>,
}

/// A PSI file (`/proc/pressure/memory` or a v2 cgroup's `memory.pressure`) and its last
/// "some" total.
#[derive(Debug)]
struct Psi {
    path: PathBuf,
    last: Option<(Instant, u64)>,
    /// [`ProbeConfig::stall_share`].
    stall_share: f64,
}

impl Psi {
    fn new(path: PathBuf) -> Option<Psi> {
        fs::metadata(&path).ok()?;
        Some(Psi {
            path,
            last: None,
            stall_share: STALL_SHARE,
        })
    }

    /// Whether the share of time stalled since the last call exceeds the stall share.
    fn stalled(&mut self) -> bool {
        let Some(total) = fs::read_to_string(&self.path)
            .ok()
            .and_then(|text| parse_psi_some_total(&text))
        else {
            return false;
        };
        let now = Instant::now();
        let stalled = self.last.is_some_and(|(then, before)| {
            let elapsed_us = now.duration_since(then).as_micros().max(1) as f64;
            total.saturating_sub(before) as f64 / elapsed_us > self.stall_share
        });
        self.last = Some((now, total));
        stalled
    }
}

/// Which cgroup hierarchy the daemon's memory cgroup is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The daemon's memory cgroup and its ancestors (up to the hierarchy's mount), innermost first.
#[derive(Debug)]
pub struct Cgroup {
    pub version: CgroupVersion,
    pub levels: Vec<PathBuf>,
    psi: Option<Psi>,
    /// v2: last `high` + `max` + `oom` count of `memory.events`.
    events: Option<u64>,
}

/// Figures of one cgroup level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    pub limit: u64,
    pub usage: u64,
    pub inactive_file: u64,
}

impl Level {
    /// What the level's programs hold that reclaim cannot take without hurting them: usage
    /// minus inactive file pages (the "working set" container runtimes report too). Active file
    /// pages count as used: the kernel reclaims them only after the inactive ones.
    fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }
}

impl Cgroup {
    /// The daemon's memory cgroup, if it is in one (of either version) whose files can be read.
    pub fn discover() -> Option<Cgroup> {
        let membership = fs::read_to_string("/proc/self/cgroup").ok()?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        let (version, dir, mount) = locate(&membership, &mountinfo)?;
        let mut levels = Vec::new();
        let mut at = dir.as_path();
        loop {
            levels.push(at.to_path_buf());
            if at == mount {
                break;
            }
            match at.parent() {
                Some(parent) if parent.starts_with(&mount) => at = parent,
                _ => break,
            }
        }
        let psi = match version {
            CgroupVersion::V2 => Psi::new(dir.join("memory.pressure")),
            CgroupVersion::V1 => None,
        };
        Some(Cgroup {
            version,
            levels,
            psi,
            events: None,
        })
    }

    /// The daemon's own cgroup directory.
    pub fn dir(&self) -> &Path {
        &self.levels[0]
    }

    /// Figures of `dir`, `None` if it has no limit (or it cannot be read: the root cgroup of a
    /// v2 hierarchy has no `memory.max`, which is the same thing).
    pub fn level(&self, dir: &Path) -> Option<Level> {
        let (limit, usage, stat_key) = match self.version {
            CgroupVersion::V1 => (
                read_number(&dir.join("memory.limit_in_bytes"))?,
                read_number(&dir.join("memory.usage_in_bytes"))?,
                "total_inactive_file",
            ),
            CgroupVersion::V2 => {
                let max = read_number(&dir.join("memory.max"))?;
                let high = read_number(&dir.join("memory.high")).unwrap_or(u64::MAX);
                (
                    max.min(high),
                    read_number(&dir.join("memory.current"))?,
                    "inactive_file",
                )
            }
        };
        if limit >= UNLIMITED {
            return None;
        }
        let stat = fs::read_to_string(dir.join("memory.stat")).ok()?;
        Some(Level {
            limit,
            usage,
            inactive_file: stat_value(&stat, stat_key).unwrap_or(0),
        })
    }

    /// The tightest limit over the levels, and the headroom and reserve under it.
    ///
    /// A cgroup holding the daemon alone (a service unit with `MemoryMax`, the benchmark's
    /// cgroup of budget + 64 MiB) keeps no reserve: nobody else can allocate there, and the
    /// limit is the user's way of bounding the daemon itself, so reaching it with a full cache
    /// is not pressure.
    fn tightest(&self) -> Option<(u64, i64, u64)> {
        self.levels
            .iter()
            .enumerate()
            .filter_map(|(at, dir)| Some((at, self.level(dir)?)))
            .map(|(at, level)| {
                let reserve = if at == 0 && self.alone() {
                    0
                } else {
                    reserve_for(level.limit)
                };
                // Limits are below 2^62 (`UNLIMITED`), usage and reserves too: no overflow.
                let headroom = level.limit as i64 - level.working_set() as i64 - reserve as i64;
                (level.limit, headroom, reserve)
            })
            .min_by_key(|&(_, headroom, _)| headroom)
    }

    /// Whether the daemon is the only process of its cgroup.
    pub fn alone(&self) -> bool {
        let Ok(procs) = fs::read_to_string(self.dir().join("cgroup.procs")) else {
            return false;
        };
        let me = std::process::id().to_string();
        procs.split_whitespace().all(|pid| pid == me)
    }

    /// v2: whether `memory.events` counted new `high`, `max` or `oom` events since last time.
    fn new_events(&mut self) -> bool {
        if self.version != CgroupVersion::V2 {
            return false;
        }
        let Ok(text) = fs::read_to_string(self.dir().join("memory.events")) else {
            return false;
        };
        let count = ["high", "max", "oom"]
            .iter()
            .filter_map(|key| stat_value(&text, key))
            .sum::<u64>();
        let fresh = self.events.is_some_and(|before| count > before);
        self.events = Some(count);
        fresh
    }

    /// The smallest limit over the levels (for the mount-time check).
    pub fn limit(&self) -> Option<u64> {
        self.levels
            .iter()
            .filter_map(|dir| self.level(dir))
            .map(|level| level.limit)
            .min()
    }
}

/// Everything the governor watches.
#[derive(Debug)]
pub struct Probe {
    system: System,
    pub cgroup: Option<Cgroup>,
}

impl Probe {
    /// The machine and the daemon's memory cgroup (if any).
    pub fn discover() -> Result<Probe, ProbeError> {
        Probe::discover_with(ProbeConfig::default())
    }

    /// [`Probe::discover`], calling memory contended as `config` says.
    pub fn discover_with(config: ProbeConfig) -> Result<Probe, ProbeError> {
        let mut probe = Probe::discover_default()?;
        let psis = [
            probe.system.psi.as_mut(),
            probe.cgroup.as_mut().and_then(|c| c.psi.as_mut()),
        ];
        for psi in psis.into_iter().flatten() {
            psi.stall_share = config.stall_share;
        }
        Ok(probe)
    }

    fn discover_default() -> Result<Probe, ProbeError> {
        let path = Path::new("/proc/meminfo");
        let meminfo = read(path)?;
        let total = meminfo_value(&meminfo, "MemTotal").ok_or(ProbeError::Missing {
            path: path.into(),
            key: "MemTotal",
        })?;
        Ok(Probe {
            system: System {
                total,
                psi: Psi::new("/proc/pressure/memory".into()),
            },
            cgroup: Cgroup::discover(),
        })
    }

    /// The most memory the daemon's programs can have: RAM, or the tightest cgroup limit.
    pub fn ceiling(&self) -> (u64, &'static str) {
        match self.cgroup.as_ref().and_then(Cgroup::limit) {
            Some(limit) if limit < self.system.total => (limit, "the memory cgroup's limit"),
            _ => (self.system.total, "RAM"),
        }
    }

    /// What the sources say now. `Err` only if `/proc/meminfo` cannot be read.
    pub fn read(&mut self) -> Result<Reading, ProbeError> {
        let path = Path::new("/proc/meminfo");
        let meminfo = read(path)?;
        let available = meminfo_value(&meminfo, "MemAvailable").ok_or(ProbeError::Missing {
            path: path.into(),
            key: "MemAvailable",
        })?;
        let reserve = reserve_for(self.system.total);
        let mut reading = Reading {
            headroom: i64::try_from(available).unwrap_or(i64::MAX) - reserve as i64,
            reserve,
            stalled: self.system.psi.as_mut().is_some_and(Psi::stalled),
            kernel_event: false,
        };
        if let Some(cgroup) = self.cgroup.as_mut() {
            if let Some((_, headroom, reserve)) = cgroup.tightest() {
                if headroom < reading.headroom {
                    reading.headroom = headroom;
                    reading.reserve = reserve;
                }
            }
            reading.stalled |= cgroup.psi.as_mut().is_some_and(Psi::stalled);
            // Reclaim in a cgroup the daemon has to itself is the daemon meeting its own bound.
            reading.kernel_event = cgroup.new_events() && !cgroup.alone();
        }
        Ok(reading)
    }
}

fn read(path: &Path) -> Result<String, ProbeError> {
    fs::read_to_string(path).map_err(|source| ProbeError::Read {
        path: path.into(),
        source,
    })
}

/// A file holding one number, or "max" (v2: no limit).
fn read_number(path: &Path) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    if text == "max" {
        return Some(u64::MAX);
    }
    text.parse().ok()
}

/// A `/proc/meminfo` value, in bytes.
pub fn meminfo_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kib * 1024)
    })
}

/// A `key value` line of `memory.stat` or `memory.events`.
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The `total=` of the `some` line of a PSI file (microseconds stalled).
pub fn parse_psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Finds the daemon's memory cgroup directory from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`: v1 if a `memory` controller hierarchy lists it, else v2.
/// Returns the version, the directory and the mount point of its hierarchy.
pub fn locate(membership: &str, mountinfo: &str) -> Option<(CgroupVersion, PathBuf, PathBuf)> {
    let v1 = membership.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    });
    let (version, path) = match v1 {
        Some(path) => (CgroupVersion::V1, path),
        None => (
            CgroupVersion::V2,
            membership
                .lines()
                .find_map(|line| line.strip_prefix("0::"))?
                .to_string(),
        ),
    };
    let (root, mount) = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        let fstype = right.next()?;
        let options = right.nth(1)?;
        let fields: Vec<&str> = left.split_whitespace().collect();
        let (root, mount) = (*fields.get(3)?, *fields.get(4)?);
        let wanted = match version {
            CgroupVersion::V1 => fstype == "cgroup" && options.split(',').any(|o| o == "memory"),
            CgroupVersion::V2 => fstype == "cgroup2",
        };
        wanted.then(|| (root.to_string(), PathBuf::from(mount)))
    })?;
    // Inside a container the hierarchy is mounted from the container's own cgroup (`root`),
    // and `/proc/self/cgroup` may name paths relative to either.
    let relative = path.strip_prefix(&root).unwrap_or(&path);
    let dir = mount.join(relative.trim_start_matches('/'));
    Some((version, dir, mount))
}

/// The largest cache budget a mount accepts where programs can have `ceiling` bytes (RAM or
/// the cgroup's limit): all of it but the reserve.
pub fn largest_budget(ceiling: u64) -> u64 {
    ceiling.saturating_sub(reserve_for(ceiling))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn meminfo_values_are_bytes() {
        let text = "MemTotal:       24608720 kB\nMemFree:        16000000 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(meminfo_value(text, "MemTotal"), Some(24608720 * 1024));
        assert_eq!(meminfo_value(text, "MemAvailable"), Some(23000000 * 1024));
        assert_eq!(meminfo_value(text, "Mem"), None);
        assert_eq!(meminfo_value(text, "SwapTotal"), None);
    }

    #[test]
    fn stat_values_match_whole_keys() {
        let text = "cache 172032\ninactive_file 81920\ntotal_inactive_file 90000\n";
        assert_eq!(stat_value(text, "inactive_file"), Some(81920));
        assert_eq!(stat_value(text, "total_inactive_file"), Some(90000));
        assert_eq!(stat_value(text, "file"), None);
    }

    #[test]
    fn the_stall_share_decides_what_is_stalled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.pressure");
        let write = |total: u64| {
            let text = format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\n");
            std::fs::write(&path, text).unwrap();
        };
        let mut psis = [0.9, 200.0].map(|stall_share| {
            write(0);
            let mut psi = Psi::new(path.clone()).unwrap();
            psi.stall_share = stall_share;
            assert!(!psi.stalled(), "the first reading has nothing to compare");
            psi
        });
        std::thread::sleep(std::time::Duration::from_millis(10));
        // One second of stalls in at least 10 ms and well under a second.
        write(1_000_000);
        let [contended, calm] = &mut psis;
        assert!(contended.stalled());
        assert!(!calm.stalled());
    }

    #[test]
    fn psi_some_total() {
        let text = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=99\n";
        assert_eq!(parse_psi_some_total(text), Some(1234));
        assert_eq!(parse_psi_some_total("full total=3\n"), None);
    }

    const MOUNTINFO_V1: &str =
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
        32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";

    #[test]
    fn locates_a_v1_memory_cgroup() {
        let membership = "9:name=systemd:/\n4:memory:/jobs/42\n1:cpu:/\n0::/\n";
        let (version, dir, mount) = locate(membership, MOUNTINFO_V1).unwrap();
        assert_eq!(version, CgroupVersion::V1);
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/memory/jobs/42"));
        assert_eq!(mount, PathBuf::from("/sys/fs/cgroup/memory"));
    }

    #[test]
    fn locates_a_v2_cgroup_under_a_container_root() {
        let membership = "0::/pod/app\n";
        let mountinfo = "40 30 0:35 /pod /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let (version, dir, _) = locate(membership, mountinfo).unwrap();
        assert_eq!(version, CgroupVersion::V2);
        assert_eq!(dir, PathBuf::from("/sys/fs/cgroup/app"));
    }

    #[test]
    fn no_hierarchy_no_cgroup() {
        assert_eq!(locate("0::/\n", MOUNTINFO_V1), None);
    }

    #[test]
    fn working_set_leaves_out_inactive_file_pages() {
        let level = Level {
            limit: 1536 * MIB,
            usage: 1400 * MIB,
            inactive_file: 100 * MIB,
        };
        assert_eq!(level.working_set(), 1300 * MIB);
    }

    #[test]
    fn reserve_bounds() {
        assert_eq!(reserve_for(256 * MIB), 128 * MIB);
        assert_eq!(reserve_for(6 * GIB), 384 * MIB);
        assert_eq!(reserve_for(100 * GIB), 512 * MIB);
        assert_eq!(largest_budget(24 * GIB), 24 * GIB - 512 * MIB);
    }
}
