"""The node's listening sockets, and the one start-up line that says where to connect.

The port is bound before anything else starts (before the model loads), so a user's
mistake in ``--host`` or ``--port`` is one line that says what to do
(:class:`~edge_vision.errors.ListenFailed`, exit code 2) rather than a traceback after
the engine has warmed up:

* :func:`listen` binds every address ``host`` resolves to, as aiohttp's TCP site would;
* :func:`listen_failed` turns the operating system's reason into that line (pure);
* :func:`where_to_connect` is the line the log shows once the port is bound: the page's
  URL, the WebSocket's, and whether a credential is needed (pure).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from typing import Any

from ..errors import ListenFailed

log = logging.getLogger(__name__)

#: Hosts that mean "every interface of this machine".
ANY_HOST = frozenset({"", "0.0.0.0", "::", "[::]"})


def _address(host: str | None, port: int) -> str:
    """``host:port`` as a user would type it (brackets around an IPv6 address)."""
    shown = host or "0.0.0.0"
    return f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"


def listen_failed(host: str | None, port: int, err: OSError) -> ListenFailed:
    """Why ``host``:``port`` cannot be listened on, and what to do, in one line."""
    where = _address(host, port)
    reason = os.strerror(err.errno) if err.errno and err.errno > 0 else (err.strerror or "")
    reason = (reason or str(err)).lower()
    other_port = f"--port {port + 1 if 0 < port < 65535 else 8081}"
    if isinstance(err, socket.gaierror):
        advice = (
            f"'{host}' does not resolve ({err.strerror}); give --host an address (0.0.0.0 "
            "for every interface, 127.0.0.1 for this machine only) or a name it resolves"
        )
    elif err.errno == errno.EADDRINUSE:
        advice = (
            f"{reason} (another edge-vision still running?); stop it, or choose a free "
            f"port with {other_port}"
        )
    elif err.errno == errno.EADDRNOTAVAIL:
        advice = (
            f"{reason} ({host} is not an address of this machine); use --host 0.0.0.0 "
            "(every interface), --host 127.0.0.1 (this machine only) or one of its own "
            "addresses"
        )
    elif err.errno == errno.EACCES and 0 < port < 1024:
        advice = (
            f"{reason} (ports below 1024 need root or CAP_NET_BIND_SERVICE); use "
            f"--port 8080, with a proxy in front for port {port} (deploy/nginx)"
        )
    else:
        advice = f"{reason}; check --host and --port (server.host, server.port)"
    return ListenFailed(f"cannot listen on {where}: {advice}")


def listen(
    host: str | None, port: int, *, backlog: int = 1024, reuse_port: bool = False
) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (all interfaces for None or
    ""), as aiohttp's TCP site binds them; ``reuse_port``: SO_REUSEPORT, so several
    processes listen on one port. Raises :class:`~edge_vision.errors.ListenFailed`."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise listen_failed(host, port, e) from None
    listeners: list[socket.socket] = []
    seen: set[Any] = set()
    try:
        for family, kind, proto, _name, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            try:
                sock = socket.socket(family, kind, proto)
            except OSError as e:  # e.g. IPv6 off: that family is skipped, as asyncio does
                log.info("not listening on %s: %s", addr, e)
                continue
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError as e:
        for sock in listeners:
            sock.close()
        raise listen_failed(host, port, e) from None
    if not listeners:
        raise listen_failed(host, port, OSError(errno.EAFNOSUPPORT, "no address family works"))
    return listeners


def bound_port(listeners: list[socket.socket], asked: int) -> int:
    """The port the sockets listen on (``asked``, or the one the system chose for 0)."""
    return int(listeners[0].getsockname()[1]) if listeners else asked


def where_to_connect(host: str | None, port: int, auth_enabled: bool, hostname: str) -> str:
    """The start-up line: the page's URL and the WebSocket's, and the security posture.

    A node listening on every interface is named as ``localhost`` (where a browser gives
    the page the camera without HTTPS) and by the machine's name (``hostname``) for other
    machines; a specific address is named as it is."""
    shown = host or ""
    if shown in ANY_HOST:
        # Browsers give a page the camera only on localhost or over HTTPS: name both.
        others = f"; from other machines http://{hostname}:{port}" if hostname else ""
        where = (
            f"http://localhost:{port} (the page{others}) and "
            f"ws://{hostname or 'localhost'}:{port}/ws (every interface, {_address(host, port)})"
        )
    else:
        name = shown
        try:
            if ipaddress.ip_address(shown.strip("[]")).version == 6:
                name = f"[{shown.strip('[]')}]"
        except ValueError:
            pass  # a host name
        where = f"http://{name}:{port} (the page) and ws://{name}:{port}/ws"
    if auth_enabled:
        posture = (
            "authentication is ON (auth.enabled): /ws needs an API key or a token "
            "from 'edge-vision token'; see docs/security.md"
        )
    elif _loopback(shown):
        posture = (
            "authentication is OFF, so only this machine can connect; to let other "
            "machines in, turn auth on (docs/security.md) and set server.host: 0.0.0.0 "
            "(--host 0.0.0.0)"
        )
    else:
        posture = (
            "authentication is OFF: anyone who can reach this port can stream; "
            "see docs/security.md to turn it on"
        )
    return f"serving on {where}; {posture}"


def _loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
