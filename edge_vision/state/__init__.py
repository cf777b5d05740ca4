"""Connection state shared by the nodes of one service: nodes, sessions, who holds what.

``state.redis_url`` unset: :class:`~.memory.MemoryStore` (this process only, the embedded
default). Set: :class:`~.redis.RedisStore`. Both pass the same contract tests.
:class:`~.keeper.StateKeeper` is the async shell the server talks to; it keeps frames
flowing whatever the store does. Key names and TTLs: docs/state.md.
"""

from .base import StateStore, create_store
from .keeper import StateKeeper

__all__ = ["StateKeeper", "StateStore", "create_store"]
