"""Soak: N clients for M minutes, good and hostile traffic mixed, the server watched (issue 12).

    python -m benchmarks.soak --minutes 10 --cameras 6 --hostile 10
    python -m benchmarks.soak --minutes 1 --url ws://host:8080/ws --pid 1234

Starts ``edge-vision serve`` (or targets ``--url``; give ``--pid`` to watch its memory)
and runs, in this process:

* ``--cameras`` polite cameras: 640x360 JPEG frames at ``--fps`` (latest mode, binary),
  each frame's latency measured from send to result;
* ``--hostile`` clients cycling through hostile kinds, one message every
  ``--hostile-interval`` seconds each: bad JSON, bad base64, a truncated JPEG, invalid
  UTF-8 (1007), the PNG bomb (decoded within the memory budget; decoded_too_large with
  ``--set server.max_decoded_bytes=67108864``), 8 MiB frames (the memory budget),
  a message over the size limit (1009), reconnect churn, and a client that never reads
  its replies (closed after ``server.send_timeout_s``). A closed client reconnects.

Every ``--interval`` seconds, and every 5 s for ``--settle`` seconds after the clients
stop (does memory come back?), it records the server's resident memory, open descriptors
and threads (from /proc), its event-loop tasks, connections and frame counters (from
/metrics), and the cameras' latency in that interval. Printed as a table, written as
JSON (``--out``, default bench-results/soak-<time>.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp

from edge_vision.session.receive import encode_binary_frame, encode_json_frame
from edge_vision.tools.bench.servers import Server, free_port, machine, serve_argv
from edge_vision.tools.bench.stats import summary

HOSTILE_KINDS = (
    "bad_json",
    "bad_base64",
    "truncated_jpeg",
    "invalid_utf8",
    "png_bomb",
    "big_frames",
    "oversized",
    "churn",
    "no_reader",
)


def png_of_zeros(side: int) -> bytes:
    """An RGB PNG of ``side``² black pixels, compressed row by row: 116 KB for 6,320², which
    would decode to 120 MB (the image bomb of issue 12; tests/integration/test_memory_budget.py
    uses it)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    z = zlib.compressobj(9)
    row = b"\x00" * (1 + side * 3)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def padded_jpeg(jpeg: bytes, target: int) -> bytes:
    """``jpeg`` made ``target`` bytes long with comment segments (JPEG COM, ITU T.81
    B.2.4.5): a maximal message that costs its bytes, not a long decode."""
    pad, left = [], target - len(jpeg)
    while left > 4:
        n = min(65533, left - 4)
        pad.append(b"\xff\xfe" + struct.pack(">H", n + 2) + b"\x00" * n)
        left -= n + 4
    return jpeg[:2] + b"".join(pad) + jpeg[2:]


class Soak:
    def __init__(self, args: argparse.Namespace, url: str, jpegs: list[bytes]) -> None:
        self.args, self.url, self.jpegs = args, url, jpegs
        self.until = time.monotonic() + args.minutes * 60
        self.latencies: list[float] = []  # cameras' latencies since the last sample, ms
        self.answered = 0
        self.camera_errors: dict[str, int] = {}
        self.kinds = args.kinds.split(",") if args.kinds else list(HOSTILE_KINDS)
        unknown = set(self.kinds) - set(HOSTILE_KINDS)
        if unknown:
            raise SystemExit(f"unknown hostile kinds {sorted(unknown)}; known: {HOSTILE_KINDS}")
        self.hostile_sent: dict[str, int] = dict.fromkeys(self.kinds, 0)
        self.replies: dict[str, int] = {}  # error codes and close codes hostile clients got
        self.connect_failures = 0
        self.bomb = png_of_zeros(6320)
        self.big = padded_jpeg(jpegs[0], 8 * 1024 * 1024 - 4096)

    def _count(self, key: str) -> None:
        self.replies[key] = self.replies.get(key, 0) + 1

    async def camera(self, http: aiohttp.ClientSession, index: int) -> None:
        period = 1.0 / self.args.fps
        while time.monotonic() < self.until:
            try:
                async with http.ws_connect(self.url + "?mode=latest", max_msg_size=0) as ws:
                    await ws.receive(timeout=30)  # hello
                    sent_at: dict[int, float] = {}
                    reader = asyncio.create_task(self._camera_replies(ws, sent_at))
                    n = 0
                    try:
                        while time.monotonic() < self.until and not reader.done():
                            sent_at[n] = time.perf_counter()
                            frame = self.jpegs[(index + n) % len(self.jpegs)]
                            await ws.send_bytes(encode_binary_frame(n, None, frame))
                            n += 1
                            await asyncio.sleep(period)
                    finally:
                        reader.cancel()
            except (aiohttp.ClientError, OSError, TimeoutError):
                self.connect_failures += 1
                await asyncio.sleep(1.0)

    async def _camera_replies(
        self, ws: aiohttp.ClientWebSocketResponse, sent_at: dict[int, float]
    ) -> None:
        async for msg in ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                continue
            obj = json.loads(msg.data)
            if obj.get("type") == "result":
                t0 = sent_at.pop(obj["id"], None)
                for old in [k for k in sent_at if k < obj["id"]]:  # dropped ones
                    del sent_at[old]
                if t0 is not None:
                    self.latencies.append((time.perf_counter() - t0) * 1000.0)
                self.answered += 1
            elif obj.get("type") == "error":
                code = str(obj.get("code"))
                self.camera_errors[code] = self.camera_errors.get(code, 0) + 1

    async def hostile(self, http: aiohttp.ClientSession, index: int) -> None:
        n = index
        while time.monotonic() < self.until:
            kind = self.kinds[n % len(self.kinds)]
            n += 1
            try:
                await self._one_hostile(http, kind)
            except (aiohttp.ClientError, OSError, TimeoutError, ConnectionError):
                self._count("connection_lost")
            self.hostile_sent[kind] += 1
            await asyncio.sleep(self.args.hostile_interval)

    async def _one_hostile(self, http: aiohttp.ClientSession, kind: str) -> None:
        async with http.ws_connect(self.url, max_msg_size=0) as ws:
            await ws.receive(timeout=30)  # hello
            if kind == "churn":
                return  # connect, read hello, go
            if kind == "no_reader":
                # Writes frames and never reads: the server closes it after send_timeout_s
                # (or this client gives up after 3 s and goes).
                for i in range(30):
                    await ws.send_bytes(encode_binary_frame(i, None, self.jpegs[0]))
                    await asyncio.sleep(0.1)
                return
            if kind == "bad_json":
                await ws.send_str('{"type": "frame", "id": 1, ')
            elif kind == "bad_base64":
                await ws.send_str(encode_json_frame(1, None, "!!!not base64!!!"))
            elif kind == "truncated_jpeg":
                await ws.send_bytes(encode_binary_frame(1, None, self.jpegs[0][:200]))
            elif kind == "invalid_utf8":
                await ws.send_frame(b'{"type":"ping","payload":"\xc3\x28"}', aiohttp.WSMsgType.TEXT)
            elif kind == "png_bomb":
                await ws.send_bytes(encode_binary_frame(1, None, self.bomb))
            elif kind == "big_frames":
                for i in range(3):
                    await ws.send_bytes(encode_binary_frame(i, None, self.big))
            elif kind == "oversized":
                await ws.send_bytes(b"\x00" * (self.args.max_message_bytes + 1024))
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                msg = await ws.receive(timeout=deadline - time.monotonic())
                if msg.type is aiohttp.WSMsgType.TEXT:
                    obj = json.loads(msg.data)
                    if obj.get("type") == "error":
                        self._count(str(obj.get("code")))
                        if kind != "big_frames":
                            return
                    elif obj.get("type") == "result" and kind == "big_frames":
                        self._count("result")
                elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                    self._count(f"close_{ws.close_code}")
                    return
                elif msg.type is aiohttp.WSMsgType.ERROR:
                    self._count("protocol_error")
                    return


def _proc(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key.lower() + "_mib"] = int(value.split()[0]) / 1024.0
        elif key == "Threads":
            out["threads"] = int(value)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def _scrape(text: str) -> dict[str, float]:
    want = {
        "edge_vision_connections": "connections",
        "edge_vision_event_loop_tasks": "tasks",
        "edge_vision_frames_received_total": "received",
        "edge_vision_frames_answered_total": "answered",
        "edge_vision_frames_dropped_total": "dropped",
        "edge_vision_memory_peak_bytes": "budget_peak_bytes",
    }
    out: dict[str, float] = {"rejected": 0.0}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in want:
            out[want[name]] = float(value)
        elif name.startswith("edge_vision_frames_rejected_total{"):
            out["rejected"] += float(value)
        elif name.startswith('edge_vision_memory_held_bytes{kind="'):
            out["held_" + name.split('"')[1] + "_bytes"] = float(value)
    return out


async def _watch(
    soak: Soak, http: aiohttp.ClientSession, base: str, pid: int | None
) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    while True:
        sample: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1)}
        if pid is not None:
            sample.update(await asyncio.to_thread(_proc, pid))
        try:
            async with http.get(base + "/metrics") as r:
                sample.update(_scrape(await r.text()))
        except aiohttp.ClientError as e:
            sample["metrics_error"] = str(e)
        lat, soak.latencies = soak.latencies, []
        sample["camera_answered_total"] = soak.answered
        sample["camera_latency_ms"] = summary(lat) if lat else None
        samples.append(sample)
        now = time.monotonic()
        if now >= soak.until + soak.args.settle:
            return samples
        # After the clients stop: a sample every 5 s while the server settles.
        await asyncio.sleep(soak.args.interval if now < soak.until else 5.0)


async def _run(
    args: argparse.Namespace, url: str, pid: int | None, jpegs: list[bytes]
) -> dict[str, Any]:
    soak = Soak(args, url, jpegs)
    base = url.replace("ws://", "http://").rsplit("/ws", 1)[0]
    async with aiohttp.ClientSession() as http:
        watcher = asyncio.create_task(_watch(soak, http, base, pid))
        clients = [soak.camera(http, i) for i in range(args.cameras)]
        clients += [soak.hostile(http, i) for i in range(args.hostile)]
        await asyncio.gather(*clients)
        samples = await watcher
    return {
        "samples": samples,
        "camera_errors": soak.camera_errors,
        "hostile_sent": soak.hostile_sent,
        "hostile_replies": soak.replies,
        "connect_failures": soak.connect_failures,
    }


def _table(samples: list[dict[str, Any]]) -> None:
    print(
        f"\n{'t s':>6} {'RSS MiB':>8} {'fds':>5} {'thr':>4} {'tasks':>6} {'conns':>5} "
        f"{'received':>9} {'answered':>9} {'dropped':>8} {'rejected':>9} "
        f"{'cam p50':>8} {'p95':>7} {'p99':>7}"
    )
    for s in samples:
        lat = s.get("camera_latency_ms") or {}
        print(
            f"{s['t_s']:>6.0f} {s.get('vmrss_mib', float('nan')):>8.0f} {s.get('fds', 0):>5} "
            f"{s.get('threads', 0):>4} {s.get('tasks', 0):>6.0f} {s.get('connections', 0):>5.0f} "
            f"{s.get('received', 0):>9.0f} {s.get('answered', 0):>9.0f} "
            f"{s.get('dropped', 0):>8.0f} {s.get('rejected', 0):>9.0f} "
            f"{lat.get('p50', float('nan')):>8.0f} {lat.get('p95', float('nan')):>7.0f} "
            f"{lat.get('p99', float('nan')):>7.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--cameras", type=int, default=6, help="polite cameras")
    ap.add_argument("--fps", type=float, default=2.0, help="each camera's frame rate")
    ap.add_argument("--hostile", type=int, default=10, help="hostile clients")
    ap.add_argument("--hostile-interval", type=float, default=1.0, help="s between attacks")
    ap.add_argument(
        "--kinds", help=f"hostile kinds, comma-separated (default all: {','.join(HOSTILE_KINDS)})"
    )
    ap.add_argument("--interval", type=float, default=15.0, help="s between samples")
    ap.add_argument(
        "--settle", type=float, default=20.0, help="s of samples after the clients stop"
    )
    ap.add_argument("--url", help="a running server's /ws instead of starting one")
    ap.add_argument("--pid", type=int, help="with --url: the server's pid, to watch its memory")
    ap.add_argument("--max-message-bytes", type=int, default=8 * 1024 * 1024)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="server config")
    ap.add_argument("--out", type=Path, help="JSON report (default bench-results/soak-<time>.json)")
    args = ap.parse_args(argv)

    from edge_vision.tools.bench.frames import encode_jpegs, generated_frames

    jpegs = encode_jpegs(generated_frames(640, 360, 20), 80)
    out = args.out or Path("bench-results") / time.strftime("soak-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "argv": sys.argv,
    }
    if args.url:
        result = asyncio.run(_run(args, args.url, args.pid, jpegs))
    else:
        port = free_port()
        argv_ = serve_argv(port)
        for s in [f"server.max_message_bytes={args.max_message_bytes}", *args.set]:
            argv_ += ["--set", s]
        log_path = out.with_suffix(".server.log")
        with Server(argv_, port, log_path) as srv:
            assert srv.proc is not None
            result = asyncio.run(_run(args, f"ws://127.0.0.1:{port}/ws", srv.proc.pid, jpegs))
        log = log_path.read_text(errors="replace")
        result["server_log"] = {
            "lines": log.count("\n"),
            "tracebacks": log.count("Traceback"),
            "errors": sum(1 for line in log.splitlines() if " ERROR " in line),
        }
    report.update(result)
    _table(report["samples"])
    print(f"\nhostile sent: {report['hostile_sent']}\nreplies: {report['hostile_replies']}")
    print(f"camera errors: {report['camera_errors']}; server log: {report.get('server_log')}")
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
