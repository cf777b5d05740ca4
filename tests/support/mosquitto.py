"""A real mosquitto (Debian's, 2.0) for tests: a free loopback port, anonymous clients,
persistence in the test's folder so a restart keeps the subscribers' sessions and the
QoS 1 messages queued for them. ``stop()`` then ``start()`` is a broker outage.
:class:`MqttListener` subscribes to what a node's MQTT sink publishes."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

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


class MqttListener:
    """A subscriber of ``topic/#`` with a persistent session (QoS 1), subscribed when
    ``async with`` enters: what it misses while the broker is down is queued for it there,
    and it reconnects by itself."""

    def __init__(self, broker: Mosquitto, topic: str = "edge-vision/events") -> None:
        self.broker = broker
        self.topic = topic
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _listen(self) -> None:
        # Here, not at the top: conftest imports this module, and the Python 3.10 smoke
        # run's unit tests have no aiomqtt (the test extra's, not the package's).
        import aiomqtt

        while True:
            try:
                async with aiomqtt.Client(
                    "127.0.0.1",
                    self.broker.port,
                    identifier="test-listener",
                    clean_session=False,
                    protocol=aiomqtt.ProtocolVersion.V311,
                ) as client:
                    await client.subscribe(f"{self.topic}/#", qos=1)
                    self._subscribed.set()
                    async for message in client.messages:
                        payload = message.payload
                        assert isinstance(payload, bytes | bytearray)
                        self.messages.append((str(message.topic), orjson.loads(payload)))
            except aiomqtt.MqttError:
                await asyncio.sleep(0.1)  # the broker is down: try again

    async def __aenter__(self) -> MqttListener:
        self._task = asyncio.create_task(self._listen())
        await asyncio.wait_for(self._subscribed.wait(), T(10))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def wait_for(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.messages) < n:
            assert time.monotonic() < deadline, f"{len(self.messages)} of {n} messages came"
            await asyncio.sleep(0.05)
