"""A node with GPU processes (``server.gpu_process``): what the main process starts, and
the frame path each worker's app gets.

:func:`start_gpu_processes` resolves the setting on this machine
(:func:`~edge_vision.gpu_process.plan`) and, when on, starts the node's GPU processes under
their supervisor before any worker: the workers then connect to them by the sockets it
names (:class:`GpuNode`). :func:`frame_path` is what ``create_app`` serves frames with: the
worker's own engine and pipeline, as ever, or the hand-off to the GPU processes
(:mod:`edge_vision.gpu_process.handoff`); the session core and its runner are the same in
both.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace

from ..common.metrics import Metrics
from ..config import Config
from ..frames.infer import InferenceService
from ..frames.pipeline import FramePipeline
from ..gpu_process import plan
from ..gpu_process.handoff import worker_side
from ..gpu_process.supervisor import GpuProcessSupervisor
from ..model.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class GpuNode:
    """Where a worker of this node finds its GPU processes."""

    paths: tuple[str, ...]  # their Unix sockets, one a GPU
    node: str  # the node's name: the workers' ring segments are named by it
    worker: int = 0

    def for_worker(self, index: int) -> GpuNode:
        return replace(self, worker=index)


def start_gpu_processes(config: Config) -> tuple[GpuProcessSupervisor, GpuNode] | None:
    """The node's GPU processes started (``server.gpu_process`` on here), or None."""
    found = plan(config)
    if found is None:
        return None
    node = config.state.node_id or f"{socket.gethostname()}-{os.getpid()}"
    supervisor = GpuProcessSupervisor(config, node, count=found.count, stand_in=found.stand_in)
    supervisor.start()
    return supervisor, GpuNode(tuple(supervisor.paths), node)


def frame_path(
    config: Config, spec: ModelSpec, metrics: Metrics, gpu: GpuNode | None
) -> tuple[InferenceService, FramePipeline]:
    """The service and pipeline a worker's app serves frames with (module docstring)."""
    if gpu is None:
        service = InferenceService(spec, config, metrics=metrics)
        return service, FramePipeline(config, service)
    return worker_side(config, spec, gpu.paths, gpu.node, worker=gpu.worker, metrics=metrics)
