//! `tierfs-gpu bench FILE`: every route, cold and warm, in one run, as one table of GB/s and
//! ratios.
//!
//! # Method
//!
//! Each measurement runs in a fresh child process (`tierfs-gpu measure …`, hidden from `--help`):
//! the cuFile driver's mode is fixed once per process (GDS and compat cannot share one), and a
//! fresh process starts every route from the same state. Timings are of the transfer itself
//! (first read to last copy finished); setup a long-running program pays once (CUDA context,
//! pinned buffers, cuFile driver) is reported apart in each child's JSON.
//!
//! *Cold* runs first drop the file's pages from the page cache (`POSIX_FADV_DONTNEED`, no
//! privileges needed). *Warm* runs follow one buffered read of the whole file; their rows say
//! how much of it was cached if the file did not fit in RAM. Rows:
//!
//! | row | what |
//! |---|---|
//! | disk read only | the pipeline into a discarding sink: the storage's (cold) or page cache's (warm) speed with `--threads` readers — the ceiling of every route that reads the file |
//! | GPUDirect Storage | cuFile, compat mode disallowed |
//! | cuFile compat | cuFile forced into its POSIX compat mode |
//! | bounce buffers | this crate's pipeline (`--gds off`) |
//! | plain read + copy | one thread, pageable memory, synchronous copies: the baseline of the ratios |
//! | pinned host→device | copies from one pinned buffer: the link's ceiling |

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde::Serialize;

use crate::cuda::{CudaError, Gpu};
use crate::io;
use crate::load::{self, GdsMode, LoadError, LoadOptions, LoadReport, Loader};
use crate::plan::{LoadPlan, Selection};
use crate::resolve;

/// Bytes per copy and copies of the host-to-device ceiling measurement: 16 × 256 MiB = 4 GiB,
/// long enough (~80 ms at 50 GB/s) for timer and launch noise to vanish.
const H2D_BYTES: usize = 256 << 20;
const H2D_COPIES: usize = 16;
/// Size of the reads that warm the page cache before the warm runs.
const WARM_READ: usize = 16 << 20;

/// What one measurement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Probe {
    Disk,
    Gds,
    Compat,
    Bounce,
    Plain,
    H2d,
}

impl Probe {
    pub const FILE_ROUTES: [Probe; 5] = [
        Probe::Disk,
        Probe::Gds,
        Probe::Compat,
        Probe::Bounce,
        Probe::Plain,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Probe::Disk => "disk",
            Probe::Gds => "gds",
            Probe::Compat => "compat",
            Probe::Bounce => "bounce",
            Probe::Plain => "plain",
            Probe::H2d => "h2d",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Probe::Disk => "disk read only (no copy)",
            Probe::Gds => "GPUDirect Storage (cuFile)",
            Probe::Compat => "cuFile compat mode",
            Probe::Bounce => "bounce buffers",
            Probe::Plain => "plain read + copy",
            Probe::H2d => "pinned host→device ceiling",
        }
    }
}

/// Page-cache state of a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CacheState {
    Cold,
    Warm,
}

impl CacheState {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            CacheState::Cold => "cold",
            CacheState::Warm => "warm",
        }
    }
}

/// One measured figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub gb_per_s: f64,
    /// Page-cache residency before the run (file routes).
    pub resident_fraction: Option<f64>,
    pub read_mode: Option<String>,
}

/// One cell of the table: a figure, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measurement {
    pub probe: Probe,
    pub cache: CacheState,
    pub result: Result<Sample, String>,
}

/// Runs one probe in this process (the hidden `measure` command) and returns its report.
pub fn measure(
    file: &Path,
    probe: Probe,
    cache: CacheState,
    device: usize,
    options: LoadOptions,
) -> Result<serde_json::Value, LoadError> {
    if probe == Probe::H2d {
        let gbps = h2d_ceiling(&Gpu::open(device)?)?;
        return Ok(serde_json::json!({ "gb_per_s": gbps }));
    }
    let source = resolve::open(file)?;
    if cache == CacheState::Cold {
        io::evict(source.reader.file());
    }
    let plan = LoadPlan::new(&source.index, &Selection::All, options.chunk_bytes)?;
    let report: LoadReport = match probe {
        Probe::Disk => load::measure_disk(&source, &plan, options)?,
        Probe::Plain => Loader::new(device, options)?.load_plain(&source, &plan)?.1,
        _ => {
            let gds = match probe {
                Probe::Gds => GdsMode::On,
                Probe::Compat => GdsMode::Compat,
                _ => GdsMode::Off,
            };
            let mut loader = Loader::new(device, LoadOptions { gds, ..options })?;
            loader.load(&source, &plan)?.1
        }
    };
    serde_json::to_value(&report).map_err(|e| {
        LoadError::Cuda(CudaError::Driver {
            op: "report",
            code: e.to_string(),
        })
    })
}

/// GB/s of copies from one pinned buffer to device memory.
pub fn h2d_ceiling(gpu: &Gpu) -> Result<f64, CudaError> {
    let mut pinned = gpu.pinned(H2D_BYTES)?;
    let device = gpu.alloc(H2D_BYTES as u64)?;
    let src = pinned.as_mut_slice();
    src.fill(1);
    // One copy first: the link and the driver's paths warm up.
    // SAFETY: `device` is H2D_BYTES of this GPU's memory; `pinned` outlives the synchronize.
    unsafe { gpu.copy_async(device.ptr(), src) }?;
    gpu.synchronize()?;
    let started = Instant::now();
    for _ in 0..H2D_COPIES {
        // SAFETY: as above.
        unsafe { gpu.copy_async(device.ptr(), src) }?;
    }
    gpu.synchronize()?;
    Ok((H2D_BYTES * H2D_COPIES) as f64 / started.elapsed().as_secs_f64() / 1e9)
}

/// Reads `file` once through the page cache (before the warm runs).
pub fn warm(file: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(file)?;
    let len = f.metadata()?.len();
    let threads = load::DEFAULT_THREADS as u64;
    let per = len.div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let f = &f;
                scope.spawn(move || -> std::io::Result<()> {
                    let mut buf = vec![0u8; WARM_READ];
                    let (mut off, end) = (i * per, ((i + 1) * per).min(len));
                    while off < end {
                        let n = WARM_READ.min((end - off) as usize);
                        std::os::unix::fs::FileExt::read_exact_at(f, &mut buf[..n], off)?;
                        off += n as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("warm-up thread panicked")))
        })
    })
}

/// Runs every measurement in a child process of `exe`, cold ones first.
pub fn run_all(exe: &Path, file: &Path, device: usize, options: LoadOptions) -> Vec<Measurement> {
    let mut out = Vec::new();
    for cache in [CacheState::Cold, CacheState::Warm] {
        if cache == CacheState::Warm {
            if let Err(e) = warm(file) {
                tracing::warn!(error = %e, "cannot warm the page cache");
            }
        }
        for probe in Probe::FILE_ROUTES {
            out.push(child(exe, file, probe, cache, device, options));
        }
    }
    out.push(child(
        exe,
        file,
        Probe::H2d,
        CacheState::Warm,
        device,
        options,
    ));
    out
}

fn child(
    exe: &Path,
    file: &Path,
    probe: Probe,
    cache: CacheState,
    device: usize,
    options: LoadOptions,
) -> Measurement {
    let output = Command::new(exe)
        .arg("measure")
        .arg(file)
        .args(["--probe", probe.name(), "--cache", cache.name()])
        .args([
            "--device",
            &device.to_string(),
            "--threads",
            &options.threads.to_string(),
        ])
        .args(["--chunk", &options.chunk_bytes.to_string()])
        .output();
    let result = match output {
        Err(e) => Err(format!("cannot run {}: {e}", exe.display())),
        Ok(o) if !o.status.success() => Err(last_line(&o.stderr)),
        Ok(o) => parse_sample(&o.stdout),
    };
    Measurement {
        probe,
        cache,
        result,
    }
}

/// The child's one-sentence error, without the program-name prefix.
fn last_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("failed without a message");
    line.strip_prefix("tierfs-gpu: ")
        .unwrap_or(line)
        .to_string()
}

fn parse_sample(stdout: &[u8]) -> Result<Sample, String> {
    let v: serde_json::Value =
        serde_json::from_slice(stdout).map_err(|e| format!("unreadable report: {e}"))?;
    let gb_per_s = v["gb_per_s"].as_f64().ok_or("report without gb_per_s")?;
    Ok(Sample {
        gb_per_s,
        resident_fraction: v["resident_fraction"].as_f64(),
        read_mode: v["read_mode"].as_str().map(str::to_string),
    })
}

fn figure(rows: &[Measurement], probe: Probe, cache: CacheState) -> Option<f64> {
    rows.iter()
        .find(|m| m.probe == probe && m.cache == cache)
        .and_then(|m| m.result.as_ref().ok())
        .map(|s| s.gb_per_s)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "-".into(),
    }
}

fn gbps(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2}"))
}

/// The table `bench` prints.
pub fn table(title: &str, rows: &[Measurement]) -> String {
    let mut out = format!("{title}\n\n");
    let _ = writeln!(
        out,
        "{:<30} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8}",
        "route", "cold GB/s", "÷ plain", "÷ disk", "warm GB/s", "÷ plain", "÷ H2D"
    );
    let h2d = figure(rows, Probe::H2d, CacheState::Warm);
    for probe in Probe::FILE_ROUTES {
        let (cold, warm) = (
            figure(rows, probe, CacheState::Cold),
            figure(rows, probe, CacheState::Warm),
        );
        let plain = |c| figure(rows, Probe::Plain, c);
        let _ = writeln!(
            out,
            "{:<30} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8}",
            probe.label(),
            gbps(cold),
            ratio(cold, plain(CacheState::Cold)),
            ratio(cold, figure(rows, Probe::Disk, CacheState::Cold)),
            gbps(warm),
            ratio(warm, plain(CacheState::Warm)),
            ratio(warm, h2d)
        );
    }
    let _ = writeln!(
        out,
        "{:<30} {:>9} {:>8} {:>8} {:>9}",
        Probe::H2d.label(),
        "-",
        "",
        "",
        gbps(h2d)
    );
    let notes: Vec<String> = rows
        .iter()
        .filter_map(|m| match &m.result {
            Err(why) => Some(format!("  {} ({}): {why}", m.probe.label(), m.cache.name())),
            Ok(s)
                if m.cache == CacheState::Warm && s.resident_fraction.is_some_and(|r| r < 0.99) =>
            {
                Some(format!(
                    "  {} (warm): only {:.0}% of the file was cached",
                    m.probe.label(),
                    s.resident_fraction.unwrap_or(0.0) * 100.0
                ))
            }
            Ok(_) => None,
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\nnotes:\n{}", notes.join("\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(probe: Probe, cache: CacheState, gb_per_s: f64) -> Measurement {
        let sample = Sample {
            gb_per_s,
            resident_fraction: Some(1.0),
            read_mode: None,
        };
        Measurement {
            probe,
            cache,
            result: Ok(sample),
        }
    }

    #[test]
    fn the_table_shows_figures_ratios_and_reasons() {
        use CacheState::*;
        let rows = vec![
            ok(Probe::Disk, Cold, 4.0),
            ok(Probe::Bounce, Cold, 3.6),
            ok(Probe::Plain, Cold, 1.2),
            ok(Probe::Bounce, Warm, 40.0),
            ok(Probe::Plain, Warm, 8.0),
            ok(Probe::H2d, Warm, 50.0),
            Measurement {
                probe: Probe::Gds,
                cache: Cold,
                result: Err("GPUDirect Storage is not usable".into()),
            },
        ];
        let t = table("bench", &rows);
        let bounce = t.lines().find(|l| l.starts_with("bounce buffers")).unwrap();
        let cells: Vec<&str> = bounce.split_whitespace().skip(2).collect();
        assert_eq!(cells, ["3.60", "3.00×", "0.90×", "40.00", "5.00×", "0.80×"]);
        let gds = t
            .lines()
            .find(|l| l.starts_with("GPUDirect Storage"))
            .unwrap();
        assert!(gds.contains("n/a"), "{gds}");
        assert!(
            t.contains("GPUDirect Storage (cuFile) (cold): GPUDirect Storage is not usable"),
            "{t}"
        );
        assert!(
            t.contains("pinned host→device ceiling") && t.contains("50.00"),
            "{t}"
        );
    }

    #[test]
    fn json_rows_have_the_shape_device_check_py_reads() {
        let rows = vec![
            ok(Probe::Bounce, CacheState::Cold, 3.5),
            Measurement {
                probe: Probe::Gds,
                cache: CacheState::Warm,
                result: Err("no GDS".into()),
            },
        ];
        let v = serde_json::to_value(&rows).unwrap();
        assert_eq!(v[0]["probe"], "bounce");
        assert_eq!(v[0]["cache"], "cold");
        assert_eq!(v[0]["result"]["Ok"]["gb_per_s"], 3.5);
        assert_eq!(v[1]["result"]["Err"], "no GDS");
    }

    #[test]
    fn child_errors_keep_their_last_line_without_the_prefix() {
        assert_eq!(
            last_line(b"warning\ntierfs-gpu: no GPU here\n\n"),
            "no GPU here"
        );
        assert_eq!(last_line(b""), "failed without a message");
        assert!(
            parse_sample(b"{\"gb_per_s\": 2.5, \"read_mode\": \"direct\"}")
                .is_ok_and(|s| s.gb_per_s == 2.5)
        );
        assert!(parse_sample(b"not json").is_err());
    }
}
