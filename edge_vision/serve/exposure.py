"""What a web page on another site can reach of a node: its Origin, and DNS rebinding.

Checked on ``/ws``, ``/metrics`` and ``/api/*`` before any credential
(:func:`check_exposure`; docs/security.md, "Origins" and "A safe demo"):

* **One Origin, an allowed one.** A request whose ``Origin`` is neither the page's own nor
  in ``auth.allowed_origins`` is refused (403), auth on or off: with auth off nothing else
  would stop a page on another site from opening a socket, or POSTing
  ``/api/engine/retry``, through a plant-floor browser. A request with two ``Origin``
  headers is refused (400): a proxy and the node could each read another one.
* **A Host that names this node (DNS rebinding).** A page on ``evil.example`` whose name
  is made to resolve to the node's address sends ``Host: evil.example`` and its own
  matching ``Origin`` (or none, for a same-origin GET), so the same-origin check passes.
  With auth off, where no credential stands in its way, such a request is served only
  when its ``Host`` is an IP address (a rebinding page's Host is always its own name),
  ``localhost`` or a ``*.localhost`` name, this machine's own name, or a name in
  ``server.allowed_hosts`` (``*``: any). With auth on the credential is the check: a
  rebinding page has none.

No I/O but the machine's own name, read once (:func:`node_names`); the caller hands in
the request's headers and host.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from aiohttp import web
from multidict import CIMultiDictProxy

from ..config import Config
from . import auth


def node_names(config: Config, hostname: str | None = None) -> frozenset[str]:
    """The names a request's ``Host`` may carry besides IP addresses and localhost: this
    machine's name and ``server.allowed_hosts``."""
    own = socket.gethostname() if hostname is None else hostname
    names = {own, *config.server.allowed_hosts}
    return frozenset(n.strip().lower().rstrip(".") for n in names if n.strip())


def _host_name(host: str) -> str:
    """The name or address of a ``Host`` value, without its port or brackets."""
    host = host.strip().lower()
    if host.startswith("["):  # [v6]:port
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def host_is_ours(host: str, names: Iterable[str]) -> bool:
    """Whether ``host`` (a ``Host`` header) names this node (see the module docstring)."""
    name = _host_name(host)
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    allowed = set(names)
    return name == "localhost" or name.endswith(".localhost") or "*" in allowed or name in allowed


def check_exposure(
    headers: CIMultiDictProxy[str], host: str, config: Config, names: frozenset[str]
) -> None:
    """Raise the refusal (an HTTP error) for a request a page on another site may have
    sent (see the module docstring); return when it may go on to the credential."""
    origins = headers.getall("Origin", [])
    if len(origins) > 1:
        raise web.HTTPBadRequest(
            text="bad request: more than one Origin header; a browser sends one\n"
        )
    origin = origins[0] if origins else None
    if not auth.origin_allowed(origin, host, config.auth.allowed_origins):
        raise web.HTTPForbidden(text="forbidden: origin not allowed (auth.allowed_origins)\n")
    if config.auth.enabled or "Host" not in headers or host_is_ours(host, names):
        return
    raise web.HTTPForbidden(
        text=f"forbidden: host {_host_name(host)!r} is not a name of this node and "
        "authentication is off (a page whose name resolves to the node: DNS rebinding); "
        "connect by address or localhost, or add the name to server.allowed_hosts\n"
    )
