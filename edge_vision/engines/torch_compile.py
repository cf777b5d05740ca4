"""``engine.torch.compile``: the converted ONNX graph built once as one flat graph per input
shape, then compiled whole, so its elementwise kernels fuse.

The torch engine's converter (onnx_torch.py) is an interpreter: ``forward`` walks the ONNX
nodes in Python, computing shape arithmetic on the host as it goes. A CUDA graph removes
its Python cost from each batch, but every node stays a kernel of its own, so each
elementwise operator (activations, adds, multiplies) is a separate pass over memory.
Handing the interpreter itself to ``torch.compile`` would leave dynamo to trace that Python
loop and its shape arithmetic (docs/benchmarks.md, "the engine compiled").

Here the engine's whole forward for one ``(batch, height, width)`` (the uint8 NHWC input's
layout and normalisation, the network, the device post-processing) is traced once with
real tensors into an FX graph of aten operators (``make_fx``): the interpreter and its host
shape arithmetic are gone, folded into constants, so the graph is the same operators the
interpreter runs (exactly the same outputs: tests/integration/test_torch_engine.py). Inductor then
compiles that graph whole (``fullgraph``, static shapes). The compiled code is what the
engine captures in its CUDA graphs, so each batch is still one replay.

Compiling takes tens of seconds a shape (about 60 s on the 2-core machine for the default
detector; max-autotune longer): it happens in the engine's warm-up, one shape at a time, in
the log. Inductor keeps what it compiled on disk (``engine.torch.compile_cache``, its FX
graph cache), so a restart with the same model, shapes and torch reuses it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..common import systemd

log = logging.getLogger(__name__)

#: ``engine.torch.compile`` -> torch.compile's mode. The engine captures its own CUDA
#: graphs, so inductor's are off.
MODES: dict[str, str | None] = {"default": None, "max-autotune": "max-autotune-no-cudagraphs"}


def use_cache_dir(path: Path) -> None:
    """Where inductor keeps what it compiled (its FX graph cache), made if missing. Torch
    reads ``TORCHINDUCTOR_CACHE_DIR`` each time it looks, and sets it to its own default
    (under /tmp, which systemd's PrivateTmp empties at each start) the first time it finds
    it unset, so this sets it outright."""
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path.resolve())


def release_compile_workers() -> None:
    """Let inductor's compile worker processes go. Inductor compiles in a pool of worker
    processes (``TORCHINDUCTOR_COMPILE_THREADS`` of them) and keeps the pool after the
    compiles end, until it has idled a while (60 s in torch 2.13's default); everything
    here compiles in the engine's warm-up, so the pool is shut down when that ends: the
    idle pools of a node's engine workers are the likely holders of a large rise in
    resident memory after warm-up (docs/benchmarks.md, "the engine compiled"). A later
    warm-up that compiles starts a new pool. A pool that will not shut down is logged, not
    raised: serving does not depend on it."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers
    except ImportError:  # a torch without it keeps its pool
        return
    try:
        shutdown_compile_workers()
    except Exception as e:  # noqa: BLE001 - a stuck pool costs memory, not frames
        log.warning("inductor's compile workers did not shut down: %s", e)


def flat_graph(torch: Any, forward: Callable[[Any], Any], example: Any) -> Any:
    """``forward`` traced once with the real ``example`` input into a flat FX graph of aten
    operators (``torch.fx.GraphModule``), valid for inputs of the example's shape, dtype
    and device."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def traced(x: Any) -> Any:  # a plain function: make_fx counts a bound method's self
        return forward(x)

    with torch.no_grad():
        return make_fx(traced, tracing_mode="real")(example)


class CompiledForward:
    """``forward`` for inputs shaped as one ``example``, as one inductor-compiled graph
    (``mode``: a key of :data:`MODES`). The compile happens on the first call, said in the
    log and, under systemd, in ``systemctl status`` with the start timeout extended. Where
    the trace or the compile fails, this shape runs ``forward`` itself (the interpreter),
    said once in the log: compiling is a speed-up, never a reason not to serve."""

    def __init__(self, torch: Any, forward: Callable[[Any], Any], example: Any, mode: str):
        self._forward = forward
        self._shape = tuple(example.shape)
        self._mode = mode
        self._fn: Callable[[Any], Any] | None = None
        self.compiled = False  # True once the compiled graph has run
        t0 = time.perf_counter()
        try:
            graph = flat_graph(torch, forward, example)
            self._fn = torch.compile(
                graph, backend="inductor", mode=MODES[mode], fullgraph=True, dynamic=False
            )
        except Exception as e:  # noqa: BLE001 - any trace failure: the interpreter serves
            self._give_up(e)
            return
        nodes = sum(1 for n in graph.graph.nodes if n.op == "call_function")
        log.info(
            "torch compile: input %s traced to %d operators in %.1f s",
            self._shape,
            nodes,
            time.perf_counter() - t0,
        )

    def _give_up(self, error: BaseException) -> None:
        self._fn = None
        log.warning(
            "torch compile (%s) failed for input %s, which runs uncompiled: %s",
            self._mode,
            self._shape,
            error,
        )

    def __call__(self, x: Any) -> Any:
        fn = self._fn
        if fn is None:
            return self._forward(x)
        if self.compiled:
            return fn(x)
        text = f"compiling the torch engine's graph for input {self._shape} ({self._mode})"
        systemd.notify(f"EXTEND_TIMEOUT_USEC=600000000\nSTATUS={text}")
        log.info("%s...", text)
        t0 = time.perf_counter()
        try:
            out = fn(x)
        except Exception as e:  # noqa: BLE001 - inductor's failure: the interpreter serves
            self._give_up(e)
            return self._forward(x)
        self.compiled = True
        log.info(
            "torch compile: input %s compiled in %.1f s", self._shape, time.perf_counter() - t0
        )
        return out
