"""sd_notify(3) without libsystemd: READY=1, WATCHDOG=1, STATUS=, STOPPING=1, EXTEND_TIMEOUT.

Who sends what, and when, is edge_vision/serve/workers.py's business (the node's contract);
this module only delivers a state string to the unit's notify socket, or, inside a worker
process, hands it to the parent (``set_relay``): systemd takes messages from the main
process only (``NotifyAccess=main``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

_relay: Callable[[str], object] | None = None


def set_relay(relay: Callable[[str], object] | None) -> None:
    """Send every later :func:`notify` through ``relay`` (a worker's queue to its parent)."""
    global _relay
    _relay = relay


def notify(state: str) -> bool:
    """Send ``state`` to systemd when run under a unit with NOTIFY_SOCKET; else no-op."""
    if _relay is not None:
        _relay(state)
        return True
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # abstract namespace
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError:  # like sd_notify(3): a missing or full socket is not the service's end
        return False
    return True


def watchdog_interval_s() -> float | None:
    """Half the unit's WatchdogSec, as systemd recommends, or None without a watchdog.

    systemd sets WATCHDOG_PID to the main process; anyone else (a worker, a child that
    inherited the environment) must not ping."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2_000_000
