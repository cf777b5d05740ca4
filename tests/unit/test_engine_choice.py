"""``engine.kind: auto``: the choice as a pure function of what the machine has, every
branch. TensorRT and Jetson cannot exist on this machine, so their branches run on
described machines (``mocked`` in the name); the probe itself runs on this machine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from edge_vision.engines import choice
from edge_vision.engines.choice import Machine, choose_engine, probe_machine

CPU_BOX = Machine(gpu=None, jetson=False, tensorrt=False, torch_cuda=None, cuda_binding=False)
H100 = Machine(
    gpu="NVIDIA H100 80GB HBM3", jetson=False, tensorrt=False, torch_cuda="13.0", cuda_binding=True
)
ORIN = Machine(
    gpu="NVIDIA Jetson AGX Orin Developer Kit",
    jetson=True,
    tensorrt=True,
    torch_cuda="12.6",
    cuda_binding=True,
)


def test_a_machine_without_a_gpu_runs_onnx_runtime_on_the_cpu() -> None:
    got = choose_engine(CPU_BOX)
    assert (got.kind, got.gpu) == ("onnxruntime", False)
    assert "no NVIDIA GPU" in got.reason


def test_a_cuda_build_of_torch_without_a_gpu_still_runs_on_the_cpu() -> None:
    got = choose_engine(replace(CPU_BOX, torch_cuda="13.0"))
    assert got.kind == "onnxruntime" and "no NVIDIA GPU" in got.reason


def test_a_gpu_with_cuda_torch_and_no_tensorrt_runs_the_torch_engine() -> None:
    got = choose_engine(H100)
    assert (got.kind, got.gpu) == ("torch", True)
    assert "NVIDIA H100" in got.reason and "CUDA 13.0" in got.reason


def test_a_gpu_without_a_gpu_library_says_what_to_install() -> None:
    got = choose_engine(replace(H100, torch_cuda=None, cuda_binding=False))
    assert (got.kind, got.gpu) == ("onnxruntime", False)
    assert "edge-vision[gpu]" in got.reason


def test_tensorrt_wins_on_a_gpu_where_it_imports_mocked_machine() -> None:
    got = choose_engine(replace(H100, tensorrt=True))
    assert (got.kind, got.gpu) == ("tensorrt", True)


def test_tensorrt_without_a_cuda_binding_falls_to_torch_and_says_why_mocked_machine() -> None:
    got = choose_engine(replace(H100, tensorrt=True, cuda_binding=False))
    assert got.kind == "torch" and "cuda-python" in got.reason


def test_a_jetson_with_jetpack_runs_tensorrt_mocked_jetson() -> None:
    got = choose_engine(ORIN)
    assert (got.kind, got.gpu) == ("tensorrt", True)
    assert "Orin" in got.reason


def test_a_jetson_without_tensorrt_or_torch_points_to_jetpack_mocked_jetson() -> None:
    got = choose_engine(replace(ORIN, tensorrt=False, torch_cuda=None))
    assert got.kind == "onnxruntime" and "JetPack" in got.reason


def test_this_machine_is_probed_as_it_is() -> None:
    """The CI and development machines have no NVIDIA GPU; the probe must say so, and it
    must not import torch (a CUDA context before the workers fork would break them)."""
    import sys

    had_torch = "torch" in sys.modules
    m = probe_machine()
    if not any(Path(n).exists() for n in choice.GPU_NODES):
        assert m.gpu is None
        assert choose_engine(m).kind == "onnxruntime"
    assert ("torch" in sys.modules) == had_torch


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cuda: Optional[str] = '13.0'\n", "13.0"),
        ("cuda = '12.6'\n", "12.6"),
        ("cuda: Optional[str] = None\n", None),
    ],
)
def test_torch_s_cuda_build_is_read_from_its_version_file_mocked_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str | None
) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "version.py").write_text("__version__ = '2.11.0'\n" + text)

    class Spec:
        origin = str(tmp_path / "__init__.py")

    monkeypatch.setattr(choice.importlib.util, "find_spec", lambda name: Spec())
    assert choice._torch_cuda() == expected
