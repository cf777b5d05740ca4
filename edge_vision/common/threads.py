"""The service's threads carry their role in the operating system's name for them.

Python names its threads (``post_0``, ``gpu-decode_1``) but, before 3.14, leaves the
kernel's name (``/proc/<pid>/task/<tid>/comm``, what ``top -H``, ``ps -L`` and ``perf``
show) as the process's. Each thread pool of the frame path is a :func:`role_pool`, whose
threads pass their name on with :func:`name_native`, so an operator sees which stage
takes a core, and ``edge-vision
bench`` reports the server's CPU by role (:func:`role_of`). Threads that native code
starts (CUDA's, a decoder library's) inherit the name of the thread that started them.

:func:`opencv_threads` is the other rule about the service's threads: how many OpenCV
may use inside one call, which the pipeline applies on each engine change.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

#: ``prctl(2)``'s option to set the calling thread's name (linux/prctl.h).
_PR_SET_NAME = 15
#: The kernel keeps 15 bytes of a thread's name (16 with the terminating NUL).
NAME_BYTES = 15


@cache
def _prctl() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def name_native(name: str | None = None) -> bool:
    """Give the calling thread's OS name its Python name (or ``name``), cut to
    :data:`NAME_BYTES`; False where the system has no ``prctl``. A thread pool's
    ``initializer``."""
    fn = _prctl()
    if fn is None:
        return False
    text = (name or threading.current_thread().name).encode("utf-8", "replace")[:NAME_BYTES]
    return bool(fn(_PR_SET_NAME, text, 0, 0, 0) == 0)


def role_pool(workers: int, role: str) -> ThreadPoolExecutor:
    """A thread pool whose threads are named ``<role>_<n>`` for Python and the OS alike."""
    return ThreadPoolExecutor(workers, thread_name_prefix=role, initializer=name_native)


def role_of(os_name: str) -> str:
    """A thread's role from its OS name: the pool's prefix without the thread's number
    (``gpu-decode_1`` -> ``gpu-decode``, ``torch-run_0`` -> ``torch-run``)."""
    return re.sub(r"_\d+$", "", os_name)


def opencv_threads(explicit: int | None, cuda_engine: bool) -> int:
    """The threads OpenCV may use inside one call (``cv2.setNumThreads``):
    ``server.opencv_threads`` when set; else 1 while a CUDA engine serves, else -1,
    OpenCV's default (one a core).

    On a GPU host each worker process already runs its frames on many threads, and an
    OpenCV pool of one thread a core under each of them only adds hand-offs: with frames
    letterboxed on the GPU, where OpenCV only post-processes small maps, the pool costs
    several times the CPU for the same time, and with the host letterbox one thread costs
    less CPU a frame and answers more frames. On a CPU engine's few cores (ONNX Runtime)
    one thread answers fewer frames, so CPU engines keep OpenCV's default
    (docs/benchmarks.md, "a fair host path, and where the GIL goes" and "OpenCV's own
    threads on the CPU path")."""
    if explicit is not None:
        return explicit
    return 1 if cuda_engine else -1
