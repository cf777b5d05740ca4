"""One process a GPU owns decode, the engine and post for every worker of the node
(``server.gpu_process``; docs/gpu.md, "One process owns the GPU").

The parts, in the order a frame meets them: :mod:`.handoff` (a worker's pipeline and
service: the session core's rules unchanged, the frame handed over still compressed),
:mod:`.ring` (the shared-memory ring a worker), :mod:`.wire` (the control messages),
:mod:`.link` (a worker's connection), :mod:`.process` (the GPU process: :mod:`.pending`, its
queue; :mod:`.decoders` and :mod:`.route`, decode where there is capacity), and
:mod:`.supervisor` (the node's main process starts and restarts it).

:func:`plan` resolves the setting on this machine once, where the node starts.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass

from ..config import Config
from ..engines.choice import Machine, probe_machine

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuProcessPlan:
    """What ``server.gpu_process`` means on this machine."""

    count: int  # GPU processes: one a GPU
    stand_in: bool  # no GPU: ONNX Runtime and host decode in the GPU process's shell
    reason: str


def gpu_count() -> int:
    """NVIDIA GPUs ``nvidia-smi -L`` lists (1 where it lists none: a Jetson's iGPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 1
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return 1
    listed = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return max(1, len(listed))


def decide(mode: str, engine_kind: str, machine: Machine, gpus: int) -> GpuProcessPlan | None:
    """``server.gpu_process`` (``mode``) for ``engine_kind`` on ``machine`` with ``gpus``
    GPUs: None when off; otherwise how many GPU processes, and whether the CPU stand-in.
    Pure: every branch is tested with literal machines."""
    on_gpu = engine_kind in ("torch", "tensorrt") and machine.gpu is not None
    if mode == "off" or (mode == "auto" and not on_gpu):
        return None
    if on_gpu:
        return GpuProcessPlan(gpus, False, f"{gpus} GPU(s): one GPU process each")
    if engine_kind == "triton":  # a remote engine: one process forms the node's batches
        return GpuProcessPlan(1, False, "engine triton: one process batches for the node")
    why = "no NVIDIA GPU" if machine.gpu is None else f"engine {engine_kind} runs on the CPU"
    return GpuProcessPlan(1, True, f"{why}: the CPU stand-in (ONNX Runtime, host decode)")


def plan(config: Config) -> GpuProcessPlan | None:
    """:func:`decide` on this machine (the probe reads it without touching CUDA)."""
    if config.server.gpu_process == "off":
        return None
    machine = probe_machine()
    gpus = gpu_count() if machine.gpu is not None else 0
    found = decide(config.server.gpu_process, config.engine.kind, machine, gpus)
    if found is not None:
        log.info("server.gpu_process %s: %s", config.server.gpu_process, found.reason)
    return found
