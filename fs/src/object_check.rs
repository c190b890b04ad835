//! `tierfs object-check s3://BUCKET/PREFIX`: whether tierfs can serve an object-store source,
//! and how fast, without mounting.
//!
//! Connects (credentials, bucket, endpoint are checked there), lists the prefix, measures the
//! latency of a few small ranged GETs, then reads one object whole (the largest, or
//! `--object`) with the parallel ranged reads of the mount, and with `--compare FILE` checks
//! its bytes against FILE's. Exit status: 0 all well, 1 the bytes differ from FILE's, 2 the
//! store or the options failed (the message says what to fix). `--json` prints the figures as
//! one JSON object.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use tierfs_core::object::{ObjectError, ObjectSource, ObjectUrl, ObjectVersion, TreeEntry};
use tierfs_core::size::format_size;

/// Small ranged GETs that measure the latency.
const LATENCY_PROBES: u64 = 5;
/// The size of each: one page, so the time is the round trip, not the transfer.
const PROBE_BYTES: u64 = 4096;
/// The most of the object held in memory at once: the object is read (and compared) in
/// windows of this size, each one `read_at` of many parallel parts.
const WINDOW: u64 = 256 << 20;
/// The longest `--hold` waits for its file to be removed.
const HOLD_LIMIT: Duration = Duration::from_secs(120);

/// Exit status: the bytes differ from `--compare`'s.
const EXIT_DIFFERENT: i32 = 1;
/// Exit status: the store, the URL or a file failed.
const EXIT_FAILED: i32 = 2;

#[derive(Args, Debug)]
pub struct ObjectCheckArgs {
    /// The source: s3://BUCKET or s3://BUCKET/PREFIX.
    pub url: String,
    /// How to reach the store (endpoint, region, profile).
    #[command(flatten)]
    pub store: crate::object_args::ObjectArgs,
    /// The object to read, relative to the prefix [default: the largest].
    #[arg(long, value_name = "KEY")]
    pub object: Option<String>,
    /// Check that the object's bytes equal FILE's.
    #[arg(long, value_name = "FILE")]
    pub compare: Option<PathBuf>,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Testing: once the object's version is known, create PATH and wait (at most 120 s)
    /// until it is removed before reading.
    #[arg(long, value_name = "PATH", hide = true)]
    pub hold: Option<PathBuf>,
}

/// What the check measured.
#[derive(Debug, Default, serde::Serialize)]
struct Report {
    url: String,
    endpoint: String,
    connect_secs: f64,
    list_secs: f64,
    objects: usize,
    bytes: u64,
    dirs: usize,
    object: String,
    object_bytes: u64,
    latency_probes: u64,
    latency_min_ms: f64,
    latency_median_ms: f64,
    read_secs: f64,
    mb_per_s: f64,
    requests: u64,
    retries: u64,
    mean_first_byte_ms: f64,
    part_size: u64,
    max_parallel: usize,
    /// `equal` or `different` with --compare.
    compare: Option<&'static str>,
    first_difference: Option<u64>,
}

/// Why the check stopped.
enum Failure {
    Store(ObjectError),
    File(String),
    Different { at: u64, why: String },
}

impl From<ObjectError> for Failure {
    fn from(e: ObjectError) -> Self {
        Failure::Store(e)
    }
}

/// Runs the check; exits with 1 or 2 itself where it fails (see the module docs).
pub fn run(args: &ObjectCheckArgs) -> anyhow::Result<()> {
    let mut report = Report::default();
    let outcome = check(args, &mut report);
    let code = match outcome {
        Ok(()) => 0,
        Err(Failure::Store(e)) => {
            say!("tierfs: object-check: {e}");
            EXIT_FAILED
        }
        Err(Failure::File(message)) => {
            say!("tierfs: object-check: {message}");
            EXIT_FAILED
        }
        Err(Failure::Different { at, why }) => {
            report.compare = Some("different");
            report.first_difference = Some(at);
            say!("tierfs: object-check: the object's bytes differ from the file's: {why}");
            EXIT_DIFFERENT
        }
    };
    if args.json && code != EXIT_FAILED {
        println!("{}", serde_json::to_string(&report)?);
    }
    let _ = std::io::stdout().flush();
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

fn check(args: &ObjectCheckArgs, report: &mut Report) -> Result<(), Failure> {
    let url = ObjectUrl::parse(&args.url)?;
    let config = args.store.config();
    report.url = url.to_string();
    report.max_parallel = config.max_parallel;
    let human = !args.json;

    let started = Instant::now();
    let source = ObjectSource::connect(&url, config)?;
    report.connect_secs = started.elapsed().as_secs_f64();
    report.endpoint = source.endpoint().to_string();
    if human {
        println!("{url} at {}", source.endpoint());
        println!("  connected in {:.3} s", report.connect_secs);
    }

    let started = Instant::now();
    let tree = source.tree()?;
    report.list_secs = started.elapsed().as_secs_f64();
    report.objects = tree.objects();
    report.bytes = tree.bytes();
    report.dirs = tree.dirs();
    if human {
        println!(
            "  listed {} objects, {} in {} directories, in {:.3} s",
            tree.objects(),
            format_size(tree.bytes()),
            tree.dirs(),
            report.list_secs
        );
    }

    let version = match &args.object {
        Some(rel) => match tree.entry(Path::new(rel)) {
            Some(TreeEntry::Object(version)) => version,
            Some(TreeEntry::Dir) => {
                return Err(Failure::File(format!(
                    "{rel} is a directory of {url}, not an object"
                )))
            }
            None => source.head(Path::new(rel))?,
        },
        None => tree
            .iter()
            .map(|(_, v)| v)
            .max_by(|a, b| a.size.cmp(&b.size).then_with(|| b.key.cmp(&a.key)))
            .cloned()
            .ok_or_else(|| Failure::File(format!("no objects under {url}")))?,
    };
    report.object = version.key.clone();
    report.object_bytes = version.size;
    if let Some(path) = &args.hold {
        hold(path)?;
    }

    let latencies = measure_latency(&source, &version)?;
    if !latencies.is_empty() {
        report.latency_probes = latencies.len() as u64;
        report.latency_min_ms = latencies[0] * 1e3;
        report.latency_median_ms = latencies[latencies.len() / 2] * 1e3;
        if human {
            println!(
                "  latency ({} ranged GETs of {} B): min {:.2} ms, median {:.2} ms",
                latencies.len(),
                PROBE_BYTES.min(version.size),
                report.latency_min_ms,
                report.latency_median_ms
            );
        }
    }

    let mut compare = match &args.compare {
        Some(path) => Some(Compare::open(path, version.size)?),
        None => None,
    };
    let mut read_secs = 0.0;
    let read = read_whole(&source, &version, compare.as_mut(), &mut read_secs);
    let stats = source.stats();
    report.read_secs = read_secs;
    report.mb_per_s = if read.is_ok() && read_secs > 0.0 {
        version.size as f64 / read_secs / 1e6
    } else {
        0.0
    };
    report.requests = stats.requests;
    report.retries = stats.retries;
    report.mean_first_byte_ms = stats.mean_first_byte_secs * 1e3;
    report.part_size = stats.part_bytes;
    read?;
    if human {
        println!(
            "  read {} ({}) in {:.3} s: {:.1} MB/s ({} GETs, {} retries, mean first byte {:.2} ms, \
             parts now {}, {} in flight)",
            version.key,
            format_size(version.size),
            read_secs,
            report.mb_per_s,
            stats.requests,
            stats.retries,
            report.mean_first_byte_ms,
            format_size(stats.part_bytes),
            report.max_parallel
        );
    }
    if let Some(path) = &args.compare {
        report.compare = Some("equal");
        if human {
            println!("  bytes equal to {}", path.display());
        }
    }
    Ok(())
}

/// Creates `path` and waits until it is removed (a test replaces the object meanwhile).
fn hold(path: &Path) -> Result<(), Failure> {
    File::create(path).map_err(|e| Failure::File(format!("--hold {}: {e}", path.display())))?;
    let deadline = Instant::now() + HOLD_LIMIT;
    while path.exists() {
        if Instant::now() > deadline {
            return Err(Failure::File(format!(
                "--hold {}: still there after {} s",
                path.display(),
                HOLD_LIMIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The times of a few small ranged GETs spread over the object, in seconds, sorted.
fn measure_latency(source: &ObjectSource, version: &ObjectVersion) -> Result<Vec<f64>, Failure> {
    if version.size == 0 {
        return Ok(Vec::new());
    }
    let len = PROBE_BYTES.min(version.size);
    let mut buf = vec![0u8; len as usize];
    let mut times = Vec::with_capacity(LATENCY_PROBES as usize);
    for i in 0..LATENCY_PROBES {
        let offset = (version.size - len) / LATENCY_PROBES * i;
        let started = Instant::now();
        source.read_at(version, &mut buf, offset)?;
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// Reads the whole object in windows, comparing each with the file if asked; `read_secs` is
/// the time spent reading (the comparison not counted), also when the check stops early.
fn read_whole(
    source: &ObjectSource,
    version: &ObjectVersion,
    mut compare: Option<&mut Compare>,
    read_secs: &mut f64,
) -> Result<(), Failure> {
    let window = WINDOW.min(version.size.max(1)) as usize;
    let mut buf = vec![0u8; window];
    let mut offset = 0u64;
    let mut reading = Duration::ZERO;
    while offset < version.size {
        let started = Instant::now();
        let n = source.read_at(version, &mut buf, offset);
        reading += started.elapsed();
        *read_secs = reading.as_secs_f64();
        let n = n?;
        if n == 0 {
            return Err(Failure::Store(ObjectError::Changed {
                key: format!(
                    "{} (ended at {offset} of {} bytes)",
                    version.key, version.size
                ),
            }));
        }
        if let Some(compare) = compare.as_deref_mut() {
            compare.check(&buf[..n], offset)?;
        }
        offset += n as u64;
    }
    Ok(())
}

/// The file the object is compared with, read alongside it.
struct Compare {
    file: File,
    path: PathBuf,
    buf: Vec<u8>,
}

impl Compare {
    fn open(path: &Path, object_size: u64) -> Result<Compare, Failure> {
        let file = File::open(path)
            .map_err(|e| Failure::File(format!("--compare {}: {e}", path.display())))?;
        let size = file
            .metadata()
            .map_err(|e| Failure::File(format!("--compare {}: {e}", path.display())))?
            .len();
        if size != object_size {
            return Err(Failure::Different {
                at: size.min(object_size),
                why: format!(
                    "the object has {object_size} bytes, {} has {size}",
                    path.display()
                ),
            });
        }
        Ok(Compare {
            file,
            path: path.to_path_buf(),
            buf: Vec::new(),
        })
    }

    /// Checks that `got`, the object's bytes at `offset`, are the file's next bytes.
    fn check(&mut self, got: &[u8], offset: u64) -> Result<(), Failure> {
        self.buf.resize(got.len(), 0);
        self.file
            .read_exact(&mut self.buf)
            .map_err(|e| Failure::File(format!("--compare {}: {e}", self.path.display())))?;
        match got.iter().zip(&self.buf).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => {
                let at = offset + i as u64;
                Err(Failure::Different {
                    at,
                    why: format!(
                        "first difference at byte {at}: the object has {:#04x}, {} has {:#04x}",
                        got[i],
                        self.path.display(),
                        self.buf[i]
                    ),
                })
            }
        }
    }
}
