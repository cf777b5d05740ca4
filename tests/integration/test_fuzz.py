"""Fuzz: over 1,200 malformed messages of 35 kinds, in both modes, against a real server
process. Each is answered with its ``error`` or closes its connection with the right code
(RFC 6455: 1002, 1007, 1009); the server log holds no traceback and no ERROR line; its RSS
grows by less than 20 MB; and a good frame afterwards gets the same detections as before.

Messages that break the WebSocket framing itself are written by :class:`RawWebSocket`,
a few lines of RFC 6455 client that will send what no library would.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from edge_vision.common.aio import with_timeout
from edge_vision.session.receive import check_base64_alphabet

from ..support.clients import connect, frame_binary, frame_json, recv
from ..support.images import png_header_only, text_scene
from ..support.server import ServerProcess
from ..support.timing import T

pytestmark = pytest.mark.timeout(240)

GOOD = text_scene(640, 360, seed=5)
JPG = GOOD.jpeg()
B64 = base64.b64encode(JPG).decode()
MAX_MESSAGE = 1024 * 1024  # the fuzzed server's server.max_message_bytes
CONNECTIONS_PER_MODE = 4
REPEATS = 28  # per error kind and mode: 2 x 25 x 28 = 1,400 error replies


def _jpeg_zero_width() -> bytes:
    sof = b"\xff\xc0\x00\x11\x08" + struct.pack(">HH", 10, 0) + b"\x03" + b"\x01\x22\x00" * 3
    return b"\xff\xd8" + sof + b"\xff\xd9"


def error_kinds() -> list[tuple[str, str | bytes, str]]:
    """(kind, message, the error code it must get). The connection lives on after each."""
    return [
        ("invalid JSON", "{'type': frame", "bad_json"),
        ("JSON array", "[1, 2, 3]", "bad_message"),
        ("unknown type", '{"type":"video","id":1}', "unknown_type"),
        ("no type", '{"id":1}', "bad_field"),
        ("frame without id", f'{{"type":"frame","image":"{B64[:64]}"}}', "bad_field"),
        ("frame without image", '{"type":"frame","id":3}', "bad_field"),
        ("ts not a number", '{"type":"frame","id":4,"ts":"noon","image":"AAAA"}', "bad_field"),
        (
            "id too long",
            orjson.dumps({"type": "frame", "id": "x" * 129, "image": "AAAA"}).decode(),
            "bad_field",
        ),
        ("base64 alphabet", '{"type":"frame","id":5,"image":"%%%not-base64%%%"}', "bad_base64"),
        ("base64 padding", '{"type":"frame","id":6,"image":"AAAAA"}', "bad_base64"),
        ("bad data URL", '{"type":"frame","id":7,"image":"data:image/jpeg,AAAA"}', "bad_base64"),
        ("non-ASCII base64", '{"type":"frame","id":8,"image":"ÄÖÜß"}', "bad_base64"),
        ("not an image", frame_json(9, 1, b"plain text, not a JPEG at all"), "unsupported_image"),
        (
            "JPEG cut before its header",
            frame_binary(10, 1, JPG[:2] + b"\xff\xe0\x00\x10JFIF"),
            "bad_image",
        ),
        ("JPEG of zero width", frame_binary(11, 1, _jpeg_zero_width()), "bad_image"),
        ("PNG without IHDR", frame_binary(12, 1, b"\x89PNG\r\n\x1a\n" + b"\x00" * 20), "bad_image"),
        (
            "over the pixel limit",
            frame_json(13, 1, png_header_only(40_000, 40_000)),
            "image_too_large",
        ),
        ("corrupt PNG body", frame_binary(14, 1, png_header_only(200, 100)), "bad_image"),
        ("binary shorter than 4 bytes", b"\x00\x01", "bad_message"),
        ("binary header length past the end", b"\x00\x00\xff\xff{}", "bad_message"),
        ("binary header not JSON", b"\x00\x00\x00\x05{abc}" + JPG, "bad_json"),
        ("binary settings", b"\x00\x00\x00\x13" + b'{"type":"settings"}' + JPG, "unknown_type"),
        ("binary frame without image", frame_binary(15, 1, b""), "bad_field"),
        ("settings out of range", '{"type":"settings","confidence":7}', "bad_settings"),
        (
            "ping nested 254 deep",
            '{"type":"ping","payload":' + "[" * 254 + "]" * 254 + "}",
            "bad_message",
        ),
    ]


# -- a raw RFC 6455 client ----------------------------------------------------------------


class RawWebSocket:
    """A WebSocket client that writes frames byte by byte as told (RFC 6455 section 5.2)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, path: str) -> RawWebSocket:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = await with_timeout(reader.readuntil(b"\r\n\r\n"), T(10))
        assert head.startswith(b"HTTP/1.1 101"), head
        ws = cls(reader, writer)
        opcode, payload = await ws.read_frame()
        assert opcode == 1 and orjson.loads(payload)["type"] == "hello"
        return ws

    @staticmethod
    def frame(opcode: int, payload: bytes, fin: bool = True, rsv: int = 0) -> bytes:
        head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        return head + mask + _mask(payload, mask)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_frame(self) -> tuple[int, bytes]:
        b0, b1 = await with_timeout(self.reader.readexactly(2), T(15))
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack(">H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack(">Q", await self.reader.readexactly(8))
        return b0 & 0x0F, await self.reader.readexactly(n)

    async def close_code(self) -> int | None:
        """The code of the server's close frame (skipping other frames); None if the
        connection ended without one (a reset: the 'connection lost' of issue 12)."""
        try:
            while True:
                opcode, payload = await self.read_frame()
                if opcode == 8:
                    return int(struct.unpack(">H", payload[:2])[0]) if payload else 1005
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        finally:
            self.writer.close()


def _mask(payload: bytes, mask: bytes) -> bytes:
    """RFC 6455 section 5.3: payload XOR the 4-byte key repeated (as one big integer)."""
    n = len(payload)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")


def close_kinds() -> list[tuple[str, bytes, int]]:
    """(kind, raw bytes to write, the close code the server must send)."""
    f = RawWebSocket.frame
    return [
        ("invalid UTF-8 in text", f(1, b'{"type":"ping","payload":"\xff\xfe"}'), 1007),
        ("message over the size limit", f(2, b"\x00" * (MAX_MESSAGE + 512 * 1024)), 1009),
        ("close code 1006", f(8, struct.pack(">H", 1006)), 1002),
        ("close code 1004", f(8, struct.pack(">H", 1004)), 1002),
        ("close code 5000", f(8, struct.pack(">H", 5000)), 1002),
        ("reserved opcode 3", f(3, b"x"), 1002),
        ("RSV1 without an extension", f(1, b"{}", rsv=4), 1002),
        ("fragmented ping", f(9, b"p", fin=False), 1002),
        ("continuation first", f(0, b"orphan"), 1002),
        ("ping payload over 125 bytes", f(9, b"p" * 126), 1002),
    ]


# -- the run -----------------------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _detections(http: aiohttp.ClientSession, url: str) -> list[Any]:
    ws, _ = await connect(http, url)
    await ws.send_bytes(frame_binary("good", 1.0, JPG))
    while (res := await recv(ws))["type"] != "result":
        pass
    await ws.close()
    assert res["detections"], res
    return [(d["box"], d["score"], d["class"]) for d in res["detections"]]


async def _send_errors(
    http: aiohttp.ClientSession, url: str, messages: list[tuple[str, str | bytes, str]]
) -> Counter[str]:
    """One connection: each message, then its error reply, in turn. Kinds answered."""
    ws, _ = await connect(http, url)
    answered: Counter[str] = Counter()
    for kind, payload, code in messages:
        if isinstance(payload, bytes):
            await ws.send_bytes(payload)
        else:
            await ws.send_str(payload)
        reply = await recv(ws, timeout=30)
        assert reply["type"] == "error" and reply["code"] == code, (kind, reply)
        assert reply["message"], (kind, reply)
        answered[kind] += 1
    await ws.close()
    assert ws.close_code == 1000, ws.close_code
    return answered


async def _fuzz_round(srv: ServerProcess, http: aiohttp.ClientSession, repeats: int) -> int:
    sent = 0
    for mode in ("latest", "every"):
        url = f"{srv.ws_url}?mode={mode}"
        messages = [m for m in error_kinds() for _ in range(repeats)]
        shares = [messages[i::CONNECTIONS_PER_MODE] for i in range(CONNECTIONS_PER_MODE)]
        counts = await asyncio.gather(*(_send_errors(http, url, share) for share in shares))
        total: Counter[str] = sum(counts, Counter())
        assert total == Counter({k: repeats for k, _, _ in error_kinds()}), total
        sent += sum(total.values())
        for kind, raw, code in close_kinds():
            for _ in range(max(1, repeats // 10)):
                ws = await RawWebSocket.open(srv.port, f"/ws?mode={mode}")
                try:
                    await ws.send(raw)
                except ConnectionError:
                    pass  # the close code is what counts, read below
                got = await ws.close_code()
                assert got == code, (mode, kind, got)
                sent += 1
    return sent


async def test_fuzz_every_malformed_message_gets_its_error_or_close_code(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    srv = ServerProcess(
        f"server.max_message_bytes={MAX_MESSAGE}", "logging.level=info", log_path=log
    )
    await asyncio.to_thread(srv.start)
    try:
        await srv.wait_ready()
        assert srv.proc is not None
        async with aiohttp.ClientSession() as http:
            before = await _detections(http, srv.ws_url)
            await _fuzz_round(srv, http, repeats=3)  # warms allocators and code paths
            rss0 = await asyncio.to_thread(_rss_mib, srv.proc.pid)
            sent = await _fuzz_round(srv, http, repeats=REPEATS)
            rss1 = await asyncio.to_thread(_rss_mib, srv.proc.pid)
            after = await _detections(http, srv.ws_url)
    finally:
        await asyncio.to_thread(srv.stop)
    text = await asyncio.to_thread(log.read_text)
    print(f"fuzz: {sent} malformed messages, server RSS {rss0:.1f} -> {rss1:.1f} MiB")
    assert sent >= 1200, sent
    assert len(error_kinds()) + len(close_kinds()) >= 14
    assert "Traceback" not in text, text[-4000:]
    assert " ERROR " not in text, [line for line in text.splitlines() if " ERROR " in line][:5]
    assert rss1 - rss0 < 20, (rss0, rss1)
    assert after == before


def test_the_base64_check_refuses_what_the_decoder_refuses() -> None:
    for payload in (b"AAAA", b"AAA=", b"AA==", B64.encode()):
        check_base64_alphabet(payload)
    for bad in (b"AAAAA", b"A===", b"AA=A", b"AA AA", b"AA\nA", b"%%%%"):
        with pytest.raises(Exception, match="base64"):
            check_base64_alphabet(bad)


@pytest.mark.parametrize("size_mb", [12, 60])
async def test_a_client_still_writing_an_oversized_message_receives_1009(
    server_factory: Any, size_mb: int
) -> None:
    """Issue 12: the server closed the socket under a client writing 60 MB, which saw only
    "connection lost". Now it lingers (server.close_linger_s) and the client gets 1009."""
    srv = await server_factory({"server": {"max_message_bytes": 8 * 1024 * 1024}})
    async with aiohttp.ClientSession() as http:
        ws, _ = await connect(http, srv.ws_url)
        await ws.send_bytes(b"\x00" * (size_mb * 1024 * 1024))  # must not raise
        msg = await ws.receive(timeout=T(30))
        assert msg.type is aiohttp.WSMsgType.CLOSE, (msg.type, msg.data)
        assert msg.data == 1009 and ws.close_code == 1009, (msg.data, ws.close_code)


async def _reset_after(port: int, stage: str) -> None:
    """Open /ws and reset the TCP connection (RST, SO_LINGER 0) at ``stage``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    if stage == "mid-request":
        writer.write(request[:40])
    else:
        writer.write(request)
    await writer.drain()
    if stage == "after-101":
        await reader.readuntil(b"\r\n\r\n")
    elif stage == "mid-hello":
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
    elif stage == "mid-frame":
        await reader.readuntil(b"\r\n\r\n")
        writer.write(RawWebSocket.frame(2, frame_binary(1, 1.0, JPG))[:300])
        await writer.drain()
    writer.transport.abort()


async def test_peers_that_reset_at_any_point_leave_no_traceback(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 12: a peer that reset before hello logged a traceback. Each stage 10 times."""
    caplog.set_level(logging.INFO)
    for stage in ("mid-request", "after-request", "after-101", "mid-hello", "mid-frame"):
        for _ in range(10):
            await _reset_after(server.port, stage)
    await asyncio.sleep(0.5)  # let the server notice every reset
    async with aiohttp.ClientSession() as http:
        assert await _detections(http, server.ws_url)  # still serving
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [(r.name, r.getMessage()) for r in loud[:5]]
