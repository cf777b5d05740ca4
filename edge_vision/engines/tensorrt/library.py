"""The ``tensorrt`` module itself: its lazy import and the process's one logger.

``import tensorrt`` happens here and nowhere else, when an engine starts or a plan is
built, so ``import edge_vision`` works without TensorRT.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ...errors import EngineError

log = logging.getLogger(__name__)


def import_tensorrt() -> Any:
    """The ``tensorrt`` module, or one EngineError saying where it comes from."""
    try:
        import tensorrt
    except ImportError as e:
        raise EngineError(
            "engine 'tensorrt' needs TensorRT's Python bindings: on Jetson they come with "
            "JetPack (python3-libnvinfer), elsewhere: pip install tensorrt"
        ) from e
    return tensorrt


# ---------------------------------------------------------------------------------------
# TensorRT callbacks: logger, progress monitor, calibrator. Their base classes exist only
# once tensorrt is imported, so the classes are made by functions.


class _LogSink:
    """What the TensorRT logger records: recent errors, to put in EngineError messages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self._count = 0

    def add(self, message: str) -> None:
        with self._lock:
            self._errors = [*self._errors[-19:], message]
            self._count += 1

    def mark(self) -> int:
        with self._lock:
            return self._count

    def since(self, mark: int) -> str:
        with self._lock:
            n = min(self._count - mark, len(self._errors))
            return "; ".join(self._errors[-n:]) if n > 0 else "no error was logged"


_LOGGER: Any = None
SINK = _LogSink()


def trt_logger(trt: Any) -> Any:
    """One ``trt.ILogger`` for the process (TensorRT warns when builders and runtimes are
    given different loggers), forwarding to :mod:`logging`."""
    global _LOGGER
    if _LOGGER is not None:
        return _LOGGER

    severity = trt.ILogger.Severity

    class _Logger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, level: Any, msg: str) -> None:
            if level in (severity.INTERNAL_ERROR, severity.ERROR):
                SINK.add(msg)
                log.error("TensorRT: %s", msg)
            elif level == severity.WARNING:
                log.warning("TensorRT: %s", msg)
            elif level == severity.INFO:
                log.debug("TensorRT: %s", msg)  # INFO is chatty: per-layer build notes

    _LOGGER = _Logger()
    return _LOGGER
