"""What every redis-py client of the service is given: the state store's
(edge_vision.state.redis) and the events' Redis Streams sink (edge_vision.events.sinks)."""

from __future__ import annotations

from typing import Any

import redis


def driver_info_options() -> dict[str, Any]:
    """The client name and version redis-py reports (CLIENT SETINFO), given up front:
    left out, redis-py reads its package metadata from disk for every new connection,
    a blocking file read on the event loop."""
    try:
        from redis.driver_info import DriverInfo  # redis-py >= 7
    except ImportError:
        return {"lib_version": redis.__version__}
    return {"driver_info": DriverInfo(name="redis-py", lib_version=redis.__version__)}
