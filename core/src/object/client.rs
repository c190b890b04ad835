//! The blocking client of one `s3://bucket/prefix`.
//!
//! **Contract.** See the module docs of [`crate::object`]. Every call blocks its thread on the
//! client's own runtime (shared by the clones) and returns within a bound: each request within
//! `request_timeout` per try, a bounded number of tries with backoff between them, and each
//! call within the sum. A call from inside an async runtime is refused (an error, not a
//! deadlock).

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::Operator;

use super::config::{process_env, resolve, shared_profile_settings, Resolved};
use super::error::{classify, is_throttling, Failed};
use super::read::{unquote, Meter, PartReader, RangePlanner};
use super::tree::Listed;
use super::{ObjectError, ObjectStoreConfig, ObjectTree, ObjectUrl, ObjectVersion};
use crate::stats::RemoteSourceSnapshot;
use crate::sync::{lock, Mutex};

/// Retries of one request after its first try (throttling, 5xx, connection errors): with the
/// backoff below, about 10 s of trying before a store is called down.
pub const MAX_RETRIES: u32 = 5;
/// The first pause before a retry; also the most jitter added to each pause.
const RETRY_MIN_DELAY: Duration = Duration::from_millis(250);
/// The longest pause between two tries.
const RETRY_MAX_DELAY: Duration = Duration::from_secs(8);
/// Growth of the pause from one retry to the next.
const RETRY_FACTOR: f32 = 2.0;
/// The most worker threads of the client's runtime: they run the connections (TLS, HTTP
/// framing); the copying into the caller's buffer runs on the caller's thread.
const MAX_RUNTIME_THREADS: usize = 4;

/// The kind of store, as the stats and a source's storage kind name it.
pub(crate) const SOURCE_KIND: &str = "s3";

/// The client of one `s3://bucket/prefix`; cheap to clone.
#[derive(Clone)]
pub struct ObjectSource {
    inner: Arc<Inner>,
}

struct Inner {
    url: ObjectUrl,
    config: ObjectStoreConfig,
    endpoint_label: String,
    /// `Some` until dropped (taken to shut it down without blocking).
    runtime: Option<tokio::runtime::Runtime>,
    op: Operator,
    planner: RangePlanner,
    meter: Arc<Meter>,
    listings: AtomicU64,
    /// The last listing.
    tree: Mutex<Option<Arc<ObjectTree>>>,
    /// Held while listing: one listing at a time, the others wait for it.
    listing: Mutex<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Without waiting for its threads: dropping a runtime that waits would panic if the
        // last clone went away inside another runtime.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for ObjectSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSource")
            .field("url", &self.inner.url)
            .field("endpoint", &self.inner.endpoint_label)
            .finish_non_exhaustive()
    }
}

impl ObjectSource {
    /// Builds the client and lists the prefix (the listing [`Self::tree`] then reuses): wrong
    /// credentials, a missing bucket, an unreachable endpoint are errors here.
    pub fn connect(
        url: &ObjectUrl,
        config: ObjectStoreConfig,
    ) -> Result<ObjectSource, ObjectError> {
        config.check()?;
        let resolved = resolve(&config, &url.bucket, &process_env, &shared_profile_settings)?;
        let threads = std::thread::available_parallelism()
            .map_or(2, usize::from)
            .clamp(2, MAX_RUNTIME_THREADS);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("tierfs-object")
            .enable_all()
            .build()
            .map_err(|e| ObjectError::Other {
                detail: format!("cannot start the object-store client's threads: {e}"),
            })?;
        let meter = Arc::new(Meter::default());
        let op = build_operator(url, &resolved, &config, &meter)?;
        tracing::debug!(
            url = %url,
            endpoint = %resolved.endpoint_label(),
            region = %resolved.region,
            profile = resolved.profile.as_deref().unwrap_or("(AWS_PROFILE or default)"),
            "object store client"
        );
        let source = ObjectSource {
            inner: Arc::new(Inner {
                url: url.clone(),
                endpoint_label: resolved.endpoint_label(),
                planner: RangePlanner::new(config.min_part, config.max_part, config.max_parallel),
                config,
                runtime: Some(runtime),
                op,
                meter,
                listings: AtomicU64::new(0),
                tree: Mutex::new(None),
                listing: Mutex::new(()),
            }),
        };
        source.tree()?;
        Ok(source)
    }

    /// The source's URL.
    pub fn url(&self) -> &ObjectUrl {
        &self.inner.url
    }

    /// The endpoint, for messages (`http://host:port`, or AWS and the region).
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint_label
    }

    /// The listing of the prefix: the last one while younger than `listing_ttl`, else a new
    /// one (the whole prefix, page by page). Concurrent callers share one listing.
    pub fn tree(&self) -> Result<Arc<ObjectTree>, ObjectError> {
        if let Some(tree) = self.fresh_tree() {
            return Ok(tree);
        }
        let _listing = lock(&self.inner.listing);
        if let Some(tree) = self.fresh_tree() {
            return Ok(tree); // listed by the caller we waited for
        }
        let tree = Arc::new(self.list()?);
        *lock(&self.inner.tree) = Some(tree.clone());
        Ok(tree)
    }

    /// Forgets the last listing: the next [`Self::tree`] lists again.
    pub fn invalidate(&self) {
        *lock(&self.inner.tree) = None;
    }

    /// The version of the object at `rel` (relative to the prefix) now: a HEAD.
    pub fn head(&self, rel: &Path) -> Result<ObjectVersion, ObjectError> {
        let rel = rel
            .to_str()
            .map(|s| s.trim_start_matches('/'))
            .filter(|s| !s.is_empty() && !s.ends_with('/'))
            .ok_or_else(|| ObjectError::NotFound {
                key: format!("{}{}", self.inner.url.prefix, rel.display()),
            })?;
        let key = self.inner.url.key_of(rel);
        let what = format!("HEAD {key}");
        let failed = self.failed(Some(&key), &what);
        self.inner.meter.requests.fetch_add(1, Ordering::Relaxed);
        let meta = self
            .run(&what, self.inner.op.stat(&key))
            .and_then(|r| r.map_err(|e| classify(&e, &failed)));
        let meta = self.count_error(meta)?;
        if meta.is_dir() {
            return Err(ObjectError::NotFound { key });
        }
        Ok(version_of(key, &meta))
    }

    /// Fills `buf` with the bytes of `version` from `offset`: all of `buf`, or up to the
    /// object's end; the bytes read. Each part is a ranged GET on the condition that the
    /// object still has the version's ETag: a replaced (or removed) object is
    /// [`ObjectError::Changed`], never a mix of versions.
    pub fn read_at(
        &self,
        version: &ObjectVersion,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<usize, ObjectError> {
        if offset >= version.size || buf.is_empty() {
            return Ok(0);
        }
        let len = usize::try_from(version.size - offset).map_or(buf.len(), |n| n.min(buf.len()));
        let inner = &self.inner;
        let reader = PartReader {
            op: &inner.op,
            planner: &inner.planner,
            meter: &inner.meter,
            bucket: &inner.url.bucket,
            endpoint: &inner.endpoint_label,
            request_timeout: inner.config.request_timeout,
            retries: MAX_RETRIES,
            retry_wait: retry_wait(),
        };
        let runtime = self.runtime()?;
        runtime.block_on(reader.read_parts(version, &mut buf[..len], offset))
    }

    /// What the client did since it connected: the stats' `source.remote` section.
    pub fn stats(&self) -> RemoteSourceSnapshot {
        let m = &self.inner.meter;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let first_bytes = get(&m.first_byte_count);
        let read_ns = get(&m.read_ns);
        RemoteSourceSnapshot {
            kind: SOURCE_KIND.to_string(),
            url: self.inner.url.to_string(),
            endpoint: self.inner.endpoint_label.clone(),
            requests: get(&m.requests),
            listings: get(&self.inner.listings),
            retries: get(&m.retries),
            throttled: get(&m.throttled),
            errors: get(&m.errors),
            bytes: get(&m.bytes),
            mean_first_byte_secs: if first_bytes == 0 {
                0.0
            } else {
                get(&m.first_byte_ns_sum) as f64 / first_bytes as f64 / 1e9
            },
            read_bytes_per_sec: if read_ns == 0 {
                0.0
            } else {
                get(&m.read_bytes) as f64 / (read_ns as f64 / 1e9)
            },
            part_bytes: self.inner.planner.target_part(),
        }
    }

    /// The planner of the parallel reads (its estimates and part sizes).
    pub fn planner(&self) -> &RangePlanner {
        &self.inner.planner
    }

    fn fresh_tree(&self) -> Option<Arc<ObjectTree>> {
        let tree = lock(&self.inner.tree);
        tree.as_ref()
            .filter(|t| t.listed_at().elapsed() < self.inner.config.listing_ttl)
            .cloned()
    }

    /// Lists the whole prefix.
    fn list(&self) -> Result<ObjectTree, ObjectError> {
        let inner = &self.inner;
        let what = format!("LIST {}", inner.url);
        let failed = self.failed(None, &what);
        let prefix = inner.url.prefix.clone();
        let path = list_path(&inner.url);
        let page_bound = request_bound(inner.config.request_timeout);
        let started = Instant::now();
        inner.listings.fetch_add(1, Ordering::Relaxed);
        let listed = self.runtime()?.block_on(async {
            let options = opendal::options::ListOptions {
                recursive: true,
                ..Default::default()
            };
            let timed_out = || ObjectError::TimedOut {
                what: what.clone(),
                after: page_bound,
            };
            let mut lister =
                tokio::time::timeout(page_bound, inner.op.lister_options(&path, options))
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(|e| classify(&e, &failed))?;
            let mut listed = Vec::new();
            // Each step may fetch the next page: each bounded, so a listing makes progress
            // or fails, however long the prefix.
            loop {
                let next = tokio::time::timeout(page_bound, lister.next())
                    .await
                    .map_err(|_| timed_out())?;
                let Some(entry) = next else { break };
                let entry = entry.map_err(|e| classify(&e, &failed))?;
                if let Some(item) = listed_of(&prefix, entry) {
                    listed.push(item);
                }
            }
            Ok(listed)
        });
        let listed = self.count_error(listed)?;
        let tree = ObjectTree::build(listed, Instant::now());
        tracing::debug!(
            url = %inner.url,
            objects = tree.objects(),
            bytes = tree.bytes(),
            secs = started.elapsed().as_secs_f64(),
            "listed"
        );
        Ok(tree)
    }

    /// Runs `future` on the client's runtime within one request's bound (its tries included).
    fn run<T>(&self, what: &str, future: impl Future<Output = T>) -> Result<T, ObjectError> {
        let bound = request_bound(self.inner.config.request_timeout);
        self.runtime()?
            .block_on(async { tokio::time::timeout(bound, future).await })
            .map_err(|_| ObjectError::TimedOut {
                what: what.to_string(),
                after: bound,
            })
    }

    fn runtime(&self) -> Result<&tokio::runtime::Runtime, ObjectError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(ObjectError::Other {
                detail: "the blocking object-store client was called from an async task".into(),
            });
        }
        self.inner
            .runtime
            .as_ref()
            .ok_or_else(|| ObjectError::Other {
                detail: "the object-store client is shut down".into(),
            })
    }

    fn failed<'a>(&'a self, key: Option<&'a str>, what: &'a str) -> Failed<'a> {
        Failed {
            bucket: &self.inner.url.bucket,
            endpoint: &self.inner.endpoint_label,
            key,
            what,
            retries: MAX_RETRIES,
            request_timeout: self.inner.config.request_timeout,
        }
    }

    fn count_error<T>(&self, result: Result<T, ObjectError>) -> Result<T, ObjectError> {
        if result.is_err() {
            self.inner.meter.errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

/// The S3 client for `url` as `resolved`: paths are whole keys (its root is the bucket's
/// root), each try bounded by `request_timeout`, tries repeated with backoff and jitter.
fn build_operator(
    url: &ObjectUrl,
    resolved: &Resolved,
    config: &ObjectStoreConfig,
    meter: &Arc<Meter>,
) -> Result<Operator, ObjectError> {
    let mut builder = opendal::services::S3::default()
        .bucket(&url.bucket)
        .root("/")
        .region(&resolved.region);
    if let Some(endpoint) = &resolved.endpoint {
        builder = builder.endpoint(endpoint);
    }
    if let Some(profile) = &resolved.profile {
        builder = builder.profile(profile);
    }
    if resolved.virtual_host {
        builder = builder.enable_virtual_host_style();
    }
    // The process-wide HTTP transport (reqwest over rustls) the S3 service sends through:
    // installed once, the first call wins, later ones change nothing.
    opendal::install_default();
    let op = Operator::new(builder).map_err(|e| ObjectError::Config {
        reason: format!("the S3 client for {url}: {e}"),
    })?;
    let meter = Arc::clone(meter);
    let notify = move |event: opendal::layers::RetryEvent<'_>| {
        meter.retries.fetch_add(1, Ordering::Relaxed);
        if is_throttling(event.err) {
            meter.throttled.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(
            op = ?event.op,
            attempt = event.attempt,
            wait_secs = event.retry_after.as_secs_f64(),
            error = %event.err,
            "object store request retried"
        );
    };
    Ok(op
        .layer(
            TimeoutLayer::new()
                .with_timeout(config.request_timeout)
                .with_io_timeout(config.request_timeout),
        )
        .layer(
            RetryLayer::new()
                .with_jitter()
                .with_factor(RETRY_FACTOR)
                .with_min_delay(RETRY_MIN_DELAY)
                .with_max_delay(RETRY_MAX_DELAY)
                .with_max_times(MAX_RETRIES as usize)
                .with_notify(notify),
        ))
}

/// The longest the retry layer pauses in all for one request: each pause at most the
/// exponential delay (capped) plus its jitter.
pub(crate) fn retry_wait() -> Duration {
    let mut total = Duration::ZERO;
    let mut delay = RETRY_MIN_DELAY;
    for _ in 0..MAX_RETRIES {
        total += delay.min(RETRY_MAX_DELAY) + RETRY_MIN_DELAY;
        delay = delay.mul_f32(RETRY_FACTOR);
    }
    total
}

/// One request's bound, its tries and their pauses included.
fn request_bound(request_timeout: Duration) -> Duration {
    request_timeout * (MAX_RETRIES + 1) + retry_wait()
}

/// The path the S3 client lists for `url`: the prefix (a directory path), or its root.
fn list_path(url: &ObjectUrl) -> String {
    if url.prefix.is_empty() {
        "/".to_string()
    } else {
        url.prefix.clone()
    }
}

/// A listed entry as a key relative to `prefix` and its version; `None` for an entry outside
/// the prefix (which a store should not return).
fn listed_of(prefix: &str, entry: opendal::Entry) -> Option<Listed> {
    let (key, meta) = entry.into_parts();
    let key = key.trim_start_matches('/').to_string();
    let Some(rel) = key.strip_prefix(prefix) else {
        tracing::warn!(key = %key, prefix, "listed key outside the prefix left out");
        return None;
    };
    let rel = rel.to_string();
    if meta.is_dir() || rel.ends_with('/') {
        let rel = if rel.ends_with('/') {
            rel
        } else {
            format!("{rel}/")
        };
        return Some(Listed { rel, version: None });
    }
    Some(Listed {
        rel,
        version: Some(version_of(key, &meta)),
    })
}

/// The version `meta` (of a HEAD or a listing) describes.
fn version_of(key: String, meta: &opendal::Metadata) -> ObjectVersion {
    ObjectVersion {
        key,
        size: meta.content_length(),
        etag: meta.etag().map(unquote).unwrap_or_default(),
        last_modified: meta
            .last_modified()
            .map_or(UNIX_EPOCH, |t| SystemTime::from(t.into_inner())),
    }
}
