// The tierfs sidebar tab of ComfyUI's page.
//
// A ComfyUI frontend extension ("tierfs.sidebar"): a sidebar tab (id "tierfs", database icon)
// that, while it is open, asks GET /api/tierfs/stats (routes.py) once a second and draws, per
// tierfs mount: its budget and cache use, hit rate, disk bytes and disk / served throughput
// (rates from successive polls), and per model file its mode, figures and residency strip: one
// cell per block in the file's reading order (docs/STATS.md, "Residency strips"), the reader's
// block outlined. With no mount it shows the route's hint. Self-contained: no external scripts
// or fonts; its styles are tierfs.css beside this file.
//
// The strips carry what a test reads from the DOM: `.tierfs-strip` elements with data-path,
// data-blocks, data-cached (`#` blocks), data-read (blocks not `.`) and data-current
// (residency_current, "" when none).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const POLL_MS = 1000;
const MAX_CELLS = 512; // a longer strip is drawn with several blocks per cell
const RATE_GAP_MS = 5000; // a sample older than this gives no rate (the tab was closed)

const STATES = {
  "#": ["c-resident", "cached"],
  ">": ["c-reading", "being read for a waiting reader"],
  "~": ["c-prefetching", "prefetching"],
  "+": ["c-partly", "partly cached"],
  "-": ["c-evicted", "read before, not cached"],
  ".": ["c-never", "never read"],
};

// Previous sample per mount root, kept while the tab is closed: {at, disk, served, files}.
const previous = new Map();

function size(bytes) {
  if (bytes === null || bytes === undefined || !isFinite(bytes)) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(bytes) >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
  return bytes.toFixed(i ? 1 : 0) + " " + units[i];
}

function rate(bytesPerSecond) {
  return bytesPerSecond === null ? "-" : size(bytesPerSecond) + "/s";
}

function hitRate(hit, miss) {
  const asked = (hit || 0) + (miss || 0);
  return asked ? (100 * hit / asked).toFixed(1) + " %" : "-";
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// A label and its value, one cell of a `.tierfs-figures` grid.
function figure(label, value) {
  const span = el("span", "tierfs-figure", label);
  span.append(el("b", "", value));
  return span;
}

// One cell for `k` blocks: the state that says most (a read in flight, then prefetch, then
// all cached, then some cached, then read before, then never read).
function merge(chars) {
  if (chars.includes(">")) return ">";
  if (chars.includes("~")) return "~";
  if (chars.every((c) => c === "#")) return "#";
  if (chars.some((c) => c === "#" || c === "+")) return "+";
  if (chars.includes("-")) return "-";
  return ".";
}

function strip(path, residency, current) {
  const chars = Array.from(residency || "");
  const box = el("div", "tierfs-strip");
  box.dataset.path = path;
  box.dataset.blocks = String(chars.length);
  box.dataset.cached = String(chars.filter((c) => c === "#").length);
  box.dataset.read = String(chars.filter((c) => c !== ".").length);
  box.dataset.current = current === null || current === undefined ? "" : String(current);
  const per = Math.max(1, Math.ceil(chars.length / MAX_CELLS));
  for (let i = 0; i < chars.length; i += per) {
    const c = per === 1 ? chars[i] : merge(chars.slice(i, i + per));
    const [cls, what] = STATES[c] || ["c-never", "unknown (" + c + ")"];
    const here = current !== null && current !== undefined && current >= i && current < i + per;
    const cell = el("span", "tierfs-cell " + cls + (here ? " current" : ""));
    const blocks = per === 1 ? "block " + (i + 1) : "blocks " + (i + 1) + "-" + Math.min(i + per, chars.length);
    cell.title = blocks + ": " + what + (here ? " (the reader is here)" : "");
    box.append(cell);
  }
  return box;
}

function reach(row) {
  const n = Array.from(row.residency || "").length;
  const at = row.residency_current;
  if (at === null || at === undefined || at >= n) return "no reader";
  const front = row.residency_prefetch_front;
  const ahead = front === null || front === undefined ? 0 : (front - at + n) % n;
  return "reader in block " + (at + 1) + " of " + n + " · prefetch " + ahead + " ahead";
}

// Rates per second between this poll and the last one of the same mount.
function rates(root, stats, now) {
  const c = stats.cache || {};
  const sample = {
    at: now,
    disk: (stats.disk || {}).read_bytes || 0,
    served: (c.hit_bytes || 0) + (c.miss_bytes || 0) + (c.uncached_bytes || 0),
    files: new Map(),
  };
  for (const f of stats.files || []) {
    sample.files.set(f.path, { disk: f.disk_read_bytes || 0, served: (f.hit_bytes || 0) + (f.miss_bytes || 0) });
  }
  const last = previous.get(root);
  previous.set(root, sample);
  const out = { disk: null, served: null, files: new Map() };
  if (!last || now - last.at > RATE_GAP_MS || now <= last.at) return out;
  const seconds = (now - last.at) / 1000;
  const per = (a, b) => Math.max(a - b, 0) / seconds;
  out.disk = per(sample.disk, last.disk);
  out.served = per(sample.served, last.served);
  for (const [path, f] of sample.files) {
    const before = last.files.get(path);
    if (before) out.files.set(path, { disk: per(f.disk, before.disk), served: per(f.served, before.served) });
  }
  return out;
}

// One model: `row` holds its strip (a files[] row, or a models[] row for a sharded model),
// `figures` its mode and byte counters (a shard's counters are its model's).
function model(name, row, figures, fileRates) {
  const box = el("div", "tierfs-file");
  const head = el("div", "tierfs-name");
  const path = el("span", "tierfs-path", name);
  path.title = name;
  const mode = figures.mode || "not open";
  const badge = el("span", "tierfs-mode m-" + mode.replace(/[^a-z]/g, ""), mode);
  if (figures.mode_reason) badge.title = figures.mode_reason;
  head.append(path, badge);
  const nums = el("div", "tierfs-figures");
  nums.append(
    figure("cached", size(row.cached_bytes) + " / " + size(row.size)),
    figure("hit rate", hitRate(figures.hit_bytes, figures.miss_bytes)),
    figure("disk read", size(figures.disk_read_bytes)),
    figure("disk rate", rate(fileRates ? fileRates.disk : null)),
    figure("served", rate(fileRates ? fileRates.served : null)),
    figure("stall", (row.stall_seconds || 0).toFixed(1) + " s"),
  );
  if (row.shards) nums.append(figure("shards", String(row.shards.length)));
  box.append(head, nums, strip(name, row.residency, row.residency_current), el("div", "tierfs-reach", reach(row)));
  return box;
}

function models(stats, r) {
  const files = stats.files || [];
  const entries = files.filter((f) => f.model === null || f.model === undefined)
    .map((f) => ({ name: f.path, row: f, figures: f, rates: r.files.get(f.path) }));
  for (const m of stats.models || []) {
    const shard = files.find((f) => f.model === m.name);
    // A shard's counters and so its rates are its model's.
    entries.push({ name: m.name, row: m, figures: shard || m, rates: shard ? r.files.get(shard.path) : null });
  }
  const reading = (e) => (e.row.residency_current === null || e.row.residency_current === undefined ? 1 : 0);
  entries.sort((a, b) => reading(a) - reading(b) || (b.row.cached_bytes > 0) - (a.row.cached_bytes > 0) ||
    a.name.localeCompare(b.name));
  return entries.map((e) => model(e.name, e.row, e.figures, e.rates));
}

function mount(entry, now) {
  const box = el("section", "tierfs-mount");
  box.dataset.root = entry.root;
  box.append(el("div", "tierfs-root", entry.root));
  if (entry.error) {
    box.append(el("div", "tierfs-error", "cannot read its stats: " + entry.error));
    return box;
  }
  const s = entry.stats;
  const c = s.cache || {};
  const r = rates(entry.root, s, now);
  const budget = (s.budget && s.budget.effective_bytes) || c.budget_bytes;
  const nums = el("div", "tierfs-figures");
  nums.append(
    figure("budget", size(budget)),
    figure("cache used", size(c.used_bytes)),
    figure("hit rate", hitRate(c.hit_bytes, c.miss_bytes)),
    figure("stall", (c.stall_seconds || 0).toFixed(1) + " s"),
    figure("disk read", size((s.disk || {}).read_bytes)),
    figure("disk rate", rate(r.disk)),
    figure("served", rate(r.served)),
  );
  box.append(nums);
  const rows = models(s, r);
  if (rows.length) box.append(...rows);
  else box.append(el("div", "tierfs-hint", "No model file opened through this mount yet."));
  return box;
}

function legend() {
  const box = el("div", "tierfs-legend");
  for (const [, [cls, what]] of Object.entries(STATES)) {
    const key = el("span", "tierfs-key");
    key.append(el("span", "tierfs-cell " + cls), document.createTextNode(what));
    box.append(key);
  }
  const reader = el("span", "tierfs-key");
  reader.append(el("span", "tierfs-cell c-never current"), document.createTextNode("the reader's block"));
  box.append(reader, el("div", "", "One cell per block, in the order the model is read."));
  return box;
}

async function poll() {
  const response = await api.fetchApi("/tierfs/stats", { cache: "no-store" });
  if (!response.ok) {
    const why = (await response.text()).trim();
    throw new Error("/tierfs/stats answered " + response.status + (why ? ": " + why : ""));
  }
  return response.json();
}

function render(el_) {
  const panel = el("div", "tierfs-panel");
  const head = el("div", "tierfs-head");
  const updated = el("span", "tierfs-updated", "loading…");
  head.append(el("span", "tierfs-title", "tierfs"), updated);
  const error = el("div", "tierfs-error");
  const body = el("div", "tierfs-body");
  panel.append(head, error, body, legend());
  el_.replaceChildren(panel);

  let timer = null;
  let stopped = false;
  let shown = false; // the panel was in the page once (render may run before it is)
  const gone = () => stopped || (shown && !panel.isConnected);
  const tick = async () => {
    timer = null;
    shown = shown || panel.isConnected;
    if (gone()) return; // the tab was closed
    if (shown && !document.hidden) {
      try {
        const doc = await poll();
        const now = performance.now();
        const parts = [];
        if (doc.error) parts.push(el("div", "tierfs-error", doc.error));
        parts.push(...(doc.mounts || []).map((m) => mount(m, now)));
        if (doc.hint) parts.push(el("div", "tierfs-hint", doc.hint));
        body.replaceChildren(...parts);
        error.textContent = "";
        updated.textContent = "updated " + new Date().toLocaleTimeString();
      } catch (e) {
        error.textContent = "cannot read the stats: " + (e && e.message ? e.message : e);
      }
    }
    if (!gone()) timer = setTimeout(tick, POLL_MS);
  };
  tick();
  return () => {
    stopped = true;
    if (timer !== null) clearTimeout(timer);
    timer = null;
  };
}

let stop = null;

app.registerExtension({
  name: "tierfs.sidebar",
  setup() {
    const css = document.createElement("link");
    css.rel = "stylesheet";
    css.href = new URL("./tierfs.css", import.meta.url).href;
    document.head.append(css);
    app.extensionManager.registerSidebarTab({
      id: "tierfs",
      icon: "pi pi-database",
      title: "tierfs",
      tooltip: "tierfs: the model cache's blocks, hit rate and throughput",
      type: "custom",
      render: (el_) => {
        if (stop) stop();
        stop = render(el_);
      },
      destroy: () => {
        if (stop) stop();
        stop = null;
      },
    });
  },
});
