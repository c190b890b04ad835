//! What a source file is stored on, as far as the file system tells: whether the storage
//! charges for each request (a hard disk's seek, a network round trip) or serves many small
//! reads in parallel as fast as a few large ones (flash).
//!
//! **Contract.** [`StorageKind::of`] never fails: what it cannot tell is
//! [`StorageKind::Unknown`], and the source's measured speed decides
//! ([`super::pacing`]). It reads the file system's type (`fstatfs`) and, for a block device,
//! whether the kernel says it rotates (`/sys/dev/block/MAJ:MIN/queue/rotational`, or the
//! parent device's for a partition). Nothing here is measured; it is what the system says.

use std::fs::File;

/// What a source file is stored on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageKind {
    /// A block device the kernel does not say rotates (SSD, NVMe, a virtual disk, a loop
    /// device): fast or not, only a measurement tells.
    Flash,
    /// A block device the kernel says rotates: a hard disk, which pays a seek for every request
    /// that does not continue the previous one.
    SpinningDisk,
    /// A network file system (NFS, SMB, Ceph, 9p, AFS, Lustre…) or a FUSE file system (the
    /// clients of object stores and distributed stores: JuiceFS, SeaweedFS, rclone, s3fs,
    /// sshfs): every request is a round trip or more.
    Network(&'static str),
    /// Nothing tells (another system, or a call failed).
    Unknown,
}

impl StorageKind {
    /// The kind of storage `file` is on.
    pub fn of(file: &File) -> StorageKind {
        #[cfg(target_os = "linux")]
        {
            linux::kind_of(file)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = file;
            StorageKind::Unknown
        }
    }

    /// Whether every request costs a seek or a round trip, whatever its size.
    pub fn charges_per_request(self) -> bool {
        matches!(self, StorageKind::SpinningDisk | StorageKind::Network(_))
    }

    /// For the stats: `flash`, `spinning disk`, the network file system's name, `unknown`.
    pub fn name(self) -> &'static str {
        match self {
            StorageKind::Flash => "flash",
            StorageKind::SpinningDisk => "spinning disk",
            StorageKind::Network(fs) => fs,
            StorageKind::Unknown => "unknown",
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    use super::StorageKind;

    /// File system types (`statfs.f_type`, from `linux/magic.h` and the file systems' own
    /// headers) whose every request crosses a network or a user-space server.
    const NETWORK_FS: &[(i64, &str)] = &[
        (0x6969, "nfs"),
        (0x517B, "smb"),
        (0xFE53_4D42, "smb2"),
        (0xFF53_4D42, "cifs"),
        (0x00C3_6400, "ceph"),
        (0x0102_1997, "9p"),
        (0x6B41_4653, "afs"),
        (0x0BD0_0BD0, "lustre"),
        (0x4750_4653, "gpfs"),
        (0x7461_636F, "ocfs2"),
        (0x0116_1970, "gfs2"),
        (0x7375_7245, "coda"),
        (0x6573_5546, "fuse"),
    ];

    pub(super) fn kind_of(file: &File) -> StorageKind {
        // SAFETY: fstatfs writes one statfs struct into the zeroed value it is given.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
            return StorageKind::Unknown;
        }
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
        let magic = fs.f_type as i64;
        if let Some((_, name)) = NETWORK_FS.iter().find(|(m, _)| *m == magic) {
            return StorageKind::Network(name);
        }
        let Ok(meta) = file.metadata() else {
            return StorageKind::Unknown;
        };
        match rotational(meta.dev()) {
            Some(true) => StorageKind::SpinningDisk,
            Some(false) => StorageKind::Flash,
            None => StorageKind::Unknown,
        }
    }

    /// Whether the block device `dev` (or, for a partition, its disk) says it rotates.
    fn rotational(dev: u64) -> Option<bool> {
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let base = format!("/sys/dev/block/{major}:{minor}");
        ["queue/rotational", "../queue/rotational"]
            .iter()
            .find_map(|rel| std::fs::read_to_string(format!("{base}/{rel}")).ok())
            .map(|text| text.trim() == "1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_this_machine_has_a_kind_and_only_disks_and_networks_charge_per_request() {
        let file = File::open("Cargo.toml").unwrap();
        let kind = StorageKind::of(&file);
        assert!(!kind.name().is_empty());
        assert!(StorageKind::SpinningDisk.charges_per_request());
        assert!(StorageKind::Network("nfs").charges_per_request());
        assert!(!StorageKind::Flash.charges_per_request());
        assert!(!StorageKind::Unknown.charges_per_request());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn proc_is_not_a_block_device_and_says_nothing_of_rotation() {
        let file = File::open("/proc/self/status").unwrap();
        assert_eq!(StorageKind::of(&file), StorageKind::Unknown);
    }
}
