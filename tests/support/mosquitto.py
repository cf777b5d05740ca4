"""A real mosquitto (Debian's, 2.0) for tests: a free loopback port, anonymous clients,
persistence in the test's folder so a restart keeps the subscribers' sessions and the
QoS 1 messages queued for them. ``stop()`` then ``start()`` is a broker outage."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from .server import free_port
from .timing import T


class Mosquitto:
    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            raise RuntimeError("mosquitto is not installed; scripts/test installs it")
        self.exe = exe
        self.workdir = workdir
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {workdir}/\n"
            "max_queued_messages 100000\n"
            f"log_dest file {workdir}/mosquitto.log\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def start(self) -> Mosquitto:
        self.proc = subprocess.Popen(
            [self.exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + T(10)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {self.log()}")
            if self._accepts():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not start: {self.log()}")

    def stop(self) -> None:
        """SIGTERM: the broker saves its sessions and queued messages, then exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=T(10))

    def log(self) -> str:
        path = self.workdir / "mosquitto.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""
