//! Commands accepted by `MOUNTPOINT/.tierfs/control`, one per `write()`.
//!
//! - `ram-cache SIZE`: change the cache budget (shrinking evicts at once);
//! - `drop`: empty the cache;
//! - `prefetch PATH`: warm a model file (PATH relative to the mount root) in its learned block
//!   order, in the background, up to the budget;
//! - `plan` and one PATH per line after it: the model files a client will load, in order; the
//!   first is warmed now, each next one when a reader is done with the one before
//!   ([`crate::models`]' plan). `plan` alone clears it. Paths that are not model files refuse
//!   the command; a file that cannot be opened (gone since) or is served as plain bytes is
//!   left out of the plan, with the reason logged.
//!
//! [`apply`] carries a command out; both front ends (FUSE, WinFsp) call it.
//!
//! Parsing is strict: one command, its arguments, optional surrounding whitespace (so `echo`'s
//! newline is fine), nothing else. Anything unexpected is an error with a reason, and the
//! daemon then changes nothing.

use std::path::{Component, Path, PathBuf};

use thiserror::Error;

use crate::models::{is_model_path, Layout, ModelStore, OpenError};
use crate::size::{parse_size, SizeError};

/// Longest command accepted: a plan of a few long paths (PATH_MAX is 4096), or many short ones.
pub const MAX_COMMAND_BYTES: usize = 16 * 1024;

/// Files a plan may name ([`crate::models::MAX_PLAN_FILES`]).
pub use crate::models::MAX_PLAN_FILES;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    RamCache(u64),
    Drop,
    Prefetch(PathBuf),
    Plan(Vec<PathBuf>),
}

#[derive(Debug, Error)]
pub enum ControlError {
    #[error("command is {0} bytes; the longest accepted is {MAX_COMMAND_BYTES}")]
    TooLong(usize),
    #[error("command is not UTF-8 text")]
    NotText,
    #[error("empty command (expected ram-cache SIZE, drop, prefetch PATH or plan PATHS)")]
    Empty,
    #[error("unknown command {0:?} (expected ram-cache SIZE, drop, prefetch PATH or plan PATHS)")]
    Unknown(String),
    #[error("{command} takes {expected}")]
    Arguments {
        command: &'static str,
        expected: &'static str,
    },
    #[error(transparent)]
    Size(#[from] SizeError),
    #[error("prefetch path {0:?} must be relative to the mount root and stay inside it")]
    Path(String),
    #[error("a plan names {0} files; at most {MAX_PLAN_FILES} are accepted")]
    PlanTooLong(usize),
    #[error("{} is not a model file in the mount", .0.display())]
    NotAModel(PathBuf),
    #[error("{} is served as plain bytes, not prefetched: {why}", path.display())]
    Raw { path: PathBuf, why: String },
    #[error(transparent)]
    Open(#[from] OpenError),
}

/// Parses one write to the control file.
pub fn parse(bytes: &[u8]) -> Result<Command, ControlError> {
    if bytes.len() > MAX_COMMAND_BYTES {
        return Err(ControlError::TooLong(bytes.len()));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| ControlError::NotText)?
        .trim();
    let (word, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    if word == "plan" {
        return parse_plan(rest);
    }
    let rest = rest.trim();
    match word {
        "" => Err(ControlError::Empty),
        "drop" if rest.is_empty() => Ok(Command::Drop),
        "drop" => Err(ControlError::Arguments {
            command: "drop",
            expected: "no arguments",
        }),
        "ram-cache" if rest.is_empty() => Err(ControlError::Arguments {
            command: "ram-cache",
            expected: "one SIZE, e.g. ram-cache 8GiB",
        }),
        "ram-cache" => Ok(Command::RamCache(parse_size(rest)?)),
        "prefetch" if rest.is_empty() => Err(ControlError::Arguments {
            command: "prefetch",
            expected: "one PATH relative to the mount root",
        }),
        "prefetch" => relative_path(rest).map(Command::Prefetch),
        other => Err(ControlError::Unknown(other.chars().take(64).collect())),
    }
}

/// Carries out `command` on `store`, whose files live under `source` (the mount's SOURCE); on
/// error nothing has changed.
pub fn apply(store: &ModelStore, source: &Path, command: Command) -> Result<(), ControlError> {
    match command {
        Command::RamCache(bytes) => {
            store.set_budget(bytes);
            tracing::info!(budget = bytes, "cache budget changed");
        }
        Command::Drop => {
            store.drop_cached();
            tracing::info!("cache dropped");
        }
        Command::Prefetch(rel) => {
            let abs = source.join(&rel);
            if !is_model_path(&rel) {
                return Err(ControlError::NotAModel(rel));
            }
            // A regular file, or a link to one (as the mount presents it), reached the way the
            // store reaches SOURCE (never through /proc or into the mount).
            let model = match store.open(&rel, &abs) {
                Ok(model) => model,
                Err(e) if e.is_not_a_file() => return Err(ControlError::NotAModel(rel)),
                Err(e) => return Err(e.into()),
            };
            if let Layout::Raw { why } = model.layout() {
                return Err(ControlError::Raw {
                    path: rel,
                    why: why.to_string(),
                });
            }
            store.warm(&model);
            tracing::info!(file = %rel.display(), "warming");
        }
        Command::Plan(paths) => {
            let mut files = Vec::with_capacity(paths.len());
            for rel in &paths {
                match store.open(rel, &source.join(rel)) {
                    Ok(model) if !model.is_raw() => files.push(model),
                    Ok(model) => {
                        tracing::info!(file = %rel.display(), why = ?model.layout(), "left out of the plan: served as plain bytes")
                    }
                    Err(e) => {
                        tracing::info!(file = %rel.display(), error = %e, "left out of the plan")
                    }
                }
            }
            tracing::info!(files = ?paths, kept = files.len(), "plan");
            store.set_plan(files);
        }
    }
    Ok(())
}

/// `plan`'s lines: one path per line (so that a path may hold spaces), blank lines skipped.
fn parse_plan(lines: &str) -> Result<Command, ControlError> {
    let paths = lines
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(relative_path)
        .collect::<Result<Vec<_>, _>>()?;
    if paths.len() > MAX_PLAN_FILES {
        return Err(ControlError::PlanTooLong(paths.len()));
    }
    if let Some(bad) = paths.iter().find(|p| !is_model_path(p)) {
        return Err(ControlError::NotAModel(bad.clone()));
    }
    Ok(Command::Plan(paths))
}

fn relative_path(text: &str) -> Result<PathBuf, ControlError> {
    let path = Path::new(text);
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            _ => return Err(ControlError::Path(text.to_owned())),
        }
    }
    if clean.as_os_str().is_empty() {
        return Err(ControlError::Path(text.to_owned()));
    }
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_commands() {
        assert_eq!(parse(b"drop\n").unwrap(), Command::Drop);
        assert_eq!(
            parse(b"ram-cache 8GiB").unwrap(),
            Command::RamCache(8 << 30)
        );
        assert_eq!(
            parse(b"  ram-cache 512MiB \n").unwrap(),
            Command::RamCache(512 << 20)
        );
        assert_eq!(
            parse(b"prefetch sub/m.safetensors\n").unwrap(),
            Command::Prefetch("sub/m.safetensors".into())
        );
        assert_eq!(
            parse(b"prefetch ./m.sft").unwrap(),
            Command::Prefetch("m.sft".into())
        );
    }

    #[test]
    fn a_plan_is_one_path_per_line() {
        assert_eq!(parse(b"plan").unwrap(), Command::Plan(vec![]));
        assert_eq!(parse(b"plan\n").unwrap(), Command::Plan(vec![]));
        assert_eq!(
            parse(b"plan\ndiffusion_models/high noise.safetensors\r\n\n./vae/v.sft\n").unwrap(),
            Command::Plan(vec![
                "diffusion_models/high noise.safetensors".into(),
                "vae/v.sft".into()
            ])
        );
        assert!(matches!(
            parse(b"plan\na.safetensors\n../b.safetensors"),
            Err(ControlError::Path(_))
        ));
        assert!(matches!(
            parse(b"plan\na.safetensors\nnotes.txt"),
            Err(ControlError::NotAModel(_))
        ));
        let long: String = (0..=MAX_PLAN_FILES)
            .map(|i| format!("m{i}.sft\n"))
            .collect();
        assert!(matches!(
            parse(format!("plan\n{long}").as_bytes()),
            Err(ControlError::PlanTooLong(_))
        ));
    }

    #[test]
    fn rejects_everything_else_with_a_reason() {
        for bad in [
            &b""[..],
            b"\n",
            b"dorp",
            b"drop now",
            b"ram-cache",
            b"ram-cache lots",
            b"ram-cache 1G 2G",
            b"prefetch",
            b"prefetch ../../etc/passwd",
            b"prefetch /etc/passwd",
            b"prefetch .",
            b"\xff\xfe",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(!err.to_string().is_empty(), "{bad:?}");
        }
        assert!(matches!(
            parse(&vec![b'a'; MAX_COMMAND_BYTES + 1]),
            Err(ControlError::TooLong(_))
        ));
    }
}
