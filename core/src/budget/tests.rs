use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A cache stand-in: full up to its budget at every moment.
#[derive(Default)]
struct FullCache {
    budget: AtomicU64,
}

impl BudgetTarget for FullCache {
    fn set_budget(&self, bytes: u64) {
        self.budget.store(bytes, Ordering::Relaxed);
    }

    fn used(&self) -> u64 {
        self.budget.load(Ordering::Relaxed)
    }
}

fn reading(headroom: i64) -> Reading {
    Reading {
        headroom,
        reserve: 64 * MIB,
        stalled: false,
        kernel_event: false,
    }
}

fn governor(configured: u64) -> (Arc<FullCache>, Governor) {
    let cache = Arc::new(FullCache::default());
    let target: Arc<dyn BudgetTarget> = cache.clone();
    let floor = default_floor(configured);
    (cache, Governor::new(target, configured, floor))
}

#[test]
fn default_floor_is_an_eighth_at_least_256_mib_at_most_the_budget() {
    assert_eq!(default_floor(4 * GIB), 512 * MIB);
    assert_eq!(default_floor(GIB), 256 * MIB);
    assert_eq!(default_floor(128 * MIB), 128 * MIB);
}

#[test]
fn effective_budget_subtracts_other_tiers_but_keeps_the_floor() {
    assert_eq!(effective_budget(4 * GIB, u64::MAX, 0, 512 * MIB), 4 * GIB);
    assert_eq!(effective_budget(4 * GIB, 3 * GIB, GIB, 512 * MIB), 2 * GIB);
    assert_eq!(effective_budget(4 * GIB, GIB, GIB, 512 * MIB), 512 * MIB);
    // A floor above the configured budget cannot raise it.
    assert_eq!(effective_budget(MIB, u64::MAX, 0, 512 * MIB), MIB);
}

/// A full cache beside memory its budget does not steer (headers and indexes).
#[derive(Default)]
struct CacheBesideIndexes {
    cache: FullCache,
    indexes: AtomicU64,
}

impl BudgetTarget for CacheBesideIndexes {
    fn set_budget(&self, bytes: u64) {
        self.cache.set_budget(bytes);
    }

    fn used(&self) -> u64 {
        self.cache.used()
    }

    fn unmanaged(&self) -> u64 {
        self.indexes.load(Ordering::Relaxed)
    }
}

#[test]
fn the_pressure_limit_counts_headers_and_indexes_and_the_cache_gives_way_to_them() {
    let target = Arc::new(CacheBesideIndexes::default());
    target.indexes.store(GIB, Ordering::Relaxed);
    let governor = Governor::new(target.clone(), 4 * GIB, 512 * MIB);
    assert_eq!(
        governor.effective(),
        4 * GIB,
        "no pressure: outside the budget"
    );
    // Holding 5 GiB in all, 512 MiB short: the limit on everything is 5 GiB less the deficit
    // and one step (5 GiB / 8); the cache gets that less the indexes.
    governor.observe(&reading(-512 * (MIB as i64)), Instant::now());
    let limit = 5 * GIB - 512 * MIB - 5 * GIB / GROW_SHARE;
    assert_eq!(governor.effective(), limit - GIB);
    assert_eq!(target.cache.budget.load(Ordering::Relaxed), limit - GIB);
    // More headers indexed under pressure take their room from the cache.
    target.indexes.store(2 * GIB, Ordering::Relaxed);
    governor.set_configured(4 * GIB);
    assert_eq!(governor.effective(), limit - 2 * GIB);
}

#[test]
fn other_tiers_lower_the_cache_budget() {
    let (cache, governor) = governor(4 * GIB);
    governor.set_other_tiers(GIB);
    assert_eq!(cache.used(), 3 * GIB);
    assert_eq!(governor.effective(), 3 * GIB);
    governor.set_other_tiers(0);
    assert_eq!(governor.effective(), 4 * GIB);
}

#[test]
fn a_deficit_gives_back_at_once_plus_one_step() {
    let (cache, governor) = governor(4 * GIB);
    let now = Instant::now();
    assert_eq!(
        governor.observe(&reading(-(GIB as i64)), now),
        Change::Shrunk
    );
    // 4 GiB − 1 GiB deficit − 512 MiB step.
    assert_eq!(cache.used(), 2560 * MIB);
    let snap = governor.snapshot();
    assert_eq!(snap.given_back_bytes, 1536 * MIB);
    assert_eq!(snap.pressure_events, 1);
    assert_eq!(snap.pressure_limit_bytes, Some(2560 * MIB));
    assert_eq!(snap.configured_bytes, 4 * GIB);
}

#[test]
fn shrinking_stops_at_the_floor() {
    let (cache, governor) = governor(4 * GIB);
    governor.observe(&reading(-(100 * GIB as i64)), Instant::now());
    assert_eq!(cache.used(), 512 * MIB);
    assert_eq!(governor.effective(), 512 * MIB);
}

#[test]
fn regrowth_waits_for_calm_then_steps() {
    let (cache, governor) = governor(4 * GIB);
    let t0 = Instant::now();
    governor.observe(&reading(-(3 * GIB as i64)), t0);
    assert_eq!(cache.used(), 512 * MIB);
    // Plenty of room but not calm for long enough: no growth.
    let plenty = reading(100 * GIB as i64);
    assert_eq!(
        governor.observe(&plenty, t0 + Duration::from_secs(2)),
        Change::None
    );
    assert_eq!(
        governor.observe(&plenty, t0 + CALM),
        Change::Grown,
        "grows after the calm period"
    );
    assert_eq!(cache.used(), GIB);
    // One step per GROW_EVERY.
    assert_eq!(
        governor.observe(&plenty, t0 + CALM + GROW_EVERY / 2),
        Change::None
    );
    let mut t = t0 + CALM;
    for _ in 0..10 {
        t += GROW_EVERY;
        governor.observe(&plenty, t);
    }
    assert_eq!(cache.used(), 4 * GIB, "back to the configured budget");
    assert_eq!(governor.snapshot().pressure_limit_bytes, None);
}

#[test]
fn regrowth_only_into_headroom_beyond_a_second_reserve() {
    let (cache, governor) = governor(4 * GIB);
    let t0 = Instant::now();
    governor.observe(&reading(-(3 * GIB as i64)), t0);
    // 100 MiB of headroom with a 64 MiB reserve: grow by 36 MiB only.
    governor.observe(&reading((100 * MIB) as i64), t0 + CALM);
    assert_eq!(cache.used(), 548 * MIB);
    // Headroom within the reserve: no growth.
    governor.observe(&reading((60 * MIB) as i64), t0 + CALM + GROW_EVERY);
    assert_eq!(cache.used(), 548 * MIB);
}

#[test]
fn stalls_block_regrowth_but_do_not_shrink() {
    let (cache, governor) = governor(4 * GIB);
    let t0 = Instant::now();
    governor.observe(&reading(-(GIB as i64)), t0);
    let before = cache.used();
    let mut stalled = reading(100 * GIB as i64);
    stalled.stalled = true;
    assert_eq!(governor.observe(&stalled, t0 + CALM), Change::None);
    assert_eq!(cache.used(), before);
    // The stall restarted the calm period.
    let plenty = reading(100 * GIB as i64);
    assert_eq!(
        governor.observe(&plenty, t0 + CALM + GROW_EVERY),
        Change::None
    );
    assert_eq!(governor.observe(&plenty, t0 + CALM * 2), Change::Grown);
}

#[test]
fn kernel_events_shrink_one_step_per_interval() {
    let (cache, governor) = governor(4 * GIB);
    let t0 = Instant::now();
    let mut event = reading(GIB as i64);
    event.kernel_event = true;
    assert_eq!(governor.observe(&event, t0), Change::Shrunk);
    assert_eq!(cache.used(), 3584 * MIB);
    assert_eq!(
        governor.observe(&event, t0 + Duration::from_millis(100)),
        Change::None
    );
    assert_eq!(governor.observe(&event, t0 + GROW_EVERY), Change::Shrunk);
    assert_eq!(cache.used(), 3 * GIB);
}

#[test]
fn a_new_configured_budget_keeps_the_pressure_limit() {
    let (cache, governor) = governor(4 * GIB);
    governor.observe(&reading(-(GIB as i64)), Instant::now());
    governor.set_configured(8 * GIB);
    assert_eq!(cache.used(), 2560 * MIB);
    governor.set_configured(GIB);
    assert_eq!(cache.used(), GIB);
    assert!(governor.snapshot().floor_bytes <= GIB);
}

#[test]
fn an_impossible_budget_is_clamped_with_one_sentence() {
    let (budget, note) = clamp_budget(100 << 40, 24 * GIB, "RAM");
    assert_eq!(budget, 24 * GIB - 512 * MIB);
    let note = note.unwrap();
    assert!(note.contains("100") && note.contains("RAM"), "{note}");
    assert_eq!(clamp_budget(4 * GIB, 24 * GIB, "RAM"), (4 * GIB, None));
    // Within the ceiling, even inside its reserve: kept.
    assert_eq!(clamp_budget(2 * GIB, 2112 * MIB, "cgroup"), (2 * GIB, None));
    assert_eq!(clamp_budget(2113 * MIB, 2112 * MIB, "cgroup").0, 1980 * MIB);
}

#[test]
fn the_real_cache_shrinks_through_the_governor() {
    use crate::stats::Counters as StatsCounters;
    let cache = Arc::new(ChunkCache::new(
        64 * MIB,
        Arc::new(StatsCounters::default()),
    ));
    let target: Arc<dyn BudgetTarget> = cache.clone();
    let governor = Governor::new(target, 64 * MIB, 16 * MIB);
    governor.observe(&reading(-(32 * MIB as i64)), Instant::now());
    // 64 − 32 deficit − 8 step (nothing is resident, so "held" is 0 and the floor wins).
    assert_eq!(cache.budget(), 16 * MIB);
}

#[test]
fn enormous_budgets_do_not_overflow() {
    let (cache, governor) = governor(u64::MAX);
    governor.set_other_tiers(u64::MAX);
    let t0 = Instant::now();
    governor.observe(&reading(i64::MIN), t0);
    governor.observe(&reading(i64::MAX), t0 + CALM);
    governor.observe(&reading(i64::MAX), t0 + CALM + GROW_EVERY);
    assert!(cache.used() >= default_floor(u64::MAX));
}

#[test]
fn a_shorter_calm_and_larger_steps_regrow_sooner_and_faster() {
    let cache = Arc::new(FullCache::default());
    let target: Arc<dyn BudgetTarget> = cache.clone();
    let config = GovernorConfig {
        calm: Duration::from_secs(1),
        grow_share: 4,
        ..GovernorConfig::default()
    };
    let governor = Governor::with_config(target, 4 * GIB, default_floor(4 * GIB), config);
    assert_eq!(governor.config(), config);
    let t0 = Instant::now();
    governor.observe(&reading(-(3 * GIB as i64)), t0);
    assert_eq!(cache.used(), 512 * MIB);
    let plenty = reading(100 * GIB as i64);
    // Within the default calm period, but past this one.
    assert_eq!(
        governor.observe(&plenty, t0 + Duration::from_secs(1)),
        Change::Grown
    );
    assert_eq!(cache.used(), GIB);
    // Steps of a quarter of the budget, not an eighth.
    governor.observe(&plenty, t0 + Duration::from_secs(2));
    assert_eq!(cache.used(), 2 * GIB);
}
