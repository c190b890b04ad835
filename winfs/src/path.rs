//! What a WinFsp file name (`\models\x.safetensors`, relative to the volume root) names: a path
//! under SOURCE, or one of the `\.tierfs` files.
//!
//! Names are matched case-insensitively, as Windows does (`\.TIERFS\Stats` is the stats file).
//! Components `.` and `..` never reach a file system from the Windows I/O manager; one that does
//! is refused rather than resolved, so nothing outside SOURCE can be named.

use std::path::PathBuf;

use tierfs_core::fs::FsError;

use crate::status::WinError;

/// Name of the control directory at the mount root (as on Linux).
pub const CONTROL_DIR: &str = tierfs_core::fs::CONTROL_DIR;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A path relative to SOURCE (empty for the root).
    Source(PathBuf),
    ControlDir,
    Stats,
    Control,
}

/// Resolves the WinFsp file name `name` (backslash-separated, leading backslash optional).
pub fn resolve(name: &str) -> Result<Target, WinError> {
    let parts: Vec<&str> = name.split('\\').filter(|p| !p.is_empty()).collect();
    if let Some(bad) = parts.iter().find(|p| is_unsafe(p)) {
        return Err(WinError::InvalidName((*bad).to_owned()));
    }
    match parts.as_slice() {
        [dir] if dir.eq_ignore_ascii_case(CONTROL_DIR) => Ok(Target::ControlDir),
        [dir, file] if dir.eq_ignore_ascii_case(CONTROL_DIR) => {
            if file.eq_ignore_ascii_case("stats") {
                Ok(Target::Stats)
            } else if file.eq_ignore_ascii_case("control") {
                Ok(Target::Control)
            } else {
                Err(FsError::NotFound.into())
            }
        }
        [dir, ..] if dir.eq_ignore_ascii_case(CONTROL_DIR) => Err(FsError::NotFound.into()),
        _ => Ok(Target::Source(parts.iter().collect())),
    }
}

/// `.`, `..`, a drive (`C:`) or a stream (`x:y`), or a forward slash: never a plain name.
fn is_unsafe(part: &str) -> bool {
    part == "." || part == ".." || part.contains(':') || part.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_source_paths_or_control_files() {
        assert_eq!(resolve("\\").unwrap(), Target::Source(PathBuf::new()));
        assert_eq!(
            resolve("\\checkpoints\\m.safetensors").unwrap(),
            Target::Source(["checkpoints", "m.safetensors"].iter().collect())
        );
        assert_eq!(resolve("\\.tierfs").unwrap(), Target::ControlDir);
        assert_eq!(resolve("\\.TierFS\\Stats").unwrap(), Target::Stats);
        assert_eq!(resolve("\\.tierfs\\control").unwrap(), Target::Control);
        assert!(matches!(
            resolve("\\.tierfs\\other"),
            Err(WinError::Fs(FsError::NotFound))
        ));
        for bad in [
            "\\..\\secret",
            "\\a\\.",
            "\\C:\\x",
            "\\m.safetensors:stream",
            "\\a/b",
        ] {
            assert!(
                matches!(resolve(bad), Err(WinError::InvalidName(_))),
                "{bad}"
            );
        }
    }
}
