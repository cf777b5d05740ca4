"""Flood bench: what one flooding connection costs a polite camera (issue 12).

    python -m benchmarks.flood --duration 20                  # the default run
    python -m benchmarks.flood --flooders 2 --set engine.onnxruntime.threads=2

Runs of ``--duration`` seconds, each against a fresh ``edge-vision serve`` process:

1. ``solo``: one polite camera (``--fps``, default 2, latest mode), alone;
2. ``flood``: the same camera while ``--flooders`` connections send frames as fast as
   they can write them (latest mode), the read budget at its configured value
   (``session.max_messages_per_s``);
3. ``flood, no budget``: the same flood with the budget off (``max_messages_per_s=0``),
   the behaviour before the budget, for comparison.

Runs 1 and 2 alternate, in rounds, until the polite camera has at least ``--samples``
answered frames on each side (issue 36: a p95 of ~24 samples says little), so drift in a
shared machine's other load falls on both sides; the p95s are of every round's samples
pooled, each round's own ratio beside them, and the machine's load average before and
after every run. Run 3 runs once, at the end.

Every client is its own process (bench/load.py). Printed and written to ``--out``
(``results.json``): the polite camera's p50/p95/p99 per run, the ratio of its p95 under
flood to its p95 alone (the issue's target: within 1.5x), how many engine turns its
frames waited in the engine's queue (the server's ``batch_wait_ms`` over ``infer_ms``: on a
shared machine the ratio of latencies moves with the other load, this much less), and for
the flooders the messages they wrote per second and the frames the server read, answered
and dropped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from edge_vision.tools.bench.servers import Server, free_port, serve_argv

from .bomb_flood import loadavg


def _run(
    name: str,
    extra_set: list[str],
    args: argparse.Namespace,
    jpegs: list[bytes],
    flooders: int,
    out: Path,
) -> dict[str, Any]:
    from edge_vision.tools.bench.load import CameraPlan, run_cameras
    from edge_vision.tools.bench.stats import summary

    port = free_port()
    argv = serve_argv(port)
    for s in [*args.set, *extra_set]:
        argv += ["--set", s]
    url = f"ws://127.0.0.1:{port}/ws"
    load_before = loadavg()
    with Server(argv, port, out / f"server-{name.replace(' ', '-').replace(',', '')}.log"):
        start_at = time.time() + 3.0
        polite = CameraPlan(0, url, jpegs, args.fps, args.duration, "binary", "latest", start_at)
        # A flooder is a camera with no frame rate: it writes as fast as the socket takes.
        plans = [polite] + [
            CameraPlan(1 + i, url, jpegs, 0.0, args.duration, "binary", "latest", start_at)
            for i in range(flooders)
        ]
        results = run_cameras(plans)
    by_index = {r.index: r for r in results}
    p = by_index.get(0)
    if p is None:
        raise RuntimeError(f"{name}: the polite camera did not report; see {out}")
    floods = [r for r in results if r.index > 0]
    return {
        "name": name,
        "loadavg": {"before": load_before, "after": loadavg()},
        "latencies_ms": p.latencies_ms,
        "polite": {
            "sent": p.sent,
            "answered": p.answered,
            "dropped": p.dropped,
            "errors": p.errors,
            "latency_ms": summary(p.latencies_ms),
            # The server's own timing of each answered frame: how long it waited in the
            # engine's queue, in engine turns (its batch_wait / its batch's infer time),
            # which the machine's other load scales out.
            "batch_wait_ms": summary([t["batch_wait_ms"] for t in p.server_timing]),
            "infer_ms": summary([t["infer_ms"] for t in p.server_timing]),
            "engine_turns_waited": summary(
                [t["batch_wait_ms"] / t["infer_ms"] for t in p.server_timing if t["infer_ms"] > 0]
            ),
        },
        "flooders": [
            {
                "written_per_s": r.sent / args.duration,
                "server_read": r.answered + r.dropped + r.errors,
                "server_read_per_s": (r.answered + r.dropped + r.errors) / args.duration,
                "answered": r.answered,
                "dropped": r.dropped,
                "errors": r.errors,
                "send_stalled": r.send_stalled,
            }
            for r in floods
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per run")
    ap.add_argument("--fps", type=float, default=2.0, help="the polite camera's frame rate")
    ap.add_argument("--flooders", type=int, default=1, help="flooding connections")
    ap.add_argument("--resolution", default="1280x720", help="frame size WxH")
    ap.add_argument("--frames", type=int, default=30, help="distinct frames to cycle through")
    ap.add_argument("--no-budget-run", action="store_true", help="skip run 3")
    ap.add_argument("--samples", type=int, default=100, help="answered frames a side, at least")
    ap.add_argument("--rounds", type=int, default=1, help="solo/flood rounds, at least")
    ap.add_argument("--max-rounds", type=int, default=8, help="rounds at most")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="server config")
    ap.add_argument("--out", type=Path, help="output folder (default bench-results/flood-<time>)")
    args = ap.parse_args(argv)

    from edge_vision.tools.bench.frames import encode_jpegs, generated_frames
    from edge_vision.tools.bench.servers import machine

    width, height = (int(v) for v in args.resolution.lower().split("x"))
    jpegs = encode_jpegs(generated_frames(width, height, args.frames), 80)
    out = args.out or Path("bench-results") / time.strftime("flood-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    from edge_vision.tools.bench.stats import summary

    rounds: list[list[dict[str, Any]]] = []
    pooled: dict[str, list[float]] = {"solo": [], "flood": []}
    while len(rounds) < args.max_rounds and (
        len(rounds) < args.rounds or min(len(v) for v in pooled.values()) < args.samples
    ):
        n = len(rounds) + 1
        order = [("solo", 0), ("flood", args.flooders)]
        if n % 2 == 0:  # every other round starts with the flood: drift cancels
            order.reverse()
        done = {kind: _run(f"{kind} {n}", [], args, jpegs, k, out) for kind, k in order}
        pair = [done["solo"], done["flood"]]
        rounds.append(pair)
        for r in pair:
            pooled[r["name"].split()[0]] += r.pop("latencies_ms")
        print(
            f"round {n}: solo p95 {pair[0]['polite']['latency_ms']['p95']:.0f} ms "
            f"({pair[0]['polite']['answered']}), flood p95 "
            f"{pair[1]['polite']['latency_ms']['p95']:.0f} ms ({pair[1]['polite']['answered']}), "
            f"load {pair[0]['loadavg']['before']} -> {pair[1]['loadavg']['after']}",
            flush=True,
        )
    runs = [r for pair in rounds for r in pair]
    if not args.no_budget_run:
        nb = _run("flood, no budget", ["session.max_messages_per_s=0"], args, jpegs, 1, out)
        nb.pop("latencies_ms")
        runs.append(nb)
    solo = summary(pooled["solo"])
    flood = summary(pooled["flood"])
    by_round = [
        pair[1]["polite"]["latency_ms"]["p95"] / pair[0]["polite"]["latency_ms"]["p95"]
        for pair in rounds
    ]
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "argv": sys.argv,
        "runs": runs,
        "pooled": {"solo": solo, "flood": flood},
        "p95_ratio": flood["p95"] / solo["p95"],
        "p95_ratio_by_round": by_round,
        "loadavg": [r["loadavg"] for r in runs],
    }
    solo_p95 = solo["p95"]
    print(
        f"\n{'run':<18} {'polite p50':>10} {'p95':>7} {'p99':>7} {'x solo p95':>10} "
        f"{'answered':>8} {'flood wrote/s':>13} {'server read/s':>13} {'flood dropped':>13} "
        f"{'turns waited p50/p95':>20} {'load before':>11}"
    )
    for r in runs:
        lat = r["polite"]["latency_ms"]
        wrote = sum(f["written_per_s"] for f in r["flooders"])
        read = sum(f["server_read_per_s"] for f in r["flooders"])
        dropped = sum(f["dropped"] for f in r["flooders"])
        turns = r["polite"]["engine_turns_waited"]
        print(
            f"{r['name']:<18} {lat['p50']:>10.0f} {lat['p95']:>7.0f} {lat['p99']:>7.0f} "
            f"{lat['p95'] / solo_p95:>10.2f} {r['polite']['answered']:>8} {wrote:>13.0f} "
            f"{read:>13.0f} {dropped:>13} {turns['p50']:>10.2f} {turns['p95']:>9.2f} "
            f"{r['loadavg']['before'][0] if r['loadavg']['before'] else float('nan'):>11.2f}"
        )
    print(
        f"pooled: solo p95 {solo['p95']:.0f} ms on {solo['n']:.0f} frames, beside the flood "
        f"{flood['p95']:.0f} ms on {flood['n']:.0f}: ratio {report['p95_ratio']:.2f} "
        f"(by round {[round(x, 2) for x in by_round]})"
    )
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
