"""Thread roles in the OS's thread names (edge_vision/common/threads.py): what top -H and the
bench's CPU-by-role table read."""

from __future__ import annotations

import threading
from pathlib import Path

from edge_vision.common.threads import role_of, role_pool
from edge_vision.tools.bench.load import cpu_by_role, thread_cpu_seconds


def _os_name() -> str:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


def test_a_pool_thread_shows_its_python_name_to_the_os_and_its_role_to_the_bench() -> None:
    with role_pool(2, "gpu-decode") as pool:
        names = {pool.submit(_os_name).result() for _ in range(8)}
        role_cpu = cpu_by_role({}, thread_cpu_seconds(__import__("os").getpid()))
    assert names <= {"gpu-decode_0", "gpu-decode_1"} and names, names
    assert {role_of(n) for n in names} == {"gpu-decode"}
    assert "gpu-decode" in role_cpu and "loop" in role_cpu, role_cpu


def test_a_long_name_is_cut_to_what_the_kernel_keeps() -> None:
    with role_pool(1, "a-very-long-thread-role") as pool:
        assert pool.submit(_os_name).result() == "a-very-long-thr"
    assert role_of("torch-run_12") == "torch-run" and role_of("loop") == "loop"
