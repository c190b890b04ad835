//! What a source file is stored on, as far as the file system tells: whether the storage
//! charges for each request (a hard disk's seek, a network round trip) or serves many small
//! reads in parallel as fast as a few large ones (flash), and, for a FUSE file system, which
//! client serves it.
//!
//! **Contract.** [`StorageKind::of`] never fails: what it cannot tell is
//! [`StorageKind::Unknown`], and the source's measured speed decides
//! ([`super::pacing`]). It reads the file system's type (`fstatfs`); for a FUSE file system,
//! the client's name from the mount's type in `/proc/self/mountinfo` (`fuse.rclone`); for a
//! block device, whether the kernel says it rotates (`/sys/dev/block/MAJ:MIN/queue/rotational`,
//! or the parent device's for a partition). Nothing here is measured; it is what the system
//! says.
//!
//! **Direct reads.** [`StorageKind::reads_buffered`] names the clients whose file handles
//! each read one stream: such a client answers the pieces of one `O_DIRECT` read, which the
//! kernel sends to a FUSE file system all at once, as seeks, and refetches from the store for
//! each ([measured](../../../docs/PERFORMANCE.md#direct-reads-through-a-store-client)). Their files
//! are read through the page cache, which sends the pieces in order, and the pages are dropped
//! after each read.

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
    /// An object store tierfs reads with its own client (`s3`): every request pays a round
    /// trip, which requests in parallel hide, as the store serves many at once; there is no
    /// seek, and no client of the kernel's between.
    ObjectStore(&'static str),
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

    /// Whether reads of this storage go through the page cache rather than `O_DIRECT` (see
    /// the module docs): the FUSE clients in [`STREAM_PER_HANDLE_CLIENTS`].
    pub fn reads_buffered(self) -> bool {
        match self {
            StorageKind::Network(name) => name
                .strip_prefix("fuse.")
                .is_some_and(|client| STREAM_PER_HANDLE_CLIENTS.contains(&client)),
            _ => false,
        }
    }

    /// For the stats: `flash`, `spinning disk`, the network file system's name (a FUSE
    /// client's as `fuse.NAME`), `unknown`.
    pub fn name(self) -> &'static str {
        match self {
            StorageKind::Flash => "flash",
            StorageKind::SpinningDisk => "spinning disk",
            StorageKind::Network(fs) => fs,
            StorageKind::ObjectStore(store) => store,
            StorageKind::Unknown => "unknown",
        }
    }
}

/// FUSE clients whose file handles each read one stream from the store, so that the pieces of
/// an `O_DIRECT` read, arriving at once, are seeks to them: `rclone mount` (without its VFS
/// cache) fetched 16–18 times a file read in 4 or 16 MiB `O_DIRECT` reads, and once read through
/// the page cache ([measured](../../../docs/PERFORMANCE.md#direct-reads-through-a-store-client)).
pub const STREAM_PER_HANDLE_CLIENTS: &[&str] = &["rclone"];

/// FUSE clients named in the stats by their mount type (`fuse.NAME`); any other is `fuse`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const KNOWN_FUSE_CLIENTS: &[&str] = &[
    "fuse.rclone",
    "fuse.juicefs",
    "fuse.seaweedfs",
    "fuse.s3fs",
    "fuse.goofys",
    "fuse.geesefs",
    "fuse.gcsfuse",
    "fuse.mountpoint-s3",
    "fuse.blobfuse2",
    "fuse.sshfs",
    "fuse.ceph-fuse",
    "fuse.glusterfs",
    "fuse.alluxio-fuse",
];

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
    ];

    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

    /// The FUSE client serving device `dev`: its mount's type (`fuse.NAME`) when it is one of
    /// [`super::KNOWN_FUSE_CLIENTS`], else `fuse`.
    fn fuse_client(dev: u64) -> &'static str {
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|text| fuse_client_in(&text, &format!("{major}:{minor}")))
            .unwrap_or("fuse")
    }

    /// [`fuse_client`] from the text of a `mountinfo` and the device's `MAJ:MIN`.
    pub(super) fn fuse_client_in(mountinfo: &str, dev: &str) -> Option<&'static str> {
        mountinfo.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.get(2) != Some(&dev) {
                return None;
            }
            // After the optional fields, a lone "-", then the file system's type.
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = *fields.get(sep + 1)?;
            super::KNOWN_FUSE_CLIENTS
                .iter()
                .find(|known| **known == fstype)
                .copied()
        })
    }

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
        if magic == FUSE_SUPER_MAGIC {
            return StorageKind::Network(fuse_client(meta.dev()));
        }
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
        assert!(StorageKind::Network("fuse.rclone").charges_per_request());
        assert!(!StorageKind::Flash.charges_per_request());
        assert!(!StorageKind::Unknown.charges_per_request());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn proc_is_not_a_block_device_and_says_nothing_of_rotation() {
        let file = File::open("/proc/self/status").unwrap();
        assert_eq!(StorageKind::of(&file), StorageKind::Unknown);
    }

    #[test]
    fn only_the_clients_that_read_a_stream_per_handle_are_read_buffered() {
        assert!(StorageKind::Network("fuse.rclone").reads_buffered());
        for other in [
            StorageKind::Network("fuse"),
            StorageKind::Network("fuse.juicefs"),
            StorageKind::Network("fuse.seaweedfs"),
            StorageKind::Network("nfs"),
            StorageKind::Flash,
            StorageKind::SpinningDisk,
            StorageKind::Unknown,
        ] {
            assert!(!other.reads_buffered(), "{other:?}");
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_fuse_client_is_named_by_its_mount_type() {
        let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
95 22 0:52 / /mnt/s3 rw,nosuid,nodev,relatime shared:50 - fuse.rclone s3: rw,user_id=0,group_id=0
96 22 0:53 / /mnt/weed rw,relatime - fuse.seaweedfs 127.0.0.1:8888:/ rw,user_id=0,group_id=0
97 22 0:54 / /mnt/other rw,relatime - fuse.myfs myfs rw,user_id=0,group_id=0
98 22 0:55 / /mnt/plain rw,relatime - fuse /dev/fuse rw,user_id=0,group_id=0
";
        let client = |dev| linux::fuse_client_in(mountinfo, dev);
        assert_eq!(client("0:52"), Some("fuse.rclone"));
        assert_eq!(client("0:53"), Some("fuse.seaweedfs"));
        assert_eq!(client("0:54"), None, "a client not known: fuse");
        assert_eq!(client("0:55"), None);
        assert_eq!(client("0:99"), None, "no such mount");
        assert_eq!(client("254:0"), None, "not FUSE");
    }
}
