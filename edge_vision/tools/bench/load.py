"""Simulated cameras: separate processes that send real JPEG frames at a fixed rate and time
each result at the client (send → result), as a camera client sees it.

Cameras run in processes of their own (``multiprocessing`` spawn) so the load generator
never steals the server's event loop: one camera a process by default, or several
(``cameras_per_process``: one event loop drives them all), so 64+ cameras do not need 64+
processes beside the server. A camera sends frame ``i`` at ``t0 + i / fps`` whether or
not earlier frames were answered (a camera does not wait); the product's client
(edge_vision.client) matches results to frames by ``id`` and keeps the books (answered,
dropped by latest-wins, rejected), and each camera reports every latency plus the
server's per-stage timings.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ...common.aio import cancel_and_wait, with_timeout
from ...common.threads import role_of


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
    errors: int = 0  # rejected: answered with an error
    dropped: int = 0  # a later frame was answered first (latest-wins; the server's count)
    unanswered: int = 0  # sent, never answered or dropped (lost, or still in flight)
    duplicates: int = 0  # results for no frame waiting
    latencies_ms: list[float] = field(default_factory=list)
    sent_at_s: list[float] = field(default_factory=list)  # per answered frame, from start
    server_timing: list[dict[str, float]] = field(default_factory=list)
    #: ``event`` messages the camera's socket carried, by rule (protocol 3; the server's
    #: node rules, benchmarks/events_load.py): whether each rule fired in the run.
    events_by_rule: dict[str, int] = field(default_factory=dict)
    connect_error: str | None = None
    #: The server stopped reading: a send was still blocked when the run and its drain
    #: time were over (a synchronous server busy with its backlog does this).
    send_stalled: bool = False


async def run_camera(plan: CameraPlan, progress: Any) -> CameraResult:
    """One simulated camera, start to end, in this process's loop, through the product's
    client (edge_vision.client): its books say what became of each frame."""
    import aiohttp

    # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
    from ...client import EdgeVisionClient, Result
    from ...errors import ConnectFailed, ConnectionClosed

    res = CameraResult(plan.index)
    wire: Any = plan.wire
    mode: Any = plan.mode
    futures: list[asyncio.Future[Result]] = []
    # Its own aiohttp session, closed here: a server that stopped reading cannot hold it.
    async with aiohttp.ClientSession() as session:
        # No retries and no resume: a camera that cannot connect, or loses its server,
        # is reported as such, not hidden in a later run.
        def heard(event: Any) -> None:
            res.events_by_rule[event.rule] = res.events_by_rule.get(event.rule, 0) + 1

        client = EdgeVisionClient(
            plan.url,
            mode=mode,
            wire=wire,
            retry_s=0.0,
            resume=False,
            session=session,
            on_event=heard,
        )
        try:
            await client.connect()
        except (ConnectFailed, ConnectionClosed) as e:
            res.connect_error = str(e)
            return res
        delay = plan.start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()

        def answered(sent_at: float, future: asyncio.Future[Result]) -> None:
            if future.cancelled() or future.exception() is not None:
                return  # dropped, rejected or lost: the client's books count it
            result = future.result()
            res.latencies_ms.append((result.received_at - sent_at) * 1000.0)
            res.sent_at_s.append(sent_at - t0)
            res.server_timing.append(dict(result.timing))
            if progress is not None:
                with progress.get_lock():
                    progress.value += 1

        async def sender() -> None:
            n = int(plan.duration_s * plan.fps) if plan.fps > 0 else 0
            i = 0
            while (i < n) if plan.fps > 0 else (time.perf_counter() - t0 < plan.duration_s):
                if plan.fps > 0:
                    target = t0 + i / plan.fps
                    wait = target - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                now = time.perf_counter()
                try:
                    future = await client.send(plan.jpegs[i % len(plan.jpegs)], frame_id=i, ts=now)
                except ConnectionClosed:
                    return  # the server went away; what was sent is in the books
                future.add_done_callback(partial(answered, now))
                futures.append(future)
                res.sent += 1
                i += 1

        send_task = asyncio.create_task(sender())
        try:
            await with_timeout(asyncio.shield(send_task), plan.duration_s + plan.drain_s)
        except TimeoutError:  # frames not written by then are not counted as sent
            await cancel_and_wait(send_task)
            res.send_stalled = True
        if futures:
            await asyncio.wait(futures, timeout=plan.drain_s)
        try:
            await with_timeout(client.close(), 5.0)
        except TimeoutError:
            pass
    books = client.books
    res.answered, res.errors, res.dropped = books.answered, books.rejected, books.dropped
    res.duplicates = books.unmatched
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


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """CPU time (user + system) of every thread of a process and its descendants, by
    thread id: ``(role, seconds)``. The role is the thread's OS name less its number
    (edge_vision/common/threads.py); a process's main thread, its event loop, is ``loop``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            comm, rest = (task / "stat").read_text().rsplit(")", 1)
            tid = int(task.name)
            role = "loop" if tid == pid else role_of(comm.split("(", 1)[1])
            out[tid] = (role, sum(int(v) for v in rest.split()[11:13]) / tick)
            for child in (task / "children").read_text().split():
                out.update(thread_cpu_seconds(int(child)))
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return out


def cpu_by_role(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each role used between two :func:`thread_cpu_seconds` readings, most
    first (threads that ended in between are not counted)."""
    roles: dict[str, float] = {}
    for tid, (role, cpu) in after.items():
        roles[role] = roles.get(role, 0.0) + cpu - before.get(tid, (role, 0.0))[1]
    return dict(sorted(roles.items(), key=lambda kv: -kv[1]))


def host_cpu_ticks() -> dict[str, int]:
    """The whole machine's CPU time so far, in clock ticks, by kind (``/proc/stat``'s
    first line: user, nice, system, idle, iowait, irq, softirq, steal); empty off Linux."""
    kinds = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return {}
    return {k: int(v) for k, v in zip(kinds, fields, strict=False)}


def host_cpu_share(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """The share of the machine's CPU time each kind took between two
    :func:`host_cpu_ticks` readings (``busy``: all but idle and iowait), and its cores."""
    spent = {k: after[k] - before.get(k, 0) for k in after}
    total = sum(spent.values())
    if total <= 0:
        return {}
    share = {k: v / total for k, v in spent.items()}
    share["busy"] = 1.0 - share.get("idle", 0.0) - share.get("iowait", 0.0)
    share["cores"] = float(os.cpu_count() or 0)
    return share


def children_cpu_seconds() -> float:
    """CPU time of this process's reaped children (the camera processes, once joined)."""
    t = os.times()
    return t.children_user + t.children_system
