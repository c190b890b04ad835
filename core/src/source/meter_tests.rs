//! Tests of the source meter, on a [`ManualClock`]: every latency and busy period is set by the
//! test, none by a sleep.

use super::*;

const MIB: u64 = 1 << 20;

fn meter_with(config: MeterConfig) -> (Arc<ManualClock>, SourceMeter) {
    let clock = Arc::new(ManualClock::default());
    let meter = SourceMeter::new(7, config, Arc::clone(&clock) as Arc<dyn Clock>);
    (clock, meter)
}

fn meter() -> (Arc<ManualClock>, SourceMeter) {
    meter_with(MeterConfig::default())
}

/// `n` reads of `bytes`, one at a time, each taking `latency`, with `idle` between them.
fn serial_reads(
    clock: &ManualClock,
    meter: &SourceMeter,
    n: usize,
    (bytes, latency, idle): (u64, Duration, Duration),
) {
    for _ in 0..n {
        let read = meter.start();
        clock.advance(latency);
        read.finish(bytes);
        clock.advance(idle);
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn serial_reads_give_their_latency_and_a_throughput_undiluted_by_idle_time() {
    let (clock, meter) = meter();
    serial_reads(
        &clock,
        &meter,
        20,
        (4 * MIB, ms(10), Duration::from_secs(1)),
    );
    let s = meter.snapshot();
    assert_eq!((s.reads, s.bytes, s.window_reads), (20, 80 * MIB, 20));
    assert!((s.busy_seconds - 0.2).abs() < 1e-9, "{s:?}");
    assert_eq!(s.latency_mean_us, Some(10_000.0));
    assert_eq!(s.latency_smoothed_us, Some(10_000.0));
    // Quantiles are their bucket's upper bound: at most 25 % above.
    for q in [s.latency_p50_us, s.latency_p99_us] {
        let q = q.unwrap();
        assert!((10_000.0..=12_500.0).contains(&q), "{s:?}");
    }
    // 4 MiB per 10 ms of busy time, though 20 s went by.
    let throughput = s.throughput_bytes_per_second.unwrap();
    assert!((throughput - 4.0 * MIB as f64 * 100.0).abs() < 1.0, "{s:?}");
    assert_eq!((s.in_flight, s.in_flight_peak), (0, 1));
    assert_eq!(s.in_flight_mean, Some(1.0));
    assert_eq!(s.histogram.count, 20);
    assert!((s.histogram.sum_seconds - 0.2).abs() < 1e-9);
}

#[test]
fn the_bandwidth_delay_product_waits_for_enough_reads() {
    let (clock, meter) = meter();
    let min = MeterConfig::default().min_reads as usize;
    serial_reads(&clock, &meter, min - 1, (4 * MIB, ms(10), ms(5)));
    assert_eq!(meter.bandwidth_delay_bytes(), None);
    assert_eq!(meter.snapshot().bandwidth_delay_bytes, None);
    serial_reads(&clock, &meter, 1, (4 * MIB, ms(10), ms(5)));
    // One 4 MiB read per 10 ms, alone: one read in flight keeps it busy (the floor is
    // its bucket's upper bound, up to 25 % above 10 ms).
    let bdp = meter.bandwidth_delay_bytes().unwrap();
    assert!((4 * MIB..=5 * MIB).contains(&bdp), "{bdp}");
    let estimate = meter.estimate().unwrap();
    assert!((estimate.bandwidth_bytes_per_second - 400.0 * MIB as f64).abs() < 1.0);
    assert!((ms(10)..=ms(13)).contains(&estimate.latency_floor));
}

#[test]
fn overlapping_reads_count_busy_time_once() {
    let (clock, meter) = meter();
    let a = meter.start();
    let b = meter.start();
    assert_eq!(meter.in_flight(), 2);
    clock.advance(ms(10));
    a.finish(MIB);
    clock.advance(ms(10));
    b.finish(MIB);
    clock.advance(ms(100)); // idle
    let s = meter.snapshot();
    assert!((s.busy_seconds - 0.020).abs() < 1e-9, "{s:?}");
    // Two in flight for 10 ms, one for 10 ms.
    assert!((s.in_flight_mean.unwrap() - 1.5).abs() < 1e-9, "{s:?}");
    assert_eq!((s.in_flight, s.in_flight_peak), (0, 2));
    assert_eq!(s.latency_mean_us, Some(15_000.0));
    let throughput = s.throughput_bytes_per_second.unwrap();
    assert!((throughput - 100.0 * MIB as f64).abs() < 1.0, "{s:?}");
}

#[test]
fn a_failed_read_leaves_the_reads_in_flight_and_adds_no_sample() {
    let (clock, meter) = meter();
    let read = meter.start();
    clock.advance(ms(30));
    assert_eq!(meter.snapshot().in_flight, 1, "a read in flight is shown");
    drop(read);
    let s = meter.snapshot();
    assert_eq!(
        (s.in_flight, s.in_flight_peak, s.reads, s.bytes),
        (0, 1, 0, 0)
    );
    assert_eq!(s.latency_mean_us, None);
    assert_eq!(s.latency_p50_us, None);
    assert!(
        (s.busy_seconds - 0.030).abs() < 1e-9,
        "the source was busy with it: {s:?}"
    );
    assert_eq!(meter.smoothed_latency(), None);
}

#[test]
fn a_read_still_in_flight_counts_as_busy_time() {
    let (clock, meter) = meter();
    let read = meter.start();
    clock.advance(ms(250));
    let s = meter.snapshot();
    assert!((s.busy_seconds - 0.25).abs() < 1e-9, "{s:?}");
    read.finish(MIB);
    assert!((meter.snapshot().busy_seconds - 0.25).abs() < 1e-9);
}

#[test]
fn the_smoothed_latency_follows_a_change_and_the_window_forgets_old_reads() {
    let config = MeterConfig {
        slot_reads: 8,
        slots: 2,
        min_reads: 4,
        ..MeterConfig::default()
    };
    let (clock, meter) = meter_with(config);
    serial_reads(&clock, &meter, 16, (MIB, ms(1), ms(1)));
    serial_reads(&clock, &meter, 16, (MIB, ms(20), ms(1)));
    let s = meter.snapshot();
    assert_eq!(
        (s.reads, s.window_reads),
        (32, 8),
        "a slot was just cleared"
    );
    // The window holds only 20 ms reads; the mean since the mount holds both.
    assert!(
        (20_000.0..=25_000.0).contains(&s.latency_p50_us.unwrap()),
        "{s:?}"
    );
    assert!(
        (20_000.0..=25_000.0).contains(&s.latency_floor_us.unwrap()),
        "{s:?}"
    );
    assert!(
        (s.latency_mean_us.unwrap() - 10_500.0).abs() < 1e-6,
        "{s:?}"
    );
    // 16 reads at a gain of 1/8 close all but (7/8)^16 = 12 % of the gap.
    let smoothed = meter.smoothed_latency().unwrap();
    assert!((ms(17)..ms(20)).contains(&smoothed), "{smoothed:?}");
    // 1 MiB per 20 ms now, though the window was 1 MiB per ms before.
    let bandwidth = meter.estimate().unwrap().bandwidth_bytes_per_second;
    assert!((bandwidth - 50.0 * MIB as f64).abs() < 1.0, "{bandwidth}");
}

#[test]
fn queueing_behind_other_reads_does_not_raise_the_bandwidth_delay_product() {
    // A source that serves one 4 MiB read per 10 ms, one at a time: 400 MiB/s, 10 ms.
    let (clock, meter) = meter();
    serial_reads(&clock, &meter, 16, (4 * MIB, ms(10), ms(1)));
    let alone = meter.bandwidth_delay_bytes().unwrap();
    // Then four kept in flight: each completes 10 ms after the one before, having waited
    // 40 ms. The throughput is the same; the latency seen quadruples.
    let mut in_flight: std::collections::VecDeque<InFlight<'_>> =
        (0..4).map(|_| meter.start()).collect();
    for _ in 0..200 {
        clock.advance(ms(10));
        if let Some(read) = in_flight.pop_front() {
            read.finish(4 * MIB);
        }
        in_flight.push_back(meter.start());
    }
    let s = meter.snapshot();
    assert!(s.latency_p50_us.unwrap() >= 30_000.0, "{s:?}");
    assert_eq!(s.in_flight_peak, 4);
    let queued = meter.bandwidth_delay_bytes().unwrap();
    // Still one read's worth: the floor comes from the reads issued alone.
    assert!(
        (4 * MIB..=5 * MIB).contains(&queued),
        "{alone} then {queued}"
    );
    drop(in_flight);
    assert_eq!(meter.in_flight(), 0);
}

#[test]
fn parallel_reads_of_a_high_latency_source_need_several_in_flight() {
    // An object store: 50 ms to answer any read, four at once without slowing. Slots of 16
    // reads, so that the window's best slot is one of four at once.
    let (clock, meter) = meter_with(MeterConfig {
        slot_reads: 16,
        ..MeterConfig::default()
    });
    serial_reads(&clock, &meter, 16, (4 * MIB, ms(50), Duration::ZERO));
    for _ in 0..16 {
        let reads: Vec<InFlight<'_>> = (0..4).map(|_| meter.start()).collect();
        clock.advance(ms(50));
        reads.into_iter().for_each(|read| read.finish(4 * MIB));
    }
    // 16 MiB per 50 ms at best, 50 ms alone: 16 MiB in flight keep it busy.
    let estimate = meter.estimate().unwrap();
    assert!((estimate.bandwidth_bytes_per_second - 320.0 * MIB as f64).abs() < 1.0);
    let bdp = meter.bandwidth_delay_bytes().unwrap();
    assert!((16 * MIB..=20 * MIB).contains(&bdp), "{bdp}");
}

#[test]
fn a_mount_has_one_meter_per_device() {
    let clock = Arc::new(ManualClock::default());
    let meters = SourceMeters::new(MeterConfig::default(), clock.clone());
    let a = meters.for_dev(2049);
    assert!(Arc::ptr_eq(&a, &meters.for_dev(2049)));
    let b = meters.for_dev(17);
    assert!(meters.get(99).is_none());
    let read = b.start();
    clock.advance(ms(2));
    read.finish(100);
    let devices = meters.snapshot();
    assert_eq!(
        devices.iter().map(|d| d.dev).collect::<Vec<_>>(),
        [17, 2049]
    );
    assert_eq!((devices[0].reads, devices[1].reads), (1, 0));
    #[cfg(not(windows))]
    assert_eq!(devices[1].device, "8:1");
}

#[test]
fn reads_from_many_threads_lose_nothing() {
    let meter = SourceMeter::new(
        1,
        MeterConfig::default(),
        Arc::new(MonotonicClock::default()),
    );
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for i in 0..2_000u64 {
                    let read = meter.start();
                    if i % 10 == 0 {
                        drop(read);
                    } else {
                        read.finish(4096);
                    }
                }
            });
        }
    });
    let s = meter.snapshot();
    assert_eq!((s.reads, s.bytes, s.in_flight), (7_200, 7_200 * 4096, 0));
    assert!((1..=4).contains(&s.in_flight_peak), "{s:?}");
}

#[test]
fn small_reads_do_not_set_the_latency_of_the_bytes() {
    // Headers: 4 KiB in 0.2 ms; chunks: 4 MiB in 10 ms; as many of each, all alone.
    let (clock, meter) = meter();
    for _ in 0..16 {
        serial_reads(&clock, &meter, 1, (4096, Duration::from_micros(200), ms(1)));
        serial_reads(&clock, &meter, 1, (4 * MIB, ms(10), ms(1)));
    }
    let s = meter.snapshot();
    // Half the reads are fast, p50 is one of them; almost every byte took 10 ms.
    assert!(s.latency_p50_us.unwrap() <= 250.0, "{s:?}");
    let estimate = meter.estimate().unwrap();
    assert!(
        (ms(10)..=ms(13)).contains(&estimate.latency_floor),
        "{estimate:?}"
    );
    assert!(estimate.bandwidth_delay_bytes >= 4 * MIB, "{estimate:?}");
}

#[test]
fn without_reads_issued_alone_the_floor_is_the_low_end_of_all() {
    // A long read always in flight, so no other is issued alone: 36 reads take 20 ms, 3 are
    // answered from the source's own cache in 1 ms. The low end is the 20 ms ones, not the
    // few that were faster than the source.
    let (clock, meter) = meter();
    let background = meter.start();
    for i in 0..39 {
        let latency = if i % 13 == 0 { ms(1) } else { ms(20) };
        serial_reads(&clock, &meter, 1, (MIB, latency, Duration::ZERO));
    }
    let estimate = meter.estimate().unwrap();
    assert!(
        (ms(20)..=ms(25)).contains(&estimate.latency_floor),
        "{estimate:?}"
    );
    drop(background);
}
