"""``engine.kind: auto``: which engine this machine should run, and why.

:func:`choose_engine` is a pure function of what the machine has (:class:`Machine`), so
every branch is tested with literal inputs; :func:`probe_machine` reads the machine without
importing torch or TensorRT and without touching CUDA (a server that forks its workers
after the probe must not have made a CUDA context first): device nodes and ``nvidia-smi``
for the GPU, the installed packages' own metadata for what they were built for.

The order: TensorRT where it imports and there is an NVIDIA GPU (a Jetson's iGPU counts);
else the torch engine on a CUDA GPU; else ONNX Runtime on the CPU, the embedded default.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

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


def probe_machine() -> Machine:
    """This machine, read without importing torch or TensorRT or touching CUDA."""
    return Machine(
        gpu=_gpu_name(),
        jetson=JETSON_RELEASE.exists(),
        tensorrt=_installed("tensorrt"),
        torch_cuda=_torch_cuda(),
        cuda_binding=_installed("cuda.bindings") or _installed("cuda") or _installed("pycuda"),
    )
