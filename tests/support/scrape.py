"""What a Prometheus scrape of a running server's ``/metrics`` sees, for tests."""

from __future__ import annotations

import aiohttp


async def metrics_text(http: aiohttp.ClientSession, url: str) -> str:
    """The Prometheus text of ``GET <url>/metrics``."""
    async with http.get(url + "/metrics") as r:
        return await r.text()


def metric(text: str, name: str) -> float:
    """The value of one sample line (``name`` with its labels) in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")
