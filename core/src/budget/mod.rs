//! The budget governor: `--ram-cache` is a ceiling, not a reservation.
//!
//! The kernel page cache that tierfs replaces is reclaimed when a program needs the memory;
//! tierfs's chunks are anonymous memory, which nothing reclaims (there is usually no swap), so
//! without this module the daemon, holding the largest RSS around, is what the OOM killer
//! takes when a loader grows. The governor keeps three figures:
//!
//! - the **configured** budget (`--ram-cache`, or `tierfs ctl ram-cache`), clamped at mount to
//!   what the machine or the memory cgroup can hold ([`probe::largest_budget`]);
//! - the **floor** (`--ram-cache-min`), below which the cache never shrinks: by default
//!   [`default_floor`], an eighth of the budget, at least 256 MiB;
//! - the **pressure limit** on everything tierfs holds, lowered when memory runs short and
//!   raised back when it has been plentiful for a while.
//!
//! The cache gets the **effective** budget `max(floor, min(configured, pressure limit) − other
//! tiers)`, where other tiers ([`Governor::set_other_tiers`]) is memory tierfs holds outside the
//! chunk cache. Shrinking goes through [`ChunkCache::set_budget`], which evicts in the cache's
//! own order: chunks needed furthest in the future first.
//!
//! **Unmanaged memory** ([`BudgetTarget::unmanaged`]): the headers and indexes of known model
//! files are held to their own cap (`--index-cache`), outside the configured budget, and the
//! budget cannot shrink them (open files need theirs). The pressure limit is on everything
//! tierfs holds, so it counts them: the cache gets the limit less what they hold, and headers
//! indexed under pressure take their room from the cache rather than from other programs.
//!
//! ## Policy ([`Policy`]; the constants below)
//! A watcher thread ([`watch`]) reads the sources every [`POLL`] and at once when the kernel
//! signals (v1: usage crossing the limit minus the reserve, `memory.pressure_level`). Each
//! reading gives the *headroom*: bytes left before the tightest source (`MemAvailable` of the
//! machine, each memory cgroup level's limit minus its working set) is within its reserve
//! ([`probe::reserve_for`]).
//! - **Deficit** (headroom < 0): the limit drops at once to what tierfs holds minus the deficit
//!   minus one growth step ([`GROW_SHARE`]), so a program that keeps growing finds room
//!   already made instead of causing one event per poll.
//! - **Kernel event** (v1 `medium` pressure level, v2 `high`/`max`/`oom` events): the kernel is
//!   reclaiming hard in the daemon's cgroup: give back one step, at most once per
//!   [`GROW_EVERY`].
//! - **Stalls** (PSI "some" over 10 % of the time, system-wide or the v2 cgroup's): no action
//!   but no regrowth either. System-wide PSI also counts stalls in other cgroups, so it is no
//!   reason to give memory back.
//! - **Calm** for [`CALM`] (no deficit, event or stall): the limit grows by one step every
//!   [`GROW_EVERY`], and only into headroom beyond a second reserve (the hysteresis in space:
//!   shrink below one reserve, grow only above two), counting budget not yet filled as used.
//!   At the configured budget the limit is lifted.
//!
//! Measured: the governor lets a program allocate into a full cache's cgroup where a daemon
//! without it is OOM-killed, at no cost without pressure
//! ([measured](../../../docs/PERFORMANCE.md#memory-pressure-governor)).
//!
//! Locks: one mutex (the state), a leaf taken through [`crate::sync`]; the target's budget is
//! set after it is released. The clocks and step size are a [`GovernorConfig`].

pub mod probe;
#[cfg(target_os = "linux")]
pub mod watch;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cache::ChunkCache;
use crate::models::ModelStore;
use crate::size::format_size;
use crate::stats::Counters;
use crate::sync::{lock, Mutex, MutexGuard};
pub use probe::{Probe, Reading};

const MIB: u64 = 1 << 20;

/// How often the watcher reads the sources when the kernel does not wake it: cheap when idle,
/// and what a fast program allocates in one period fits the system reserve
/// ([measured](../../../docs/PERFORMANCE.md#memory-pressure-governor)).
pub const POLL: Duration = Duration::from_millis(50);

/// How long memory must stay plentiful before the cache grows back. Loaders and samplers
/// allocate in bursts (a model load, a sampling step of 0.1–2 s, a VAE decode); 5 s spans
/// several steps, so the cache does not grow back between two bursts of the same job only to
/// be evicted again (each round trip costs disk reads of what was given back).
pub const CALM: Duration = Duration::from_secs(5);

/// Interval between two growth steps (and between two shrink steps on kernel events).
pub const GROW_EVERY: Duration = Duration::from_secs(1);

/// One step is this share of the configured budget: an eighth, so that from the floor the
/// cache is back to its full budget 8 s after the calm period, and a step taken too early
/// costs at most an eighth of the budget to give back.
pub const GROW_SHARE: u64 = 8;

/// The governor's clocks and step size; [`Default`] is the constants above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GovernorConfig {
    /// How often the watcher reads the sources when the kernel does not wake it ([`POLL`]).
    pub poll: Duration,
    /// How long memory must stay plentiful before the cache grows back ([`CALM`]).
    pub calm: Duration,
    /// Interval between two growth steps, and between two shrink steps on kernel events
    /// ([`GROW_EVERY`]).
    pub grow_every: Duration,
    /// One step is `1 / grow_share` of the configured budget ([`GROW_SHARE`]).
    pub grow_share: u64,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        GovernorConfig {
            poll: POLL,
            calm: CALM,
            grow_every: GROW_EVERY,
            grow_share: GROW_SHARE,
        }
    }
}

/// The default floor (see the module docs): an eighth of the budget and at least 256 MiB, but
/// never more than the budget. 256 MiB keeps the read path working as designed: reads in
/// flight may reserve half the budget, and 8 request threads plus 4 prefetch workers each
/// reading 4 MiB chunks need 48 MiB in flight, with the rest holding the chunks readers are
/// between requests of (a 64 MiB budget in the stress test already ran without stalls). An
/// eighth keeps the block order's head resident on large budgets, so repeated passes keep
/// part of their hit rate while the machine is short.
pub fn default_floor(configured: u64) -> u64 {
    configured.min((256 * MIB).max(configured / 8))
}

/// What the governor steers: the cache budget.
pub trait BudgetTarget: Send + Sync {
    fn set_budget(&self, bytes: u64);
    /// The floor in force, passed before each budget: a target that shares its budget with
    /// other tiers keeps at least this much for its cache.
    fn set_floor(&self, _bytes: u64) {}
    /// Bytes held now (resident chunks and reads in flight).
    fn used(&self) -> u64;
    /// Memory the target holds that its budget does not steer: the headers and indexes of
    /// known model files, under their own cap (`--index-cache`). The pressure limit covers it
    /// (see "Unmanaged memory" in the module docs).
    fn unmanaged(&self) -> u64 {
        0
    }
}

impl BudgetTarget for ChunkCache {
    fn set_budget(&self, bytes: u64) {
        ChunkCache::set_budget(self, bytes);
    }

    fn used(&self) -> u64 {
        self.snapshot().used_bytes
    }
}

impl BudgetTarget for ModelStore {
    fn set_budget(&self, bytes: u64) {
        // The store splits the budget between the chunk cache and passthrough files.
        ModelStore::set_budget(self, bytes);
    }

    fn set_floor(&self, bytes: u64) {
        ModelStore::set_chunk_floor(self, bytes);
    }

    fn used(&self) -> u64 {
        self.cache().snapshot().used_bytes + self.passthrough_held_bytes()
    }

    fn unmanaged(&self) -> u64 {
        self.index_snapshot().index_bytes
    }
}

/// The pressure limit and its clocks: the policy of the module docs, free of I/O.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Limit on everything tierfs holds; `u64::MAX` when there is no pressure.
    pub limit: u64,
    last_pressure: Option<Instant>,
    last_step: Option<Instant>,
    config: GovernorConfig,
}

/// What a reading changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    Shrunk,
    Grown,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::with_config(GovernorConfig::default())
    }
}

/// What the policy needs to know about tierfs besides the reading.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    pub configured: u64,
    /// Bytes tierfs holds now (cache and other tiers).
    pub held: u64,
    /// Bytes tierfs may hold under the current budget (filled or not).
    pub allowed: u64,
}

impl Policy {
    /// No pressure yet, steered by `config`.
    pub fn with_config(config: GovernorConfig) -> Policy {
        Policy {
            limit: u64::MAX,
            last_pressure: None,
            last_step: None,
            config,
        }
    }

    pub fn step(&mut self, reading: &Reading, me: Held, now: Instant) -> Change {
        let step = (me.configured / self.config.grow_share.max(1)).max(1);
        let stepped_recently = self
            .last_step
            .is_some_and(|t| now.duration_since(t) < self.config.grow_every);
        if reading.headroom < 0 {
            let deficit = reading.headroom.unsigned_abs();
            self.last_pressure = Some(now);
            self.last_step = Some(now);
            return self.lower(me.held.saturating_sub(deficit.saturating_add(step)));
        }
        if reading.kernel_event {
            self.last_pressure = Some(now);
            if stepped_recently {
                return Change::None;
            }
            self.last_step = Some(now);
            return self.lower(me.held.saturating_sub(step));
        }
        if reading.stalled {
            self.last_pressure = Some(now);
            return Change::None;
        }
        let calm = self
            .last_pressure
            .is_none_or(|t| now.duration_since(t) >= self.config.calm);
        if self.limit == u64::MAX || !calm || stepped_recently {
            return Change::None;
        }
        // Budget not filled yet is as good as used: it fills as soon as a reader reads.
        let committed = i64::try_from(me.allowed.saturating_sub(me.held)).unwrap_or(i64::MAX);
        let reserve = i64::try_from(reading.reserve).unwrap_or(i64::MAX);
        let spare = reading
            .headroom
            .saturating_sub(committed)
            .saturating_sub(reserve);
        if spare <= 0 {
            return Change::None;
        }
        self.last_step = Some(now);
        let grown = self
            .limit
            .min(me.allowed)
            .saturating_add(step.min(spare as u64));
        self.limit = if grown >= me.configured {
            u64::MAX
        } else {
            grown
        };
        Change::Grown
    }

    fn lower(&mut self, to: u64) -> Change {
        if to >= self.limit {
            return Change::None;
        }
        self.limit = to;
        Change::Shrunk
    }
}

/// The `budget` section of the stats document.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetSnapshot {
    /// `--ram-cache` (or the last `ram-cache` command), after the mount-time clamp.
    pub configured_bytes: u64,
    /// The budget in force.
    pub effective_bytes: u64,
    pub floor_bytes: u64,
    /// Memory tierfs holds outside the chunk cache, counted against the budget.
    pub other_tiers_bytes: u64,
    /// Limit on everything tierfs holds set by memory pressure; `null` when there is none.
    pub pressure_limit_bytes: Option<u64>,
    /// Times the governor lowered the limit.
    pub pressure_events: u64,
    /// Cache bytes given back to the system under pressure.
    pub given_back_bytes: u64,
    /// Times the limit was raised again after pressure.
    pub regrow_steps: u64,
    /// What is watched: "system", "cgroup v1 DIR", "cgroup v2 DIR".
    pub watching: Vec<String>,
    /// The daemon's `/proc/self/oom_score_adj`.
    pub oom_score_adj: Option<i32>,
}

struct State {
    configured: u64,
    floor: u64,
    other_tiers: u64,
    policy: Policy,
    applied: u64,
    watching: Vec<String>,
}

/// Steers the cache budget between the floor and the configured budget.
pub struct Governor {
    config: GovernorConfig,
    target: Arc<dyn BudgetTarget>,
    state: Mutex<State>,
    pressure_events: AtomicU64,
    given_back: AtomicU64,
    regrow_steps: AtomicU64,
}

impl Governor {
    /// A governor for `target` with `configured` bytes (the mount-time clamp already applied)
    /// and `floor` (at most `configured`). Sets the target's budget.
    pub fn new(target: Arc<dyn BudgetTarget>, configured: u64, floor: u64) -> Governor {
        Governor::with_config(target, configured, floor, GovernorConfig::default())
    }

    /// [`Governor::new`] with other clocks and step size than the defaults.
    pub fn with_config(
        target: Arc<dyn BudgetTarget>,
        configured: u64,
        floor: u64,
        config: GovernorConfig,
    ) -> Governor {
        let governor = Governor {
            config,
            target,
            state: Mutex::new(State {
                configured,
                floor: floor.min(configured),
                other_tiers: 0,
                policy: Policy::with_config(config),
                applied: configured,
                watching: Vec::new(),
            }),
            pressure_events: AtomicU64::new(0),
            given_back: AtomicU64::new(0),
            regrow_steps: AtomicU64::new(0),
        };
        governor.apply(governor.lock());
        governor
    }

    /// A new configured budget (`tierfs ctl MNT ram-cache SIZE`). The floor stays what it was,
    /// but never above the budget; pressure in force keeps limiting it.
    pub fn set_configured(&self, bytes: u64) {
        let mut state = self.lock();
        state.configured = bytes;
        state.floor = state.floor.min(bytes);
        self.apply(state);
    }

    /// Memory tierfs holds outside the chunk cache (for example the page cache of files it
    /// serves by passthrough), counted against the budget.
    pub fn set_other_tiers(&self, bytes: u64) {
        let mut state = self.lock();
        state.other_tiers = bytes;
        self.apply(state);
    }

    /// The clocks and step size this governor runs with.
    pub fn config(&self) -> GovernorConfig {
        self.config
    }

    /// The budget in force.
    pub fn effective(&self) -> u64 {
        self.lock().applied
    }

    /// Takes one reading into account (called by the watcher; tests call it directly).
    pub fn observe(&self, reading: &Reading, now: Instant) -> Change {
        let mut state = self.lock();
        let used = self.target.used();
        let besides = state.other_tiers.saturating_add(self.target.unmanaged());
        let held = Held {
            configured: state.configured.saturating_add(besides),
            held: used.saturating_add(besides),
            allowed: state.applied.saturating_add(besides),
        };
        let change = state.policy.step(reading, held, now);
        let limit = state.policy.limit;
        match change {
            Change::None => return change,
            Change::Shrunk => Counters::add(&self.pressure_events, 1),
            Change::Grown => Counters::add(&self.regrow_steps, 1),
        }
        let started = Instant::now();
        self.apply(state);
        if change == Change::Shrunk {
            let freed = used.saturating_sub(self.target.used());
            Counters::add(&self.given_back, freed);
            tracing::info!(
                headroom = reading.headroom,
                limit,
                freed,
                micros = started.elapsed().as_micros() as u64,
                "memory pressure: gave cache memory back"
            );
        }
        change
    }

    /// Records what the watcher watches, for the stats.
    pub fn set_watching(&self, watching: Vec<String>) {
        self.lock().watching = watching;
    }

    pub fn snapshot(&self) -> BudgetSnapshot {
        let state = self.lock();
        BudgetSnapshot {
            configured_bytes: state.configured,
            effective_bytes: state.applied,
            floor_bytes: state.floor,
            other_tiers_bytes: state.other_tiers,
            pressure_limit_bytes: (state.policy.limit != u64::MAX).then_some(state.policy.limit),
            pressure_events: Counters::get(&self.pressure_events),
            given_back_bytes: Counters::get(&self.given_back),
            regrow_steps: Counters::get(&self.regrow_steps),
            watching: state.watching.clone(),
            oom_score_adj: oom_score_adj(),
        }
    }

    /// Sets the target's budget from the state; the lock is released before evicting.
    fn apply(&self, mut state: MutexGuard<'_, State>) {
        let effective = effective_budget(
            state.configured,
            state.policy.limit.saturating_sub(self.target.unmanaged()),
            state.other_tiers,
            state.floor,
        );
        state.applied = effective;
        let floor = state.floor;
        drop(state);
        self.target.set_floor(floor);
        self.target.set_budget(effective);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// The budget a mount runs with when `requested` is asked for where programs can have
/// `ceiling` bytes (RAM or the memory cgroup's limit, named by `what`): the request if it is
/// within the ceiling, else the ceiling less its reserve, with the one sentence that says so.
/// A request within the ceiling is kept even if it leaves less than the reserve: the daemon
/// may be alone in a cgroup sized for it (the benchmark's budget + 64 MiB), and where it is
/// not, the governor takes the reserve back as soon as another program needs it.
pub fn clamp_budget(requested: u64, ceiling: u64, what: &str) -> (u64, Option<String>) {
    if requested <= ceiling {
        return (requested, None);
    }
    let largest = probe::largest_budget(ceiling);
    let note = format!(
        "--ram-cache {} is more than this machine can hold ({what}: {}); using {}, which \
         shrinks further under memory pressure",
        format_size(requested),
        format_size(ceiling),
        format_size(largest)
    );
    (largest, Some(note))
}

/// `max(floor, min(configured, limit) − other tiers)`.
pub fn effective_budget(configured: u64, limit: u64, other_tiers: u64, floor: u64) -> u64 {
    configured
        .min(limit)
        .saturating_sub(other_tiers)
        .max(floor.min(configured))
}

/// The daemon's `oom_score_adj` (Linux only: the pressure watcher is Linux-only).
#[cfg(target_os = "linux")]
fn oom_score_adj() -> Option<i32> {
    watch::oom_score_adj()
}

#[cfg(not(target_os = "linux"))]
fn oom_score_adj() -> Option<i32> {
    None
}

#[cfg(test)]
mod tests;
