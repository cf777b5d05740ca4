"""A real redis-server for tests: a free loopback port, a unix socket, or TLS; no persistence."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from edge_vision.state.redis import driver_info_options

from .server import free_port
from .timing import T


def make_self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, made by the openssl command."""
    cert, key = folder / "redis.crt", folder / "redis.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


class RedisServer:
    """``redis-server`` as a child process; ``kill()`` then ``start()`` brings it back,
    empty, on the same address (a Redis restart without persistence)."""

    def __init__(
        self,
        workdir: Path,
        *,
        unix_socket: bool = False,
        tls: bool = False,
        password: str | None = None,
    ) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed; scripts/test installs it")
        self.exe = exe
        self.workdir = workdir
        self.port = free_port()
        self.password = password
        # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
        self._sock_dir = Path(tempfile.mkdtemp(prefix="ev-redis-")) if unix_socket else None
        self.cert: Path | None = None
        self.key: Path | None = None
        if tls:
            self.cert, self.key = make_self_signed_cert(workdir)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path | None:
        return self._sock_dir / "redis.sock" if self._sock_dir else None

    @property
    def url(self) -> str:
        if self.socket_path is not None:
            return f"unix://{self.socket_path}?db=0"
        scheme = "rediss" if self.cert else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def _args(self) -> list[str]:
        args = [self.exe, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.workdir)]
        if self.socket_path is not None:
            args += ["--port", "0", "--unixsocket", str(self.socket_path)]
        elif self.cert is not None and self.key is not None:
            args += ["--port", "0", "--tls-port", str(self.port)]
            args += ["--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key)]
            args += ["--tls-ca-cert-file", str(self.cert), "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        if self.password is not None:
            args += ["--requirepass", self.password]
        return args

    def _connect(self) -> socket.socket:
        if self.socket_path is not None:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.settimeout(0.5)
                s.connect(str(self.socket_path))
            except OSError:
                s.close()
                raise
            return s
        s = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
        if self.cert is not None:
            ctx = ssl.create_default_context(cafile=str(self.cert))
            try:
                return ctx.wrap_socket(s, server_hostname="127.0.0.1")
            except OSError:
                s.close()
                raise
        return s

    def _answers_ping(self) -> bool:
        try:
            with self._connect() as c:
                if self.password is not None:
                    c.sendall(f"AUTH {self.password}\r\n".encode())
                    if not c.recv(64).startswith(b"+OK"):
                        return False
                c.sendall(b"PING\r\n")
                return c.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + T(10)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if self._answers_ping():
                return self
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def freeze(self) -> None:
        """SIGSTOP: Redis stops answering but keeps its sockets open (a slow Redis)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: what a crash looks like to clients (no goodbye, all data gone)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)


def raw_client(url: str) -> Any:
    """A plain redis.asyncio client, to look at keys the way an operator would:
    ``async with raw_client(url) as raw:`` closes it at the end."""
    # Retries, because tests restart Redis under it and every pooled connection dies then.
    retry = Retry(NoBackoff(), 3)
    return aioredis.from_url(url, decode_responses=True, retry=retry, **driver_info_options())


async def key_gone(raw: Any, key: str) -> bool:
    """Whether ``key`` no longer exists (deleted, or expired by its TTL)."""
    return bool(await raw.exists(key) == 0)
