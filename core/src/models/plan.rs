//! The plan: the model files a client says it will load, in order (`plan` on the control file;
//! ComfyUI's custom node sends the files a queued prompt's loaders name).
//!
//! Contract:
//! - A new plan replaces the one before; an empty plan clears it.
//! - When the plan is set, its first file no reader has open is warmed at once (up to the
//!   budget), unless a file of the plan is open: the reader is then in the plan, at that file.
//! - When a reader has streamed a file of the plan and its last handle closes (or the last
//!   handle of a plan's file served by passthrough closes: the mount sees nothing else of its
//!   load), the plan's next file is warmed (up to the budget), whatever the learned sequence says
//!   ([`super::sequence`] warms only a head of the learned successor: it guesses, a plan is
//!   told). A file of the plan that a reader streams out of order moves the plan there.
//! - The plan holds at most [`MAX_PLAN_FILES`] files, each opened as the store opens any model
//!   file; the plan is never waited on: a reader of a planned file that is not warmed yet
//!   reads it as any other.
//!
//! The plan is a hint about the near future, never a promise: what it warms is evicted by the
//! cache's rule like any prefetch.

use std::sync::Arc;

use super::ModelFile;

/// Files a plan holds at most: several queued prompts' loaders (a workflow names 2–10 files).
pub const MAX_PLAN_FILES: usize = 64;

/// The mount's plan.
#[derive(Default)]
pub struct Plan {
    files: Vec<Arc<ModelFile>>,
    /// Index of the file the reader is at or that is warmed for it; files before it are done.
    at: usize,
}

/// What the plan's owner should warm now.
pub type Warm = Option<Arc<ModelFile>>;

impl Plan {
    /// Replaces the plan with `files` (at most [`MAX_PLAN_FILES`] kept); returns the file to
    /// warm now: the first one nobody has open, unless a reader has one of them open.
    pub fn set(&mut self, mut files: Vec<Arc<ModelFile>>) -> Warm {
        files.truncate(MAX_PLAN_FILES);
        self.files = files;
        self.at = 0;
        if let Some(open) = self.files.iter().position(|f| is_open(f)) {
            self.at = open;
            return None;
        }
        self.files.first().cloned()
    }

    /// A reader streams `file`: if it is in the plan from the current file on, the plan is there.
    pub fn streamed(&mut self, file: &ModelFile) {
        if let Some(i) = self.position_from_current(file) {
            self.at = i;
        }
    }

    /// The last handle of `file` closed after a reader streamed it (or after passthrough served
    /// it): the file after it in the plan is returned to be warmed, if `file` is in the plan
    /// from the current file on.
    pub fn closed(&mut self, file: &ModelFile) -> Warm {
        let i = self.position_from_current(file)?;
        self.at = i + 1;
        self.files.get(self.at).cloned()
    }

    /// The plan's files (paths as the mount shows them) and the index of the current one.
    pub fn snapshot(&self) -> (Vec<String>, usize) {
        let paths = self
            .files
            .iter()
            .map(|f| f.path.to_string_lossy().into_owned())
            .collect();
        (paths, self.at)
    }

    fn position_from_current(&self, file: &ModelFile) -> Option<usize> {
        self.files
            .iter()
            .skip(self.at)
            .position(|f| f.generation == file.generation)
            .map(|i| i + self.at)
    }
}

fn is_open(file: &ModelFile) -> bool {
    file.handles.load(std::sync::atomic::Ordering::Acquire) > 0
}
