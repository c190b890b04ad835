//! How reads ahead of a reader go to a file's source: chunk by chunk in parallel, or as few
//! large requests in file order, and how many of those in flight.
//!
//! **Contract.** [`Pacing::for_source`] decides from what the mount measured of the source
//! ([`SourceSpeed`]) and, until it measured enough, what the file system says it is
//! ([`StorageKind`]), nothing else:
//! - **Parallel** (measured at or above [`PacingConfig::ordered_below_bytes_per_second`], or
//!   not measured yet and not a network file system): chunks are read ahead by the prefetch
//!   pool's workers, several at once, each chunk its own request. Flash serves many requests
//!   at once as fast as one large one.
//! - **Ordered** (measured slower than the threshold, or not measured yet and a network or
//!   FUSE file system): reads ahead go to one lane in the order they were queued (file order
//!   within a block, blocks in the learned order), adjacent queued chunks joined into one
//!   request of up to [`PacingConfig::request_bytes`], with `depth` requests in flight: one,
//!   plus as many as it takes to cover the source's latency beyond one request's own transfer
//!   (the bandwidth-delay product, [`SourceEstimate::bandwidth_delay_bytes`], less one request,
//!   over the request size, rounded up once it is past [`PacingConfig::depth_slack`]), at most
//!   [`PacingConfig::max_depth`]. The estimate's latency is that of reads issued alone, so a
//!   second request in flight, queueing behind the first, does not raise it. Such a source
//!   charges a seek or a round trip per request, so fewer, larger, contiguous requests are
//!   what reaches its sequential speed ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)).
//!   Requests start at [`PacingConfig::first_request_bytes`] until the source is measured, and
//!   never take more than [`PacingConfig::deadline_share`] of the source's deadline
//!   (`--source-timeout`) at its measured bandwidth: a large request on a slow link must not
//!   time out where the chunk alone would not.
//!
//! - **An object store** read by tierfs's own client ([`StorageKind::ObjectStore`]) is read in
//!   parallel whatever its measured speed: the store serves many requests at once, and
//!   requests in parallel are what hides its round trips (a 1 Gbit/s SeaweedFS S3 gateway:
//!   0.95 of its limit in parallel, 0.83 in one ordered lane,
//!   [measured](../../../docs/PERFORMANCE.md#models-in-an-object-store)).
//!
//! A measurement overrides the kind both ways: a FUSE file system may sit on local flash. A
//! device that says it rotates is read in parallel until measured: many virtual disks say they
//! rotate, and a real hard disk is measured slow within its first request's worth.

use std::time::Duration;

use crate::source::kind::StorageKind;
use crate::source::meter::SourceEstimate;

/// Who decides the pacing: the rule of the module docs, or the user (`--source-pacing`), for a
/// source the rule misjudges (a FUSE file system over local flash, a disk measured fast
/// through a cache of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PacingMode {
    #[default]
    Auto,
    Parallel,
    Ordered,
}

/// The pacing's tuning, part of [`super::PrefetchConfig`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacingConfig {
    /// Who decides ([`PacingMode`]).
    pub mode: PacingMode,
    /// The longest a source read may take (`--source-timeout`; `None`: no bound).
    pub deadline: Option<Duration>,
    /// Share of `deadline` one request may take at the measured bandwidth: a quarter, so a
    /// request in flight and the retries the deadline allows after a transient error fit.
    pub deadline_share: f64,
    /// Largest request before the source is measured: 4 MiB, the largest chunk, which a source
    /// serves within the deadline whenever a chunk read alone would be.
    pub first_request_bytes: u64,
    /// Largest request of an ordered source: 16 MiB, twelve times the 1.25 MiB a hard disk's
    /// readahead sends, so a seek or a round trip of 8–20 ms is a small share of each request's
    /// time at 100–200 MB/s ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)).
    pub request_bytes: u64,
    /// A source measured slower than this is read in order even if nothing says it charges per
    /// request (a throttled cloud volume, a USB disk): 500 MB/s is above what hard disks and
    /// 1–2.5 GbE networks deliver and below local flash, which parallel reads serve as well
    /// ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)).
    pub ordered_below_bytes_per_second: f64,
    /// Most requests in flight on an ordered source: 4 × 16 MiB covers a 1 GB/s link with
    /// 60 ms to first byte, beyond any source this lane is for.
    pub max_depth: usize,
    /// Latency beyond one request's transfer that is worth no second request in flight, in
    /// requests: one. A reader's own miss queued beside the lane's request doubles the latency
    /// measured with no gap to fill, and a second request at another offset costs a disk a
    /// seek; 20 ms to first byte at 1 Gbit/s (15 % of a 16 MiB request) is served at the
    /// source's limit with one ([measured](../../../docs/PERFORMANCE.md#slow-and-network-sources)).
    pub depth_slack: f64,
    /// Bytes read from a source before their throughput decides its pacing (before the meter's
    /// window has enough reads for an estimate): one request's worth, one large read.
    pub measured_after_bytes: u64,
}

impl Default for PacingConfig {
    fn default() -> Self {
        PacingConfig {
            mode: PacingMode::Auto,
            deadline: None,
            deadline_share: 0.25,
            first_request_bytes: 4 << 20,
            request_bytes: 16 << 20,
            ordered_below_bytes_per_second: 500e6,
            max_depth: 4,
            depth_slack: 1.0,
            measured_after_bytes: 16 << 20,
        }
    }
}

/// What the mount measured of a source so far.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SourceSpeed {
    /// The meter's estimate, once its window holds enough reads.
    pub estimate: Option<SourceEstimate>,
    /// Throughput over every read so far, once they are [`PacingConfig::measured_after_bytes`].
    pub throughput: Option<f64>,
}

/// How reads ahead go to one file's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    Parallel,
    Ordered { request_bytes: u64, depth: usize },
}

impl Pacing {
    /// The pacing of a source that is `kind` and measured `estimate` (see the module docs).
    pub fn for_source(kind: StorageKind, speed: SourceSpeed, config: &PacingConfig) -> Pacing {
        let measured = speed
            .estimate
            .map(|e| e.bandwidth_bytes_per_second)
            .or(speed.throughput);
        let ordered = match (config.mode, measured) {
            (PacingMode::Parallel, _) => false,
            (PacingMode::Ordered, _) => true,
            // Parallel requests are what hides an object store's round trips, at any speed.
            (PacingMode::Auto, _) if matches!(kind, StorageKind::ObjectStore(_)) => false,
            (PacingMode::Auto, Some(bandwidth)) => {
                bandwidth < config.ordered_below_bytes_per_second
            }
            (PacingMode::Auto, None) => matches!(kind, StorageKind::Network(_)),
        };
        if !ordered {
            return Pacing::Parallel;
        }
        let largest = config.request_bytes.max(1);
        let smallest = config.first_request_bytes.clamp(1, largest);
        let request_bytes = match (measured, config.deadline) {
            (None, _) => smallest,
            (Some(bandwidth), Some(deadline)) => {
                let in_time = bandwidth * deadline.as_secs_f64() * config.deadline_share;
                (in_time as u64).clamp(smallest, largest)
            }
            (Some(_), None) => largest,
        };
        let depth = speed.estimate.map_or(1, |e| {
            let beyond = e.bandwidth_delay_bytes.saturating_sub(request_bytes) as f64;
            let more = (beyond / request_bytes as f64 - config.depth_slack)
                .ceil()
                .max(0.0);
            1 + more.min(config.max_depth as f64) as usize
        });
        Pacing::Ordered {
            request_bytes,
            depth: depth.clamp(1, config.max_depth.max(1)),
        }
    }

    pub fn is_ordered(self) -> bool {
        matches!(self, Pacing::Ordered { .. })
    }

    /// This pacing as a number ([`crate::source::meter::SourceMeter::derived`] keeps it): 0
    /// parallel, else the depth of an ordered lane (low 8 bits) and its request in KiB.
    pub fn code(self) -> u32 {
        match self {
            Pacing::Parallel => 0,
            Pacing::Ordered {
                request_bytes,
                depth,
            } => {
                let depth = u32::try_from(depth.clamp(1, 255)).unwrap_or(1);
                let kib = u32::try_from((request_bytes >> 10).clamp(1, 0xff_ffff)).unwrap_or(1);
                depth | kib << 8
            }
        }
    }

    /// The pacing [`Self::code`] gave `code`.
    pub fn from_code(code: u32) -> Pacing {
        match code {
            0 => Pacing::Parallel,
            code => Pacing::Ordered {
                request_bytes: u64::from(code >> 8) << 10,
                depth: (code & 0xff) as usize,
            },
        }
    }
}

impl SourceSpeed {
    /// Whether any measurement is there.
    pub fn is_measured(&self) -> bool {
        self.estimate.is_some() || self.throughput.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_object_store_is_read_in_parallel_at_any_measured_speed_unless_told() {
        let slow = measured(50e6, Duration::from_millis(20));
        let auto = PacingConfig::default();
        let kind = StorageKind::ObjectStore("s3");
        assert_eq!(Pacing::for_source(kind, slow, &auto), Pacing::Parallel);
        assert_eq!(
            Pacing::for_source(kind, SourceSpeed::default(), &auto),
            Pacing::Parallel
        );
        let told = PacingConfig {
            mode: PacingMode::Ordered,
            ..auto
        };
        assert!(Pacing::for_source(kind, slow, &told).is_ordered());
        // A FUSE client of the same store, measured as slow, is read in one ordered lane.
        assert!(Pacing::for_source(StorageKind::Network("fuse.rclone"), slow, &auto).is_ordered());
    }

    fn measured(bytes_per_second: f64, floor: Duration) -> SourceSpeed {
        SourceSpeed {
            estimate: Some(SourceEstimate {
                bandwidth_bytes_per_second: bytes_per_second,
                latency_floor: floor,
                bandwidth_delay_bytes: (bytes_per_second * floor.as_secs_f64()) as u64,
            }),
            throughput: Some(bytes_per_second),
        }
    }

    const NONE: SourceSpeed = SourceSpeed {
        estimate: None,
        throughput: None,
    };

    #[test]
    fn a_pacing_survives_its_code() {
        let config = PacingConfig::default();
        for pacing in [
            Pacing::Parallel,
            Pacing::Ordered {
                request_bytes: config.request_bytes,
                depth: 3,
            },
        ] {
            assert_eq!(Pacing::from_code(pacing.code()), pacing);
        }
    }

    #[test]
    fn a_request_takes_at_most_a_quarter_of_the_deadline() {
        let config = PacingConfig {
            deadline: Some(Duration::from_secs(3)),
            ..PacingConfig::default()
        };
        let request = |bytes_per_second: f64| match Pacing::for_source(
            StorageKind::Network("fuse"),
            measured(bytes_per_second, Duration::from_millis(100)),
            &config,
        ) {
            Pacing::Ordered { request_bytes, .. } => request_bytes,
            Pacing::Parallel => 0,
        };
        assert_eq!(
            request(100e6),
            16 << 20,
            "75 MB in a quarter of 3 s: the largest"
        );
        assert_eq!(request(6.25e6), 4_687_500, "50 Mbit/s: 0.75 s worth");
        assert_eq!(request(1e6), 4 << 20, "never below a chunk");
    }

    #[test]
    fn the_user_may_decide() {
        let config = |mode| PacingConfig {
            mode,
            ..PacingConfig::default()
        };
        let slow = measured(100e6, Duration::from_millis(160));
        let parallel = config(PacingMode::Parallel);
        assert_eq!(
            Pacing::for_source(StorageKind::Network("nfs"), slow, &parallel),
            Pacing::Parallel
        );
        let ordered = config(PacingMode::Ordered);
        assert!(Pacing::for_source(
            StorageKind::Flash,
            measured(3e9, Duration::from_millis(5)),
            &ordered
        )
        .is_ordered());
    }

    #[test]
    fn flash_is_parallel_until_measured_slow() {
        let config = PacingConfig::default();
        let fast = measured(2e9, Duration::from_micros(2000));
        assert_eq!(
            Pacing::for_source(StorageKind::Flash, NONE, &config),
            Pacing::Parallel
        );
        assert_eq!(
            Pacing::for_source(StorageKind::Flash, fast, &config),
            Pacing::Parallel
        );
        assert_eq!(
            Pacing::for_source(StorageKind::Unknown, fast, &config),
            Pacing::Parallel
        );
        let throttled = measured(200e6, Duration::from_millis(84));
        assert!(Pacing::for_source(StorageKind::Flash, throttled, &config).is_ordered());
    }

    #[test]
    fn disks_and_networks_are_ordered_with_the_depth_their_bandwidth_delay_product_needs() {
        let config = PacingConfig::default();
        let ordered = |kind, estimate| Pacing::for_source(kind, estimate, &config);
        let one = Pacing::Ordered {
            request_bytes: 16 << 20,
            depth: 1,
        };
        assert_eq!(
            ordered(StorageKind::Network("nfs"), NONE),
            Pacing::Ordered {
                request_bytes: 4 << 20,
                depth: 1,
            },
            "not measured: one request of a chunk's size at most"
        );
        assert_eq!(
            ordered(StorageKind::SpinningDisk, NONE),
            Pacing::Parallel,
            "many virtual disks say they rotate: measured first"
        );
        // A virtual disk that says it rotates, measured fast after one large read.
        let one_read = SourceSpeed {
            estimate: None,
            throughput: Some(1.5e9),
        };
        assert_eq!(
            ordered(StorageKind::SpinningDisk, one_read),
            Pacing::Parallel
        );
        let slow_read = SourceSpeed {
            estimate: None,
            throughput: Some(150e6),
        };
        assert_eq!(ordered(StorageKind::Flash, slow_read), one);
        // 16 MiB at 200 MB/s alone take 84 ms: the transfer itself, one in flight.
        let disk = measured(200e6, Duration::from_millis(84));
        assert_eq!(ordered(StorageKind::SpinningDisk, disk), one);
        // 20 ms to first byte at 1 Gbit/s: 15 % of a request, one in flight.
        let object = measured(125e6, Duration::from_millis(134 + 20));
        assert_eq!(ordered(StorageKind::Network("fuse"), object), one);
        // A second request queued behind the first doubles the latency: still one.
        let queued = measured(80e6, Duration::from_millis(400));
        assert_eq!(ordered(StorageKind::Network("fuse"), queued), one);
        // 100 ms to first byte at 400 MB/s, 2.4 requests' transfer: two more in flight.
        let far_ish = measured(400e6, Duration::from_millis(42 + 100));
        assert_eq!(
            ordered(StorageKind::Network("fuse"), far_ish),
            Pacing::Ordered {
                request_bytes: 16 << 20,
                depth: 3
            }
        );
        // Measured fast: parallel, whatever the kind says.
        let fast = measured(1.25e9, Duration::from_millis(30));
        assert_eq!(
            ordered(StorageKind::Network("fuse"), fast),
            Pacing::Parallel
        );
        // A slow link far away: capped.
        let far = measured(400e6, Duration::from_millis(300));
        assert_eq!(
            ordered(StorageKind::Network("fuse"), far),
            Pacing::Ordered {
                request_bytes: 16 << 20,
                depth: 4
            }
        );
    }
}
