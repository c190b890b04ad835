//! `tierfs top MOUNTPOINT`: a live terminal view of a mount, refreshed every `--interval`.
//!
//! **Contract.** Reads only `MOUNTPOINT/.tierfs/stats` (so it shows what any script sees) and
//! acts only through `MOUNTPOINT/.tierfs/control`: `q` (or Esc, Ctrl-C) quits, `d` drops the
//! cache, `+` / `-` raise / lower the configured budget by a quarter / a fifth, `↑`/`↓` (or
//! `k`/`j`) select a model and `p` prefetches it. It shows the budget, what the cache holds, the
//! hit rate by bytes, memory pressure and what it made the mount give back, each source
//! device's measured latency, throughput while reading and reads in flight (`source` in the
//! stats), the disk and served throughput as sparklines, per-operation p50/p99, and for each model (a file, or a sharded
//! model with all its shards) its mode, what of it is cached, its stall time, its own hit rate
//! and served and disk throughput (text sparklines), how far prefetch reaches ahead of its
//! reader, and its residency strip (`files[].residency`, `models[].residency`, docs/STATS.md)
//! in colour with the reader's block highlighted; models a reader is in or that hold cached
//! bytes first.
//! When stdout is not a terminal it prints the `tierfs stats` text view once instead.
//!
//! The terminal is restored however the view ends (`ratatui::init` installs a panic hook).

use std::collections::{HashMap, VecDeque};
use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline, Wrap};
use ratatui::{DefaultTerminal, Frame};
use tierfs_core::size::format_size;

use crate::mount::send_control;
use crate::stats_read::{FileRead, StatsRead, StripRead, OPS};

/// Tuning of the view; [`Default`] is what `tierfs top` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TopConfig {
    /// Throughput samples kept for the sparklines (four minutes at the default interval).
    history: usize,
    /// Samples shown in a model's sparklines.
    file_sparkline: usize,
}

impl Default for TopConfig {
    fn default() -> TopConfig {
        TopConfig {
            history: 240,
            file_sparkline: 24,
        }
    }
}

/// Source devices shown in the summary (a SOURCE rarely spans more file systems).
const MAX_SOURCE_LINES: usize = 4;

/// One file's throughput since the view started.
#[derive(Default)]
struct FileHistory {
    /// When last sampled, its served and disk byte counters.
    last: Option<(Instant, u64, u64)>,
    served_rate: VecDeque<u64>,
    disk_rate: VecDeque<u64>,
}

pub fn run(mountpoint: &Path, interval: f64) -> Result<()> {
    let interval = Duration::from_secs_f64(interval.max(0.1));
    if !std::io::stdout().is_terminal() {
        let once = crate::stats_cmd::StatsOptions {
            interval: interval.as_secs_f64(),
            ..crate::stats_cmd::StatsOptions::once()
        };
        return crate::stats_cmd::run(mountpoint, once);
    }
    let mut view = View::new(mountpoint);
    view.refresh(); // a mount that cannot be read fails before the screen is taken
    if let Some(error) = &view.error {
        anyhow::bail!("{error}");
    }
    let mut terminal = ratatui::init();
    let result = view.run(&mut terminal, interval);
    ratatui::restore();
    result
}

/// What the screen shows, and what it remembers between refreshes.
struct View<'a> {
    mountpoint: &'a Path,
    config: TopConfig,
    doc: StatsRead,
    /// When `doc` was read, its disk and served byte counters.
    last: Option<(Instant, u64, u64)>,
    /// Bytes per second, oldest first.
    disk_rate: VecDeque<u64>,
    served_rate: VecDeque<u64>,
    /// Per file path, its own throughput.
    files: HashMap<String, FileHistory>,
    /// The outcome of the last key's command, or why the stats cannot be read.
    message: String,
    error: Option<String>,
    /// The selected model's name (what `p` prefetches).
    selected: Option<String>,
}

/// One model of the models pane: a file served on its own, or a sharded model.
struct Entry<'d> {
    /// The file's path, or the sharded model's name (relative to the mount).
    name: &'d str,
    /// Its strip, size and cached bytes (`files[]` or `models[]` row).
    strip: &'d StripRead,
    /// How many shards a sharded model has (`None` for a file on its own).
    shards: Option<usize>,
    /// Its mode and byte counters: the file's row, or its first shard's (a shard's counters
    /// are its model's).
    figures: Figures<'d>,
    /// What `prefetch` is given for it: the file, or the model's first shard.
    prefetch: Option<&'d str>,
}

/// The mode and byte counters of a model of the models pane, from a `files[]` row (none where
/// a sharded model has no shard row).
#[derive(Clone, Copy, Default)]
struct Figures<'d> {
    path: Option<&'d str>,
    mode: Option<&'d str>,
    hit_bytes: u64,
    miss_bytes: u64,
    start_stall_seconds: f64,
}

impl<'d> Figures<'d> {
    fn of(file: &'d FileRead) -> Figures<'d> {
        Figures {
            path: file.path.as_deref(),
            mode: file.mode.as_deref(),
            hit_bytes: file.hit_bytes,
            miss_bytes: file.miss_bytes,
            start_stall_seconds: file.start_stall_seconds,
        }
    }
}

impl<'a> View<'a> {
    fn new(mountpoint: &'a Path) -> View<'a> {
        View::with_config(mountpoint, TopConfig::default())
    }

    fn with_config(mountpoint: &'a Path, config: TopConfig) -> View<'a> {
        View {
            mountpoint,
            config,
            doc: StatsRead::default(),
            last: None,
            disk_rate: VecDeque::new(),
            served_rate: VecDeque::new(),
            files: HashMap::new(),
            message: String::new(),
            error: None,
            selected: None,
        }
    }

    fn run(&mut self, terminal: &mut DefaultTerminal, interval: Duration) -> Result<()> {
        let mut next_refresh = Instant::now() + interval;
        loop {
            terminal
                .draw(|frame| self.draw(frame))
                .context("cannot draw on the terminal")?;
            let wait = next_refresh.saturating_duration_since(Instant::now());
            if event::poll(wait).context("cannot read the terminal")? {
                if let Event::Key(key) = event::read().context("cannot read the terminal")? {
                    if key.kind != KeyEventKind::Release && !self.key(key.code, key.modifiers) {
                        return Ok(());
                    }
                }
            }
            if Instant::now() >= next_refresh {
                self.refresh();
                next_refresh = Instant::now() + interval;
            }
        }
    }

    /// Acts on a key; false to quit.
    fn key(&mut self, code: KeyCode, modifiers: KeyModifiers) -> bool {
        let command = match code {
            KeyCode::Char('q') | KeyCode::Esc => return false,
            KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => return false,
            KeyCode::Char('d') => "drop".to_string(),
            KeyCode::Char('+') | KeyCode::Char('=') => self.resize(5, 4),
            KeyCode::Char('-') => self.resize(4, 5),
            KeyCode::Up | KeyCode::Char('k') => return self.select(-1),
            KeyCode::Down | KeyCode::Char('j') => return self.select(1),
            KeyCode::Char('p') => match self.selected_entry().and_then(|e| e.prefetch) {
                Some(path) => format!("prefetch {path}"),
                None => {
                    self.message = "no model to prefetch".to_string();
                    return true;
                }
            },
            _ => return true,
        };
        self.message = match send_control(self.mountpoint, &command) {
            Ok(()) => format!("sent: {command}"),
            Err(e) => format!("{command}: {e:#}"),
        };
        self.refresh();
        true
    }

    /// Moves the selection `by` models; true (the view goes on).
    fn select(&mut self, by: isize) -> bool {
        let entries = self.entries();
        let at = self.selected_index(&entries).unwrap_or(0);
        let to = at
            .saturating_add_signed(by)
            .min(entries.len().saturating_sub(1));
        self.selected = entries.get(to).map(|e| e.name.to_string());
        true
    }

    /// Index of the selected model among `entries`: the first if none is selected yet.
    fn selected_index(&self, entries: &[Entry<'_>]) -> Option<usize> {
        if entries.is_empty() {
            return None;
        }
        let named = self.selected.as_deref();
        Some(
            entries
                .iter()
                .position(|e| Some(e.name) == named)
                .unwrap_or(0),
        )
    }

    fn selected_entry(&self) -> Option<Entry<'_>> {
        let mut entries = self.entries();
        let at = self.selected_index(&entries)?;
        Some(entries.swap_remove(at))
    }

    /// The models to show, in display order: files on their own and sharded models (their
    /// shards' rows are folded into them); those a reader is in first, then those the cache
    /// holds, each group in the stats' order.
    fn entries(&self) -> Vec<Entry<'_>> {
        let files = &self.doc.files;
        let mut entries: Vec<Entry<'_>> = files
            .iter()
            .filter(|f| f.model.is_none())
            .filter_map(|f| {
                let name = f.path.as_deref()?;
                Some(Entry {
                    name,
                    strip: &f.strip,
                    shards: None,
                    figures: Figures::of(f),
                    prefetch: Some(name),
                })
            })
            .collect();
        for model in &self.doc.models {
            let Some(name) = model.name.as_deref() else {
                continue;
            };
            let shard = files.iter().find(|f| f.model.as_deref() == Some(name));
            entries.push(Entry {
                name,
                strip: &model.strip,
                shards: model.shards.as_ref().map(Vec::len),
                figures: shard.map(Figures::of).unwrap_or_default(),
                prefetch: model
                    .shards
                    .as_ref()
                    .and_then(|shards| shards.first())
                    .and_then(|shard| shard.path.as_deref()),
            });
        }
        entries.sort_by_key(|e| {
            (
                e.strip.residency_current.is_none(),
                e.strip.cached_bytes == 0,
            )
        });
        entries
    }

    /// The `ram-cache` command that scales the configured budget by `num / den` (whole MiB).
    fn resize(&self, num: u64, den: u64) -> String {
        let configured = self
            .doc
            .budget
            .as_ref()
            .and_then(|budget| budget.configured_bytes)
            .unwrap_or(self.doc.cache.budget_bytes);
        let mib = ((configured / den * num) >> 20).max(1);
        format!("ram-cache {mib}MiB")
    }

    fn refresh(&mut self) {
        let path = self.mountpoint.join(".tierfs/stats");
        let doc = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|text| {
                serde_json::from_str::<StatsRead>(&text)
                    .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))
            });
        match doc {
            Ok(doc) => {
                self.error = None;
                self.sample(&doc);
                self.doc = doc;
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// Adds the throughput since the last document to the sparklines.
    fn sample(&mut self, doc: &StatsRead) {
        let now = Instant::now();
        let disk = doc.disk.read_bytes;
        let served = doc.cache.hit_bytes + doc.cache.miss_bytes + doc.cache.uncached_bytes;
        if let Some((then, last_disk, last_served)) = self.last {
            let seconds = now.duration_since(then).as_secs_f64().max(1e-3);
            let rate = |now: u64, before: u64| (now.saturating_sub(before) as f64 / seconds) as u64;
            let history = self.config.history;
            push(&mut self.disk_rate, rate(disk, last_disk), history);
            push(&mut self.served_rate, rate(served, last_served), history);
        }
        self.last = Some((now, disk, served));
        for file in &doc.files {
            let Some(path) = file.path.as_deref() else {
                continue;
            };
            let history = self.files.entry(path.to_string()).or_default();
            let served = file.hit_bytes + file.miss_bytes;
            let disk = file.disk_read_bytes;
            if let Some((then, last_served, last_disk)) = history.last {
                let seconds = now.duration_since(then).as_secs_f64().max(1e-3);
                let rate =
                    |now: u64, before: u64| (now.saturating_sub(before) as f64 / seconds) as u64;
                push(
                    &mut history.served_rate,
                    rate(served, last_served),
                    self.config.history,
                );
                push(
                    &mut history.disk_rate,
                    rate(disk, last_disk),
                    self.config.history,
                );
            }
            history.last = Some((now, served, disk));
        }
    }

    fn draw(&self, frame: &mut Frame) {
        let [summary, rates, files, ops, help] = Layout::vertical([
            Constraint::Length(2 + self.summary_lines()),
            Constraint::Length(4),
            Constraint::Min(4),
            Constraint::Length(8),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        frame.render_widget(self.summary(), summary);
        self.draw_rates(frame, rates);
        frame.render_widget(self.files(files.width.saturating_sub(2)), files);
        frame.render_widget(self.ops(), ops);
        let status = self.error.as_deref().unwrap_or(&self.message);
        frame.render_widget(
            Paragraph::new(format!(
                "q quit · d drop the cache · +/- budget ×1.25/×0.8 · ↑/↓ select, p prefetch   {status}"
            )),
            help,
        );
    }

    /// Lines of the summary pane: two, one for the store of a remote source, one for the disk
    /// tier if the mount has one, and one per source device (at least one, at most
    /// [`MAX_SOURCE_LINES`]).
    fn summary_lines(&self) -> u16 {
        2 + self.doc.source.devices.len().clamp(1, MAX_SOURCE_LINES) as u16
            + u16::from(self.doc.source.remote.is_some())
            + u16::from(self.doc.disk_tier.is_some())
    }

    fn summary(&self) -> Paragraph<'_> {
        let doc = &self.doc;
        let budget = doc.budget_or_default();
        let (hit, miss) = (doc.cache.hit_bytes, doc.cache.miss_bytes);
        let hit_rate = if hit + miss == 0 {
            "-".to_string()
        } else {
            format!("{:.1} %", hit as f64 * 100.0 / (hit + miss) as f64)
        };
        let pressure = match budget.pressure_limit_bytes {
            Some(limit) => format!("limit {}", format_size(limit)),
            None => "none".to_string(),
        };
        let z = &doc.cache.compress;
        let compressed = format!(
            "   compress {} {}",
            z.mode.as_deref().unwrap_or("?"),
            z.held().unwrap_or_else(|| "nothing held".to_string())
        );
        let mut lines = vec![
            Line::from(format!(
                "budget {}   cache {} of {}   passthrough {} open   hit rate {hit_rate} by bytes{compressed}",
                format_size(doc.cache.budget_bytes),
                format_size(doc.cache.used_bytes),
                format_size(doc.cache.chunk_budget_bytes),
                format_size(doc.passthrough.open_bytes),
            )),
            Line::from(format!(
                "stall {:.2} s   disk read {}   prefetch {} issued, {} wasted   pressure {pressure} ({} events, {} given back)",
                doc.cache.stall_seconds,
                format_size(doc.disk.read_bytes),
                format_size(doc.prefetch.issued_bytes),
                format_size(doc.prefetch.wasted_bytes),
                budget.pressure_events,
                format_size(budget.given_back_bytes),
            )),
        ];
        if let Some(remote) = &doc.source.remote {
            lines.push(Line::from(format!("store {}", remote.summary())));
        }
        if let Some(tier) = &doc.disk_tier {
            lines.push(Line::from(format!("disk tier {}", tier.summary())));
        }
        let devices = &doc.source.devices;
        if devices.is_empty() {
            lines.push(Line::from("source no reads yet"));
        }
        for device in devices.iter().take(MAX_SOURCE_LINES) {
            lines.push(Line::from(format!(
                "source {}",
                crate::stats_cmd::source_summary(device)
            )));
        }
        let title = format!(" tierfs top {} ", self.mountpoint.display());
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(title))
    }

    fn draw_rates(&self, frame: &mut Frame, area: Rect) {
        let [disk, served] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
                .areas(area);
        for (rates, name, area) in [
            (&self.disk_rate, "disk", disk),
            (&self.served_rate, "served", served),
        ] {
            let now = rates.back().copied().unwrap_or(0);
            let title = format!(" {name} {}/s ", format_size(now));
            // The newest samples that fit, right-aligned.
            let width = usize::from(area.width.saturating_sub(2));
            let data: Vec<u64> = rates
                .iter()
                .skip(rates.len().saturating_sub(width))
                .copied()
                .collect();
            let sparkline = Sparkline::default()
                .block(Block::default().borders(Borders::ALL).title(title))
                .data(&data);
            frame.render_widget(sparkline, area);
        }
    }

    fn files(&self, width: u16) -> Paragraph<'_> {
        let entries = self.entries();
        let selected = self.selected_index(&entries);
        let mut lines = Vec::new();
        for (at, entry) in entries.iter().enumerate() {
            let (figures, strip) = (entry.figures, entry.strip);
            let marker = if Some(at) == selected { "▶ " } else { "  " };
            let shards = match entry.shards {
                Some(shards) => format!("  {shards} shards"),
                None => String::new(),
            };
            let compressed = strip
                .compressed
                .held()
                .map(|held| format!("  {held}"))
                .unwrap_or_default();
            lines.push(Line::from(vec![
                Span::raw(marker),
                Span::styled(
                    entry.name.to_string(),
                    Style::default().add_modifier(Modifier::BOLD),
                ),
                Span::raw(format!(
                    "{shards}  {}  cached {} of {}{compressed}  stall {:.2} s  start stall {:.2} s",
                    figures.mode.unwrap_or("?"),
                    format_size(strip.cached_bytes),
                    format_size(strip.size),
                    strip.stall_seconds,
                    figures.start_stall_seconds,
                )),
            ]));
            lines.push(self.file_rates(entry.name, figures));
            lines.push(Line::from(format!("  {}", reach(strip))));
            lines.extend(strip_lines(strip, usize::from(width.max(8))));
        }
        if lines.is_empty() {
            lines.push(Line::from("no model file opened yet"));
        }
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::default()
                .borders(Borders::ALL)
                .title(Line::from(legend())),
        )
    }

    /// A model's hit rate by bytes and its served and disk throughput as text sparklines.
    fn file_rates(&self, name: &str, file: Figures<'_>) -> Line<'static> {
        let (hit, miss) = (file.hit_bytes, file.miss_bytes);
        let hit_rate = if hit + miss == 0 {
            "-".to_string()
        } else {
            format!("{:.1} %", hit as f64 * 100.0 / (hit + miss) as f64)
        };
        // A sharded model's counters are its first shard's row, sampled under that path.
        let path = file.path.unwrap_or(name);
        let history = self.files.get(path);
        let rates = |pick: fn(&FileHistory) -> &VecDeque<u64>| {
            history.map_or((String::new(), 0), |h| {
                let rates = pick(h);
                (
                    text_sparkline(rates, self.config.file_sparkline),
                    rates.back().copied().unwrap_or(0),
                )
            })
        };
        let (served, served_now) = rates(|h| &h.served_rate);
        let (disk, disk_now) = rates(|h| &h.disk_rate);
        Line::from(format!(
            "  hit rate {hit_rate} by bytes   served {served:<width$} {}/s   disk {disk:<width$} {}/s",
            format_size(served_now),
            format_size(disk_now),
            width = self.config.file_sparkline,
        ))
    }

    fn ops(&self) -> Paragraph<'_> {
        let mut lines = vec![Line::from(format!(
            "{:<9}{:>10}{:>8}{:>12}{:>12}",
            "op", "count", "errors", "p50", "p99"
        ))];
        for op in OPS {
            let figures = self.doc.op(op);
            lines.push(Line::from(format!(
                "{op:<9}{:>10}{:>8}{:>12}{:>12}",
                figures.count,
                figures.errors,
                format_micros(figures.p50_us),
                format_micros(figures.p99_us),
            )));
        }
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" requests "))
    }
}

/// The colour of each strip character (docs/STATS.md, "Residency strips").
fn strip_style(c: char) -> Style {
    let colour = match c {
        '#' => Color::Green,
        '>' => Color::Yellow,
        '~' => Color::Cyan,
        '+' => Color::LightGreen,
        '-' => Color::Red,
        _ => Color::DarkGray,
    };
    Style::default().fg(colour)
}

/// The models pane's title: what each strip character means, in its colour.
fn legend() -> Vec<Span<'static>> {
    let mut spans = vec![Span::raw(" models: blocks in reading order ")];
    for (c, meaning) in [
        ('#', "cached"),
        ('>', "reading"),
        ('~', "prefetching"),
        ('+', "partly"),
        ('-', "evicted"),
        ('.', "never read"),
    ] {
        spans.push(Span::styled(c.to_string(), strip_style(c)));
        spans.push(Span::raw(format!(" {meaning}  ")));
    }
    spans
}

/// Where the reader is, how far ahead of it prefetch has read (`residency_prefetch_front`), and
/// how many blocks are being prefetched.
fn reach(row: &StripRead) -> String {
    let index = |i: Option<u64>| i.and_then(|i| usize::try_from(i).ok());
    let strip = row.residency.as_deref().unwrap_or("");
    let blocks = strip.chars().count();
    let in_flight = strip.chars().filter(|&c| c == '~').count();
    let Some(current) = index(row.residency_current).filter(|&c| c < blocks) else {
        return format!("no reader   {in_flight} blocks prefetching");
    };
    // The order goes on from the end of the strip to its start (the next pass).
    let ahead = index(row.residency_prefetch_front).map_or(0, |f| (f + blocks - current) % blocks);
    format!(
        "reader in block {} of {blocks}   prefetch reaches {ahead} blocks ahead   {in_flight} blocks prefetching",
        current + 1,
    )
}

/// The residency strip cut into lines of `width`, coloured, the reader's block reversed.
fn strip_lines(row: &StripRead, width: usize) -> Vec<Line<'static>> {
    let strip: Vec<char> = row.residency.as_deref().unwrap_or("").chars().collect();
    let current = row.residency_current.and_then(|c| usize::try_from(c).ok());
    strip
        .chunks(width)
        .enumerate()
        .map(|(line, chars)| {
            let spans = chars
                .iter()
                .enumerate()
                .map(|(col, &c)| {
                    let mut style = strip_style(c);
                    if Some(line * width + col) == current {
                        style = style.add_modifier(Modifier::REVERSED);
                    }
                    Span::styled(c.to_string(), style)
                })
                .collect::<Vec<_>>();
            Line::from(spans)
        })
        .collect()
}

/// The newest `width` of `rates` as block characters, scaled to their largest.
fn text_sparkline(rates: &VecDeque<u64>, width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let shown: Vec<u64> = rates
        .iter()
        .skip(rates.len().saturating_sub(width))
        .copied()
        .collect();
    let top = shown.iter().copied().max().unwrap_or(0).max(1);
    shown
        .iter()
        .map(|&rate| BARS[(rate.saturating_mul(7) / top) as usize])
        .collect()
}

/// Appends `rate`, keeping the newest `history` samples.
fn push(rates: &mut VecDeque<u64>, rate: u64, history: usize) {
    if rates.len() >= history {
        rates.pop_front();
    }
    rates.push_back(rate);
}

fn format_micros(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sparklines_keep_the_configured_history() {
        let config = TopConfig {
            history: 3,
            ..TopConfig::default()
        };
        let mut view = View::with_config(Path::new("/mnt"), config);
        let doc = StatsRead::default();
        for _ in 0..6 {
            view.sample(&doc);
        }
        assert_eq!(view.disk_rate.len(), 3);
        assert_eq!(view.served_rate.len(), 3);
        let mut default = View::new(Path::new("/mnt"));
        for _ in 0..6 {
            default.sample(&doc);
        }
        assert_eq!(default.disk_rate.len(), 5);
    }

    #[test]
    fn the_summary_has_a_line_per_source_device() {
        let mut view = View::new(Path::new("/mnt"));
        assert_eq!(
            view.summary_lines(),
            3,
            "a line saying no source was read yet"
        );
        view.doc.source.devices = vec![Default::default(); 2];
        assert_eq!(view.summary_lines(), 4);
        view.doc.source.devices = vec![Default::default(); 9];
        assert_eq!(view.summary_lines(), 2 + MAX_SOURCE_LINES as u16);
        view.doc.source.remote = Some(Default::default());
        assert_eq!(
            view.summary_lines(),
            3 + MAX_SOURCE_LINES as u16,
            "a line for the store"
        );
    }
}
