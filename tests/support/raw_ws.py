"""A WebSocket client on a bare TCP socket, for tests that must do what no library client
does: stop reading, close with a FIN or a reset (SO_LINGER 0) mid-stream, send frames the
RFC forbids (unmasked), or send a handshake with odd headers.

RFC 6455 section 5.2 framing, written here so that every bit on the wire is the test's.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .timing import T

TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes, *, masked: bool = True) -> bytes:
    """One final frame (section 5.2); a client must mask it (section 5.3)."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([mask_bit | n])
    elif n < 1 << 16:
        head += bytes([mask_bit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([mask_bit | 127]) + struct.pack(">Q", n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    data = np.frombuffer(payload, np.uint8)
    pad = np.resize(np.frombuffer(key, np.uint8), data.size)
    return head + key + (data ^ pad).tobytes()


@dataclass
class RawSocket:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int
    headers: dict[str, str]

    @property
    def sock(self) -> socket.socket:
        s: socket.socket = self.writer.get_extra_info("socket")
        return s

    def send(self, opcode: int, payload: bytes, *, masked: bool = True) -> None:
        """Queue one frame (written as the kernel takes it; never waits)."""
        self.writer.write(frame(opcode, payload, masked=masked))

    async def read_frame(self, timeout: float = 10) -> tuple[int, bytes]:
        """The next frame from the server (servers never mask): (opcode, payload)."""
        head = await asyncio.wait_for(self.reader.readexactly(2), T(timeout))
        n = head[1] & 0x7F
        if n == 126:
            (n,) = struct.unpack(">H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack(">Q", await self.reader.readexactly(8))
        payload = await asyncio.wait_for(self.reader.readexactly(n), T(timeout))
        return head[0] & 0x0F, payload

    def close_with_fin(self) -> None:
        """The client's side ends as a process's close() would: FIN after what it wrote,
        and nothing it was sent is ever read."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.writer.transport.abort()

    def close_with_reset(self) -> None:
        """The client's side ends with a TCP reset (SO_LINGER 0): a crashed process, a
        phone that lost its network."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:  # already closed (by the server's reset, say)
            pass
        self.writer.transport.abort()


async def handshake(
    port: int,
    path: str = "/ws",
    headers: list[tuple[str, str]] | None = None,
    *,
    host: str = "127.0.0.1",
    timeout: float = 10,
    then: bytes = b"",
) -> RawSocket:
    """Open a TCP connection and send a WebSocket upgrade (``headers`` may replace Host);
    the answer's status and headers (the socket is a WebSocket only when it is 101)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), T(timeout))
    key = base64.b64encode(os.urandom(16)).decode()
    extra = headers or []
    own_host = [] if any(k.lower() == "host" for k, _ in extra) else [f"Host: {host}:{port}"]
    lines = [
        f"GET {path} HTTP/1.1",
        *own_host,
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{k}: {v}" for k, v in extra),
    ]
    # ``then``: bytes sent with the request, before the answer (frames in the same packet)
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + then)
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), T(timeout))
    status_line, *header_lines = raw.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    got = {}
    for line in header_lines:
        if ":" in line:
            k, v = line.split(":", 1)
            got[k.strip().lower()] = v.strip()
    return RawSocket(reader, writer, status, got)


# /proc/net/tcp's states (include/net/tcp_states.h)
TCP_STATES = {1: "ESTABLISHED", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE"}


def server_sockets(port: int) -> list[tuple[str, int]]:
    """Every IPv4 TCP socket whose local port is ``port`` except the listener, as the
    kernel lists them (/proc/net/tcp): (state, bytes in its send queue)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].split(":")[1], 16)
        state = int(fields[3], 16)
        if local_port != port or state == 10:  # 10: LISTEN
            continue
        tx_queue = int(fields[4].split(":")[0], 16)
        found.append((TCP_STATES.get(state, str(state)), tx_queue))
    return found
