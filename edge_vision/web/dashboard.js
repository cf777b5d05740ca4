// The node's dashboard (/dashboard): a few figures of the node and, per event sink, what it
// delivered, retried, holds and dropped and how long delivery takes, read from /metrics
// every two seconds (docs/events.md, "Metrics"). /metrics needs the admin scope where
// authentication is on: open the page with #token=<admin token>.

const $ = (id) => document.getElementById(id);
const REFRESH_MS = 2000;
const SINK_PREFIX = "edge_vision_events_";

/**
 * Prometheus' text format (version 0.0.4) into samples: `{name, labels, value}`.
 * @param {string} text
 * @returns {Array<{name: string, labels: Object<string, string>, value: number}>}
 */
export function parseMetrics(text) {
  const samples = [];
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const raw of text.split("\n")) {
    if (!raw || raw.startsWith("#")) continue;
    const m = line.exec(raw);
    if (!m) continue;
    const labels = {};
    for (const [, k, v] of (m[2] || "").matchAll(label)) {
      labels[k] = v.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
    }
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

/**
 * Per sink (the `sink` label of the events' metrics; a configured sink has its `queued`
 * gauge from the start): delivered, retried, queued, dropped, up, latency mean and p95.
 */
export function sinkFigures(samples) {
  const sinks = new Map();
  const of = (name) => {
    if (!sinks.has(name)) {
      sinks.set(name, {
        sink: name, delivered: 0, retried: 0, queued: 0, dropped: 0, up: null,
        count: 0, sum: 0, buckets: [],
      });
    }
    return sinks.get(name);
  };
  for (const s of samples) {
    if (!s.name.startsWith(SINK_PREFIX) || s.labels.sink === undefined) continue;
    const f = of(s.labels.sink);
    const metric = s.name.slice(SINK_PREFIX.length);
    if (metric === "delivered_total") f.delivered += s.value;
    else if (metric === "retried_total") f.retried += s.value;
    else if (metric === "dropped_total") f.dropped += s.value;
    else if (metric === "queued") f.queued = s.value;
    else if (metric === "sink_up") f.up = s.value;
    else if (metric === "delivery_seconds_count") f.count = s.value;
    else if (metric === "delivery_seconds_sum") f.sum = s.value;
    else if (metric === "delivery_seconds_bucket") f.buckets.push([Number(s.labels.le), s.value]);
  }
  return [...sinks.values()]
    .sort((a, b) => a.sink.localeCompare(b.sink))
    .map((f) => ({
      sink: f.sink,
      delivered: f.delivered,
      retried: f.retried,
      queued: f.queued,
      dropped: f.dropped,
      up: f.up,
      meanS: f.count ? f.sum / f.count : null,
      p95S: f.count ? quantile(f.buckets, 0.95, f.count) : null,
    }));
}

/** The upper bound of the histogram bucket that holds the quantile `q` (seconds). */
function quantile(buckets, q, count) {
  const sorted = [...buckets].sort((a, b) => a[0] - b[0]);
  const want = q * count;
  for (const [le, n] of sorted) if (n >= want) return le;
  return Infinity;
}

function sum(samples, name) {
  const found = samples.filter((s) => s.name === name);
  return found.length ? found.reduce((t, s) => t + s.value, 0) : null;
}

function seconds(v) {
  if (v === null) return "—";
  if (!Number.isFinite(v)) return "> 300 s";
  return v < 1 ? `${(v * 1000).toFixed(v < 0.01 ? 1 : 0)} ms` : `${v.toFixed(2)} s`;
}

function count(v) {
  return v === null ? "—" : String(Math.round(v));
}

function token() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get("token");
  if (given) {
    sessionStorage.setItem("edge_vision.token", given);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("edge_vision.token");
}

function showNode(samples) {
  const engine = samples.find((s) => s.name === "edge_vision_engine_active" && s.value === 1);
  const values = {
    connections: count(sum(samples, "edge_vision_connections")),
    received: count(sum(samples, "edge_vision_frames_received_total")),
    answered: count(sum(samples, "edge_vision_frames_answered_total")),
    dropped: count(sum(samples, "edge_vision_frames_dropped_total")),
    rejected: count(sum(samples, "edge_vision_frames_rejected_total") ?? 0),
    engine: engine ? engine.labels.kind : "none active",
    raised: count(sum(samples, "edge_vision_events_raised_total") ?? 0),
  };
  for (const el of $("node").querySelectorAll("dd[data-metric]")) {
    const text = values[el.dataset.metric];
    if (el.textContent !== text) el.textContent = text;
  }
}

function showSinks(samples) {
  const figures = sinkFigures(samples);
  $("sinks-empty").hidden = figures.length > 0;
  $("sinks").hidden = figures.length === 0;
  const rows = figures.map((f) => {
    const row = document.createElement("tr");
    row.dataset.sink = f.sink;
    const state = f.up === null ? "waiting" : f.up ? "up" : "down";
    const cells = [
      ["sink", f.sink, f.sink],
      ["state", state, state],
      ["delivered", count(f.delivered), f.delivered],
      ["retried", count(f.retried), f.retried],
      ["queued", count(f.queued), f.queued],
      ["dropped", count(f.dropped), f.dropped],
      ["latency_mean", seconds(f.meanS), f.meanS ?? ""],
      ["latency_p95", seconds(f.p95S), f.p95S ?? ""],
    ];
    for (const [field, text, value] of cells) {
      const cell = document.createElement(field === "sink" ? "th" : "td");
      if (field === "sink") cell.scope = "row";
      cell.dataset.field = field;
      cell.dataset.value = String(value);
      cell.textContent = text;
      if (field === "state") cell.dataset.state = state;
      row.append(cell);
    }
    return row;
  });
  $("sinks").tBodies[0].replaceChildren(...rows);
}

async function refresh(bearer) {
  const state = $("dash-state");
  try {
    const headers = bearer ? { Authorization: `Bearer ${bearer}` } : {};
    const r = await fetch("/metrics", { headers, cache: "no-store" });
    if (!r.ok) {
      const why = r.status === 401 || r.status === 403
        ? "an admin token is needed: open /dashboard#token=<admin token>"
        : (await r.text()).trim();
      state.dataset.kind = "refused";
      state.textContent = `/metrics answered ${r.status}: ${why}`;
      return;
    }
    const samples = parseMetrics(await r.text());
    showNode(samples);
    showSinks(samples);
    state.dataset.kind = "open";
    state.textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    state.dataset.kind = "waiting";
    state.textContent = `node unreachable (${e.message}); trying again`;
  }
}

function main() {
  const bearer = token();
  const tick = async () => {
    await refresh(bearer);
    setTimeout(tick, REFRESH_MS);
  };
  tick();
}

main();
