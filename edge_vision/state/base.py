"""The state store interface (records are flat ``str -> str`` mappings, like Redis hashes)."""

from __future__ import annotations

from abc import ABC, abstractmethod

Record = dict[str, str]


class StateStore(ABC):
    kind: str

    async def start(self) -> None:  # noqa: B027 - optional hook, nothing by default
        """Connect; raising here only marks state degraded, it never stops the node."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing by default
        """Release connections."""

    @abstractmethod
    async def ping(self) -> None:
        """Raise if the store cannot be reached."""

    @abstractmethod
    async def write_node(self, node_id: str, record: Record, ttl_s: float) -> None:
        """Create or refresh a node's record; it expires after ``ttl_s`` unless refreshed."""

    @abstractmethod
    async def remove_node(self, node_id: str) -> None:
        """Delete a node's record and its session set (clean shutdown)."""

    @abstractmethod
    async def list_nodes(self) -> list[Record]: ...

    @abstractmethod
    async def write_sessions(
        self, node_id: str, records: list[Record], session_ttl_s: float, node_ttl_s: float
    ) -> None:
        """Write live sessions held by ``node_id`` and refresh its session set."""

    @abstractmethod
    async def release_session(self, node_id: str, record: Record, ttl_s: float) -> None:
        """A session disconnected but may resume: keep it ``ttl_s``, drop it from the node."""

    @abstractmethod
    async def end_session(self, node_id: str, session_id: str) -> None:
        """A session ended for good: delete it."""

    @abstractmethod
    async def get_session(self, session_id: str) -> Record | None: ...

    @abstractmethod
    async def list_sessions(self) -> list[Record]: ...

    @abstractmethod
    async def node_sessions(self, node_id: str) -> set[str]: ...


def create_store(redis_url: str | None, op_timeout_s: float = 1.0) -> StateStore:
    if redis_url:
        from .redis import RedisStore

        return RedisStore(redis_url, op_timeout_s=op_timeout_s)
    from .memory import MemoryStore

    return MemoryStore()
