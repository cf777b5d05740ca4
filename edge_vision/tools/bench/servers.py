"""The processes a bench starts, the machine it ran on, and the report it writes.

:class:`Server` is one ``edge-vision serve`` (or any server with a port) for the length of a
load run: started, waited for until ready, its memory sampled, stopped with SIGTERM (killed
after 20 s), and never left running when it fails to start. ``edge-vision bench`` and the
smaller benches (``loop``, ``soak``, ``flood``, ``balance``) start theirs here, and the
tests take :func:`free_port`, :func:`serve_argv` and :func:`stop_process` from here too.
"""

from __future__ import annotations

import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .load import rss_mib

#: How long a bench's server may take to become ready (``--server-ready-s``).
SERVER_READY_S = 300.0


def free_port() -> int:
    """A loopback TCP port that is free now (the tests' servers take theirs here too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> int:
    """Send a running child ``sig``, give it ``timeout`` seconds to exit, else kill it.
    Its exit code (the tests stop their servers and nginx here too)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Server:
    """A server process for the duration of a load run, with its memory sampled."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        log_path: Path,
        ready_path: str | None = "/readyz",
        ready_s: float = SERVER_READY_S,
    ) -> None:
        """``ready_path`` None: ready once the port accepts (a server without /readyz)."""
        self.argv, self.port, self.log_path, self.ready_path = argv, port, log_path, ready_path
        self.ready_s = ready_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.rss: list[tuple[float, float]] = []

    def __enter__(self) -> Server:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=self._log)
        try:
            self._wait_ready()
        except BaseException:  # not ready in time, or stopped while starting: not left behind
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        import urllib.error
        import urllib.request

        deadline = time.time() + self.ready_s
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited early; see {self.log_path}")
            try:
                if self.ready_path is None:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                        return
                url = f"http://127.0.0.1:{self.port}{self.ready_path}"
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {self.ready_s:.0f} s; see {self.log_path}")

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def sample(self, t: float) -> None:
        if self.proc is not None:
            mib = rss_mib(self.proc.pid)
            if mib is not None:
                self.rss.append((t, mib))

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGTERM, 20)
        self._log.close()


#: Settings for a bench's server whose clients all come from 127.0.0.1: no per-address
#: share of the node's limits applies to simulated cameras.
ONE_ADDRESS_SETS = ("server.max_connections=4096", "limits.max_connections_per_address=4096")


def serve_argv(port: int) -> list[str]:
    """``python -m edge_vision serve`` on 127.0.0.1:``port`` (the tests' server too)."""
    return [
        sys.executable,
        "-m",
        "edge_vision",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def machine() -> dict[str, Any]:
    """CPUs, platform, Python and the GPU, for a bench's results."""
    import os
    import platform

    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def medians(
    runs: list[dict[str, Any]], by: str, keys: tuple[str, ...]
) -> dict[str, dict[str, float]]:
    """Per value of ``runs``' field ``by`` (in first-seen order), the median of each of
    ``keys`` over the rounds: the small benches' summary."""
    values = list(dict.fromkeys(r[by] for r in runs))
    return {
        str(v): {k: statistics.median(r[k] for r in runs if r[by] == v) for k in keys}
        for v in values
    }


def write_report(path: Path, runs: list[dict[str, Any]], median: dict[str, Any]) -> None:
    """A small bench's results.json: when, where, how it was called, every round, the
    medians."""
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "argv": sys.argv,
        "runs": runs,
        "median": median,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
