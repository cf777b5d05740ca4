"""``engine.kind: auto``: the choice as a pure function of what the machine has, every
branch. TensorRT and Jetson cannot exist on this machine, so their branches run on
described machines (``mocked`` in the name); the probe itself runs on this machine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from edge_vision.config import load_config
from edge_vision.engines import choice
from edge_vision.engines.choice import (
    Machine,
    choose_engine,
    engine_choice_of,
    probe_machine,
    resolve_engine,
)
from edge_vision.errors import ConfigError

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


# -- what the choice derives ---------------------------------------------------------------


def test_auto_is_the_default_and_resolves_to_onnx_runtime_on_a_cpu_box() -> None:
    config = load_config(environ={})
    assert config.engine.kind == "auto"
    resolved = resolve_engine(config, CPU_BOX)
    assert resolved.engine.kind == "onnxruntime"
    # The CPU's own defaults stay: no batching, host decode, one worker.
    assert (resolved.engine.max_batch, resolved.engine.in_flight) == (1, 1)
    assert resolved.decode.device == "host" and resolved.server.workers == 1
    assert engine_choice_of(resolved)["derived"] == {"engine.kind": "onnxruntime"}


def test_on_a_gpu_everything_the_engine_implies_follows_it_mocked_gpu_machine() -> None:
    resolved = resolve_engine(
        load_config(environ={"XDG_CACHE_HOME": "/var/cache"}), replace(H100, cores=16, mps=True)
    )
    assert resolved.engine.kind == "torch"
    assert (resolved.engine.max_batch, resolved.engine.in_flight) == (16, 3)
    assert resolved.session.latest_in_flight == 2
    assert resolved.decode.device == "auto"
    assert resolved.server.workers == 12  # MPS: the workers share one GPU context
    choice = engine_choice_of(resolved)
    assert choice["kind"] == "torch" and choice["gpu"] is True
    assert choice["derived"]["server.workers"] == 12


def test_without_mps_fewer_workers_share_the_gpu_mocked_gpu_machine() -> None:
    resolved = resolve_engine(load_config(environ={}), replace(H100, cores=16, mps=False))
    assert resolved.server.workers == 4
    small = resolve_engine(load_config(environ={}), replace(H100, cores=2, mps=False))
    assert small.server.workers == 1


def test_the_compile_and_its_cache_follow_torch_where_triton_is_mocked_gpu_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with_triton = resolve_engine(load_config(environ={}), replace(H100, triton=True))
    assert with_triton.engine.torch.compile == "default"
    assert with_triton.engine.torch.compile_cache == tmp_path / "edge-vision" / "torch-compile"
    without = resolve_engine(load_config(environ={}), replace(H100, triton=False))
    assert without.engine.torch.compile == "off"


def test_what_the_user_set_is_kept_mocked_gpu_machine() -> None:
    config = load_config(
        environ={},
        cli={"engine": {"max_batch": 4}, "server": {"workers": 2}, "decode": {"device": "host"}},
    )
    resolved = resolve_engine(config, replace(H100, mps=True, cores=16))
    assert resolved.engine.kind == "torch"
    assert (resolved.engine.max_batch, resolved.server.workers) == (4, 2)
    assert resolved.decode.device == "host"
    assert resolved.engine.in_flight == 3  # not set by the user: derived
    derived = engine_choice_of(resolved)["derived"]
    assert "engine.max_batch" not in derived and "server.workers" not in derived


def test_an_explicit_kind_is_kept_as_it_is() -> None:
    config = load_config(environ={}, cli={"engine": {"kind": "onnxruntime"}})
    resolved = resolve_engine(config, H100)
    assert resolved is config
    assert engine_choice_of(resolved)["reason"] == "engine.kind set in the config"


def test_an_unknown_kind_names_auto_among_the_choices() -> None:
    with pytest.raises(ConfigError, match="known: auto, onnxruntime"):
        load_config(environ={}, cli={"engine": {"kind": "cuda"}})
