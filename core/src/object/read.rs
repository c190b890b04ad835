//! Reads of an object version as parallel ranged GETs, and the planner that sizes them.
//!
//! **Contract.** [`RangePlanner::parts`] cuts `[offset, offset + len)` into contiguous parts
//! that cover it exactly, without overlap, each within `[min_part, max_part]` (a read shorter
//! than `min_part` is one smaller part; with `max_part < 2 x min_part` some lengths have no
//! such cut, and their parts keep to `max_part`). The part size follows the measured link: a
//! part should take [`LATENCY_HIDING`] round trips' worth of transfer at the throughput one
//! request gets (the bandwidth-delay product of one connection, times that), so the wait for
//! its first byte is a small share of its time; a read with fewer such parts than
//! `max_parallel` is spread over more, smaller parts, so every connection has one.
//! [`RangePlanner::observe`] takes each request's time to first byte and transfer; estimates
//! are moving averages, kept in atomics so that concurrent reads share them without a lock.
//!
//! `read_parts` reads the parts, at most `max_parallel` at a time, each a GET of its range on
//! the condition `If-Match: ETAG`, straight into its slice of the caller's buffer: a part of a
//! replaced object fails (412, `Changed`) instead of mixing versions. The response's own ETag
//! and length are checked too, so a store that ignores `If-Match` cannot mix them either.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt, TryStreamExt};

use super::error::{classify, Failed};
use super::{ObjectError, ObjectVersion};

/// Round trips' worth of transfer in one part: with 4, the wait for the first byte is at most
/// a fifth of a part's time.
pub const LATENCY_HIDING: f64 = 4.0;
/// The time to first byte assumed before any is measured: a request to a nearby S3 region.
const INITIAL_LATENCY: Duration = Duration::from_millis(20);
/// The throughput of one request assumed before any is measured: what one S3 connection
/// commonly gets (with `INITIAL_LATENCY`, a first part of about 2.7 MB).
const INITIAL_STREAM_BPS: f64 = 32.0 * 1024.0 * 1024.0;
/// Weight of a new sample in the moving averages: a few requests move the estimate, one
/// outlier does not.
const EWMA_WEIGHT: f64 = 0.25;
/// Transfers shorter than this say little about throughput (they end before TCP's window has
/// grown): their time to first byte counts, their throughput does not.
const MIN_THROUGHPUT_SAMPLE: u64 = 256 << 10;
/// The slowest transfer a part may take before its read is abandoned, in bytes per second,
/// on top of the retries' time: a store this slow is failing, not slow.
const MIN_PART_RATE: u64 = 128 << 10;

/// Sizes the parts of ranged reads from the measured latency and throughput.
#[derive(Debug)]
pub struct RangePlanner {
    min_part: u64,
    max_part: u64,
    max_parallel: usize,
    /// Moving average of the time to first byte, in nanoseconds (f64 bits).
    latency_ns: AtomicU64,
    /// Moving average of one request's throughput after its first byte, bytes/s (f64 bits).
    stream_bps: AtomicU64,
}

impl RangePlanner {
    /// A planner for parts of `min_part..=max_part` bytes, `max_parallel` in flight. Bounds
    /// out of order are put in order; zeros become 1.
    pub fn new(min_part: u64, max_part: u64, max_parallel: usize) -> RangePlanner {
        let min_part = min_part.max(1);
        RangePlanner {
            min_part: min_part.min(max_part.max(1)),
            max_part: max_part.max(min_part),
            max_parallel: max_parallel.max(1),
            latency_ns: AtomicU64::new((INITIAL_LATENCY.as_nanos() as f64).to_bits()),
            stream_bps: AtomicU64::new(INITIAL_STREAM_BPS.to_bits()),
        }
    }

    /// Requests in flight per read.
    pub fn max_parallel(&self) -> usize {
        self.max_parallel
    }

    /// The measured time to first byte.
    pub fn latency(&self) -> Duration {
        Duration::from_nanos(load(&self.latency_ns) as u64)
    }

    /// The measured throughput of one request, bytes per second.
    pub fn stream_throughput(&self) -> f64 {
        load(&self.stream_bps)
    }

    /// The part size the link calls for: [`LATENCY_HIDING`] x latency x one request's
    /// throughput, within `[min_part, max_part]`.
    pub fn target_part(&self) -> u64 {
        let bdp = LATENCY_HIDING * self.latency().as_secs_f64() * self.stream_throughput();
        (bdp as u64).clamp(self.min_part, self.max_part)
    }

    /// The parts `(offset, len)` of a read of `len` bytes at `offset`, in order.
    pub fn parts(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        if len == 0 {
            return Vec::new();
        }
        // Enough parts that each connection has one, none larger than the link calls for...
        let spread = len.div_ceil(self.max_parallel as u64);
        let part = spread.min(self.target_part()).max(self.min_part);
        // ...then as many parts as that makes, within the counts whose even cut keeps every
        // part within [min_part, max_part]: at least len / max_part, at most len / min_part.
        // (Both bounds hold whenever max_part >= 2 x min_part; otherwise max_part wins.)
        let fewest = len.div_ceil(self.max_part);
        let most = len / self.min_part;
        let n = len.div_ceil(part).min(most).max(fewest).max(1);
        // Sizes len / n and len / n + 1, the longer ones first.
        let (base, longer) = (len / n, len % n);
        let mut parts = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        let mut at = offset;
        for i in 0..n {
            let this = base + u64::from(i < longer);
            parts.push((at, this));
            at = at.saturating_add(this);
        }
        parts
    }

    /// One request's measurement: `first_byte` from sending to its first byte, then `bytes`
    /// received in `transfer`.
    pub fn observe(&self, first_byte: Duration, bytes: u64, transfer: Duration) {
        ewma(&self.latency_ns, first_byte.as_nanos() as f64);
        if bytes >= MIN_THROUGHPUT_SAMPLE && !transfer.is_zero() {
            ewma(&self.stream_bps, bytes as f64 / transfer.as_secs_f64());
        }
    }
}

fn load(cell: &AtomicU64) -> f64 {
    f64::from_bits(cell.load(Ordering::Relaxed))
}

/// Moves the average in `cell` towards `sample` (a lost race between two updates loses one
/// sample's weight, which an estimate can afford).
fn ewma(cell: &AtomicU64, sample: f64) {
    if !sample.is_finite() || sample < 0.0 {
        return;
    }
    let old = load(cell);
    let new = old + EWMA_WEIGHT * (sample - old);
    cell.store(new.to_bits(), Ordering::Relaxed);
}

/// Counters of what the client did (see [`super::ObjectSource::stats`]).
#[derive(Debug, Default)]
pub(crate) struct Meter {
    pub requests: AtomicU64,
    /// Retries of any request (by the client's retry layer).
    pub retries: AtomicU64,
    /// Answers that asked the client to slow down (503 `SlowDown`, 429), retried or not.
    pub throttled: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    pub first_byte_ns_sum: AtomicU64,
    pub first_byte_count: AtomicU64,
    /// Bytes and nanoseconds of whole `read_at` calls of at least a part's size: the
    /// throughput a reader gets.
    pub read_bytes: AtomicU64,
    pub read_ns: AtomicU64,
}

/// What `read_parts` needs of the client.
pub(crate) struct PartReader<'a> {
    pub op: &'a opendal::Operator,
    pub planner: &'a RangePlanner,
    pub meter: &'a Meter,
    pub bucket: &'a str,
    pub endpoint: &'a str,
    pub request_timeout: Duration,
    /// Retries of one request the client's retry layer makes.
    pub retries: u32,
    /// The longest the retry layer waits in all between the tries of one request.
    pub retry_wait: Duration,
}

impl PartReader<'_> {
    /// Fills `buf` with the bytes of `version` at `offset` (the caller has cut `buf` to the
    /// object's end), in parallel parts; the bytes read, `buf.len()`.
    pub async fn read_parts(
        &self,
        version: &ObjectVersion,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<usize, ObjectError> {
        let started = Instant::now();
        let total = buf.len();
        let parts = self.planner.parts(offset, total as u64);
        let mut slices = Vec::with_capacity(parts.len());
        let mut rest = buf;
        for &(_, len) in &parts {
            let (head, tail) = rest.split_at_mut(len as usize);
            slices.push(head);
            rest = tail;
        }
        stream::iter(parts.into_iter().zip(slices))
            .map(|((at, _), slice)| self.read_part(version, slice, at))
            .buffer_unordered(self.planner.max_parallel())
            .try_collect::<Vec<()>>()
            .await?;
        if total as u64 >= self.planner.min_part {
            self.meter
                .read_bytes
                .fetch_add(total as u64, Ordering::Relaxed);
            self.meter
                .read_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        Ok(total)
    }

    /// One part: a GET of `[at, at + slice.len())` if the ETag still matches, into `slice`,
    /// bounded in time (the requests, their retries, and the transfer at a floor rate).
    async fn read_part(
        &self,
        version: &ObjectVersion,
        slice: &mut [u8],
        at: u64,
    ) -> Result<(), ObjectError> {
        let len = slice.len() as u64;
        let what = format!("GET {} bytes {}..{}", version.key, at, at + len);
        let attempts = self.retries + 1;
        let bound = self.request_timeout * attempts
            + self.retry_wait
            + Duration::from_secs(len / MIN_PART_RATE);
        let failed = Failed {
            bucket: self.bucket,
            endpoint: self.endpoint,
            key: Some(&version.key),
            what: &what,
            retries: self.retries,
            request_timeout: self.request_timeout,
        };
        let result = tokio::time::timeout(bound, self.get_range(version, slice, at)).await;
        let outcome = match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(PartError::Store(e))) => Err(match classify(&e, &failed) {
                // The version is gone: the object was removed since it was listed.
                ObjectError::NotFound { key } => ObjectError::Changed { key },
                other => other,
            }),
            Ok(Err(PartError::Length(got))) => Err(ObjectError::Changed {
                key: format!(
                    "{} (a GET of {len} bytes at {at} returned {got}: the object's size changed)",
                    version.key
                ),
            }),
            Ok(Err(PartError::Etag(etag))) => Err(ObjectError::Changed {
                key: format!(
                    "{} (a GET answered with ETag {etag}, not the listed {})",
                    version.key, version.etag
                ),
            }),
            Err(_) => Err(ObjectError::TimedOut { what, after: bound }),
        };
        if outcome.is_err() {
            self.meter.errors.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    async fn get_range(
        &self,
        version: &ObjectVersion,
        slice: &mut [u8],
        at: u64,
    ) -> Result<(), PartError> {
        let len = slice.len() as u64;
        self.meter.requests.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let options = opendal::options::ReaderOptions {
            // A store that gave no ETag leaves nothing to hold the version to but its size.
            if_match: (!version.etag.is_empty()).then(|| quoted(&version.etag)),
            ..Default::default()
        };
        let reader = self
            .op
            .reader_options(&version.key, options)
            .await
            .map_err(PartError::Store)?;
        let mut body = reader
            .into_bytes_stream(at..at + len)
            .await
            .map_err(PartError::Store)?;
        // The response's own ETag, where the client has it (no request of its own): a store
        // that ignored If-Match still cannot hand over another version's bytes.
        match body.metadata().await {
            Ok(meta) => {
                let etag = meta.etag().map(unquote).unwrap_or_default();
                if !etag.is_empty() && !version.etag.is_empty() && etag != version.etag {
                    return Err(PartError::Etag(etag));
                }
            }
            Err(e) if e.kind() == opendal::ErrorKind::Unsupported => {}
            Err(e) => return Err(PartError::Store(e)),
        }
        let mut filled = 0usize;
        let mut first_byte: Option<Instant> = None;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| PartError::Store(opendal_error(e)))?;
            if chunk.is_empty() {
                continue;
            }
            if first_byte.is_none() {
                let now = Instant::now();
                first_byte = Some(now);
                self.meter
                    .first_byte_ns_sum
                    .fetch_add((now - sent).as_nanos() as u64, Ordering::Relaxed);
                self.meter.first_byte_count.fetch_add(1, Ordering::Relaxed);
            }
            let room = slice.len() - filled;
            if chunk.len() > room {
                return Err(PartError::Length(filled as u64 + chunk.len() as u64));
            }
            slice[filled..filled + chunk.len()].copy_from_slice(&chunk);
            filled += chunk.len();
            self.meter
                .bytes
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        if filled != slice.len() {
            return Err(PartError::Length(filled as u64));
        }
        if let Some(first) = first_byte {
            self.planner.observe(first - sent, len, first.elapsed());
        }
        Ok(())
    }
}

/// How one part failed.
enum PartError {
    /// The store or the transport.
    Store(opendal::Error),
    /// The body was not the range's length (the bytes it had).
    Length(u64),
    /// The response was of another version (its ETag).
    Etag(String),
}

/// The byte stream's error back as the client's (the stream wraps it in an `io::Error`).
fn opendal_error(e: std::io::Error) -> opendal::Error {
    match e
        .into_inner()
        .map(|inner| inner.downcast::<opendal::Error>())
    {
        Some(Ok(e)) => *e,
        Some(Err(other)) => opendal::Error::new(
            opendal::ErrorKind::Unexpected,
            format!("read data from http response: {other}"),
        ),
        None => opendal::Error::new(
            opendal::ErrorKind::Unexpected,
            "read data from http response",
        ),
    }
}

/// An ETag as `If-Match` wants it: in quotes.
pub(crate) fn quoted(etag: &str) -> String {
    format!("\"{etag}\"")
}

/// An ETag without its quotes (and the weak marker some stores add).
pub(crate) fn unquote(etag: &str) -> String {
    let etag = etag.trim();
    let etag = etag.strip_prefix("W/").unwrap_or(etag);
    etag.trim_matches('"').to_string()
}
