"""The GPU beside a bench run: the node's GPU memory and utilisation, from ``nvidia-smi``.

:class:`GpuSampler` asks ``nvidia-smi`` once a second while the cameras run, from a thread
of its own, and says what it saw: ``gpu_mem_mib`` (the most the node's GPUs held together
at once: every process on them, the GPU process's or each worker's contexts), the samples,
and ``gpu_util_pct`` (the mean utilisation over the run, averaged over the GPUs). On a
machine without ``nvidia-smi`` it says nothing, so a run's JSON has no such fields there.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Any

QUERY = ["--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"]


def parse_smi(text: str) -> tuple[float, float] | None:
    """``nvidia-smi``'s ``memory.used, utilization.gpu`` lines (one a GPU) as the node's
    total MiB and the GPUs' mean utilisation in percent; None when nothing parses."""
    mem: list[float] = []
    util: list[float] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            m, u = float(parts[0]), float(parts[1])
        except ValueError:  # "[N/A]" on a board that does not report it
            continue
        mem.append(m)
        util.append(u)
    return (sum(mem), sum(util) / len(util)) if mem else None


class GpuSampler:
    """Samples while a run goes on (module docstring)."""

    def __init__(self, every_s: float = 1.0, smi: str | None = None) -> None:
        self.smi = smi if smi is not None else shutil.which("nvidia-smi")
        self.every_s = every_s
        self.samples: list[tuple[float, float, float]] = []  # (seconds in, MiB, util %)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    @classmethod
    def start(cls, every_s: float = 1.0, smi: str | None = None) -> GpuSampler:
        sampler = cls(every_s, smi)
        if sampler.smi is not None:
            sampler._thread = threading.Thread(target=sampler._run, name="bench-gpu", daemon=True)
            sampler._thread.start()
        return sampler

    def sample(self) -> None:
        if self.smi is None:
            return
        try:
            out = subprocess.run(
                [self.smi, *QUERY], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return
        got = parse_smi(out.stdout) if out.returncode == 0 else None
        if got is not None:
            self.samples.append((round(time.monotonic() - self._t0, 2), *got))

    def _run(self) -> None:
        self.sample()
        while not self._stop.wait(self.every_s):
            self.sample()

    def stop(self) -> dict[str, Any]:
        """What the run's JSON gets: nothing without ``nvidia-smi`` or a sample."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
        if not self.samples:
            return {}
        return {
            "gpu_mem_mib": max(m for _, m, _ in self.samples),
            "gpu_util_pct": round(sum(u for _, _, u in self.samples) / len(self.samples), 1),
            "gpu_samples": [list(s) for s in self.samples],
        }
