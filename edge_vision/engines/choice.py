"""``engine.kind: auto``: which engine this machine should run, and why.

:func:`choose_engine` is a pure function of what the machine has (:class:`Machine`), so
every branch is tested with literal inputs; :func:`probe_machine` reads the machine without
importing torch or TensorRT and without touching CUDA (a server that forks its workers
after the probe must not have made a CUDA context first): device nodes and ``nvidia-smi``
for the GPU, the installed packages' own metadata for what they were built for.

The order: TensorRT where it imports and there is an NVIDIA GPU (a Jetson's iGPU counts);
else the torch engine on a CUDA GPU; else ONNX Runtime on the CPU, the embedded default.

:func:`resolve_engine` turns a config whose ``engine.kind`` is ``auto`` into the one this
machine runs, and on a GPU derives what the engine implies (:data:`GPU_DEFAULTS`, the
worker layout, the compile and its cache) for every key the user did not set; the table
of derived values and their rules: docs/configuration.md, "What engine.kind: auto derives".
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Config

log = logging.getLogger(__name__)

#: Device nodes of an NVIDIA GPU: a discrete card's, and a Jetson's integrated GPU's.
GPU_NODES = ("/dev/nvidia0", "/dev/nvhost-ctrl-gpu", "/dev/nvgpu/igpu0/ctrl")
JETSON_RELEASE = Path("/etc/nv_tegra_release")


@dataclass(frozen=True, slots=True)
class Machine:
    """What the engine choice depends on."""

    gpu: str | None  # the NVIDIA GPU's name ("NVIDIA H100 80GB HBM3"), "" if unnamed
    jetson: bool  # an L4T (JetPack) system
    tensorrt: bool  # the tensorrt package is installed
    torch_cuda: str | None  # the CUDA version torch was built for; None: no torch or CPU-only
    cuda_binding: bool  # cuda-python or pycuda, which the TensorRT engine needs
    triton: bool = False  # OpenAI Triton, which torch.compile's GPU kernels need
    mps: bool = False  # an NVIDIA MPS control daemon this process's CUDA clients would join
    cores: int = 1


@dataclass(frozen=True, slots=True)
class EngineChoice:
    kind: str
    reason: str  # one line: why this engine on this machine
    gpu: bool  # the engine runs on a GPU: the GPU defaults follow it

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "reason": self.reason, "gpu": self.gpu}


def choose_engine(machine: Machine) -> EngineChoice:
    """The engine ``engine.kind: auto`` runs on ``machine``."""
    if machine.gpu is None:
        have = "torch built for CUDA" if machine.torch_cuda else "no CUDA GPU"
        why = "no NVIDIA GPU found" + ("" if not machine.torch_cuda else f" ({have})")
        return EngineChoice("onnxruntime", f"{why}: ONNX Runtime on the CPU", gpu=False)
    name = machine.gpu or ("Jetson GPU" if machine.jetson else "NVIDIA GPU")
    if machine.tensorrt and machine.cuda_binding:
        return EngineChoice("tensorrt", f"{name} and TensorRT: TensorRT", gpu=True)
    if machine.torch_cuda:
        missing = (
            "; TensorRT is installed but neither cuda-python nor pycuda is"
            if machine.tensorrt
            else ""
        )
        return EngineChoice(
            "torch",
            f"{name}, torch built for CUDA {machine.torch_cuda}, no TensorRT{missing}: "
            "the torch engine",
            gpu=True,
        )
    hint = "pip install 'edge-vision[gpu]'" if not machine.jetson else "JetPack's torch"
    return EngineChoice(
        "onnxruntime",
        f"{name} found, but neither TensorRT nor a CUDA build of torch is installed "
        f"(install {hint}): ONNX Runtime on the CPU",
        gpu=False,
    )


# -- reading the machine ----------------------------------------------------------------


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _gpu_name() -> str | None:
    """The first NVIDIA GPU's name; "" when a device node exists but nothing names it;
    None when there is no NVIDIA GPU."""
    if JETSON_RELEASE.exists() and any(Path(n).exists() for n in GPU_NODES[1:]):
        model = Path("/proc/device-tree/model")
        return model.read_text(errors="replace").strip("\x00\n ") if model.exists() else ""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            out = None
        if out is not None and out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    return "" if any(Path(n).exists() for n in GPU_NODES) else None


def _torch_cuda() -> str | None:
    """The CUDA version torch was built for, read from torch/version.py (no import)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    version_file = Path(spec.origin).with_name("version.py")
    try:
        text = version_file.read_text()
    except OSError:
        return None
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def mps_pipe_dir(env: Mapping[str, str]) -> Path | None:
    """The pipe directory of a running MPS control daemon (``CUDA_MPS_PIPE_DIRECTORY``, by
    default /tmp/nvidia-mps), when its ``control`` FIFO is there; CUDA clients started
    with the same environment join it. None: no MPS."""
    pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    try:
        return pipe if stat.S_ISFIFO((pipe / "control").stat().st_mode) else None
    except OSError:
        return None


def probe_machine(env: Mapping[str, str] | None = None) -> Machine:
    """This machine, read without importing torch or TensorRT or touching CUDA; read once a
    process for the process's own environment (it reads files and may run nvidia-smi:
    the entry points call it before their event loop starts)."""
    if env is None:
        return _this_machine()
    return _read_machine(env)


@functools.cache
def _this_machine() -> Machine:
    return _read_machine(os.environ)


def _read_machine(env: Mapping[str, str]) -> Machine:
    return Machine(
        gpu=_gpu_name(),
        jetson=JETSON_RELEASE.exists(),
        tensorrt=_installed("tensorrt"),
        torch_cuda=_torch_cuda(),
        cuda_binding=_installed("cuda.bindings") or _installed("cuda") or _installed("pycuda"),
        triton=_installed("triton"),
        mps=mps_pipe_dir(env) is not None,
        cores=os.cpu_count() or 1,
    )


# -- what the engine implies -------------------------------------------------------------

#: Set for a GPU engine wherever the user did not set them: the GPU batches across
#: cameras (the CPU engine gains nothing from batching), keeps three batches in flight
#: so copies overlap compute, holds at most two frames a camera (lower latency at the same
#: throughput), decodes JPEGs on the GPU when a device decoder is installed, and warms only
#: 16:9 frames at start (every batch size of a shape is a compile of its own: the four
#: default shapes made a node ready in 230 s even from a warm compile cache; another
#: shape compiles at its first frame).
GPU_DEFAULTS: dict[str, Any] = {
    "engine.max_batch": 16,
    "engine.in_flight": 3,
    "session.latest_in_flight": 2,
    "decode.device": "auto",
    "engine.warmup_shapes": [(720, 1280)],
}


def user_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where edge-vision keeps what it builds for this machine: ``$XDG_CACHE_HOME`` or
    ``~/.cache``, then ``edge-vision`` (the Jetson unit sets ``XDG_CACHE_HOME`` to
    /var/cache)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-vision"


def gpu_workers(machine: Machine) -> int:
    """Worker processes for a GPU engine: under MPS (one GPU context shared by every
    worker) as many as the hand-set recipe measured best, leaving cores for the load it
    serves; without MPS the workers' contexts take turns on the GPU, so fewer."""
    if machine.mps:
        return max(1, min(12, machine.cores - 4))
    return max(1, min(4, machine.cores // 4))


def _is_set(config: Config, dotted: str) -> bool:
    """Whether the user set ``dotted`` (in a file, the environment or a flag)."""
    node: Any = config
    *parents, leaf = dotted.split(".")
    for part in parents:
        if part not in node.model_fields_set:
            return False
        node = getattr(node, part)
    return leaf in node.model_fields_set


def _assign(config: Config, dotted: str, value: Any) -> None:
    node: Any = config
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = getattr(node, part)
    setattr(node, leaf, value)


def derived_values(
    config: Config, choice: EngineChoice, machine: Machine, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What ``choice`` implies on ``machine``, for the keys the user did not set."""
    wanted: dict[str, Any] = {"engine.kind": choice.kind}
    if choice.gpu:
        wanted.update(GPU_DEFAULTS)
        wanted["server.workers"] = gpu_workers(machine)
        if choice.kind == "torch" and machine.triton:
            wanted["engine.torch.compile"] = "default"
            wanted["engine.torch.compile_cache"] = user_cache_dir(env) / "torch-compile"
    return {k: v for k, v in wanted.items() if k == "engine.kind" or not _is_set(config, k)}


def resolve_engine(config: Config, machine: Machine | None = None) -> Config:
    """``config`` with ``engine.kind: auto`` made the engine this machine runs and, on a
    GPU, what that engine implies; a config with an explicit kind comes back as it is.
    How it was decided is kept for the start-up log (:func:`describe_choice`, said once the
    node's port is bound), ``/readyz`` and ``doctor`` (:func:`engine_choice_of`)."""
    if config.engine.kind != "auto":
        return config
    machine = probe_machine() if machine is None else machine
    choice = choose_engine(machine)
    resolved = config.model_copy(deep=True)
    derived = derived_values(config, choice, machine)
    for key, value in derived.items():
        _assign(resolved, key, value)
    shown = {k: str(v) if isinstance(v, Path) else v for k, v in derived.items()}
    resolved._engine_choice = {**choice.describe(), "derived": shown}
    return resolved


def describe_choice(config: Config) -> str:
    """One line: the engine and why, and what ``auto`` derived (the start-up log's)."""
    choice = engine_choice_of(config)
    derived = {k: v for k, v in (choice.get("derived") or {}).items() if k != "engine.kind"}
    head = "engine.kind auto" if config._engine_choice is not None else "engine.kind"
    tail = "; derived " + ", ".join(f"{k}={v}" for k, v in derived.items()) if derived else ""
    return f"{head}: {choice['kind']} ({choice['reason']}){tail}"


def engine_choice_of(config: Config) -> dict[str, Any]:
    """How this config's engine was chosen: by ``auto`` (its reason and derived values), or
    set by the user."""
    found = config._engine_choice
    if found is not None:
        return dict(found)
    return {"kind": config.engine.kind, "reason": "engine.kind set in the config", "gpu": None}
