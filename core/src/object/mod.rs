//! The client of an object-store source: `s3://BUCKET/PREFIX` on AWS S3 or an S3-compatible
//! store (MinIO, R2, SeaweedFS, ...). Feature `object-store`.
//!
//! # Contract
//!
//! - **A source is a prefix.** [`ObjectUrl`] names the bucket and the prefix; the source's
//!   paths are the keys under the prefix with the prefix removed, `/` their separator.
//! - **Listings are snapshots.** [`ObjectSource::tree`] lists the whole prefix (page by page)
//!   into an [`ObjectTree`] and reuses it while it is younger than
//!   [`ObjectStoreConfig::listing_ttl`]; [`ObjectSource::invalidate`] forgets it. Keys that
//!   cannot be paths are left out with a warning naming them (`tree.rs`).
//! - **A version is `(key, size, etag)`.** [`ObjectVersion::identity`] is the
//!   [`SourceIdentity`](crate::source::SourceIdentity) the cache keys its bytes by: a replaced
//!   object has a new ETag, so a new identity.
//! - **Reads are of one version.** [`ObjectSource::read_at`] fills the buffer with that
//!   version's bytes or fails with [`ObjectError::Changed`]: every ranged GET carries
//!   `If-Match: ETAG`, so bytes of two versions are never mixed. A large read is split by the
//!   [`RangePlanner`] into parts read in parallel (up to `max_parallel`), sized to the measured
//!   latency and throughput.
//! - **Nothing hangs.** Each request try is bounded by `request_timeout` (the wait for its
//!   response and every pause in its body); throttling (503 `SlowDown`, 429), 5xx answers,
//!   connection errors and timeouts are retried with exponential backoff and jitter, a
//!   bounded number of times; every call is bounded by the sum.
//! - **Blocking API.** The daemon's threads are synchronous: [`ObjectSource`] owns a small
//!   runtime, shared by its clones, and each call blocks the calling thread on it. It must not
//!   be called from an async task (that is an error, not a deadlock).
//! - **Credentials the usual way.** The environment (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), the shared credentials and config files
//!   (`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`, `~/.aws/`) under `AWS_PROFILE` or an
//!   explicit profile, SSO, web identity, the container or instance role. The endpoint and
//!   region likewise: explicit, `AWS_ENDPOINT_URL`, `AWS_REGION`, the profile
//!   (`config.rs`). A custom endpoint is addressed path-style, over
//!   `http://` where it says so.
//! - **Errors say what to fix.** [`ObjectError`]: a bad URL, the configuration, credentials,
//!   a missing bucket or key, a changed object, throttling, a timeout, an unreachable
//!   endpoint; [`ObjectError::into_io`] maps each to an I/O error of its kind.
//!
//! # The S3 client
//!
//! Apache OpenDAL's S3 service, over reqwest with rustls. Its credential chain (reqsign)
//! reads the environment, the shared credentials and config files under `AWS_PROFILE` or a
//! profile chosen in code, SSO, `credential_process`, web identity, ECS and IMDS roles, which
//! Apache `object_store` does not (it takes the environment and explicit keys; profiles would
//! need a second credential reader). Its retry layer retries temporary errors with exponential
//! backoff and jitter, its timeout layer bounds each operation and each read of a body, and its
//! reads take a range and an `If-Match` condition. Only the profile's `region` and
//! `endpoint_url` are read here, with `rust-ini`, the INI reader the chain itself uses.
//!
//! # Files
//!
//! - `url.rs`: [`ObjectUrl`].
//! - `config.rs`: [`ObjectStoreConfig`] and its resolution (environment, profile).
//! - `client.rs`: [`ObjectSource`] and what it did ([`ObjectSource::stats`]).
//! - `tree.rs`: [`ObjectTree`], [`TreeEntry`], [`ObjectVersion`].
//! - `read.rs`: [`RangePlanner`] and the parallel ranged reads.
//! - `error.rs`: [`ObjectError`] and the classification of the store's errors.
//! - `remote_tree.rs`: [`ObjectRemoteTree`], the prefix as a mount's SOURCE.

mod client;
mod config;
mod error;
mod read;
mod remote_tree;
mod tree;
mod url;

#[cfg(test)]
mod tests;

pub use client::{ObjectSource, MAX_RETRIES};
pub use config::{
    ObjectStoreConfig, DEFAULT_LISTING_TTL, DEFAULT_MAX_PARALLEL, DEFAULT_MAX_PART,
    DEFAULT_MIN_PART, DEFAULT_REQUEST_TIMEOUT, FALLBACK_REGION,
};
pub use error::ObjectError;
pub use read::{RangePlanner, LATENCY_HIDING};
pub use remote_tree::ObjectRemoteTree;
pub use tree::{DirSummary, ObjectTree, ObjectVersion, TreeEntry};
pub use url::ObjectUrl;
