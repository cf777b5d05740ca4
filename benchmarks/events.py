"""What events cost (edge_vision/events, docs/events.md): the rules on the frame path, and
how fast the node's hub gets events to a real sink.

    python -m benchmarks.events [--frames 300] [--labels 1 5 20] [--events 2000]
        [--rounds 3] [--json out.json]

1. **Rules**: ten rules (two of each kind, a zone and a line, no ``text``) over clips of
   ``--labels`` tracked labels moving through the line, ``--frames`` frames each, fed to one
   session's :class:`~edge_vision.events.session_rules.SessionRules` as the connection does
   (every answered frame, in order). The thread's CPU time of each frame: median and p90,
   with and without the rules (zones only: what results carry), so the rules' own cost is
   the difference.
2. **Delivery**: ``--events`` events emitted into the node's hub
   (:class:`~edge_vision.events.hub.EventHub`) as fast as the loop takes them, delivered to
   a real HTTP receiver on loopback (the webhook sink, signed), once with the outbox in
   memory and once on disk (``events.outbox_dir``, SQLite). Reported: events a second from
   the first emit to the last one taken, and the loop's CPU time an ``emit`` (what a frame
   that raises an event pays).

Prints one table; ``--json`` writes every figure. docs/events.md, "Cost", quotes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from edge_vision.config import EventsConfig, StateConfig
from edge_vision.events.hub import EventHub
from edge_vision.events.session_rules import SessionRules
from edge_vision.events.sinks import build_sinks

W, H = 1280, 720
TEN_RULES: list[dict[str, Any]] = [
    {"name": "a1", "on": "appear"},
    {"name": "a2", "on": "appear", "zone": "check"},
    {"name": "l1", "on": "leave"},
    {"name": "l2", "on": "leave", "zone": "check"},
    {"name": "c1", "on": "cross", "line": "gate"},
    {"name": "c2", "on": "cross", "line": "gate", "direction": "forward"},
    {"name": "d1", "on": "dwell", "seconds": 2},
    {"name": "d2", "on": "dwell", "seconds": 5, "zone": "check"},
    {"name": "e1", "on": "every", "interval_s": 1},
    {"name": "e2", "on": "every", "interval_s": 0.5, "min_score": 0.5},
]
GEOMETRY: dict[str, Any] = {
    "zones": {"check": [[0.1, 0.1], [0.9, 0.1], [0.9, 0.9], [0.1, 0.9]]},
    "lines": {"gate": [[0, 0.5], [1, 0.5]]},
}


def clip(labels: int, frames: int, seed: int) -> list[np.ndarray]:
    """``labels`` 120×30 boxes in a row, moving down 2 px a frame with ±1 px jitter."""
    rng = np.random.default_rng(seed)
    out = []
    for f in range(frames):
        rows = []
        for i in range(labels):
            x = 40 + (i * 1180 / max(labels, 1)) % 1160
            y = 100 + 2 * f + rng.normal(0, 1)
            rows.append([x, y, x + 120, y + 30, 0.6 + 0.3 * rng.random(), 0])
        out.append(np.array(rows, np.float32).reshape(-1, 6))
    return out


def rules_cost(labels: int, frames: int, with_rules: bool, seed: int) -> list[float]:
    cfg = EventsConfig.model_validate({**GEOMETRY, "rules": TEN_RULES if with_rules else []})
    rules = SessionRules.build(cfg, None, lambda c: "text")
    ids = list(range(1, labels + 1))
    costs = []
    for f, dets in enumerate(clip(labels, frames, seed)):
        t0 = time.thread_time_ns()
        rules.observe(dets, ids, None, W, H, f / 15, f, f * 66.7)
        costs.append((time.thread_time_ns() - t0) / 1e6)
    return costs


async def delivery(n: int, outbox_dir: Path | None) -> dict[str, float]:
    """``n`` events through a hub to a real webhook receiver on loopback."""
    taken = 0
    done = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        nonlocal taken
        await request.read()
        taken += 1
        if taken >= n:
            done.set()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = int(runner.addresses[0][1])
    cfg = EventsConfig.model_validate(
        {
            "outbox_dir": str(outbox_dir) if outbox_dir else None,
            "sinks": {"webhook": {"url": f"http://127.0.0.1:{port}/hook", "secret": "bench"}},
        }
    )
    hub = EventHub(cfg, build_sinks(cfg, StateConfig(), "bench"))
    await hub.start()
    try:
        body = {"rule": "r", "on": "appear", "at": time.time(), "track": 1, "text": "LOT 42"}
        start = time.perf_counter()
        cpu = time.thread_time()
        for i in range(n):
            hub.emit({**body, "event_id": f"{i:032x}"}, source="node")
            if i % 64 == 63:
                await asyncio.sleep(0)  # let the delivery run, as frames would
        emit_cpu = time.thread_time() - cpu
        await asyncio.wait_for(done.wait(), 120)
        elapsed = time.perf_counter() - start
    finally:
        await hub.close()
        await runner.cleanup()
    return {"events_per_s": n / elapsed, "emit_us": emit_cpu / n * 1e6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=300, help="frames a clip (default 300)")
    p.add_argument("--labels", type=int, nargs="+", default=[1, 5, 20], help="labels a frame")
    p.add_argument("--events", type=int, default=2000, help="events to deliver (default 2000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, medians over them")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args(argv)
    report: dict[str, Any] = {"rules": [], "delivery": []}
    print(f"{'labels':>6} {'rules':>5} {'median ms':>10} {'p90 ms':>8}")
    for labels in args.labels:
        for with_rules in (False, True):
            costs: list[float] = []
            for r in range(args.rounds):
                costs += rules_cost(labels, args.frames, with_rules, seed=r)
            row = {
                "labels": labels,
                "rules": 10 if with_rules else 0,
                "median_ms": float(np.median(costs)),
                "p90_ms": float(np.percentile(costs, 90)),
            }
            report["rules"].append(row)
            print(f"{labels:>6} {row['rules']:>5} {row['median_ms']:>10.4f} {row['p90_ms']:>8.4f}")
    print(f"{'outbox':>6} {'events/s':>10} {'emit µs':>8}")
    for where in ("memory", "disk"):
        runs = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp) if where == "disk" else None
                runs.append(asyncio.run(delivery(args.events, folder)))
        row = {
            "outbox": where,
            "events": args.events,
            "events_per_s": float(np.median([r["events_per_s"] for r in runs])),
            "emit_us": float(np.median([r["emit_us"] for r in runs])),
        }
        report["delivery"].append(row)
        print(f"{where:>6} {row['events_per_s']:>10.0f} {row['emit_us']:>8.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
