"""Connection state shared by the nodes of one service: nodes, sessions, who holds what.

``state.redis_url`` unset: :class:`~.memory.MemoryStore` (this process only, the embedded
default). Set: :class:`~.redis.RedisStore`. Both pass the same contract tests.
:class:`~.keeper.StateKeeper` is the async shell the server talks to; it keeps frames
flowing whatever the store does. Key names and TTLs: docs/state.md.
"""

from ..config import StateConfig
from .base import StateStore
from .keeper import StateKeeper
from .memory import MemoryStore
from .redis import RedisStore


def create_store(cfg: StateConfig) -> StateStore:
    """:class:`RedisStore` when ``state.redis_url`` is set, else the in-process store."""
    if cfg.redis_url:
        return RedisStore.from_config(cfg)
    return MemoryStore()


__all__ = ["StateKeeper", "StateStore", "create_store"]
