//! Serving-mode admission: whether a new open of a model file is handed to the kernel by FUSE
//! passthrough ([`crate::passthrough`]) or served through the chunk cache ([`ServeMode`]), and
//! why ([`ModeReason`], shown in the stats as `files[].mode_reason`).
//!
//! **Contract.** [`ModelStore::choose_mode`] admits a file to passthrough only when the caller
//! can offer it and the whole file fits in what the chunk cache does not use: admission never
//! evicts the chunk cache, and a file with bytes in the cache stays served from there. A file
//! whose source charges per request ([`crate::prefetch::pacing`]) is never passed through: the
//! cache reads it in large ordered requests, where the kernel's readahead would pay a seek or a
//! round trip per 128 KiB. On a mount with a local disk tier ([`crate::disk_tier`]) a file is
//! passed through only from its whole, checked copy in the tier, never from the source
//! (`tier_copy.rs`); until the tier holds it whole it is served through the cache, which
//! keeps its chunks there. A file held in RAM (tmpfs) is passed through outside the budget.
//! Every admission and release
//! rebalances the budget between the chunk cache and the passthrough tier
//! ([`ModelStore::rebalance`]). Mode and reason are stored per version in atomics (no lock).

use std::sync::atomic::{AtomicU8, Ordering};

use super::{Layout, ModelFile, ModelStore, RawReason};
use crate::prefetch::PacingMode;
use crate::source::kind::StorageKind;

/// How an open model file is served, as the stats show it (`files[].mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeMode {
    /// Through the chunk cache (reads reach the daemon).
    Cache = 0,
    /// Handed to the kernel with FUSE passthrough ([`crate::passthrough`]).
    Passthrough = 1,
}

impl ServeMode {
    pub fn name(self) -> &'static str {
        match self {
            ServeMode::Cache => "cache",
            ServeMode::Passthrough => "passthrough",
        }
    }
}

/// Why a model file is served in its mode, as the stats show it (`files[].mode_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum ModeReason {
    NotOpened = 0,
    FitsBudget,
    InodeInPassthrough,
    PassthroughOff,
    Malformed,
    AlreadyCached,
    ModelLargerThanBudget,
    LargerThanRoom,
    Competes,
    IndexCapFull,
    InRam,
    SourceChargesPerRequest,
    DiskTier,
    FromDiskTier,
    Remote,
}

impl ModeReason {
    pub(super) const ALL: [ModeReason; 15] = [
        ModeReason::NotOpened,
        ModeReason::FitsBudget,
        ModeReason::InodeInPassthrough,
        ModeReason::PassthroughOff,
        ModeReason::Malformed,
        ModeReason::AlreadyCached,
        ModeReason::ModelLargerThanBudget,
        ModeReason::LargerThanRoom,
        ModeReason::Competes,
        ModeReason::IndexCapFull,
        ModeReason::InRam,
        ModeReason::SourceChargesPerRequest,
        ModeReason::DiskTier,
        ModeReason::FromDiskTier,
        ModeReason::Remote,
    ];

    pub(super) fn text(self) -> Option<&'static str> {
        Some(match self {
            ModeReason::NotOpened => return None,
            ModeReason::FitsBudget => "fits what the budget has left",
            ModeReason::InodeInPassthrough => "other handles of the file are passthrough",
            ModeReason::PassthroughOff => "passthrough is off or unavailable",
            ModeReason::Malformed => "the header does not parse",
            ModeReason::AlreadyCached => "the chunk cache holds part of it",
            ModeReason::ModelLargerThanBudget => "its model is larger than the budget",
            ModeReason::LargerThanRoom => "larger than what the budget had left",
            ModeReason::Competes => "competes with other models for the budget",
            ModeReason::IndexCapFull => "the index cap is full of open files' headers",
            ModeReason::InRam => "its source is held in RAM (tmpfs)",
            ModeReason::SourceChargesPerRequest => {
                "its source charges per request (a disk or a network): read in large requests"
            }
            ModeReason::DiskTier => {
                "the local disk tier does not hold it whole yet: read through the cache, which keeps its chunks there"
            }
            ModeReason::FromDiskTier => {
                "fits what the budget has left: read from its whole copy in the local disk tier"
            }
            ModeReason::Remote => {
                "its source is an object store: read through the cache (passthrough needs a local file; a disk tier gives it one)"
            }
        })
    }

    pub(super) fn load(cell: &AtomicU8) -> ModeReason {
        let index = cell.load(Ordering::Relaxed) as usize;
        ModeReason::ALL
            .get(index)
            .copied()
            .unwrap_or(ModeReason::NotOpened)
    }
}

impl ModelFile {
    /// How the last open of this version was served.
    fn set_mode(&self, mode: ServeMode, reason: ModeReason) {
        self.mode.store(mode as u8, Ordering::Relaxed);
        self.mode_reason.store(reason as u8, Ordering::Relaxed);
    }

    pub fn mode(&self) -> ServeMode {
        match self.mode.load(Ordering::Relaxed) {
            1 => ServeMode::Passthrough,
            _ => ServeMode::Cache,
        }
    }
}

impl ModelStore {
    /// Decides how a new open of `file` is served: passthrough if the caller can offer it and
    /// the whole file fits in the budget next to the other passthrough files, else the chunk
    /// cache. A passthrough open must be closed with [`Self::close_passthrough`]. A file held in
    /// RAM (tmpfs) is passed through whenever the caller can, outside the budget: its pages
    /// are not the mount's to hold or give back.
    ///
    /// Admission never evicts the chunk cache: the file must fit in what the cache does not use
    /// (`room`). A scan that opens every model file to read its header (ComfyUI's discovery)
    /// must not push out the model being served from the cache, and a file that already has
    /// bytes in the cache (warmed by `prefetch`, or read before) keeps being served from there,
    /// as does one a plan is warming (its first chunks may not have landed yet).
    pub fn choose_mode(&self, file: &ModelFile, passthrough_possible: bool) -> ServeMode {
        if file.in_ram && passthrough_possible && !file.is_raw() {
            // Its bytes are in RAM already and always resident: the kernel serves them by
            // passthrough at memory speed, and the passthrough tier neither reserves nor parks
            // them (it could never give them back: they would hold the budget for good).
            file.set_mode(ServeMode::Passthrough, ModeReason::InRam);
            return ServeMode::Passthrough;
        }
        let room = self
            .budget()
            .saturating_sub(self.cache.snapshot().used_bytes);
        // A shard of a model larger than the budget is read through the cache: passthrough
        // would keep it out of the model's order, prefetch and eviction.
        let room = if too_large(file, self.budget()) {
            0
        } else {
            room
        };
        let (mode, reason) = match self.admission(file, passthrough_possible, room) {
            Ok(from_tier) => (
                ServeMode::Passthrough,
                if from_tier {
                    ModeReason::FromDiskTier
                } else {
                    ModeReason::FitsBudget
                },
            ),
            Err(reason) => {
                // The chunk cache gets its room back from parked passthrough files.
                self.passthrough
                    .make_room_for_model(self.budget(), file.size());
                (ServeMode::Cache, reason)
            }
        };
        file.set_mode(mode, reason);
        self.rebalance();
        mode
    }

    /// Whether an open of `file` may be passed through in `room` bytes: `Ok(from_tier)`, the
    /// open admitted to the passthrough tier (reading the version's whole copy in the disk
    /// tier when `from_tier`, which it then holds: `tier_copy.rs`), or why not.
    fn admission(
        &self,
        file: &ModelFile,
        passthrough_possible: bool,
        room: u64,
    ) -> Result<bool, ModeReason> {
        let identity = file.source.identity();
        let tier = file.disk_tier.is_some();
        if let Layout::Raw { why } = &file.layout {
            return Err(match why {
                RawReason::Malformed(_) => ModeReason::Malformed,
                RawReason::IndexCapFull { .. } => ModeReason::IndexCapFull,
            });
        }
        if !passthrough_possible {
            return Err(ModeReason::PassthroughOff);
        }
        // Passthrough hands the kernel a local file: a remote source's is its copy in the tier.
        if !tier && file.remote {
            return Err(ModeReason::Remote);
        }
        // From the disk tier's copy the source's pacing does not matter.
        if !tier && self.source_charges_per_request(file) {
            return Err(ModeReason::SourceChargesPerRequest);
        }
        // The passthrough tier knows a copy in the disk tier by the copy's own identity.
        let known_as = if tier {
            file.tier_copy_identity()
        } else {
            Some(identity)
        };
        if known_as.is_some_and(|id| self.passthrough.refuses_competing(&id)) {
            return Err(ModeReason::Competes);
        }
        if self.cache.cached_bytes(file.generation) > 0
            || file.warmed_by_plan.load(Ordering::Acquire)
        {
            return Err(ModeReason::AlreadyCached);
        }
        let target = if tier {
            // Checked only for an open that could use it: checking reads the whole copy.
            if identity.size > room {
                return Err(too_large_reason(file, self.budget(), room));
            }
            file.acquire_tier_copy().ok_or(ModeReason::DiskTier)?
        } else {
            file.passthrough_target()
        };
        if self.passthrough.admit(&target.path, &target.identity, room) {
            Ok(tier)
        } else {
            if tier {
                file.release_tier_copy();
            }
            Err(too_large_reason(file, self.budget(), room))
        }
    }

    /// Whether `file`'s source charges per request ([`crate::prefetch::pacing`]), so that the
    /// chunk cache, which reads it in large ordered requests, serves it better than
    /// passthrough, where the kernel reads it in its readahead's requests (128 KiB for a
    /// mapping), each paying a seek or a round trip. A device that says it rotates but that the
    /// mount has not measured yet is measured first, with two reads of a measurement's worth of
    /// the file ([`Self::measure_source`]): many virtual disks say they rotate.
    fn source_charges_per_request(&self, file: &ModelFile) -> bool {
        let config = &self.prefetcher.config().pacing;
        // Measured only where the measurement decides (`--source-pacing auto`).
        let unmeasured_disk = config.mode == PacingMode::Auto
            && file.source.meter().is_some_and(|meter| {
                meter.storage() == StorageKind::SpinningDisk
                    && !file.source_speed(config).is_measured()
            });
        if unmeasured_disk {
            // Two reads, each of a measurement's worth, timed together: a throttled device
            // (a cgroup's bandwidth limit, a cloud volume's burst credit) lets the first through
            // at full speed ([measured](../../../docs/PERFORMANCE.md#a-real-comfyui-server)).
            let piece = config.measured_after_bytes;
            self.measure_source(file, 0, piece);
            self.measure_source(file, piece, piece);
        }
        file.pacing_now(config).is_ordered()
    }

    /// Reads `bytes` of `file`'s data from `skip` bytes into it (not kept), so that the source's
    /// meter has a measurement; nothing if the file holds fewer.
    fn measure_source(&self, file: &ModelFile, skip: u64, bytes: u64) {
        let Some(start) = file.header_end().map(|end| end.saturating_add(skip)) else {
            return;
        };
        if file.size() < start.saturating_add(bytes) {
            return;
        }
        if let Err(e) = file.source.read_aligned(start, start + bytes) {
            tracing::debug!(file = %file.path.display(), error = %e, "could not measure the source");
        }
    }

    /// Admits one more passthrough open of `file` whatever its size: for an inode the kernel
    /// already serves by passthrough, which cannot take a cached open next to it. On a mount
    /// with a disk tier, the inode's passthrough reads a version's copy in the tier: only that
    /// version's opens may join it (false for another: the kernel would serve it the old
    /// version's bytes).
    pub fn force_passthrough(&self, file: &ModelFile) -> bool {
        if file.in_ram {
            file.set_mode(ServeMode::Passthrough, ModeReason::InRam);
            return true;
        }
        if file.disk_tier.is_some() && !file.join_tier_copy() {
            return false;
        }
        let target = file.passthrough_target();
        self.passthrough
            .admit(&target.path, &target.identity, u64::MAX);
        if file.mode() != ServeMode::Passthrough {
            file.set_mode(ServeMode::Passthrough, ModeReason::InodeInPassthrough);
        }
        self.rebalance();
        true
    }

    /// A passthrough handle of `file` closed.
    pub fn close_passthrough(&self, file: &ModelFile) {
        self.passthrough
            .release(&file.passthrough_target().identity);
        file.release_tier_copy();
        self.rebalance();
    }
}

/// Why a file that does not fit `room` is not passed through.
fn too_large_reason(file: &ModelFile, budget: u64, room: u64) -> ModeReason {
    if room == 0 && too_large(file, budget) {
        ModeReason::ModelLargerThanBudget
    } else {
        ModeReason::LargerThanRoom
    }
}

/// Whether `file` is a shard of a model larger than `budget`.
fn too_large(file: &ModelFile, budget: u64) -> bool {
    file.shard_of
        .as_ref()
        .is_some_and(|of| of.model.size > budget)
}
