"""Engines: one module per backend behind the small :class:`~.base.Engine` interface.

Backends are imported lazily by name (``engine.kind``), so ``import edge_vision`` works
without torch, TensorRT, CUDA or tritonclient, and a missing library is one clear error.

Adding an engine: a module (or package) ``edge_vision/engines/<kind>.py`` with an
:class:`~.base.Engine` subclass whose ``kind`` is ``<kind>`` and, if it has metrics of
its own, a class of them made through :meth:`~edge_vision.common.metrics.Metrics.extension` (as
:mod:`.triton` does); and its section ``<kind>: <Kind>Config`` in
:class:`~edge_vision.config.EngineConfig`, an :class:`~edge_vision.config.EngineSection`
with its ``install`` hint. The kinds ``engine.kind`` accepts, the lookup, the CLI help and
the ``edge_vision_engine_active`` series follow from that section.
"""

from .base import Engine, create_engine, engine_class

__all__ = ["Engine", "create_engine", "engine_class"]
