"""Simulated cameras: separate processes that send real JPEG frames at a fixed rate and time
each result at the client (send → result), as a camera client sees it.

Cameras run in processes of their own (``multiprocessing`` spawn) so the load generator
never steals the server's event loop: one camera a process by default, or several
(``cameras_per_process``: one event loop drives them all), so 64+ cameras do not need 64+
processes beside the server. A camera sends frame ``i`` at ``t0 + i / fps`` whether or
not earlier frames were answered (a camera does not wait), matches results to frames by
``id``, and reports every latency plus the server's per-stage timings.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..aio import cancel_and_wait, with_timeout


@dataclass
class CameraPlan:
    index: int
    url: str
    jpegs: list[bytes]
    fps: float
    duration_s: float
    wire: str = "binary"  # or "json"
    mode: str = "latest"  # or "every"
    start_at: float = 0.0  # time.time() at which to start (all cameras start together)
    drain_s: float = 10.0  # after the last send, wait this long for outstanding results


@dataclass
class CameraResult:
    index: int
    sent: int = 0
    answered: int = 0
    errors: int = 0
    dropped: int = 0  # as reported by the server (cumulative) in the last result
    unanswered: int = 0
    duplicates: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    sent_at_s: list[float] = field(default_factory=list)  # per answered frame, from start
    server_timing: list[dict[str, float]] = field(default_factory=list)
    connect_error: str | None = None
    #: The server stopped reading: a send was still blocked when the run and its drain
    #: time were over (a synchronous server busy with its backlog does this).
    send_stalled: bool = False


async def run_camera(plan: CameraPlan, progress: Any) -> CameraResult:
    """One simulated camera, start to end, in this process's loop."""
    import base64

    import aiohttp
    import orjson

    from ..receive import encode_binary_frame, encode_json_frame

    res = CameraResult(plan.index)
    sent_at: dict[int, float] = {}
    seen: set[int] = set()
    sep = "&" if "?" in plan.url else "?"
    url = f"{plan.url}{sep}mode={plan.mode}"
    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(url, max_msg_size=0, heartbeat=None)
        except (aiohttp.ClientError, OSError) as e:
            res.connect_error = str(e)
            return res
        first = await ws.receive(timeout=30)
        if first.type is not aiohttp.WSMsgType.TEXT:
            res.connect_error = f"no hello: {first.type}"
            return res
        b64 = [base64.b64encode(j).decode() for j in plan.jpegs] if plan.wire == "json" else []
        delay = plan.start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()
        done_sending = asyncio.Event()

        async def sender() -> None:
            n = int(plan.duration_s * plan.fps) if plan.fps > 0 else 0
            i = 0
            while (i < n) if plan.fps > 0 else (time.perf_counter() - t0 < plan.duration_s):
                if plan.fps > 0:
                    target = t0 + i / plan.fps
                    wait = target - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                k = i % len(plan.jpegs)
                now = time.perf_counter()
                sent_at[i] = now
                if plan.wire == "json":
                    await ws.send_str(encode_json_frame(i, now, b64[k]))
                else:
                    await ws.send_bytes(encode_binary_frame(i, now, plan.jpegs[k]))
                res.sent += 1
                i += 1
            done_sending.set()

        async def receiver() -> None:
            while True:
                msg = await ws.receive()
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    return
                now = time.perf_counter()
                obj = orjson.loads(msg.data)
                kind = obj.get("type")
                if kind == "result":
                    fid = int(obj["id"])
                    if fid in seen:
                        res.duplicates += 1
                        continue
                    seen.add(fid)
                    res.answered += 1
                    res.dropped = int(obj.get("dropped", 0))
                    res.latencies_ms.append((now - sent_at[fid]) * 1000.0)
                    res.sent_at_s.append(sent_at[fid] - t0)
                    res.server_timing.append(obj.get("timing", {}))
                    if progress is not None:
                        with progress.get_lock():
                            progress.value += 1
                elif kind == "error":
                    res.errors += 1
                    if "id" in obj:
                        seen.add(int(obj["id"]))
                if done_sending.is_set() and len(seen) + res.dropped >= res.sent:
                    return

        recv_task = asyncio.create_task(receiver())
        send_task = asyncio.create_task(sender())
        try:
            await with_timeout(asyncio.shield(send_task), plan.duration_s + plan.drain_s)
        except TimeoutError:  # frames not written by then are not counted as sent
            await cancel_and_wait(send_task)
            res.send_stalled = True
            done_sending.set()
        try:
            await with_timeout(asyncio.shield(recv_task), plan.drain_s)
        except TimeoutError:
            await cancel_and_wait(recv_task)
        try:
            await with_timeout(ws.close(), 5.0)
        except TimeoutError:
            pass
    res.unanswered = max(0, res.sent - res.answered - res.errors - res.dropped)
    return res


def _camera_process(plans: list[CameraPlan], out: Any, progress: Any) -> None:
    async def drive(plan: CameraPlan) -> None:
        out.put(await run_camera(plan, progress))

    async def all_of_them() -> None:
        await asyncio.gather(*(drive(p) for p in plans))

    asyncio.run(all_of_them())


def run_cameras(
    plans: list[CameraPlan], on_tick: Any = None, cameras_per_process: int = 1
) -> list[CameraResult]:
    """Run the cameras, ``cameras_per_process`` to a process (one event loop each);
    ``on_tick(answered_so_far)`` about once a second."""
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    progress: Any = ctx.Value("l", 0)
    k = max(1, cameras_per_process)
    groups = [plans[i : i + k] for i in range(0, len(plans), k)]
    procs = [
        ctx.Process(target=_camera_process, args=(g, out, progress), daemon=True) for g in groups
    ]
    for p in procs:
        p.start()
    results: list[CameraResult] = []
    deadline = max(p.start_at for p in plans) + max(p.duration_s + p.drain_s for p in plans) + 60
    while len(results) < len(plans) and time.time() < deadline:
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and out.empty():
                break  # cameras died (their tracebacks went to stderr); report what came
        if on_tick is not None:
            on_tick(progress.value)
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return sorted(results, key=lambda r: r.index)


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process and its children (server workers), from /proc."""
    try:
        total = 0.0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024.0
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += rss_mib(int(child)) or 0.0
        return total
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) of a process and its descendants (server workers), live
    and already reaped, from /proc; None once it is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        # Fields after the ")" that closes the command name: state is the first (3rd of
        # proc(5)), so utime/stime/cutime/cstime (14th-17th) are 11..14 here.
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = sum(int(v) for v in rest[11:15]) / tick
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += cpu_seconds(int(child)) or 0.0
        return total
    except (OSError, IndexError, ValueError):
        return None


def children_cpu_seconds() -> float:
    """CPU time of this process's reaped children (the camera processes, once joined)."""
    t = os.times()
    return t.children_user + t.children_system
