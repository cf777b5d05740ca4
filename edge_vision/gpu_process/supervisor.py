"""The node's main process side: one GPU process a GPU, started, watched and restarted.

:class:`GpuProcessSupervisor` makes a private folder for the node's sockets (mode 0700),
spawns one GPU process a GPU (:func:`~.process.gpu_process_main`, its ``CUDA_VISIBLE_DEVICES``
narrowed to its GPU; the CPU stand-in where there is none), and watches each from a
thread of its own: a GPU process that exits, or whose event loop wrote no heartbeat for
:data:`HANG_AFTER_S` once it had been ready (:data:`START_TIMEOUT_S` before: a compile
may take minutes), is killed (SIGKILL) and started again at once, then after a growing
pause if it keeps failing (:func:`restart_delay`). The workers see the loss as the end of
their connection, answer what they had in flight, and reconnect by themselves
(:mod:`.link`). A worker that dies only closes its connection: the GPU process goes on
serving the others.

:func:`judge` and :func:`restart_delay` decide without I/O
(tests/unit/test_gpu_process_supervisor.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config import Config
from .process import gpu_process_main
from .ring import safe_name, sweep_stale

log = logging.getLogger(__name__)

#: A GPU process that was ready and wrote no heartbeat for this long is hung.
HANG_AFTER_S = 10.0
#: A GPU process that has not become ready this long after its start is hung.
START_TIMEOUT_S = 600.0
#: A GPU process ready this long counts as healthy again: its next restart is immediate.
HEALTHY_AFTER_S = 30.0
WATCH_EVERY_S = 0.1

Verdict = Literal["ok", "dead", "hung"]


def judge(
    alive: bool,
    since_beat_s: float | None,
    since_start_s: float,
    been_ready: bool,
    *,
    hang_after_s: float = HANG_AFTER_S,
    start_timeout_s: float = START_TIMEOUT_S,
) -> Verdict:
    """Whether a GPU process is fine, dead or hung, from whether its process runs, the age
    of its last heartbeat (None: none yet) and of its start, and whether it was ever
    ready."""
    if not alive:
        return "dead"
    if been_ready:
        age = since_beat_s if since_beat_s is not None else since_start_s
        return "hung" if age > hang_after_s else "ok"
    return "hung" if since_start_s > start_timeout_s else "ok"


def restart_delay(failures: int) -> float:
    """Seconds to wait before restart number ``failures`` in a row (1 = the first): none
    for the first, then 0.5, 1, 2 ... up to 10 s, so a GPU process that cannot start does
    not spin."""
    return 0.0 if failures <= 1 else min(10.0, 0.5 * 2 ** (failures - 2))


@dataclass(slots=True)
class _Child:
    index: int
    path: str
    process: Any = None  # multiprocessing.Process
    beat: Any = None  # RawArray('d', 3): last heartbeat (monotonic), ready, pid
    started: float = 0.0
    been_ready: bool = False
    ready_since: float | None = None
    failures: int = 0
    restarts: int = 0
    last_end: str | None = None
    events: list[str] = field(default_factory=list)


class GpuProcessSupervisor:
    """Starts and keeps the node's GPU processes (module docstring)."""

    def __init__(
        self,
        config: Config,
        node: str,
        *,
        count: int = 1,
        stand_in: bool,
        hang_after_s: float = HANG_AFTER_S,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.config_json = config.model_dump_json()
        self.node = node
        self.stand_in = stand_in
        self.hang_after_s = hang_after_s
        self.start_timeout_s = start_timeout_s
        swept = sweep_stale(node)
        if swept:
            log.info("removed %d hand-off segment name(s) a killed node left", len(swept))
        # A short path: a Unix socket's path is at most 107 bytes.
        self.folder = Path(tempfile.mkdtemp(prefix=f"ev-{safe_name(node)[:24]}-"))
        self.children = [_Child(i, str(self.folder / f"gpu{i}.sock")) for i in range(count)]
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._visible = os.environ.get("CUDA_VISIBLE_DEVICES")

    @property
    def paths(self) -> list[str]:
        return [c.path for c in self.children]

    def _visible_for(self, index: int) -> str | None:
        if len(self.children) == 1 or self.stand_in:
            return None  # one GPU process sees what the node sees
        if self._visible:
            ids = [v.strip() for v in self._visible.split(",") if v.strip()]
            return ids[index] if index < len(ids) else str(index)
        return str(index)

    def _spawn(self, child: _Child) -> None:
        beat = self._ctx.RawArray("d", 3)
        process = self._ctx.Process(
            target=gpu_process_main,
            args=(self.config_json, child.path, beat),
            kwargs={
                "stand_in": self.stand_in,
                "gpu": child.index,
                "visible": self._visible_for(child.index),
            },
            name=f"gpu{child.index}",
        )
        process.start()
        child.process, child.beat = process, beat
        child.started = time.monotonic()
        child.been_ready = False
        child.ready_since = None
        what = "CPU stand-in" if self.stand_in else f"GPU {child.index}"
        log.info("GPU process gpu%d started (%s, pid %s)", child.index, what, process.pid)

    def start(self) -> None:
        for child in self.children:
            self._spawn(child)
        self._thread = threading.Thread(target=self._watch, name="gpu-supervisor", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            for child in self.children:
                with self._lock:
                    if not self._stop.is_set():
                        self._check(child, time.monotonic())

    def _check(self, child: _Child, now: float) -> None:
        process, beat = child.process, child.beat
        last = beat[0] if beat is not None and beat[0] > 0 else None
        if beat is not None and beat[1] >= 1 and not child.been_ready:
            child.been_ready, child.ready_since = True, now
        if child.ready_since is not None and now - child.ready_since > HEALTHY_AFTER_S:
            child.failures = 0
        verdict = judge(
            process is not None and process.is_alive(),
            None if last is None else now - last,
            now - child.started,
            child.been_ready,
            hang_after_s=self.hang_after_s,
            start_timeout_s=self.start_timeout_s,
        )
        if verdict == "ok":
            return
        if verdict == "hung":
            age = now - (last if last is not None else child.started)
            log.error(
                "GPU process gpu%d (pid %s) sent no heartbeat for %.1f s: killing it",
                child.index,
                process.pid,
                age,
            )
            process.kill()
            process.join(5)
            child.last_end = f"hung ({age:.0f} s without a heartbeat), killed"
        else:
            code = process.exitcode
            child.last_end = f"killed by signal {-code}" if code and code < 0 else f"exit {code}"
            log.error(
                "GPU process gpu%d (pid %s) died: %s", child.index, process.pid, child.last_end
            )
        child.failures += 1
        child.restarts += 1
        delay = restart_delay(child.failures)
        if delay and self._stop.wait(delay):
            return
        log.info("restarting GPU process gpu%d (restart %d)", child.index, child.restarts)
        self._spawn(child)

    def describe(self) -> list[dict[str, Any]]:
        """Each GPU process as the main process sees it (for logs and tests)."""
        out = []
        for c in self.children:
            p = c.process
            out.append(
                {
                    "gpu": c.index,
                    "pid": p.pid if p is not None else None,
                    "alive": bool(p is not None and p.is_alive()),
                    "ready": bool(c.beat is not None and c.beat[1] >= 1),
                    "restarts": c.restarts,
                    "last_end": c.last_end,
                }
            )
        return out

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching, ask each GPU process to stop (SIGTERM: it finishes once its
        workers are gone), kill what is left after ``timeout``, remove the socket folder."""
        self._stop.set()
        with self._lock:  # no restart in progress from here on
            procs = [c.process for c in self.children if c.process is not None]
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("GPU process %s did not stop in %.0f s; killing it", p.pid, timeout)
                p.kill()
                p.join(5)
        if self._thread is not None:
            self._thread.join(2)
        shutil.rmtree(self.folder, ignore_errors=True)
