//! An open handle of a model file, and what its close prunes.
//!
//! A front end opens a model file with [`ModelStore::open_handle`] and keeps the [`OpenModel`]
//! for as long as its handle is open. The handle holds the version's source descriptors
//! ([`crate::source::slot`]), so its reads go on from the version it opened whatever SOURCE
//! does meanwhile; handles of one version share one set of descriptors.
//!
//! When the last handle of a version closes, and SOURCE no longer holds that version (the file
//! was deleted, replaced or rewritten), the version is pruned: taken out of the known files, its
//! cached chunks and parked page cache dropped from the budget, its queued prefetches skipped.
//! Nobody can read them any more: a later open finds the new version, or nothing. Its
//! descriptors close with the handle, or, if a prefetch worker is reading a chunk of it at that
//! moment, when that read ends (whatever that read brings in is dropped too, see
//! `ModelFile::fetch_chunk`). A version still in SOURCE stays known (its header and index,
//! within `--index-cache`), with no descriptor, and its chunks stay cached for the next open.

use std::ops::Deref;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::store::OpenedBy;
use super::{sequence, ModelFile, ModelStore, OpenError};
use crate::source::SourceFile;
use crate::sync::lock;

/// An open handle of one model file version (see the module docs).
pub struct OpenModel {
    file: Arc<ModelFile>,
    source: Arc<SourceFile>,
    store: Arc<ModelStore>,
}

impl OpenModel {
    /// The file version this handle reads.
    pub fn file(&self) -> &Arc<ModelFile> {
        &self.file
    }

    /// The open descriptors of the version (e.g. to hand the kernel a backing file for
    /// passthrough). Shadows [`ModelFile::source`], the version without descriptors.
    pub fn source(&self) -> &SourceFile {
        &self.source
    }
}

impl Deref for OpenModel {
    type Target = ModelFile;

    fn deref(&self) -> &ModelFile {
        &self.file
    }
}

impl Drop for OpenModel {
    fn drop(&mut self) {
        if self.file.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.store.closed(&self.file);
        }
    }
}

impl std::fmt::Debug for OpenModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenModel")
            .field("file", &self.file.path)
            .field("generation", &self.file.generation)
            .finish()
    }
}

impl ModelStore {
    /// Opens the current version of the model file at `path` (relative to the mount root,
    /// source `abs`) for a handle: [`Self::open`], with the version's descriptors held until
    /// the returned handle is dropped. Fails with [`crate::source::SourceError::Changed`] when
    /// `abs` was replaced between the two.
    pub fn open_handle(self: &Arc<Self>, path: &Path, abs: &Path) -> Result<OpenModel, OpenError> {
        let (file, source) = self.open_version((path, abs, None), OpenedBy::Reader)?;
        let source = match source {
            Some(source) => source,
            None => file.source.get()?,
        };
        Ok(self.handle(file, source))
    }

    /// [`Self::open_handle`] for a front end that opened `abs` already (as the requester:
    /// the access check), and checked that `opened` is the object its inode stands for: the
    /// version indexed is the one that descriptor reads (what the requester opened, never
    /// what the path names a moment later), and the descriptor is the handle's if the version
    /// has none open, which saves an `open`, a `fadvise` and an `fstat` per open of a known
    /// file. Returns `None` when a version indexed meanwhile by another open is not the one
    /// `opened` reads (the front end answers `ESTALE`).
    #[cfg(target_os = "linux")]
    pub fn open_handle_with(
        self: &Arc<Self>,
        path: &Path,
        abs: &Path,
        opened: std::fs::File,
    ) -> Result<Option<OpenModel>, OpenError> {
        let (file, source) = self.open_version((path, abs, Some(&opened)), OpenedBy::Reader)?;
        let source = match source {
            Some(source) => source,
            None => match file.source.get_or_adopt(opened)? {
                Some(source) => source,
                None => return Ok(None),
            },
        };
        Ok(Some(self.handle(file, source)))
    }

    fn handle(self: &Arc<Self>, file: Arc<ModelFile>, source: Arc<SourceFile>) -> OpenModel {
        file.handles.fetch_add(1, Ordering::AcqRel);
        OpenModel {
            file,
            source,
            store: Arc::clone(self),
        }
    }

    /// The last open handle of `file` closed: prunes the version if SOURCE no longer holds it.
    fn closed(&self, file: &Arc<ModelFile>) {
        // Only a file a reader streamed is a step of a workflow; a header scan probes many.
        let streamed = file.streamed.load(Ordering::Relaxed);
        if streamed {
            // The plan's warm was for this load (not for a probe's open and close before it):
            // a later open is decided afresh.
            file.warmed_by_plan.store(false, Ordering::Release);
        }
        // A file passthrough serves is read unseen by the mount: its close is all the plan
        // learns of its load (for a loader that maps it, the reads may go on after it).
        let passthrough = file.mode() == super::ServeMode::Passthrough;
        if streamed || passthrough {
            // A plan is told what comes next; the learned sequence guesses.
            match self.planned_after(file) {
                Some(next) => self.warm_planned(&next),
                None if streamed => self.warm_successor(file),
                None => {}
            }
        }
        if file.source.is_current() {
            return;
        }
        tracing::info!(file = %file.source.path().display(), "source deleted or replaced: forgetting the closed version and its cached bytes");
        file.pruned.store(true, Ordering::SeqCst);
        self.lock().remove_version(&file.path, file);
        self.cache.forget_file(file.generation);
        self.passthrough.forget(&file.source.identity());
        self.rebalance();
    }

    /// Warms the model that followed `file` last time ([`sequence`]).
    fn warm_successor(&self, file: &Arc<ModelFile>) {
        let successor = lock(&self.sequence).closed(file);
        match successor {
            sequence::Successor::Known(Some(next)) => self.warm_next(&next),
            sequence::Successor::Known(None) => {}
            sequence::Successor::Unknown { guess } => {
                if !self.warm_saved_next(sequence::key_of(file)) {
                    if let Some(guess) = guess {
                        tracing::debug!(file = %guess.path.display(), "guessing the next model: the first of the chain that led here");
                        self.warm_next(&guess);
                    }
                }
            }
        }
    }
}
