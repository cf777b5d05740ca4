"""How evenly a node's worker processes share cameras (``server.worker_balance``).

    python -m benchmarks.balance --workers 12 --cameras 64 --rounds 5 --json out.json

For each way of spreading connections (``reuse-port``: the kernel's SO_REUSEPORT hash;
``least-clients``: the node's main process hands each to the worker with the fewest), one
server with ``--workers`` processes is started; each round opens ``--cameras`` WebSockets at
once, reads which worker (``hello.node``) took each, and closes them. A worker with more
cameras than its share is what sets a node's tail (edge_vision/serve/balance.py). Needs no GPU:
the default engine serves, and no frame is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from edge_vision.tools.bench.servers import ONE_ADDRESS_SETS, Server, free_port, serve_argv

MODES = ("reuse-port", "least-clients")


async def _round(url: str, cameras: int) -> list[int]:
    """Cameras per worker (largest first) for ``cameras`` connections open at once."""
    async with aiohttp.ClientSession() as s:
        sockets = await asyncio.gather(*(s.ws_connect(url) for _ in range(cameras)))
        try:
            hellos = [await ws.receive_json(timeout=30) for ws in sockets]
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))
    per_worker = collections.Counter(h["node"] for h in hellos)
    return sorted(per_worker.values(), reverse=True)


def run_mode(mode: str, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    port = free_port()
    # Every camera comes from this one address: lift the per-address share (each worker
    # admits ceil(limit / workers) of it) as edge-vision bench does.
    sets = [f"server.workers={args.workers}", f"server.worker_balance={mode}", *ONE_ADDRESS_SETS]
    argv = [*serve_argv(port), *(a for s in sets for a in ("--set", s))]
    with Server(argv, port, logs / f"server-{mode}.log", ready_s=args.ready_s):
        rounds = []
        for _ in range(args.rounds):
            counts = asyncio.run(_round(f"ws://127.0.0.1:{port}/ws", args.cameras))
            counts += [0] * (args.workers - len(counts))  # workers that got none
            rounds.append(counts)
            print(f"{mode:14s} cameras a worker, most to fewest: {counts}", flush=True)
            time.sleep(args.pause_s)  # the workers' beats report them gone
    most = [r[0] for r in rounds]
    return {
        "mode": mode,
        "rounds": rounds,
        "most_on_one_worker": most,
        "most_median": statistics.median(most),
        "fewest_on_one_worker": [r[-1] for r in rounds],
        "fair_share": args.cameras / args.workers,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--cameras", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pause-s", type=float, default=2.5)
    ap.add_argument("--ready-s", type=float, default=300.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "workers": args.workers,
            "cameras": args.cameras,
            "modes": [run_mode(m, args, Path(tmp)) for m in MODES],
        }
    for m in results["modes"]:
        print(
            f"{m['mode']:14s} most cameras on one worker: {m['most_on_one_worker']} "
            f"(fair share {m['fair_share']:.1f})"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
