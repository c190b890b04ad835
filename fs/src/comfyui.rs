//! `tierfs comfyui-config`: prints an `extra_model_paths.yaml` section that points ComfyUI's
//! model folders at a tierfs mount.
//!
//! ComfyUI (`utils/extra_config.py`) reads each top-level section of that file as
//! `base_path` plus `folder_name: subfolder` pairs (a value may hold several subfolders, one
//! per line) and adds `base_path/subfolder` to that folder's search list. The folder names are
//! the keys of `folder_names_and_paths` in ComfyUI's `folder_paths.py`; `unet` and `clip` are
//! legacy names that ComfyUI maps to `diffusion_models` and `text_encoders`.
//!
//! Each key is mapped to the first of its candidate subfolders that exists under the mount
//! (directly, or under `models/` when the mount is a whole ComfyUI directory); when none
//! exists the conventional name is written anyway, so the section keeps working once the
//! folder appears. Strings are written as YAML double-quoted scalars (JSON string syntax, which
//! YAML 1.1 and 1.2 parsers both read), so any path is safe.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::mount::is_tierfs_mount;

/// ComfyUI folder name → subfolders to look for under the mount, conventional name first.
pub const FOLDERS: &[(&str, &[&str])] = &[
    ("checkpoints", &["checkpoints"]),
    ("diffusion_models", &["diffusion_models", "unet"]),
    ("unet", &["unet", "diffusion_models"]),
    ("loras", &["loras"]),
    ("vae", &["vae"]),
    ("clip", &["clip", "text_encoders"]),
    ("text_encoders", &["text_encoders", "clip"]),
    ("clip_vision", &["clip_vision"]),
    ("controlnet", &["controlnet"]),
    ("upscale_models", &["upscale_models"]),
    ("embeddings", &["embeddings"]),
];

/// `tierfs comfyui-config MOUNTPOINT [--name NAME]`.
pub fn run(mountpoint: &Path, name: &str) -> Result<()> {
    let base = absolute(mountpoint)?;
    if !is_tierfs_mount(&base) {
        say!(
            "tierfs: warning: {} is not a live tierfs mount; folders are looked up in it as it is now",
            base.display()
        );
    }
    print!("{}", render(&base, name, |rel| base.join(rel).is_dir())?);
    Ok(())
}

/// The YAML section for `base`; `exists(rel)` says whether `base/rel` is a directory.
pub fn render(base: &Path, name: &str, exists: impl Fn(&str) -> bool) -> Result<String> {
    if name.trim().is_empty() {
        bail!("--name must not be empty");
    }
    let base_str = base
        .to_str()
        .with_context(|| format!("mountpoint {} is not valid UTF-8", base.display()))?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# ComfyUI model folders served by tierfs from {base_str}.\n\
         # Add this section to ComfyUI/extra_model_paths.yaml, or save it to a file and start\n\
         # ComfyUI with --extra-model-paths-config FILE."
    );
    let key = if name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        name.to_string()
    } else {
        quote(name)
    };
    let _ = writeln!(out, "{key}:");
    let _ = writeln!(out, "    base_path: {}", quote(base_str));
    for (key, candidates) in FOLDERS {
        let found = candidates
            .iter()
            .flat_map(|c| [c.to_string(), format!("models/{c}")])
            .find(|rel| exists(rel))
            .unwrap_or_else(|| candidates[0].to_string());
        let _ = writeln!(out, "    {key}: {}", quote(&found));
    }
    Ok(out)
}

/// A YAML double-quoted scalar (JSON string syntax).
fn quote(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

fn absolute(path: &Path) -> Result<PathBuf> {
    if let Ok(canonical) = path.canonicalize() {
        return Ok(canonical);
    }
    // Not reachable (not mounted yet, or a dead mount): keep the path as given, made absolute.
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(std::env::current_dir()
        .context("cannot find the current directory")?
        .join(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_every_folder_and_prefers_existing_ones() {
        let out = render(Path::new("/mnt/models"), "tierfs", |rel| {
            matches!(rel, "unet" | "models/loras" | "clip")
        })
        .unwrap();
        assert!(
            out.contains("\ntierfs:\n    base_path: \"/mnt/models\"\n"),
            "{out}"
        );
        assert!(out.contains("    checkpoints: \"checkpoints\"\n"));
        assert!(out.contains("    diffusion_models: \"unet\"\n"));
        assert!(out.contains("    unet: \"unet\"\n"));
        assert!(out.contains("    loras: \"models/loras\"\n"));
        assert!(out.contains("    text_encoders: \"clip\"\n"));
        assert!(out.contains("    clip: \"clip\"\n"));
        for (key, _) in FOLDERS {
            assert!(
                out.contains(&format!("\n    {key}: \"")),
                "{key} missing:\n{out}"
            );
        }
    }

    #[test]
    fn quotes_awkward_paths() {
        let out = render(Path::new("/mnt/a \"b\": #c\\d"), "my: name", |_| false).unwrap();
        assert!(out.contains("\"my: name\":\n"), "{out}");
        assert!(
            out.contains("base_path: \"/mnt/a \\\"b\\\": #c\\\\d\"\n"),
            "{out}"
        );
    }

    #[test]
    fn empty_name_is_refused() {
        assert!(render(Path::new("/m"), " ", |_| false).is_err());
    }
}
