//! The JSON document served at `MOUNTPOINT/.tierfs/stats`: it lives in the core, shared with the
//! WinFsp front end.

pub use tierfs_core::stats_doc::StatsDocument;
