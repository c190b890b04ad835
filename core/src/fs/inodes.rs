//! Inode numbers for the objects under the source root, and how long the daemon remembers them.
//!
//! **Contract.** An inode number stands for *one source object*: its device, inode number and
//! birth time in SOURCE ([`ObjectId`]). The number is a function of that identity, not of the
//! path or of when the object was met, so that tools identifying a file by `(st_dev, st_ino)`
//! (hashers comparing `stat` before and after a read, `find -samefile`, `du`/`tar`/`rsync -H`
//! hard-link detection, git's stat cache, `os.path.samefile`) see what they would see in
//! SOURCE:
//! - a number is **stable for the life of the mount**, however often the kernel forgets the
//!   inode (`drop_caches`, memory pressure) and the daemon prunes it;
//! - **hard links** (and a link presented as its target) share one number;
//! - objects of **different devices** (a link followed to another disk, a filesystem mounted
//!   inside SOURCE) never share a number;
//! - a **replaced** object (`mv` over it, delete and recreate, a re-download) gets a new number:
//!   the kernel keeps a page cache per inode, and an `mmap` of the old version must never be
//!   filled with pages of the new one (nor the other way round), since the old handle still
//!   reads the old file. The old number lives on, answering with its last known attributes,
//!   until the kernel forgets it.
//!
//! **How a number is formed.** 64 bits: an 8-bit *slot* above the low 56 bits of the source's
//! inode number.
//! - Slot 0 is SOURCE's own device: an object there is numbered with its source `st_ino`
//!   itself, so `ls -i` agrees with SOURCE and numbers survive a remount (as long as SOURCE
//!   stays on the same filesystem). Every filesystem in common use (ext4, XFS, btrfs, ZFS,
//!   tmpfs) numbers far below 2^56.
//! - Slots 1 to 254 go, in the order they are met, to each other pair of (device, top 8 bits
//!   of the inode number): a second device, or the top-bit "layer" numbers of overlayfs
//!   (`xino`) and of some NFS servers. Numbers there are stable for the life of the mount, and
//!   across remounts only where the devices are met in the same order: the device numbers of
//!   other filesystems mean nothing from one boot to the next anyway.
//! - Slot 255 holds *spare* numbers from a counter, for what the two rules above cannot place:
//!   an object of slot 0 whose number is reserved (below [`FIRST_SOURCE_INO`]: the root and
//!   `.tierfs`), objects past the 254th (device, top byte) pair, and a replaced object whose
//!   filesystem recycled its predecessor's inode number (ext4 does) while the kernel still
//!   holds the predecessor's number. The first two are remembered for the life of the mount
//!   (up to [`MAX_REMEMBERED_SPARES`] objects, past which only while the kernel holds them);
//!   the last only while held, after which the object takes its own number.
//!
//! The mapping is one-to-one, so no two objects can ever share a number, whatever the kernel
//! still caches: this is why a second device takes a slot of its own rather than a hash of its
//! device number (which could collide).
//!
//! **Generation.** The FUSE reply carries a generation with each number; the kernel's
//! NFS-export identity is the pair, and a kernel that finds a known number with a new
//! generation treats its old inode as stale. The generation is derived from the birth time
//! ([`generation_of`]), so a recycled source inode number, once its predecessor's number was
//! forgotten and given again, comes back with another generation. Where the filesystem keeps
//! no birth time (NFS, for one) the generation is 0 and a recycled inode number cannot be told
//! from the same object. (On Windows, the birth time is the creation time and the inode number
//! the file index.)
//!
//! **Lifetime of an entry.** Each entry counts the lookups the kernel was answered with
//! (`lookup` replies, each one a reference the kernel holds until it sends `forget` for it) and
//! the handles open on it. An entry goes when both are zero: at the `forget` that takes the
//! last reference, or at the release of its last handle after that. An entry a directory
//! listing numbered but the kernel never looked up holds no reference at all; it goes when that
//! listing is released ([`Inodes::drop_unreferenced`]), so listing a folder of 20 000 files
//! does not leave 20 000 entries behind. A pruned object looked up again gets the same number.
//!
//! **Paths.** Every operation looks the object up in SOURCE again by path, so changes show
//! through at once. An entry keeps the last few paths it was met at ([`MAX_PATHS`], most recent
//! first): hard links have several, and one of them may be gone while another still holds the
//! object.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::sync::{Mutex, MutexGuard};

use super::attr::Attr;

/// The root directory (FUSE's fixed root inode).
pub const ROOT_INO: u64 = 1;
/// `.tierfs/`, the control directory.
pub const CONTROL_DIR_INO: u64 = 2;
/// `.tierfs/stats`.
pub const STATS_INO: u64 = 3;
/// `.tierfs/control`.
pub const CONTROL_INO: u64 = 4;
/// `.tierfs/metrics`, where the front end renders metrics ([`super::TierFs::with_metrics`]).
pub const METRICS_INO: u64 = 5;
/// The numbers below this one are reserved for the root and the virtual files.
pub const FIRST_SOURCE_INO: u64 = 16;

/// Bits of the source inode number kept below the slot.
const SLOT_SHIFT: u32 = 56;
const LOW_MASK: u64 = (1 << SLOT_SHIFT) - 1;
/// The slot of spare numbers (see the module docs).
const SPARE_SLOT: u64 = 0xff;
/// Objects whose spare number is remembered for the life of the mount; past this many, a spare
/// number lasts only while the kernel holds it (about 64 bytes each: at most 4 MiB).
pub const MAX_REMEMBERED_SPARES: usize = 65_536;
/// Paths an entry remembers.
pub const MAX_PATHS: usize = 4;

/// Tuning of the inode table; [`Default`] is what a mount uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodesConfig {
    /// Objects whose spare number is remembered for the life of the mount
    /// ([`MAX_REMEMBERED_SPARES`]).
    pub max_remembered_spares: usize,
    /// Paths an entry remembers ([`MAX_PATHS`]).
    pub max_paths: usize,
}

impl Default for InodesConfig {
    fn default() -> InodesConfig {
        InodesConfig {
            max_remembered_spares: MAX_REMEMBERED_SPARES,
            max_paths: MAX_PATHS,
        }
    }
}

/// A source object: device, inode number and birth time there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectId {
    pub dev: u64,
    pub ino: u64,
    /// Birth time in nanoseconds since the epoch; 0 where the filesystem keeps none. Tells a
    /// new object from an old one whose inode number the filesystem recycled.
    pub born: u64,
}

/// The FUSE generation of an object born at `born` ([`ObjectId::born`]): 32 bits, as the
/// kernel keeps it.
pub fn generation_of(born: u64) -> u64 {
    (born ^ (born >> 32)) & 0xffff_ffff
}

/// What the table knows of one inode.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Where the object was last met, most recent first (never empty; the root's is "").
    pub paths: Vec<PathBuf>,
    /// `None` for the root, which stands for SOURCE itself whatever it is.
    pub object: Option<ObjectId>,
    /// The attributes last reported for it.
    pub attr: Option<Attr>,
    /// Lookups answered and not yet forgotten by the kernel.
    lookups: u64,
    /// Handles open on it.
    handles: u64,
}

impl Entry {
    /// The path it was last met at.
    pub fn path(&self) -> &Path {
        &self.paths[0]
    }

    fn unused(&self) -> bool {
        self.lookups == 0 && self.handles == 0
    }

    /// Puts `path` first, keeping at most `max_paths` ([`InodesConfig::max_paths`]).
    fn met_at(&mut self, path: &Path, max_paths: usize) {
        if self.paths.first().is_some_and(|p| p == path) {
            return;
        }
        self.paths.retain(|p| p != path);
        self.paths.insert(0, path.to_owned());
        self.paths.truncate(max_paths);
    }
}

/// How numbers are formed from identities (see the module docs).
#[derive(Debug)]
struct Numbering {
    /// Slot of each (device, top byte of the inode number) met; SOURCE's device is slot 0.
    slots: HashMap<(u64, u64), u64>,
    /// Spare numbers remembered for the life of the mount, by object.
    spares: HashMap<ObjectId, u64>,
    next_spare: u64,
    /// Spare numbers remembered at most ([`InodesConfig::max_remembered_spares`]).
    max_remembered_spares: usize,
    /// Whether running past that many was logged.
    warned: bool,
}

impl Numbering {
    fn new(source_dev: u64, max_remembered_spares: usize) -> Numbering {
        Numbering {
            slots: HashMap::from([((source_dev, 0), 0)]),
            spares: HashMap::new(),
            next_spare: 1,
            max_remembered_spares,
            warned: false,
        }
    }

    /// The number `object` takes when nothing else holds it.
    fn own(&mut self, object: ObjectId) -> u64 {
        if let Some(&spare) = self.spares.get(&object) {
            return spare;
        }
        match self.derived(object) {
            Some(ino) => ino,
            None => self.remembered_spare(object),
        }
    }

    /// The number derived from the object's device and inode number, if there is one.
    fn derived(&mut self, object: ObjectId) -> Option<u64> {
        let key = (object.dev, object.ino >> SLOT_SHIFT);
        let slot = match self.slots.get(&key) {
            Some(&slot) => slot,
            None if (self.slots.len() as u64) < SPARE_SLOT => {
                let slot = self.slots.len() as u64;
                self.slots.insert(key, slot);
                slot
            }
            None => return None,
        };
        let low = object.ino & LOW_MASK;
        (slot != 0 || low >= FIRST_SOURCE_INO).then_some(slot << SLOT_SHIFT | low)
    }

    /// A spare number for `object`, remembered while there is room.
    fn remembered_spare(&mut self, object: ObjectId) -> u64 {
        let ino = self.spare();
        if self.spares.len() < self.max_remembered_spares {
            self.spares.insert(object, ino);
        } else if !self.warned {
            self.warned = true;
            tracing::warn!(
                limit = self.max_remembered_spares,
                "too many source objects without a number of their own: further ones keep \
                 their inode number only while the kernel holds it"
            );
        }
        ino
    }

    /// A number never given before.
    fn spare(&mut self) -> u64 {
        let ino = SPARE_SLOT << SLOT_SHIFT | (self.next_spare & LOW_MASK);
        self.next_spare += 1;
        ino
    }
}

#[derive(Debug)]
struct Table {
    entries: HashMap<u64, Entry>,
    /// The number of each object with an entry.
    live: HashMap<ObjectId, u64>,
    numbering: Numbering,
    /// Paths an entry remembers ([`InodesConfig::max_paths`]).
    max_paths: usize,
}

/// Two-way map between inode numbers and source objects.
#[derive(Debug)]
pub struct Inodes {
    table: Mutex<Table>,
}

impl Inodes {
    /// The table of a mount of a SOURCE on device `source_dev`.
    pub fn new(source_dev: u64) -> Inodes {
        Inodes::with_config(source_dev, InodesConfig::default())
    }

    /// [`Inodes::new`], tuned by `config`.
    pub fn with_config(source_dev: u64, config: InodesConfig) -> Inodes {
        let root = Entry {
            paths: vec![PathBuf::new()],
            object: None,
            attr: None,
            lookups: 0,
            handles: 0,
        };
        Inodes {
            table: Mutex::new(Table {
                entries: HashMap::from([(ROOT_INO, root)]),
                live: HashMap::new(),
                numbering: Numbering::new(source_dev, config.max_remembered_spares),
                max_paths: config.max_paths,
            }),
        }
    }

    /// The inode number of `object`, met at `path`, with an entry made if it had none (the
    /// flag says so). Counts no reference: for directory listings.
    pub fn ino_of(&self, path: &Path, object: ObjectId, attr: Attr) -> (u64, bool) {
        number(&mut self.lock(), path, object, attr)
    }

    /// The inode number of `object`, met at `path`, for a lookup answered to the kernel: counts
    /// one reference, which the kernel gives back with `forget`.
    pub fn looked_up(&self, path: &Path, object: ObjectId, attr: Attr) -> u64 {
        let mut table = self.lock();
        let (ino, _) = number(&mut table, path, object, attr);
        if let Some(entry) = table.entries.get_mut(&ino) {
            entry.lookups += 1;
        }
        ino
    }

    /// What is known of inode `ino`, if it is a source object.
    pub fn entry(&self, ino: u64) -> Option<Entry> {
        self.lock().entries.get(&ino).cloned()
    }

    /// Records the attributes just reported for `ino`.
    pub fn remember(&self, ino: u64, attr: Attr) {
        remember(&mut self.lock(), ino, attr);
    }

    /// A handle was opened on `ino`; false if the inode is not (or no longer) known.
    pub fn opened(&self, ino: u64) -> bool {
        match self.lock().entries.get_mut(&ino) {
            Some(entry) => {
                entry.handles += 1;
                true
            }
            None => false,
        }
    }

    /// A handle of `ino` closed; prunes the entry if that was its last use. Returns whether
    /// it went.
    pub fn closed(&self, ino: u64) -> bool {
        let mut table = self.lock();
        if let Some(entry) = table.entries.get_mut(&ino) {
            entry.handles = entry.handles.saturating_sub(1);
        }
        prune(&mut table, ino)
    }

    /// The kernel dropped `count` references to `ino`; prunes the entry if nothing else uses
    /// it. Returns whether it went.
    pub fn forget(&self, ino: u64, count: u64) -> bool {
        let mut table = self.lock();
        if let Some(entry) = table.entries.get_mut(&ino) {
            entry.lookups = entry.lookups.saturating_sub(count);
        }
        prune(&mut table, ino)
    }

    /// Prunes `ino` if no lookup and no handle holds it (entries numbered by a listing).
    pub fn drop_unreferenced(&self, ino: u64) -> bool {
        prune(&mut self.lock(), ino)
    }

    /// How many inodes the table holds (the root included).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Never true: the root is always there (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        crate::sync::lock(&self.table)
    }
}

/// The number of `object`, met at `path`, with `attr` (its `ino` set) remembered for it; and
/// whether its entry is new.
fn number(table: &mut Table, path: &Path, object: ObjectId, attr: Attr) -> (u64, bool) {
    if let Some(&ino) = table.live.get(&object) {
        if let Some(entry) = table.entries.get_mut(&ino) {
            entry.met_at(path, table.max_paths);
            entry.attr = Some(Attr { ino, ..attr });
            return (ino, false);
        }
    }
    let own = table.numbering.own(object);
    // Held by another object: a predecessor whose inode number the filesystem recycled.
    let ino = match table.entries.contains_key(&own) {
        true => table.numbering.spare(),
        false => own,
    };
    table.live.insert(object, ino);
    let entry = Entry {
        paths: vec![path.to_owned()],
        object: Some(object),
        attr: Some(Attr { ino, ..attr }),
        lookups: 0,
        handles: 0,
    };
    table.entries.insert(ino, entry);
    (ino, true)
}

fn remember(table: &mut Table, ino: u64, attr: Attr) {
    if let Some(entry) = table.entries.get_mut(&ino) {
        entry.attr = Some(attr);
    }
}

/// Removes `ino` if unused (never the root); whether it went.
fn prune(table: &mut Table, ino: u64) -> bool {
    if ino == ROOT_INO || !table.entries.get(&ino).is_some_and(Entry::unused) {
        return false;
    }
    if let Some(object) = table.entries.remove(&ino).and_then(|e| e.object) {
        if table.live.get(&object) == Some(&ino) {
            table.live.remove(&object);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::attr::Kind;
    use std::time::UNIX_EPOCH;

    const DEV: u64 = 0x803;

    fn attr() -> Attr {
        Attr {
            ino: 0,
            generation: 0,
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: Kind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        }
    }

    fn object(dev: u64, ino: u64, born: u64) -> ObjectId {
        ObjectId { dev, ino, born }
    }

    fn look(inodes: &Inodes, path: &str, object: ObjectId) -> u64 {
        inodes.looked_up(Path::new(path), object, attr())
    }

    #[test]
    fn objects_of_the_source_device_keep_their_own_number_after_a_forget() {
        let inodes = Inodes::new(DEV);
        let a = object(DEV, 12_345, 7);
        assert_eq!(look(&inodes, "a", a), 12_345);
        assert!(inodes.forget(12_345, 1));
        assert_eq!(inodes.len(), 1);
        assert_eq!(look(&inodes, "a", a), 12_345);
    }

    #[test]
    fn hard_links_share_a_number_and_remember_their_paths() {
        let inodes = Inodes::new(DEV);
        let a = object(DEV, 500, 7);
        assert_eq!(look(&inodes, "x", a), look(&inodes, "y", a));
        let entry = inodes.entry(500).unwrap();
        assert_eq!(entry.paths, [PathBuf::from("y"), PathBuf::from("x")]);
        for i in 0..10 {
            look(&inodes, &format!("p{i}"), a);
        }
        assert_eq!(inodes.entry(500).unwrap().paths.len(), MAX_PATHS);
        assert_eq!(inodes.len(), 2);
    }

    #[test]
    fn an_entry_remembers_the_configured_number_of_paths() {
        let config = InodesConfig {
            max_paths: 2,
            ..InodesConfig::default()
        };
        let inodes = Inodes::with_config(DEV, config);
        let a = object(DEV, 500, 7);
        for i in 0..10 {
            look(&inodes, &format!("p{i}"), a);
        }
        let entry = inodes.entry(500).unwrap();
        assert_eq!(entry.paths, [PathBuf::from("p9"), PathBuf::from("p8")]);
    }

    #[test]
    fn reserved_numbers_are_never_given_and_spares_are_stable() {
        let inodes = Inodes::new(DEV);
        let small = object(DEV, CONTROL_DIR_INO, 1);
        let ino = look(&inodes, "lost+found", small);
        assert!(ino >= FIRST_SOURCE_INO && ino >> SLOT_SHIFT == SPARE_SLOT);
        assert!(inodes.forget(ino, 1));
        assert_eq!(look(&inodes, "lost+found", small), ino);
    }

    #[test]
    fn other_devices_and_high_numbers_never_collide() {
        let inodes = Inodes::new(DEV);
        let here = look(&inodes, "a", object(DEV, 100, 1));
        let there = look(&inodes, "b", object(DEV + 1, 100, 1));
        let layer = look(&inodes, "c", object(DEV, 1 << 63 | 100, 1));
        let other_layer = look(&inodes, "d", object(DEV + 1, 1 << 63 | 100, 1));
        let all = [here, there, layer, other_layer];
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| a != b), "{all:x?}");
            assert_eq!(a & LOW_MASK, 100);
        }
        assert!(inodes.forget(there, 1));
        assert_eq!(look(&inodes, "b", object(DEV + 1, 100, 1)), there);
    }

    #[test]
    fn past_the_last_slot_objects_get_distinct_spare_numbers() {
        let inodes = Inodes::new(DEV);
        let numbers: Vec<u64> = (1..300)
            .map(|dev| look(&inodes, "f", object(DEV + dev, 100, 1)))
            .collect();
        let mut unique = numbers.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), numbers.len());
        assert!(numbers[298] >> SLOT_SHIFT == SPARE_SLOT);
    }

    #[test]
    fn a_recycled_inode_number_held_by_its_predecessor_gets_another_number() {
        let inodes = Inodes::new(DEV);
        let old = object(DEV, 700, 1);
        let new = object(DEV, 700, 2);
        assert_eq!(look(&inodes, "m", old), 700);
        let stand_in = look(&inodes, "m", new);
        assert_ne!(stand_in, 700);
        assert_eq!(look(&inodes, "m", new), stand_in, "stable while held");
        assert!(inodes.forget(700, 1));
        assert!(inodes.forget(stand_in, 2));
        assert_eq!(look(&inodes, "m", new), 700, "its own number once free");
        assert_ne!(generation_of(1), generation_of(2));
    }
}
