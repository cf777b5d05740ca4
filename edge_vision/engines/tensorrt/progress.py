"""Build progress: TensorRT ``IProgressMonitor`` callbacks as log lines.

:class:`LogBuildProgress` is plain code (tested on CPUs); :func:`progress_monitor` wraps
any :class:`BuildProgress` in a ``trt.IProgressMonitor`` (made by a function: its base
class exists only once ``tensorrt`` is imported).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Protocol

from ...common import systemd

log = logging.getLogger(__name__)


class BuildProgress(Protocol):
    """Receives TensorRT ``IProgressMonitor`` callbacks (from TensorRT's build threads)."""

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None: ...

    def step_complete(self, phase: str, step: int) -> bool:
        """False asks TensorRT to stop the build."""
        ...

    def phase_finish(self, phase: str) -> None: ...


class LogBuildProgress:
    """Build progress as log lines, for plans built by ``serve``.

    Logs each top-level phase and, at most every ``interval_s``, where the innermost one is.
    Under systemd it extends the unit's start timeout while the build runs
    (``EXTEND_TIMEOUT_USEC``) and shows the phase in ``systemctl status`` (``STATUS=``), so
    a build after a JetPack upgrade is not killed as a hung start. ``cancel()`` makes
    TensorRT stop at its next step (the engine is closed during a build).
    """

    def __init__(self, interval_s: float = 5.0, notify: bool = True) -> None:
        self._interval = interval_s
        self._notify = notify
        self._lock = threading.Lock()
        self._phases: dict[str, tuple[str | None, int, int, float]] = {}
        self._last_log = 0.0
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def _emit(self, text: str) -> None:
        log.info("TensorRT build: %s", text)
        if self._notify:
            with contextlib.suppress(OSError):
                systemd.notify(
                    f"EXTEND_TIMEOUT_USEC=120000000\nSTATUS=building TensorRT plan: {text}"
                )

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        with self._lock:
            self._phases[phase] = (parent, 0, max(1, steps), time.monotonic())
            if parent is None:
                self._emit(f"{phase} ({steps} steps)")

    def step_complete(self, phase: str, step: int) -> bool:
        now = time.monotonic()
        with self._lock:
            if phase in self._phases:
                parent, _, steps, t0 = self._phases[phase]
                self._phases[phase] = (parent, step + 1, steps, t0)
            if now - self._last_log >= self._interval:
                self._last_log = now
                self._emit(self.describe())
        return not self._cancelled.is_set()

    def phase_finish(self, phase: str) -> None:
        with self._lock:
            entry = self._phases.pop(phase, None)
            if entry is not None and entry[0] is None:
                self._emit(f"{phase} done in {time.monotonic() - entry[3]:.1f} s")

    def describe(self) -> str:
        """``"Building engine 3/10 > Tactic timing 40/120"``: the open phases, outermost first."""
        return " > ".join(
            f"{name} {done}/{steps}" for name, (_, done, steps, _) in self._phases.items()
        )


def progress_monitor(trt: Any, sink: BuildProgress) -> Any:
    """A ``trt.IProgressMonitor`` forwarding to ``sink``. Exceptions never reach TensorRT
    (it calls from its own threads); Ctrl-C during a build cancels it, as NVIDIA's
    ``simple_progress_monitor`` sample does, and is re-raised after the build returns."""

    class _Monitor(trt.IProgressMonitor):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.interrupted = False

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            try:
                sink.phase_start(phase_name, parent_phase, num_steps)
            except KeyboardInterrupt:
                self.interrupted = True
            except Exception:  # progress display must not break a build
                log.exception("build progress display failed")

        def step_complete(self, phase_name: str, step: int) -> bool:
            try:
                return bool(sink.step_complete(phase_name, step)) and not self.interrupted
            except KeyboardInterrupt:
                self.interrupted = True
                return False
            except Exception:
                log.exception("build progress display failed")
                return not self.interrupted

        def phase_finish(self, phase_name: str) -> None:
            try:
                sink.phase_finish(phase_name)
            except KeyboardInterrupt:
                self.interrupted = True
            except Exception:
                log.exception("build progress display failed")

    return _Monitor()
