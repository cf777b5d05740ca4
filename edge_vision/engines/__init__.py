"""Engines: one module per backend behind the small :class:`~.base.Engine` interface.

Backends are imported lazily by name (``engine.kind``), so ``import edge_vision`` works
without torch, TensorRT, CUDA or tritonclient, and a missing library is one clear error.
"""

from .base import Engine, create_engine, engine_names

__all__ = ["Engine", "create_engine", "engine_names"]
