"""Bomb flood: what image bombs cost a legitimate camera and the node's memory (issue 36).

    python -m benchmarks.bomb_flood                       # the default runs
    python -m benchmarks.bomb_flood --bomb png --duration 40

Runs against a fresh ``edge-vision serve`` process each (default config: the bombs are
under every header limit, so they are answered, not refused):

1. ``alone``: one legitimate camera (``--fps``, default 4, 1280x720 JPEG, latest mode),
   long enough for at least ``--samples`` answered frames;
2. ``bombs``: the same camera beside ``--bombers`` (8) connections in ``every`` mode, each
   keeping ``--window`` bombs in flight: ``jpeg``, a 6300x6300 progressive JPEG of about
   0.5 MB whose decode holds about 227 MiB of DCT coefficients in libjpeg (4:4:4), or
   ``png``, a 4600x4600 PNG of zeros (62 KB, 61 MiB of pixels).

Reported (printed, and as JSON in ``--out``): the camera's p50/p95/p99 and its answered
count per run, the ratio of its p95 beside the bombs to alone, the bombs answered and
refused (by error code) and their server-side ``decode_ms`` (which counts the wait for a
decode turn), the lone bomb's, the server's
resident memory (idle, peak, peak minus idle, sampled every 50 ms from /proc) and the
memory budget's own peak (``edge_vision_memory_peak_bytes``). The issue's targets: the
camera's p95 within 2 x its own alone plus one bomb's decode time; peak RSS minus idle
within the budget plus 2 x ``server.max_message_bytes`` x connections.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from edge_vision.session.receive import encode_binary_frame
from edge_vision.tools.bench.load import rss_mib
from edge_vision.tools.bench.servers import Server, free_port, machine, serve_argv
from edge_vision.tools.bench.stats import summary

from .soak import png_of_zeros

MiB = 1024 * 1024


def progressive_jpeg_bomb(side: int = 6300) -> bytes:
    """A ``side``² progressive JPEG, 4:4:4, smooth enough to be about 0.5 MB: libjpeg holds
    every coefficient of a progressive image (2 bytes a sample) while it decodes."""
    from PIL import Image

    ramp = np.linspace(0, 255, side, dtype=np.float32)
    rgb = np.empty((side, side, 3), np.uint8)
    rgb[..., 0] = ramp[None, :]
    rgb[..., 1] = ramp[:, None]
    rgb[..., 2] = 128
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "JPEG", quality=30, progressive=True, subsampling=0)
    return out.getvalue()


class Sampler(threading.Thread):
    """The server's resident memory every ``period_s`` while it runs."""

    def __init__(self, pid: int, period_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.period_s = pid, period_s
        self.peak = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_mib(self.pid) or 0.0)
            self._done.wait(self.period_s)

    def stop(self) -> float:
        self._done.set()
        self.join()
        return self.peak


async def _bomber(url: str, bomb: bytes, window: int, until: float, out: dict[str, Any]) -> None:
    """One connection in every mode keeping ``window`` bombs in flight until ``until``."""
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url + "?mode=every", max_msg_size=0)
        await ws.receive()  # hello
        sent = 0
        outstanding = 0
        while True:
            while outstanding < window and time.time() < until:
                await ws.send_bytes(encode_binary_frame(sent, time.time(), bomb))
                sent += 1
                outstanding += 1
            if outstanding == 0:
                break
            msg = await ws.receive(timeout=120)
            if msg.type is not aiohttp.WSMsgType.TEXT:
                break
            reply = orjson.loads(msg.data)
            if reply.get("type") == "result":
                outstanding -= 1
                out["answered"] += 1
                out["decode_ms"].append(reply["timing"]["decode_ms"])
                out["timing"].append(reply["timing"])
            elif reply.get("type") == "error":
                outstanding -= 1
                out["refused"][reply["code"]] = out["refused"].get(reply["code"], 0) + 1
        out["sent"] += sent
        await ws.close()


async def _one_bomb(url: str, bomb: bytes) -> float:
    """The server's decode time of one bomb on the otherwise idle node (its result's
    ``decode_ms``): "one bomb's decode time" of the target."""
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url, max_msg_size=0)
        await ws.receive()  # hello
        await ws.send_bytes(encode_binary_frame(0, 0.0, bomb))
        reply = orjson.loads((await ws.receive(timeout=120)).data)
        await ws.close()
    if reply.get("type") != "result":
        raise RuntimeError(f"the lone bomb was not answered: {reply}")
    return float(reply["timing"]["decode_ms"])


def _bombs(url: str, bomb: bytes, n: int, window: int, until: float, out: dict[str, Any]) -> None:
    async def all_of_them() -> None:
        await asyncio.gather(*(_bomber(url, bomb, window, until, out) for _ in range(n)))

    asyncio.run(all_of_them())


#: The server's per-stage timings of a result (pipeline.py ``_timing``).
_STAGES = ("decode_ms", "shape_ms", "queue_ms", "batch_wait_ms", "infer_ms", "post_ms", "server_ms")


def loadavg() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (a shared machine's other load)."""
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def _metric(url: str, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return float("nan")


def _run(
    name: str, args: argparse.Namespace, jpegs: list[bytes], bomb: bytes | None, out: Path
) -> dict[str, Any]:
    from edge_vision.tools.bench.load import CameraPlan, run_cameras

    port = free_port()
    argv = serve_argv(port)
    for s in args.set:
        argv += ["--set", s]
    url = f"ws://127.0.0.1:{port}/ws"
    http_url = f"http://127.0.0.1:{port}"
    load_before = loadavg()
    with Server(argv, port, out / f"server-{name}.log") as server:
        assert server.proc is not None
        time.sleep(2.0)  # settled after warm-up
        idle = rss_mib(server.proc.pid) or 0.0
        sampler = Sampler(server.proc.pid)
        sampler.start()
        duration = max(args.duration, args.samples / args.fps)
        start_at = time.time() + 3.0
        bombs: dict[str, Any] = {
            "sent": 0,
            "answered": 0,
            "refused": {},
            "decode_ms": [],
            "timing": [],
        }
        bomber = None
        lone_decode_ms = float("nan")
        if bomb is not None:
            lone_decode_ms = asyncio.run(_one_bomb(url, bomb))
            until = start_at + duration
            bomber = threading.Thread(
                target=_bombs, args=(url, bomb, args.bombers, args.window, until, bombs)
            )
            bomber.start()
        plan = CameraPlan(0, url, jpegs, args.fps, duration, "binary", "latest", start_at)
        [camera] = run_cameras([plan])
        if bomber is not None:
            bomber.join()
        peak = sampler.stop()
        budget_peak = _metric(http_url, "edge_vision_memory_peak_bytes") / MiB
        budget = _metric(http_url, "edge_vision_memory_budget_bytes") / MiB
    return {
        "name": name,
        "camera": {
            "sent": camera.sent,
            "answered": camera.answered,
            "dropped": camera.dropped,
            "errors": camera.errors,
            "latency_ms": summary(camera.latencies_ms),
            "decode_ms": summary([t["decode_ms"] for t in camera.server_timing]),
            # Where its time went on the server (each answered frame's own timing).
            "stages_ms": {
                k: summary([t[k] for t in camera.server_timing if k in t]) for k in _STAGES
            },
        },
        "bombs": {
            "connections": args.bombers if bomb is not None else 0,
            "sent": bombs["sent"],
            "answered": bombs["answered"],
            "refused": bombs["refused"],
            "decode_ms": summary(bombs["decode_ms"]),
            "stages_ms": {k: summary([t[k] for t in bombs["timing"] if k in t]) for k in _STAGES},
            "lone_decode_ms": lone_decode_ms,
        },
        "rss_mib": {"idle": idle, "peak": peak, "peak_minus_idle": peak - idle},
        "budget_mib": budget,
        "budget_peak_mib": budget_peak,
        "loadavg": {"before": load_before, "after": loadavg()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bomb_flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--bomb", choices=["jpeg", "png"], default="jpeg", help="which bomb")
    ap.add_argument("--bombers", type=int, default=8, help="bomb-sending connections")
    ap.add_argument("--window", type=int, default=4, help="bombs in flight per connection")
    ap.add_argument("--fps", type=float, default=4.0, help="the camera's frame rate")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per run (at least)")
    ap.add_argument("--samples", type=int, default=100, help="camera frames per run, at least")
    ap.add_argument("--resolution", default="1280x720", help="the camera's frame size WxH")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="server config")
    ap.add_argument("--out", type=Path, help="output folder (default bench-results/bomb-<time>)")
    args = ap.parse_args(argv)

    from edge_vision.tools.bench.frames import encode_jpegs, generated_frames

    width, height = (int(v) for v in args.resolution.lower().split("x"))
    jpegs = encode_jpegs(generated_frames(width, height, 30), 80)
    bomb = progressive_jpeg_bomb() if args.bomb == "jpeg" else png_of_zeros(4600)
    out = args.out or Path("bench-results") / time.strftime("bomb-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    runs = [_run("alone", args, jpegs, None, out), _run("bombs", args, jpegs, bomb, out)]
    alone, flood = runs
    alone_p95 = alone["camera"]["latency_ms"]["p95"]
    bomb_decode = flood["bombs"]["lone_decode_ms"]
    max_msg = 8 * MiB
    for s in args.set:
        if s.startswith("server.max_message_bytes="):
            max_msg = int(s.split("=", 1)[1])
    connections = 1 + args.bombers
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "argv": sys.argv,
        "bomb": {"kind": args.bomb, "bytes": len(bomb)},
        "runs": runs,
        "p95_ratio": flood["camera"]["latency_ms"]["p95"] / alone_p95,
        "p95_target_ms": 2 * alone_p95 + bomb_decode,
        "rss_target_mib": flood["budget_mib"] + 2 * max_msg * connections / MiB,
    }
    print(f"\nbomb: {args.bomb}, {len(bomb)} bytes, {args.bombers} connections")
    print(
        f"{'run':<8} {'cam p50':>8} {'p95':>7} {'p99':>7} {'answered':>8} {'bombs ok':>8} "
        f"{'refused':>8} {'bomb decode_ms p50':>18} {'RSS +peak MiB':>13} {'budget peak':>11}"
    )
    for r in runs:
        lat, b = r["camera"]["latency_ms"], r["bombs"]
        print(
            f"{r['name']:<8} {lat['p50']:>8.0f} {lat['p95']:>7.0f} {lat['p99']:>7.0f} "
            f"{r['camera']['answered']:>8} {b['answered']:>8} {sum(b['refused'].values()):>8} "
            f"{b['decode_ms']['p50']:>18.0f} {r['rss_mib']['peak_minus_idle']:>13.0f} "
            f"{r['budget_peak_mib']:>11.0f}"
        )
    print(
        f"camera p95 beside bombs {flood['camera']['latency_ms']['p95']:.0f} ms, target "
        f"{report['p95_target_ms']:.0f} ms (2 x {alone_p95:.0f} + one bomb {bomb_decode:.0f}); "
        f"RSS +{flood['rss_mib']['peak_minus_idle']:.0f} MiB, target "
        f"{report['rss_target_mib']:.0f} MiB"
    )
    print("server stage p50 / p95 ms (camera | bombs):")
    for r in runs:
        cam, bmb = r["camera"]["stages_ms"], r["bombs"]["stages_ms"]
        line = "  ".join(
            f"{k[:-3]} {cam[k]['p50']:.0f}/{cam[k]['p95']:.0f}"
            + (f"|{bmb[k]['p50']:.0f}/{bmb[k]['p95']:.0f}" if bmb[k].get("n") else "")
            for k in _STAGES
        )
        print(f"  {r['name']:<6} {line}")
    print(f"load average before/after each run: {[r['loadavg'] for r in runs]}")
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
