//! `open` and `release`: the open policy (which file is served how) and the handles it makes;
//! their reads are [`super::read`]'s.

use std::fs::File;
use std::io;
use std::sync::Arc;

use crate::models::{is_model_path, OpenModel, ServeMode};
use crate::stats::ops::Op;
use crate::sync::lock;

use super::handles::Handle;
use super::platform::{self, oflag, Acting};
use super::present::present_object;
use super::source_tree::SourceMeta;
use super::{FsError, Kind, Requester, TierFs};
use super::{CONTROL_DIR_INO, CONTROL_INO, METRICS_INO, STATS_INO};
use crate::source::Opened as SourceOpened;

/// How the kernel is to treat a handle this process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenFlags {
    /// Reads bypass the kernel's page cache (FUSE `FOPEN_DIRECT_IO`).
    pub direct_io: bool,
    /// The inode's page cache stays valid (FUSE `FOPEN_KEEP_CACHE`).
    pub keep_cache: bool,
}

/// How an `open` is answered.
#[derive(Debug)]
pub enum Opened<B> {
    /// A handle whose reads come to this process ([`TierFs::read`](super::TierFs::read)).
    Served { fh: u64, flags: OpenFlags },
    /// A handle whose reads the kernel serves from `backing` (passthrough).
    Passthrough { fh: u64, backing: Arc<B> },
}

impl<B: Send + Sync> TierFs<B> {
    /// `open` of inode `ino` with the kernel's open `flags` (`O_*`). `open_backing` makes the
    /// kernel's backing object for a passthrough open from a descriptor of the source file;
    /// it is called at most once, and only when passthrough is in force.
    pub fn open(
        &self,
        req: Requester,
        ino: u64,
        flags: i32,
        open_backing: &dyn Fn(File) -> io::Result<B>,
    ) -> Result<Opened<B>, FsError> {
        self.ops().time(Op::Open, || {
            if ino == CONTROL_INO {
                return self.open_control(req, flags);
            }
            if flags & oflag::ACCMODE != oflag::RDONLY || flags & oflag::TRUNC != 0 {
                return Err(FsError::ReadOnly);
            }
            match ino {
                CONTROL_DIR_INO => Err(FsError::IsDirectory),
                STATS_INO | METRICS_INO if req.uid != self.uid && req.uid != 0 => {
                    Err(FsError::Denied("the stats are the mounting user's"))
                }
                METRICS_INO => match self.metrics_text() {
                    Some(text) => Ok(Opened::Served {
                        fh: self.add_handle(ino, Handle::Stats(text)),
                        flags: OpenFlags {
                            direct_io: true,
                            keep_cache: false,
                        },
                    }),
                    None => Err(FsError::NotFound),
                },
                STATS_INO => Ok(Opened::Served {
                    fh: self.add_handle(ino, Handle::Stats(self.stats_json())),
                    flags: OpenFlags {
                        direct_io: true,
                        keep_cache: false,
                    },
                }),
                ino => self.open_source(ino, self.act_for(req)?, open_backing),
            }
        })
    }

    /// `release` (and `releasedir`) of handle `fh`; an unknown handle is ignored.
    pub fn release(&self, fh: u64) {
        let Some(handle) = self.handles.remove(fh) else {
            return;
        };
        match &handle.kind {
            Handle::Model(_) | Handle::ModelPassthrough(..) => {
                self.closed_model(handle.ino, &handle.kind)
            }
            Handle::Dir(_, numbered) => {
                for &ino in numbered {
                    if self.inodes.drop_unreferenced(ino) {
                        self.pruned(ino);
                    }
                }
            }
            _ => {}
        }
        if self.inodes.closed(handle.ino) {
            self.pruned(handle.ino);
        }
    }

    pub(super) fn add_handle(&self, ino: u64, kind: Handle<B>) -> u64 {
        self.inodes.opened(ino);
        self.handles.add(ino, kind)
    }

    fn open_source(
        &self,
        ino: u64,
        acting: Acting,
        open_backing: &dyn Fn(File) -> io::Result<B>,
    ) -> Result<Opened<B>, FsError> {
        let entry = self.inodes.entry(ino).ok_or(FsError::NotFound)?;
        let follow_links = acting.follow_links();
        let rel = self.live_path(&entry, follow_links);
        let abs = self.abs(&rel);
        self.check_acl(&rel, &acting)?;
        // The open, made as the requester (see `crate::access`), is the access check; what it
        // opened must be the object this inode stands for (else the kernel looks it up again),
        // whatever was swapped since.
        let (file, opened) = match self.source.open_regular(&rel, follow_links) {
            Ok(opened) => opened,
            Err(e) => return Err(self.open_refused(&rel, entry.object, follow_links, e)),
        };
        let object = match (&file, &opened) {
            (SourceOpened::File(file), SourceMeta::Local(meta)) => {
                platform::file_object_id(file, meta)
            }
            (_, meta) => meta.object_id(&abs, Kind::File),
        }
        .map_err(FsError::io("fstat"))?;
        if entry.object.is_some_and(|o| o != object) {
            return Err(FsError::Stale);
        }
        if is_model_path(&rel) {
            let identity = match (&file, &opened) {
                (SourceOpened::File(file), SourceMeta::Local(meta)) => {
                    platform::file_identity(file, meta)
                }
                (file, _) => file.identity(),
            }
            .map_err(FsError::io("fstat"))?;
            // Malformed model files are served by the read path too (uncached), never with
            // passthrough: the kernel refuses a passthrough open of an inode that is open in
            // cached mode, which a model file's earlier, well-formed version may still be.
            // The requester's own descriptor is what gets indexed, and becomes the handle's
            // source descriptor when the version has none open
            // (`ModelStore::open_handle_with`). Still acting as the requester: shard discovery
            // reads the files beside this one with their rights (`crate::models::shards`).
            // A remote file is opened by the store through the tree, which lists the version
            // `identity` names (or a newer one: then the open is stale).
            let model = match file {
                SourceOpened::File(file) => platform::open_model(&self.store, &rel, &abs, file),
                SourceOpened::Remote(_) => self.store.open_handle(&rel, &abs).map(Some),
            };
            // The rest runs with the daemon's own rights (passthrough needs them): it only
            // serves what the requester opened. (Windows: nothing was switched.)
            #[cfg_attr(windows, allow(clippy::drop_non_drop))]
            drop(acting);
            return match model {
                // Cached bytes are served only for the version the requester itself opened.
                Ok(Some(model)) if model.source().identity() == identity => {
                    self.open_model(ino, model, open_backing)
                }
                Ok(_) => Err(FsError::Stale),
                Err(e) => {
                    tracing::warn!(file = %abs.display(), error = %e, "cannot open model file");
                    Err(e.into())
                }
            };
        }
        #[cfg_attr(windows, allow(clippy::drop_non_drop))]
        drop(acting);
        if let (true, SourceOpened::File(local)) = (self.settings.passthrough, &file) {
            match self.backing(ino, || open_backing(local.try_clone()?)) {
                Ok(backing) => {
                    let fh = self.add_handle(ino, Handle::Passthrough(Arc::clone(&backing)));
                    return Ok(Opened::Passthrough { fh, backing });
                }
                Err(e) => {
                    tracing::debug!(file = %abs.display(), error = %e, "passthrough refused; serving with pread")
                }
            }
        }
        let fh = self.add_handle(ino, Handle::Plain(file));
        Ok(Opened::Served {
            fh,
            flags: OpenFlags::default(),
        })
    }

    /// Why the open of `rel` failed with `error`, as the path presents itself (the rare path,
    /// so looked up again): another object than the inode's (`object`) is stale, a link shown
    /// as a link or anything but a file is not to be opened, a directory is one.
    fn open_refused(
        &self,
        rel: &std::path::Path,
        object: Option<super::inodes::ObjectId>,
        follow_links: bool,
        error: io::Error,
    ) -> FsError {
        match present_object(&self.source, rel, follow_links) {
            Ok((now, ..)) if object.is_some_and(|o| o != now) => FsError::Stale,
            Ok((_, _, Kind::Directory, _)) => FsError::IsDirectory,
            Ok((_, _, Kind::File, _)) => FsError::io("open")(error),
            Ok(_) => FsError::Denied("not a regular file"),
            Err(_) => FsError::io("open")(error),
        }
    }

    /// Opens a model file in the mode its inode is already served in, or, for the inode's
    /// first open, passthrough if the file fits the budget (`ModelStore::choose_mode`).
    /// `O_DIRECT` opens follow the same rule: passthrough gives them the plain file's speed and
    /// semantics; serving them from the chunk cache made reloads faster but cold loads slower
    /// than the plain file (`crate::passthrough`, "O_DIRECT readers").
    fn open_model(
        &self,
        ino: u64,
        model: OpenModel,
        open_backing: &dyn Fn(File) -> io::Result<B>,
    ) -> Result<Opened<B>, FsError> {
        let gate = self.open_gates.gate(&ino);
        let _one_open_of_this_inode_at_a_time = lock(&gate);
        let current = lock(&self.open_modes).get(&ino).map(|(mode, _)| *mode);
        let mode = match current {
            Some(ServeMode::Passthrough) => {
                if !self.store.force_passthrough(&model) {
                    // Its other handles read another version's copy in the disk tier.
                    return Err(FsError::ModeConflict);
                }
                ServeMode::Passthrough
            }
            // A raw version still says why (its reason is its own, not the inode's).
            Some(ServeMode::Cache) if model.is_raw() => self.store.choose_mode(&model, false),
            Some(ServeMode::Cache) => ServeMode::Cache,
            None => self.store.choose_mode(
                &model,
                self.settings.passthrough && self.settings.model_passthrough,
            ),
        };
        if mode == ServeMode::Passthrough {
            // The version's whole copy in the disk tier where it is read from there
            // (`ModelStore::choose_mode`), else the source file.
            let backing_file = || match model.tier_copy_file() {
                Some(copy) => copy,
                None => platform::reopen(model.source()),
            };
            match self.backing(ino, || open_backing(backing_file()?)) {
                Ok(backing) => {
                    lock(&self.open_modes).entry(ino).or_insert((mode, 0)).1 += 1;
                    let handle = Handle::ModelPassthrough(model, Arc::clone(&backing));
                    let fh = self.add_handle(ino, handle);
                    return Ok(Opened::Passthrough { fh, backing });
                }
                Err(e) => {
                    tracing::info!(file = %model.path().display(), error = %e, "passthrough refused; serving from the cache");
                    self.store.close_passthrough(&model);
                    if lock(&self.open_modes).contains_key(&ino) {
                        return Err(FsError::ModeConflict); // its other handles are passthrough
                    }
                    self.store.choose_mode(&model, false);
                }
            }
        }
        lock(&self.open_modes)
            .entry(ino)
            .or_insert((ServeMode::Cache, 0))
            .1 += 1;
        let flags = self.model_open_flags(ino, model.generation());
        let fh = self.add_handle(ino, Handle::Model(model));
        Ok(Opened::Served { fh, flags })
    }

    /// The backing object of inode `ino`'s passthrough opens: the live one, or a new one made
    /// by `open`.
    ///
    /// The open (a reopen of the source file and an ioctl on `/dev/fuse`) runs without the
    /// table's lock; of two opens racing for one inode, the first to register its backing
    /// wins and the other's is dropped.
    fn backing(&self, ino: u64, open: impl FnOnce() -> io::Result<B>) -> io::Result<Arc<B>> {
        if let Some(backing) = self.live_backing(ino) {
            return Ok(backing);
        }
        let backing = Arc::new(open()?);
        let mut backings = lock(&self.backings);
        if let Some(winner) = backings.get(&ino).and_then(std::sync::Weak::upgrade) {
            return Ok(winner);
        }
        backings.retain(|_, b| b.strong_count() > 0);
        backings.insert(ino, Arc::downgrade(&backing));
        Ok(backing)
    }

    fn live_backing(&self, ino: u64) -> Option<Arc<B>> {
        lock(&self.backings)
            .get(&ino)
            .and_then(std::sync::Weak::upgrade)
    }

    /// A handle of model inode `ino` closed.
    fn closed_model(&self, ino: u64, handle: &Handle<B>) {
        if let Handle::ModelPassthrough(model, _) = handle {
            self.store.close_passthrough(model);
        }
        let mut modes = lock(&self.open_modes);
        if let Some((_, count)) = modes.get_mut(&ino) {
            *count -= 1;
            if *count == 0 {
                modes.remove(&ino);
            }
        }
    }

    /// Opens the control file: write-only, for the mounting user (or root).
    fn open_control(&self, req: Requester, flags: i32) -> Result<Opened<B>, FsError> {
        if flags & oflag::ACCMODE != oflag::WRONLY {
            return Err(FsError::Denied("the control file is write-only"));
        }
        if req.uid != self.uid && req.uid != 0 {
            return Err(FsError::Denied("the control file is the mounting user's"));
        }
        let fh = self.add_handle(CONTROL_INO, Handle::Control);
        Ok(Opened::Served {
            fh,
            flags: OpenFlags {
                direct_io: true,
                keep_cache: false,
            },
        })
    }

    /// Model files are opened with `direct_io` where the kernel still allows `mmap` of such
    /// files (`FUSE_DIRECT_IO_ALLOW_MMAP`, Linux 6.6+): each `read()` then reaches the cache
    /// with the reader's own offsets and sizes, copied once, straight into the reader's
    /// buffer, with no page cache of the mounted file and no kernel readahead. Readahead would
    /// read past the end of what the reader asked for, into whatever block comes next *in the
    /// file*, which both blurs the block order tierfs learns and costs a disk read of a block
    /// the reader may not want; tierfs's own prefetch does the reading ahead instead. `mmap`
    /// readers still go through the page cache (kept to the window). Older kernels keep page
    /// cache mode.
    ///
    /// `keep_cache` is set when the inode's page cache was filled from this same file
    /// generation. Without it the kernel drops the inode's whole page cache at every open,
    /// waiting on each page still being read for an `mmap` reader, which then faults the pages
    /// it had just read in again
    /// ([measured](../../../docs/PERFORMANCE.md#open-flags-of-cache-served-model-files)). When
    /// the generation changed (the file was rewritten in place), the flag is left out, so the
    /// stale pages go.
    fn model_open_flags(&self, ino: u64, generation: u64) -> OpenFlags {
        let previous = lock(&self.page_cache_generations).insert(ino, generation);
        OpenFlags {
            direct_io: self.direct_io_mmap,
            keep_cache: previous == Some(generation),
        }
    }
}
