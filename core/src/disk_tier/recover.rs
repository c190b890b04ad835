//! Taking DIR over at a mount's start: its lock, and what an earlier mount left in it.
//!
//! **Contract.** [`take_lock`] gives the folder to this process or says which process holds
//! it. [`take_in`] adopts every version whose log and data file agree (the log replayed up to
//! its first damaged record and rewritten when it has records to shed; the data file's pages no
//! record vouches for freed) and deletes the files of every other one: nothing is served at a
//! restart that a record does not vouch for, and every chunk is still checked on its way back.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use super::index::TierIndex;
use super::log::{replay, Held, Record, RECORD_BYTES};
use super::{io, version_file, DiskTierError, VersionFiles, DATA, LOG};

/// Locks DIR for this process, or says who holds it.
pub(super) fn take_lock(given: &Path, path: &Path) -> Result<File, DiskTierError> {
    let lock_err = |source| DiskTierError::Lock {
        path: path.to_owned(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(lock_err)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "a process that did not say which".to_owned(),
                pid => format!("process {pid}"),
            };
            return Err(DiskTierError::InUse {
                dir: given.to_owned(),
                holder,
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(lock_err(e)),
    }
    file.set_len(0).map_err(lock_err)?;
    file.write_all(std::process::id().to_string().as_bytes())
        .map_err(lock_err)?;
    Ok(file)
}

/// Takes in the versions an earlier mount left in `dir`, oldest first: each log replayed (and
/// rewritten when it has records to shed), the data file's unrecorded pages freed; a log
/// without its data file (or of another size), or a data file without its log, is deleted.
pub(super) fn take_in(
    dir: &Path,
    index: &mut TierIndex,
) -> Result<HashMap<String, Arc<VersionFiles>>, DiskTierError> {
    let listing = std::fs::read_dir(dir).map_err(|source| DiskTierError::List {
        dir: dir.to_owned(),
        source,
    })?;
    let mut logs = Vec::new();
    let mut datas = Vec::new();
    for entry in listing.flatten() {
        let path = entry.path();
        let (Some(stem), Some(ext)) = (
            path.file_stem().and_then(|s| s.to_str()).map(str::to_owned),
            path.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        match ext {
            LOG => {
                let modified = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                logs.push((modified, stem));
            }
            DATA => datas.push(stem),
            "tmp" => remove(&path),
            _ => {}
        }
    }
    logs.sort();
    let mut files = HashMap::new();
    for (_, name) in logs {
        if let Some(opened) = take_in_version(dir, &name, index) {
            files.insert(name, Arc::new(opened));
        }
    }
    for name in datas {
        if !files.contains_key(&name) {
            remove(&version_file(dir, &name, DATA));
        }
    }
    Ok(files)
}

/// One version of [`take_in`]: its files, opened, or `None` (and both deleted).
fn take_in_version(dir: &Path, name: &str, index: &mut TierIndex) -> Option<VersionFiles> {
    let data_path = version_file(dir, name, DATA);
    let log_path = version_file(dir, name, LOG);
    let forget = || {
        remove(&data_path);
        remove(&log_path);
    };
    let Ok(bytes) = std::fs::read(&log_path) else {
        forget();
        return None;
    };
    let replayed = replay(&bytes);
    let Some(size) = replayed.size else {
        forget();
        return None;
    };
    let Ok(data) = OpenOptions::new().read(true).write(true).open(&data_path) else {
        forget();
        return None;
    };
    if replayed.held.is_empty() || data.metadata().map(|m| m.len()).ok() != Some(size) {
        drop(data); // Windows deletes no file that is open
        forget();
        return None;
    }
    // Pages no record vouches for (a chunk written when the mount stopped) are freed.
    let mut at = 0;
    for (&start, held) in &replayed.held {
        io::punch(&data, at, start);
        at = held.end;
    }
    io::punch(&data, at, size);
    if replayed.superseded > 0 || replayed.valid_len < bytes.len() {
        let mut fresh = Vec::with_capacity((replayed.held.len() + 1) * RECORD_BYTES);
        fresh.extend_from_slice(&Record::Header { size }.encode());
        for (&start, &Held { end, hash }) in &replayed.held {
            fresh.extend_from_slice(&Record::Add { start, end, hash }.encode());
        }
        if let Err(e) = rewrite(&log_path, &fresh) {
            tracing::warn!(log = %log_path.display(), error = %e, "cannot rewrite a disk tier log: dropping its version");
            drop(data);
            forget();
            return None;
        }
    }
    let log = OpenOptions::new().append(true).open(&log_path).ok()?;
    index.adopt(name.to_owned(), size, replayed.held);
    Some(VersionFiles::new(data_path, data, log))
}

/// Replaces `path` with `bytes` whole (a crash leaves the old file or the new one).
fn rewrite(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

pub(super) fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::debug!(path = %path.display(), error = %e, "cannot remove a disk tier file");
        }
    }
}
