"""The aiohttp app's typed state: one :class:`web.AppKey` per object the app holds, and
:class:`NodeState`, what this process knows about itself. Beside the server so that the
worker supervisor and the hand-over read the same keys without importing the app."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from ..common.metrics import Metrics
from ..config import Config
from ..frames.infer import InferenceService
from ..frames.pipeline import FramePipeline
from ..state import StateKeeper
from . import auth
from .connection import Connection, ConnectionContext
from .limits import ConnectionLimits, IPNetwork, PenaltyBox


def _always_warm() -> bool:
    return True


@dataclass(slots=True)
class NodeState:
    """What this server process knows about itself."""

    node_id: str
    started: float  # time.time() when the app was made
    web_root: Path  # the overlay page's folder
    startup_error: str | None = None  # why the engine could not start
    stopping: bool = False  # shutdown began: /readyz says not ready
    handed: int = 0  # connections the node's main process handed to this worker
    #: Whether every worker of the node is warm (a worker's /readyz waits for all).
    workers_warm: Callable[[], bool] = field(default=_always_warm)
    on_engine_started: Callable[[], None] | None = None


CONFIG = web.AppKey("config", Config)
METRICS = web.AppKey("metrics", Metrics)
SERVICE = web.AppKey("service", InferenceService)
PIPELINE = web.AppKey("pipeline", FramePipeline)
KEEPER = web.AppKey("keeper", StateKeeper)
CONNECTIONS = web.AppKey("connections", dict[str, Connection])
STARTUP: web.AppKey[asyncio.Task[None]] = web.AppKey("startup")
STATE = web.AppKey("state", NodeState)
CONNECTION_CTX = web.AppKey("connection_ctx", ConnectionContext)
#: Optional features this node has, announced in hello (docs/protocol.md, "Versions"): a
#: feature turned on by config is appended in create_app.
FEATURES = web.AppKey("features", list[str])
AUTH = web.AppKey("auth", auth.Authenticator)
LIMITS = web.AppKey("limits", ConnectionLimits)
TRUSTED_PROXIES = web.AppKey("trusted_proxies", list[IPNetwork])
#: Addresses refused for a while: their connections kept not reading (limits.py).
PENALTIES = web.AppKey("penalties", PenaltyBox)
#: Per request: the client address the limits count (limits.client_address).
ADDRESS = web.RequestKey("address", str)
#: Names a Host may carry while auth is off, besides addresses and localhost (exposure.py).
HOST_NAMES = web.AppKey("host_names", frozenset[str])
