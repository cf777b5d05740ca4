"""GPU tests: run on a CUDA machine (the H200 here); skip cleanly everywhere else."""

from __future__ import annotations

import importlib.util

import pytest

from edge_vision.engines.cuda import cuda_available

BACKENDS = ["cuda-python", "pycuda"]
_HAVE_CUDA = cuda_available()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if not _HAVE_CUDA:
                item.add_marker(pytest.mark.skip(reason="no CUDA device on this machine"))


def backend_installed(name: str) -> bool:
    module = {"cuda-python": "cuda.bindings", "pycuda": "pycuda"}[name]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Both CUDA layer implementations run the same tests."""
    name: str = request.param
    if not backend_installed(name):
        pytest.skip(f"{name} is not installed on this machine")
    return name
