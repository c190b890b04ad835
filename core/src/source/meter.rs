//! The source's measured speed, per source device of a mount: how long its reads take, how fast
//! it delivers while it is being read, how many reads are in flight, and how many bytes must be
//! in flight to keep it busy (the bandwidth-delay product).
//!
//! **Contract.** Every read of a source file by the daemon (the aligned and the plain reads of
//! [`super::SourceFile`]: chunk loads, prefetch, probes, uncached reads, headers) is one
//! [`SourceMeter::start`] at its issue and one [`InFlight::finish`] with its bytes at its
//! completion, on the meter of its file's device ([`super::SourceIdentity::dev`]); a read that
//! fails is dropped unfinished: it leaves the reads in flight and adds no sample. A mount holds
//! one [`SourceMeters`], one meter per device it read from (a SOURCE that spans file systems
//! reports each). From those events:
//! - **latency**, the time from a read's issue to its completion: smoothed (each read moves the
//!   estimate [`MeterConfig::smoothing_gain`] of the way to its own latency, as TCP smooths its
//!   round trip), the mean since the mount, and quantiles over the recent window;
//! - **the recent window**: the last [`MeterConfig::slots`] × [`MeterConfig::slot_reads`]
//!   reads, in slots of `slot_reads`, the oldest slot cleared when a new one starts. A count,
//!   not a time, so the figures of a source that went idle stay those of its last reads;
//! - **busy time**, the time with at least one read in flight; **throughput while reading** is
//!   bytes / busy time, so idle periods do not dilute it;
//! - **reads in flight** now, their peak, and their mean while busy (time-weighted);
//! - **the bandwidth-delay product**, [`SourceMeter::estimate`].
//!
//! Every figure is exact for the events seen: busy time and the time-weighted reads in flight
//! are integrated at each issue and completion, not sampled.
//!
//! **Locks.** One mutex per meter (through [`crate::sync`]), a leaf, held for a few additions
//! at a read's issue and again at its completion (and, once every `slot_reads` reads, to clear
//! a slot's three histograms of [`BUCKETS`] counters); never across the read. No allocation
//! after the meter is made. [`SourceMeters`]' own lock is taken when a source file is opened,
//! not per read. The cost is a tenth of a microsecond per read, a few thousandths of the
//! cheapest source read ([measured](../../../docs/STATS.md#source)).
//!
//! **Clock.** Times come from a [`Clock`]: [`MonotonicClock`] in the daemon, [`ManualClock`] in
//! tests, which set every latency and busy period exactly (no sleep decides an outcome).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::histogram::{bucket, coarse, quantile_ns, CoarseHistogram, BUCKETS};
use crate::sync::{lock, Mutex};

use super::kind::StorageKind;

/// A monotonic time source for the meter.
pub trait Clock: Send + Sync {
    /// Nanoseconds since an origin of the clock's choosing; never goes back.
    fn now_ns(&self) -> u64;
}

/// The system's monotonic clock, from the moment it was made.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to (tests, of the meter and of what schedules by it).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// Moves the clock `by` forward.
    pub fn advance(&self, by: Duration) {
        let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Tuning of a meter; [`Default`] is what a mount uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeterConfig {
    /// Reads per slot of the recent window: 256 reads of 4 MiB chunks are 1 GiB, seconds of
    /// any source tierfs is worth mounting over, and enough reads for a p99.
    pub slot_reads: u64,
    /// Slots of the window: four, so that clearing the oldest forgets a quarter of it at once.
    pub slots: usize,
    /// How far each read moves the smoothed latency towards its own: 1/8, TCP's gain for its
    /// smoothed round trip (RFC 6298), which follows a change within a few tens of reads.
    pub smoothing_gain: f64,
    /// Reads the window must hold, and a slot to count for the bandwidth, before an estimate
    /// is given: fewer is too few for a low quantile of the latency.
    pub min_reads: u64,
    /// The quantile (by bytes) of the latencies of the window's reads issued while no other
    /// was in flight taken as the source's latency without queueing, when the window holds
    /// `min_reads` of them: the median, as they did not queue.
    pub solo_quantile: f64,
    /// The quantile (by bytes) of all the window's latencies taken instead when it does not:
    /// the low end, where the reads that queued least are (not the minimum, which one read
    /// served from the source's own cache sets).
    pub floor_quantile: f64,
}

impl Default for MeterConfig {
    fn default() -> Self {
        MeterConfig {
            slot_reads: 256,
            slots: 4,
            smoothing_gain: 0.125,
            min_reads: 16,
            solo_quantile: 0.5,
            floor_quantile: 0.1,
        }
    }
}

/// The bandwidth-delay product of a source and what it is made of ([`SourceMeter::estimate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceEstimate {
    /// The best throughput while reading of a slot of the window: what the source delivered
    /// when it was kept busiest.
    pub bandwidth_bytes_per_second: f64,
    /// A read's time when it does not queue behind others ([`SourceMeter::estimate`]).
    pub latency_floor: Duration,
    /// `bandwidth × latency floor`: the bytes in flight that keep the source busy.
    pub bandwidth_delay_bytes: u64,
}

/// The latencies of a set of reads, in the buckets of [`crate::histogram`]: counted (the
/// quantiles shown), and weighted by the reads' bytes, of all reads and of those issued while no
/// other was in flight (the latency floor).
#[derive(Debug)]
struct Latencies {
    reads: u64,
    solo_reads: u64,
    counts: Box<[u64; BUCKETS]>,
    bytes: Box<[u64; BUCKETS]>,
    solo_bytes: Box<[u64; BUCKETS]>,
}

impl Latencies {
    fn new() -> Latencies {
        Latencies {
            reads: 0,
            solo_reads: 0,
            counts: Box::new([0; BUCKETS]),
            bytes: Box::new([0; BUCKETS]),
            solo_bytes: Box::new([0; BUCKETS]),
        }
    }

    fn add(&mut self, at: usize, bytes: u64, alone: bool) {
        self.reads += 1;
        self.counts[at] += 1;
        self.bytes[at] = self.bytes[at].saturating_add(bytes);
        if alone {
            self.solo_reads += 1;
            self.solo_bytes[at] = self.solo_bytes[at].saturating_add(bytes);
        }
    }

    /// Takes `part` (a slot summed into this window) out, and clears it.
    fn take_out(&mut self, part: &mut Latencies) {
        self.reads -= part.reads;
        self.solo_reads -= part.solo_reads;
        for (sums, parts) in [
            (&mut self.counts, &mut part.counts),
            (&mut self.bytes, &mut part.bytes),
            (&mut self.solo_bytes, &mut part.solo_bytes),
        ] {
            for (sum, n) in sums.iter_mut().zip(parts.iter_mut()) {
                *sum -= *n;
                *n = 0;
            }
        }
        (part.reads, part.solo_reads) = (0, 0);
    }
}

/// One slot of the recent window.
#[derive(Debug)]
struct Slot {
    bytes: u64,
    busy_ns: u64,
    latencies: Latencies,
}

/// What a meter's lock guards.
#[derive(Debug)]
struct State {
    in_flight: u64,
    in_flight_peak: u64,
    /// When busy time and reads in flight were last integrated.
    last_event_ns: u64,
    /// Time with at least one read in flight, and the integral of reads in flight over time.
    busy_ns: u64,
    in_flight_ns: u64,
    reads: u64,
    bytes: u64,
    latency_ns: u64,
    smoothed_ns: Option<f64>,
    /// Latencies since the meter was made, counted.
    counts: Box<[u64; BUCKETS]>,
    slots: Vec<Slot>,
    current: usize,
    /// The sum of the slots' latencies.
    window: Latencies,
}

impl State {
    fn new(slots: usize) -> State {
        State {
            in_flight: 0,
            in_flight_peak: 0,
            last_event_ns: 0,
            busy_ns: 0,
            in_flight_ns: 0,
            reads: 0,
            bytes: 0,
            latency_ns: 0,
            smoothed_ns: None,
            counts: Box::new([0; BUCKETS]),
            slots: (0..slots.max(1))
                .map(|_| Slot {
                    bytes: 0,
                    busy_ns: 0,
                    latencies: Latencies::new(),
                })
                .collect(),
            current: 0,
            window: Latencies::new(),
        }
    }

    /// Integrates busy time and reads in flight up to `now`.
    fn accrue(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.last_event_ns);
        self.last_event_ns = self.last_event_ns.max(now);
        if self.in_flight == 0 || elapsed == 0 {
            return;
        }
        self.busy_ns = self.busy_ns.saturating_add(elapsed);
        self.in_flight_ns = self
            .in_flight_ns
            .saturating_add(elapsed.saturating_mul(self.in_flight));
        let slot = &mut self.slots[self.current];
        slot.busy_ns = slot.busy_ns.saturating_add(elapsed);
    }

    /// A read of `bytes` took `latency_ns`; `alone`: no other read was in flight at its issue.
    fn record(&mut self, (latency_ns, bytes, alone): (u64, u64, bool), config: &MeterConfig) {
        self.reads += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        self.latency_ns = self.latency_ns.saturating_add(latency_ns);
        let at = bucket(latency_ns);
        self.counts[at] += 1;
        self.window.add(at, bytes, alone);
        let latency = latency_ns as f64;
        self.smoothed_ns = Some(match self.smoothed_ns {
            Some(smoothed) => smoothed + config.smoothing_gain * (latency - smoothed),
            None => latency,
        });
        let slot = &mut self.slots[self.current];
        slot.bytes = slot.bytes.saturating_add(bytes);
        slot.latencies.add(at, bytes, alone);
        if slot.latencies.reads >= config.slot_reads {
            self.current = (self.current + 1) % self.slots.len();
            let next = &mut self.slots[self.current];
            self.window.take_out(&mut next.latencies);
            (next.bytes, next.busy_ns) = (0, 0);
        }
    }

    fn estimate(&self, config: &MeterConfig) -> Option<SourceEstimate> {
        if self.window.reads < config.min_reads.max(1) {
            return None;
        }
        let enough = config.min_reads.clamp(1, config.slot_reads.max(1));
        let bandwidth = self
            .slots
            .iter()
            .filter(|slot| slot.latencies.reads >= enough && slot.busy_ns > 0)
            .map(|slot| slot.bytes as f64 * 1e9 / slot.busy_ns as f64)
            .max_by(f64::total_cmp)?;
        // Weighted by bytes: by Little's law, bytes in flight are bytes per second times the
        // time a byte spends in flight, so a few small reads (headers) must not set it.
        let floor_ns = if self.window.solo_reads >= config.min_reads.max(1) {
            quantile_ns(&self.window.solo_bytes[..], config.solo_quantile)
        } else {
            quantile_ns(&self.window.bytes[..], config.floor_quantile)
        }?;
        Some(SourceEstimate {
            bandwidth_bytes_per_second: bandwidth,
            latency_floor: Duration::from_nanos(floor_ns),
            bandwidth_delay_bytes: (bandwidth * floor_ns as f64 / 1e9).round() as u64,
        })
    }
}

/// The meter of one source device (see the module docs).
pub struct SourceMeter {
    dev: u64,
    config: MeterConfig,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// What the device is, as the file system says ([`SourceMeter::note_storage`]).
    storage: OnceLock<StorageKind>,
    /// [`SourceMeter::derived`]: milliseconds + 1 when derived (0: never) in the high half,
    /// the value in the low half.
    derived: AtomicU64,
}

impl std::fmt::Debug for SourceMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceMeter")
            .field("device", &device_name(self.dev))
            .finish()
    }
}

/// A read in flight on a [`SourceMeter`]: [`Self::finish`] it with its bytes once it completed;
/// dropped unfinished, it counts as failed (no sample, no longer in flight).
#[must_use = "a read in flight ends with finish(bytes), or is dropped when it fails"]
pub struct InFlight<'a> {
    meter: &'a SourceMeter,
    issued_ns: u64,
    /// No other read was in flight at its issue.
    alone: bool,
    finished: bool,
}

impl InFlight<'_> {
    /// The read completed with `bytes`.
    pub fn finish(mut self, bytes: u64) {
        self.finished = true;
        self.meter.complete(self.issued_ns, self.alone, Some(bytes));
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.meter.complete(self.issued_ns, self.alone, None);
        }
    }
}

impl SourceMeter {
    /// The meter of device `dev`, timed by `clock`.
    pub fn new(dev: u64, config: MeterConfig, clock: Arc<dyn Clock>) -> SourceMeter {
        let mut state = State::new(config.slots);
        state.last_event_ns = clock.now_ns();
        SourceMeter {
            dev,
            config,
            clock,
            state: Mutex::new(state),
            storage: OnceLock::new(),
            derived: AtomicU64::new(0),
        }
    }

    /// A value derived from this meter's figures (the pacing of reads ahead of the device),
    /// derived again by `derive` only when the last one is older than `max_age`: it is asked
    /// for on every read, and the figures it comes from move with whole reads.
    pub fn derived(&self, max_age: Duration, derive: impl FnOnce() -> u32) -> u32 {
        let now_ms = (self.clock.now_ns() / 1_000_000).wrapping_add(1) & u64::from(u32::MAX);
        let memo = self.derived.load(Ordering::Relaxed);
        let at = memo >> 32;
        let max_ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        if at != 0 && now_ms.wrapping_sub(at) & u64::from(u32::MAX) < max_ms {
            return memo as u32;
        }
        let value = derive();
        self.derived
            .store((now_ms << 32) | u64::from(value), Ordering::Relaxed);
        value
    }

    /// Records what the device is, asking `kind` once per meter (the first file measured on
    /// it tells).
    pub fn note_storage(&self, kind: impl FnOnce() -> StorageKind) {
        self.storage.get_or_init(kind);
    }

    /// What the device is ([`StorageKind::Unknown`] before a file told).
    pub fn storage(&self) -> StorageKind {
        self.storage.get().copied().unwrap_or(StorageKind::Unknown)
    }

    /// The device (`SourceIdentity::dev`) this meter measures.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// A read is issued now.
    pub fn start(&self) -> InFlight<'_> {
        let now = self.clock.now_ns();
        let mut state = lock(&self.state);
        state.accrue(now);
        let alone = state.in_flight == 0;
        state.in_flight += 1;
        state.in_flight_peak = state.in_flight_peak.max(state.in_flight);
        InFlight {
            meter: self,
            issued_ns: now,
            alone,
            finished: false,
        }
    }

    /// A read issued at `issued_ns` (`alone` in flight then) completed with `bytes`, or
    /// failed (`None`).
    fn complete(&self, issued_ns: u64, alone: bool, bytes: Option<u64>) {
        let now = self.clock.now_ns();
        let mut state = lock(&self.state);
        state.accrue(now);
        state.in_flight = state.in_flight.saturating_sub(1);
        if let Some(bytes) = bytes {
            let latency = now.saturating_sub(issued_ns);
            state.record((latency, bytes, alone), &self.config);
        }
    }

    /// Reads in flight now.
    pub fn in_flight(&self) -> u64 {
        lock(&self.state).in_flight
    }

    /// The bandwidth-delay product of the source: the best throughput while reading of a slot
    /// of the recent window (what the source delivered when kept busiest), times the latency
    /// of a read that does not queue behind others: the median by bytes
    /// ([`MeterConfig::solo_quantile`]) of the window's reads issued while no other was in
    /// flight, when it holds [`MeterConfig::min_reads`] of them, else the low end by bytes
    /// ([`MeterConfig::floor_quantile`]) of all its reads. By bytes: Little's law counts the
    /// time each byte is in flight, so small reads (headers) weigh little. That many bytes in
    /// flight keep the source busy; fewer leave it idle between reads, more only queue. `None`
    /// until the window holds `min_reads` reads.
    ///
    /// Not the product of the throughput and the latency measured together: by Little's law
    /// that is the mean of the bytes in flight, whatever they are, so sizing reads in flight by
    /// it would only keep them as they are (and queueing, which raises both, would raise it).
    /// A scheduler that never lets the reads in flight fall to one for a whole window sees the
    /// floor rise with its own queueing: it should issue a read alone now and then.
    pub fn estimate(&self) -> Option<SourceEstimate> {
        lock(&self.state).estimate(&self.config)
    }

    /// [`Self::estimate`]'s bytes: what a scheduler sizes the reads in flight to (`None` until
    /// enough reads were seen).
    pub fn bandwidth_delay_bytes(&self) -> Option<u64> {
        self.estimate().map(|e| e.bandwidth_delay_bytes)
    }

    /// Bytes per second of busy time over every read since the mount, once they add up to
    /// `min_bytes`: what one large read already tells of a source, before the window holds
    /// enough reads for [`Self::estimate`].
    pub fn throughput_since_mount(&self, min_bytes: u64) -> Option<f64> {
        let state = lock(&self.state);
        (state.bytes >= min_bytes.max(1) && state.busy_ns > 0)
            .then(|| state.bytes as f64 * 1e9 / state.busy_ns as f64)
    }

    /// The smoothed latency (`None` before the first read completed).
    pub fn smoothed_latency(&self) -> Option<Duration> {
        lock(&self.state)
            .smoothed_ns
            .map(|ns| Duration::from_nanos(ns.round() as u64))
    }

    /// The meter's figures now (the `source.devices[]` entry of the stats).
    pub fn snapshot(&self) -> SourceDeviceSnapshot {
        let now = self.clock.now_ns();
        let mut state = lock(&self.state);
        state.accrue(now);
        let us = |ns: u64| ns as f64 / 1e3;
        let quantile = |q: f64| quantile_ns(&state.window.counts[..], q).map(us);
        let (window_bytes, window_busy) = state
            .slots
            .iter()
            .fold((0u64, 0u64), |(b, t), s| (b + s.bytes, t + s.busy_ns));
        let estimate = state.estimate(&self.config);
        SourceDeviceSnapshot {
            device: device_name(self.dev),
            dev: self.dev,
            storage: self.storage().name(),
            reads: state.reads,
            bytes: state.bytes,
            busy_seconds: state.busy_ns as f64 / 1e9,
            latency_mean_us: (state.reads > 0).then(|| us(state.latency_ns) / state.reads as f64),
            latency_smoothed_us: state.smoothed_ns.map(|ns| ns / 1e3),
            latency_p50_us: quantile(0.5),
            latency_p99_us: quantile(0.99),
            latency_floor_us: estimate.map(|e| us(e.latency_floor.as_nanos() as u64)),
            throughput_bytes_per_second: (window_busy > 0)
                .then(|| window_bytes as f64 * 1e9 / window_busy as f64),
            bandwidth_bytes_per_second: estimate.map(|e| e.bandwidth_bytes_per_second),
            bandwidth_delay_bytes: estimate.map(|e| e.bandwidth_delay_bytes),
            in_flight: state.in_flight,
            in_flight_peak: state.in_flight_peak,
            in_flight_mean: (state.busy_ns > 0)
                .then(|| state.in_flight_ns as f64 / state.busy_ns as f64),
            window_reads: state.window.reads,
            histogram: coarse(state.counts.iter().copied(), state.latency_ns),
        }
    }
}

/// One entry of `source.devices` in the stats document (docs/STATS.md). Figures not measured
/// yet are `None` (`null`).
#[derive(Debug, Clone, Serialize)]
pub struct SourceDeviceSnapshot {
    /// The device as people name it (`MAJOR:MINOR` on Linux, the volume serial number on
    /// Windows).
    pub device: String,
    /// `SourceIdentity::dev`.
    pub dev: u64,
    /// What the file system says the device is ([`StorageKind::name`]).
    pub storage: &'static str,
    /// Reads completed, and their bytes.
    pub reads: u64,
    pub bytes: u64,
    /// Time with at least one read in flight.
    pub busy_seconds: f64,
    /// Latency since the mount (mean), smoothed, and the recent window's p50 and p99 (the
    /// upper bound of their histogram bucket, at most 25 % above the true value).
    pub latency_mean_us: Option<f64>,
    pub latency_smoothed_us: Option<f64>,
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
    /// The latency the bandwidth-delay product is made of ([`SourceEstimate::latency_floor`]).
    pub latency_floor_us: Option<f64>,
    /// Bytes per second of busy time over the recent window.
    pub throughput_bytes_per_second: Option<f64>,
    /// The bandwidth the bandwidth-delay product is made of
    /// ([`SourceEstimate::bandwidth_bytes_per_second`]).
    pub bandwidth_bytes_per_second: Option<f64>,
    /// [`SourceMeter::bandwidth_delay_bytes`].
    pub bandwidth_delay_bytes: Option<u64>,
    /// Reads in flight now, their peak since the mount, and their time-weighted mean while
    /// at least one was.
    pub in_flight: u64,
    pub in_flight_peak: u64,
    pub in_flight_mean: Option<f64>,
    /// Reads the recent window holds.
    pub window_reads: u64,
    /// Latencies since the mount in coarse buckets (not in the JSON: the metrics' histogram).
    #[serde(skip)]
    pub histogram: CoarseHistogram,
}

/// The meters of a mount, one per source device (see the module docs).
pub struct SourceMeters {
    config: MeterConfig,
    clock: Arc<dyn Clock>,
    meters: Mutex<Vec<Arc<SourceMeter>>>,
}

impl std::fmt::Debug for SourceMeters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceMeters")
            .field("config", &self.config)
            .finish()
    }
}

impl Default for SourceMeters {
    fn default() -> Self {
        SourceMeters::new(MeterConfig::default(), Arc::new(MonotonicClock::default()))
    }
}

impl SourceMeters {
    /// Meters tuned by `config`, timed by `clock`.
    pub fn new(config: MeterConfig, clock: Arc<dyn Clock>) -> SourceMeters {
        SourceMeters {
            config,
            clock,
            meters: Mutex::new(Vec::new()),
        }
    }

    /// The meter of device `dev`, made at the first call.
    pub fn for_dev(&self, dev: u64) -> Arc<SourceMeter> {
        let mut meters = lock(&self.meters);
        if let Some(meter) = meters.iter().find(|m| m.dev == dev) {
            return Arc::clone(meter);
        }
        let meter = Arc::new(SourceMeter::new(dev, self.config, Arc::clone(&self.clock)));
        meters.push(Arc::clone(&meter));
        meter
    }

    /// The meter of device `dev`, if the mount read from it.
    pub fn get(&self, dev: u64) -> Option<Arc<SourceMeter>> {
        lock(&self.meters).iter().find(|m| m.dev == dev).cloned()
    }

    /// The lowest throughput while reading ([`SourceMeter::throughput_since_mount`]) among
    /// the devices that delivered at least `min_bytes`; `None` if none did yet.
    pub fn slowest_throughput(&self, min_bytes: u64) -> Option<f64> {
        let meters: Vec<Arc<SourceMeter>> = lock(&self.meters).clone();
        meters
            .iter()
            .filter_map(|m| m.throughput_since_mount(min_bytes))
            .reduce(f64::min)
    }

    /// Every device's figures, by device number.
    pub fn snapshot(&self) -> Vec<SourceDeviceSnapshot> {
        let meters: Vec<Arc<SourceMeter>> = lock(&self.meters).clone();
        let mut devices: Vec<SourceDeviceSnapshot> = meters.iter().map(|m| m.snapshot()).collect();
        devices.sort_by_key(|d| d.dev);
        devices
    }
}

/// `dev` as people name it: `MAJOR:MINOR` (glibc's encoding of `dev_t`) on Linux.
#[cfg(not(windows))]
pub fn device_name(dev: u64) -> String {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
    format!("{major}:{minor}")
}

/// `dev` as people name it: the volume serial number, in hex, on Windows.
#[cfg(windows)]
pub fn device_name(dev: u64) -> String {
    format!("{dev:08X}")
}

#[cfg(test)]
#[path = "meter_tests.rs"]
mod tests;
