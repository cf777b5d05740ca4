"""sd_notify(3) without libsystemd: READY=1 after warm-up, WATCHDOG=1 while healthy."""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send ``state`` to systemd when run under a unit with NOTIFY_SOCKET; else no-op."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # abstract namespace
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        s.sendall(state.encode())
    return True


def watchdog_interval_s() -> float | None:
    """Half the unit's WatchdogSec, as systemd recommends, or None without a watchdog."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2_000_000
