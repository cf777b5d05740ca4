"""Fair shares of connections: per client address, per credential and in total. No I/O.

One address (a broken scanner, an attacker, a script in a loop) must not take every slot
of a node: over ``limits.max_connections_per_address`` it is refused, while everyone
else still connects. Likewise one API key or one token subject over
``limits.max_connections_per_token``, and everyone together over
``server.max_connections``. A refusal happens before the WebSocket upgrade (HTTP 503,
the body naming the limit), so it costs the server one HTTP request, not a socket.

The client address is the TCP peer, except when the peer is a configured trusted proxy
(``limits.trusted_proxies``, e.g. the shipped nginx): then it is taken from
``X-Forwarded-For``, read right to left, skipping trusted proxies, as the first address
no trusted proxy could have written (anything to its left the client itself may have
forged). A peer that is not trusted cannot choose its address by sending the header.

With ``server.workers`` = N each worker process enforces ``ceil(limit / N)`` of every
limit on its own connections (:meth:`LimitsPolicy.for_workers`), so the node admits at
most ``N * ceil(limit / N)`` per address, per token and in total. Connections reach the
workers evenly by their client counts (``server.worker_balance``, edge_vision/serve/balance.py),
or by the kernel's hash of the address pair (``reuse-port``), so one address may be
refused a little before the node limit when its connections land unevenly
(docs/security.md, "Limits with several workers").

An address whose connections keep having to be closed for not reading their results
(``limits.slow_client_strikes`` of them within ``limits.slow_client_penalty_s``) is
refused for that long (:class:`PenaltyBox`): each such client holds its slot, its unsent
replies and a kernel send queue until ``server.send_timeout_s`` and
``server.close_timeout_s`` have passed, and a script that reconnects at once would hold
them again.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
LimitName = Literal["total", "per_address", "per_token"]


def parse_networks(entries: Iterable[str]) -> list[IPNetwork]:
    """``"10.0.0.5"``, ``"10.0.0.0/8"``, ``"::1"`` as networks (``ValueError`` if bad)."""
    return [ipaddress.ip_network(e.strip(), strict=False) for e in entries]


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "1.2.3.4:5678"
        text = text.split(":", 1)[0]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _trusted(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, nets: list[IPNetwork]) -> bool:
    return any(addr.version == n.version and addr in n for n in nets)


def client_address(peer: str, forwarded_for: str, trusted: list[IPNetwork]) -> str:
    """The address limits count for this request (see the module docstring)."""
    peer_ip = _ip(peer)
    if peer_ip is None:
        return peer  # a Unix socket or unknown: counted as given
    if not trusted or not _trusted(peer_ip, trusted):
        return str(peer_ip)
    hops = [h for h in (part.strip() for part in forwarded_for.split(",")) if h]
    for hop in reversed(hops):
        ip = _ip(hop)
        if ip is None:
            break  # garbage from here leftwards is the client's own writing
        if not _trusted(ip, trusted):
            return str(ip)
    # Every hop is a trusted proxy (or none is listed): the nearest one is the client.
    return str(peer_ip)


@dataclass(frozen=True, slots=True)
class LimitsPolicy:
    total: int
    per_address: int
    per_token: int

    def for_workers(self, workers: int) -> LimitsPolicy:
        """One worker's share when ``workers`` processes serve the port."""
        if workers <= 1:
            return self

        def share(n: int) -> int:
            return max(1, math.ceil(n / workers))

        return replace(
            self,
            total=share(self.total),
            per_address=share(self.per_address),
            per_token=share(self.per_token),
        )


@dataclass(frozen=True, slots=True)
class LimitExceeded:
    limit: LimitName
    value: int

    @property
    def message(self) -> str:
        what = {
            "total": "server.max_connections",
            "per_address": "limits.max_connections_per_address",
            "per_token": "limits.max_connections_per_token",
        }[self.limit]
        return f"connection limit reached: {what} ({self.value})"


class Slot:
    """One admitted connection's place; :meth:`release` gives it back (idempotent)."""

    __slots__ = ("_limits", "_released", "address", "token")

    def __init__(self, limits: ConnectionLimits, address: str, token: str | None) -> None:
        self._limits = limits
        self.address = address
        self.token = token
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limits._release(self)


class ConnectionLimits:
    """Counts open connections; :meth:`acquire` admits one or names the limit it hits."""

    def __init__(self, policy: LimitsPolicy) -> None:
        self.policy = policy
        self.total = 0
        self.by_address: Counter[str] = Counter()
        self.by_token: Counter[str] = Counter()

    @property
    def full(self) -> bool:
        """No slot is left for anyone (what /readyz reports as "full")."""
        return self.total >= self.policy.total

    def acquire(self, address: str, token: str | None) -> Slot | LimitExceeded:
        p = self.policy
        if self.total >= p.total:
            return LimitExceeded("total", p.total)
        if self.by_address[address] >= p.per_address:
            return LimitExceeded("per_address", p.per_address)
        if token is not None and self.by_token[token] >= p.per_token:
            return LimitExceeded("per_token", p.per_token)
        self.total += 1
        self.by_address[address] += 1
        if token is not None:
            self.by_token[token] += 1
        return Slot(self, address, token)

    def _release(self, slot: Slot) -> None:
        self.total -= 1
        self.by_address[slot.address] -= 1
        if self.by_address[slot.address] <= 0:
            del self.by_address[slot.address]
        if slot.token is not None:
            self.by_token[slot.token] -= 1
            if self.by_token[slot.token] <= 0:
                del self.by_token[slot.token]


class PenaltyBox:
    """Addresses refused for a while because their connections had to be closed for not
    reading (see the module docstring). ``penalty_s`` 0 turns it off."""

    #: Addresses remembered at most; the oldest strikes are forgotten first.
    MAX_ADDRESSES = 4096

    def __init__(
        self, strikes: int, penalty_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.strikes = strikes
        self.penalty_s = penalty_s
        self._clock = clock
        self._strikes: dict[str, deque[float]] = {}
        self._until: dict[str, float] = {}

    def strike(self, address: str) -> bool:
        """One connection of ``address`` was closed for not reading. True when this strike
        starts its penalty (say so once)."""
        if self.penalty_s <= 0:
            return False
        now = self._clock()
        seen = self._strikes.pop(address, None) or deque()
        while seen and seen[0] <= now - self.penalty_s:
            seen.popleft()
        seen.append(now)
        self._strikes[address] = seen  # most recent last: the oldest goes first
        if len(self._strikes) > self.MAX_ADDRESSES:
            del self._strikes[next(iter(self._strikes))]
        if len(seen) < self.strikes or self.refused_for(address) > 0:
            return False
        self._until[address] = now + self.penalty_s
        seen.clear()
        if len(self._until) > self.MAX_ADDRESSES:
            self._until = {a: t for a, t in self._until.items() if t > now}
        return True

    def refused_for(self, address: str) -> float:
        """Seconds ``address`` is still refused; 0 when it may connect."""
        until = self._until.get(address)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._until[address]
            return 0.0
        return left

    def message(self, left: float) -> str:
        """The refusal's one line: what happened, the settings, what to do."""
        return (
            f"connection refused for {math.ceil(left)} s: {self.strikes} connections from "
            f"this address were closed for not reading their results within "
            f"{self.penalty_s:g} s (limits.slow_client_strikes, limits.slow_client_penalty_s); "
            "read results as they come"
        )
