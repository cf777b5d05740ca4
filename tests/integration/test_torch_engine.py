"""The torch engine's ONNX converter against ONNX Runtime, on the CPU (CI has no GPU).

The GPU path (pinned memory, streams, CUDA graphs) is proved in tests/gpu/ on a CUDA
machine; this checks the converter and the engine contract everywhere torch is installed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from edge_vision.common.messages import FrameMessage
from edge_vision.config import Config
from edge_vision.engines import create_engine
from edge_vision.frames.infer import InferenceService
from edge_vision.frames.pipeline import FramePipeline, FrameSettings
from edge_vision.model.spec import ModelSpec

from ..support.assertions import assert_same_boxes
from ..support.images import text_scene
from ..support.server import make_config

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed here (scripts/test installs a CPU build of torch only "
    "where one lies in /opt/wheels)",
)


#: Inductor compiles the engine's forward to C++ on the CPU (engine.torch.compile).
_CXX = shutil.which("g++") or shutil.which("c++")


def _cpu_config() -> Config:
    return make_config(
        {
            "engine": {
                "kind": "torch",
                "fallback": "none",
                "max_batch": 2,
                "warmup_shapes": [[384, 640]],
                "torch": {"device": "cpu", "fp16": False},
            }
        }
    )


async def test_converted_graph_matches_onnx_runtime_on_random_input(spec: ModelSpec) -> None:
    cfg = _cpu_config()
    ort_engine = create_engine("onnxruntime", spec, cfg)
    torch_engine = create_engine("torch", spec, cfg)
    await ort_engine.start()
    await torch_engine.start()
    try:
        rng = np.random.default_rng(3)
        frames = [rng.integers(0, 255, (384, 640, 3), dtype=np.uint8) for _ in range(2)]
        ref = (await ort_engine.infer(frames))[0]
        got = (await torch_engine.infer(frames))[0]
    finally:
        await ort_engine.close()
        await torch_engine.close()
    assert got.shape == ref.shape == (2, 1, 384, 640)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3


async def test_torch_engine_finds_the_same_text_as_onnx_runtime(spec: ModelSpec) -> None:
    scene = text_scene(1280, 720, texts=[("PART 77-A", (300, 260)), ("LOT 12", (700, 500))])
    msg = FrameMessage(1, 0.0, scene.jpeg(), False, 0.0)
    boxes = {}
    for kind in ("onnxruntime", "torch"):
        cfg = _cpu_config()
        cfg.engine.kind = kind  # type: ignore[assignment]
        service = InferenceService(spec, cfg)
        await service.start()
        pipeline = FramePipeline(cfg, service)
        try:
            res = await pipeline.process(msg, FrameSettings(0.5))
        finally:
            await pipeline.close()
            await service.close()
        boxes[kind] = [d[:4].tolist() for d in res.detections]
    assert len(boxes["torch"]) == 2
    assert_same_boxes(boxes["torch"], boxes["onnxruntime"], tol=1.0)


def test_the_flat_graph_runs_the_same_operators_as_the_interpreter(spec: ModelSpec) -> None:
    """engine.torch.compile's first step (engines/torch_compile.py): the interpreter traced
    once into a flat graph of torch operators, its host shape arithmetic folded away, gives
    exactly the interpreter's outputs."""
    from edge_vision.engines.onnx_torch import OnnxGraphModule
    from edge_vision.engines.torch_compile import flat_graph

    module = OnnxGraphModule(spec.path).eval()
    x = torch.rand(2, 3, 96, 160, generator=torch.Generator().manual_seed(1))
    graph = flat_graph(torch, module, x)
    ops = [n for n in graph.graph.nodes if n.op == "call_function"]
    assert len(ops) > 100  # the whole network, not a call back into the interpreter
    with torch.no_grad():
        for got, ref in zip(graph(x), module(x), strict=True):
            assert torch.equal(got, ref)


@pytest.mark.timeout(600)
# torch's inductor imports its own deprecated torch.jit.script_method (torch 2.13)
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
async def test_compiled_torch_engine_gives_the_interpreter_s_outputs(
    spec: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine.torch.compile default on torch's CPU build: the warm-up (prepare) compiles
    the engine's forward for each batch bucket of the warm-up shape (about a minute each
    on the 2-core machine; C++ on the CPU, Triton kernels on a GPU), frames of that shape
    run what was compiled, with the interpreter's outputs within float rounding, and a
    shape the warm-up did not compile runs the interpreter instead of compiling on a
    frame."""
    if _CXX is None:
        pytest.skip("no C++ compiler here: inductor compiles to C++ on the CPU")
    # Inductor's cache is process-wide (an environment variable): this test's own.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(5)
    frames = [rng.integers(0, 255, (96, 160, 3), dtype=np.uint8) for _ in range(2)]
    other = rng.integers(0, 255, (64, 128, 3), dtype=np.uint8)
    outputs = {}
    for mode in ("off", "default"):
        cfg = _cpu_config()
        cfg.engine.max_batch = 1  # one bucket, one compile
        cfg.engine.torch.compile = mode  # type: ignore[assignment]
        cfg.engine.torch.compile_cache = tmp_path / "cache"
        engine = create_engine("torch", spec, cfg)
        await engine.start()
        try:
            if mode == "default":
                # inductor's compile worker pool, which a GPU's Triton compiles start (its
                # C++ compiles on the CPU here run in this process): it must not outlive
                # the warm-up
                await asyncio.to_thread(_start_compile_workers)
                assert await asyncio.to_thread(_compile_workers)
            await engine.prepare([(96, 160)])
            outputs[mode] = [(await engine.infer([f]))[0] for f in frames]
            outputs[mode + "-other"] = (await engine.infer([other]))[0]
            if mode == "default":
                assert engine.describe()["compiled_shapes"] == 1
                left = await asyncio.to_thread(_compile_workers)
                assert left == [], left
        finally:
            await engine.close()
    for got, ref in zip(outputs["default"], outputs["off"], strict=True):
        assert got.shape == ref.shape == (1, 1, 96, 160)
        np.testing.assert_allclose(got, ref, atol=1e-4)
    assert np.array_equal(outputs["default-other"], outputs["off-other"])  # the interpreter
    kept = await asyncio.to_thread(lambda: any((tmp_path / "cache").rglob("*")))
    assert kept, "inductor kept nothing on disk"


def _start_compile_workers() -> None:
    from torch._inductor.async_compile import AsyncCompile

    AsyncCompile.process_pool()


def _compile_workers() -> list[str]:
    """The command lines of inductor's compile worker processes that are this process's
    children or grandchildren (its pool runs them under one subprocess)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if "compile_worker" in cmd and os.getpid() in _ancestors(proc.name):
            found.append(cmd)
    return found


def _ancestors(pid: str) -> list[int]:
    out: list[int] = []
    while pid.isdigit() and pid != "1" and len(out) < 16:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = stat.rsplit(")", 1)[1].split()[1]
        out.append(int(pid))
    return out


def test_a_shape_that_cannot_be_compiled_runs_uncompiled_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """engine.torch.compile is a speed-up: a forward the tracer cannot follow (here it
    reads the input's raw storage) runs as it is for that shape, with a warning, not an
    error."""
    from edge_vision.engines.torch_compile import CompiledForward

    def forward(x: torch.Tensor) -> list[torch.Tensor]:
        raw = torch.frombuffer(bytearray(x.untyped_storage()), dtype=torch.float32)
        return [raw.reshape(x.shape) * 2]

    x = torch.ones(2, 3)
    with caplog.at_level("WARNING"):
        fn = CompiledForward(torch, forward, x, "default")
        out = fn(x)
    assert torch.equal(out[0], x * 2) and not fn.compiled
    assert "runs uncompiled" in caplog.text
