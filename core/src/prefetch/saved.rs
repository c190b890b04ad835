//! Learned orders kept across remounts: one small JSON file in the daemon's state directory
//! (never in SOURCE, which is mounted read-only and may not be ours to write).
//!
//! Orders are keyed by the source file's canonical path, size and modification time: a file
//! replaced or rewritten starts fresh, and an order whose block count no longer
//! matches the file is ignored when loaded ([`crate::prefetch::access::FileAccess::new`]). The
//! file is rewritten (to a temporary name, then renamed) each time a pass is learned, which is
//! at most once per sampling step; it holds one short list of numbers per model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::prefetch::order::AccessOrder;
use crate::source::SourceIdentity;

/// Orders kept at most; beyond this the alphabetically first keys are dropped. A models folder
/// has tens of files, so this only bounds a pathological state file.
const MAX_ORDERS: usize = 4096;

/// The saved orders of a mount.
#[derive(Debug, Default)]
pub struct SavedOrders {
    path: Option<PathBuf>,
    orders: Mutex<BTreeMap<String, AccessOrder>>,
}

impl SavedOrders {
    /// Orders from `path` (none if it is missing or unreadable, with a warning for the latter);
    /// `None` keeps orders in memory only.
    pub fn load(path: Option<PathBuf>) -> SavedOrders {
        let orders = path.as_deref().map(read_orders).unwrap_or_default();
        SavedOrders {
            path,
            orders: Mutex::new(orders),
        }
    }

    pub fn key(abs: &Path, identity: &SourceIdentity) -> String {
        let canonical = abs.canonicalize().unwrap_or_else(|_| abs.to_owned());
        format!(
            "{}|{}|{}",
            canonical.display(),
            identity.size,
            identity.mtime_ns
        )
    }

    pub fn get(&self, key: &str) -> Option<AccessOrder> {
        self.orders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Records a learned order and rewrites the state file.
    pub fn put(&self, key: String, order: AccessOrder) {
        let json = {
            let mut orders = self.orders.lock().unwrap_or_else(PoisonError::into_inner);
            orders.insert(key, order);
            while orders.len() > MAX_ORDERS {
                orders.pop_first();
            }
            serde_json::to_vec(&*orders)
        };
        let (Some(path), Ok(json)) = (&self.path, json) else {
            return;
        };
        if let Err(e) = write_atomically(path, &json) {
            tracing::warn!(path = %path.display(), error = %e, "cannot save learned block orders");
        }
    }
}

fn read_orders(path: &Path) -> BTreeMap<String, AccessOrder> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable saved block orders");
            BTreeMap::new()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read saved block orders");
            BTreeMap::new()
        }
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_survive_a_reload_and_bad_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/orders.json");
        let saved = SavedOrders::load(Some(path.clone()));
        let mut order = AccessOrder::new(8);
        for block in [3, 2, 1, 0, 4, 5, 6, 7, 3] {
            order.touch(block);
        }
        assert!(order.is_learned());
        saved.put("m|1".into(), order.clone());
        let reloaded = SavedOrders::load(Some(path.clone()));
        assert_eq!(
            reloaded.get("m|1").map(|o| o.order().to_vec()),
            Some(order.order().to_vec())
        );
        std::fs::write(&path, b"{not json").unwrap();
        assert!(SavedOrders::load(Some(path)).get("m|1").is_none());
    }
}
