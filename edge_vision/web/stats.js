// Rolling figures for the heads-up display: rates, percentiles and means over the last
// few seconds, so the numbers follow what is happening now rather than since page load.

export class RollingWindow {
  /** @param {number} spanMs how far back the window reaches */
  constructor(spanMs) {
    this.spanMs = spanMs;
    this.items = []; // {t, v}, oldest first
    this.startedAt = null;
  }

  push(t, v = 1) {
    if (this.startedAt === null) this.startedAt = t;
    this.items.push({ t, v });
    this.prune(t);
  }

  prune(now) {
    const oldest = now - this.spanMs;
    let drop = 0;
    while (drop < this.items.length && this.items[drop].t < oldest) drop += 1;
    if (drop) this.items.splice(0, drop);
  }

  /** Events per second; while the window is still filling, over the time seen so far. */
  rate(now) {
    this.prune(now);
    if (this.startedAt === null) return 0;
    const seen = Math.min(this.spanMs, now - this.startedAt);
    return seen > 0 ? (this.items.length * 1000) / Math.max(seen, 250) : 0;
  }

  /** Nearest-rank percentile (p in 0..100) of the values, or null when empty. */
  percentile(p, now) {
    this.prune(now);
    if (!this.items.length) return null;
    const sorted = this.items.map((i) => i.v).sort((a, b) => a - b);
    const rank = Math.ceil((p / 100) * sorted.length);
    return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
  }

  mean(now) {
    this.prune(now);
    if (!this.items.length) return null;
    return this.items.reduce((sum, i) => sum + i.v, 0) / this.items.length;
  }
}

/** Means of each named timing over the window: the server's per-stage `timing` objects. */
export class TimingWindow {
  constructor(spanMs) {
    this.spanMs = spanMs;
    this.windows = new Map();
  }

  push(t, timing) {
    for (const [name, value] of Object.entries(timing || {})) {
      if (typeof value !== "number" || !Number.isFinite(value)) continue;
      if (!this.windows.has(name)) this.windows.set(name, new RollingWindow(this.spanMs));
      this.windows.get(name).push(t, value);
    }
  }

  mean(name, now) {
    const w = this.windows.get(name);
    return w ? w.mean(now) : null;
  }
}
