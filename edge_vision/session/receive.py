"""Stage 1, receive: client messages parsed into typed values. Sans-I/O.

Two wire forms carry a frame (docs/protocol.md):

* a text message, JSON: ``{"type":"frame","id":17,"ts":1732950000123.4,"image":"<base64>"}``;
  the base64 may carry a ``data:image/jpeg;base64,`` prefix;
* a binary message: a 4-byte big-endian header length ``n``, then ``n`` bytes of the same
  JSON header without ``image``, then the raw JPEG/PNG bytes (no base64 tax).

Everything here is a pure function of the message; errors are :class:`ClientError` with
a protocol code. Base64 is *not* decoded here: that happens in the decode stage, off the
event loop, and only for frames that are actually served (latest-wins drops are free).
"""

from __future__ import annotations

import math
import struct
from base64 import b64encode
from dataclasses import dataclass
from typing import Any

import orjson

from ..common.messages import FrameId, FrameMessage
from ..common.settings import Mode, is_mode
from ..errors import ClientError
from ..frames.decode import check_pixel_limit, decode_base64, read_image_header

#: The version this release speaks by default; SUPPORTED_VERSIONS are all it serves (the
#: current and the previous one). What differs between them: edge_vision/session/versions.py.
PROTOCOL_VERSION = 3
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2, 3)
BINARY_HEADER_MAX = 64 * 1024
_LEN = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class SettingsMessage:
    """Per-session settings; fields left ``None`` keep their value."""

    mode: Mode | None = None
    confidence: float | None = None
    classes: list[int] | None = None
    clear_classes: bool = False
    track: bool | None = None  # since protocol 2: track ids on (default) or off
    input_size: int | None = None  # since protocol 2: engine input long side
    clear_input_size: bool = False  # "input_size": null: back to the server's default
    read: bool | None = None  # since protocol 2: read the boxes' text (read.py); off default
    # Since protocol 3: the session's own zones, lines and rules, as sent (checked by
    # edge_vision.events); a key present with null clears it, an absent one keeps it.
    events: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class PingMessage:
    """Application-level ping (browsers cannot send WebSocket pings)."""

    payload: Any = None


ClientMessage = FrameMessage | SettingsMessage | PingMessage


def _frame_fields(obj: dict[str, Any]) -> tuple[FrameId, float | int | None]:
    if "id" not in obj:
        raise ClientError("bad_field", "frame is missing 'id'")
    fid = obj["id"]
    if isinstance(fid, bool) or not isinstance(fid, int | str):
        raise ClientError("bad_field", "'id' must be an integer or a string")
    if isinstance(fid, str) and len(fid) > 128:
        raise ClientError("bad_field", "'id' longer than 128 characters")
    ts = obj.get("ts")
    if ts is not None and (
        isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts)
    ):
        raise ClientError("bad_field", "'ts' must be a finite number", fid)
    return fid, ts


def strip_data_url(image: str) -> str:
    """``data:image/jpeg;base64,AAAA`` → ``AAAA``; plain base64 passes through."""
    if image.startswith("data:"):
        head, sep, rest = image.partition(",")
        if not sep or not head.endswith(";base64"):
            raise ClientError("bad_base64", "data URL must be of the form data:<mime>;base64,...")
        return rest
    return image


_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
# Base64 characters decoded to find an image's header on arrival: 192 KiB of image, more
# than the EXIF/ICC segments a camera JPEG carries before its frame header.
_B64_HEAD = 256 * 1024


def check_base64_alphabet(payload: bytes) -> None:
    """What :func:`decode_base64` would refuse, without decoding: characters outside the
    RFC 4648 section 4 alphabet, misplaced padding, a length not a multiple of 4. One
    C-speed pass (``bytes.translate``), about 0.5 ms per MB."""
    body = payload.rstrip(b"=")
    if len(payload) % 4 or len(payload) - len(body) > 2:
        raise ClientError("bad_base64", "'image' is not valid base64: bad length or padding")
    if body.translate(None, _B64_ALPHABET):
        raise ClientError("bad_base64", "'image' holds characters outside the base64 alphabet")


def check_frame(frame: FrameMessage, max_pixels: int) -> None:
    """The cheap checks every frame gets as it arrives, before admission, so that a
    malformed frame is answered with its ``error`` even in latest mode (where an admitted
    frame may be replaced by a newer one before it is decoded): the base64 alphabet, the
    image's magic bytes (JPEG or PNG), its header (width and height) and the pixel
    limit. Decoding pixels is left to the frames admitted.

    Of a base64 image only the first 192 KiB are decoded; a JPEG whose frame header lies
    beyond them is checked by the decode stage instead (a prefix never causes a refusal
    the whole image would not)."""
    try:
        if frame.image_is_base64:
            check_base64_alphabet(frame.image)
            head = decode_base64(frame.image[:_B64_HEAD])
            whole = len(frame.image) <= _B64_HEAD
        else:
            head, whole = frame.image, True
        try:
            header = read_image_header(head)
        except ClientError as e:
            if whole or e.code != "bad_image":
                raise
            return  # maybe only the prefix is short of the header: the decoder decides
        check_pixel_limit(header, max_pixels)
    except ClientError as e:
        raise e.with_frame_id(frame.id) from None


class MessageBudget:
    """One connection's read budget: a token bucket of ``rate`` messages per second and
    ``burst`` at once. Sans-I/O: the caller passes the time (``time.monotonic()``).

    :meth:`take` spends one message and says how long to wait before reading it. The
    reader waits that long *without reading*: aiohttp's read queue fills, aiohttp pauses
    the socket, the kernel's buffers fill and TCP stops the sender (back-pressure), so a
    flood costs the server at most ``rate`` messages a second. ``rate`` 0: no budget."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if burst < 1:
            raise ValueError("burst must be >= 1")
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._at = now

    def take(self, now: float) -> float:
        """Spend one message; the seconds to wait before reading it (0.0: read now)."""
        if self.rate <= 0:
            return 0.0
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


#: The settings of a session's own events (since protocol 3).
_EVENTS = ("zones", "lines", "rules")


def _settings(obj: dict[str, Any]) -> SettingsMessage:
    known = {"type", "mode", "confidence", "classes", "track", "input_size", "read", *_EVENTS}
    extra = sorted(set(obj) - known)
    if extra:
        raise ClientError(
            "bad_settings", f"unknown settings {extra}; known: {sorted(known - {'type'})}"
        )
    mode = obj.get("mode")
    if mode is not None and not is_mode(mode):
        raise ClientError("bad_settings", "'mode' must be 'latest' or 'every'")
    conf = obj.get("confidence")
    if conf is not None:
        if isinstance(conf, bool) or not isinstance(conf, int | float) or not 0 <= conf <= 1:
            raise ClientError("bad_settings", "'confidence' must be a number in [0, 1]")
        conf = float(conf)
    classes = obj.get("classes")
    clear = "classes" in obj and classes is None
    if classes is not None:
        if not isinstance(classes, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in classes
        ):
            raise ClientError("bad_settings", "'classes' must be a list of class indices or null")
        if len(classes) > 1000:
            raise ClientError("bad_settings", "'classes' lists more than 1000 classes")
    track = obj.get("track")
    if track is not None and not isinstance(track, bool):
        raise ClientError("bad_settings", "'track' must be true or false")
    size = obj.get("input_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
        raise ClientError("bad_settings", "'input_size' must be a positive integer or null")
    read = obj.get("read")
    if read is not None and not isinstance(read, bool):
        raise ClientError("bad_settings", "'read' must be true or false")
    events = {k: obj[k] for k in _EVENTS if k in obj}
    for key, value in events.items():
        kind = list if key == "rules" else dict
        if value is not None and not isinstance(value, kind):
            what = "a list of rules" if key == "rules" else "a mapping of name to points"
            raise ClientError("bad_settings", f"'{key}' must be {what}, or null")
    return SettingsMessage(
        mode=mode,
        confidence=conf,
        classes=classes,
        clear_classes=clear,
        track=track,
        input_size=size,
        clear_input_size="input_size" in obj and size is None,
        read=read,
        events=events or None,
    )


def _load_object(data: bytes | str, what: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise ClientError("bad_json", f"{what} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ClientError("bad_message", f"{what} must be a JSON object")
    return obj


def parse_text(data: bytes | str, received_at: float) -> ClientMessage:
    """Parse a text WebSocket message."""
    obj = _load_object(data, "message")
    kind = obj.get("type")
    if kind == "frame":
        fid, ts = _frame_fields(obj)
        image = obj.get("image")
        if not isinstance(image, str) or not image:
            raise ClientError("bad_field", "frame is missing 'image' (base64 string)", fid)
        try:
            payload = strip_data_url(image).encode("ascii")
        except UnicodeEncodeError:
            raise ClientError("bad_base64", "'image' holds non-ASCII characters", fid) from None
        except ClientError as e:
            raise e.with_frame_id(fid) from None
        return FrameMessage(fid, ts, payload, True, received_at)
    if kind == "settings":
        return _settings(obj)
    if kind == "ping":
        return PingMessage(obj.get("payload"))
    if kind is None:
        raise ClientError("bad_field", "message is missing 'type'")
    raise ClientError(
        "unknown_type", f"unknown message type {kind!r}; known: frame, settings, ping"
    )


def parse_binary(data: bytes, received_at: float) -> FrameMessage:
    """Parse a binary frame message: u32 big-endian header length, JSON header, image bytes."""
    if len(data) < _LEN.size:
        raise ClientError("bad_message", "binary message shorter than its 4-byte header length")
    (n,) = _LEN.unpack_from(data)
    if n == 0 or n > BINARY_HEADER_MAX or _LEN.size + n > len(data):
        raise ClientError(
            "bad_message",
            f"binary header length {n} is invalid for a {len(data)}-byte message "
            f"(1..{BINARY_HEADER_MAX} and inside the message)",
        )
    obj = _load_object(data[_LEN.size : _LEN.size + n], "binary header")
    kind = obj.get("type", "frame")
    if kind != "frame":
        raise ClientError("unknown_type", f"binary messages carry frames only, not {kind!r}")
    fid, ts = _frame_fields(obj)
    image = data[_LEN.size + n :]
    if not image:
        raise ClientError("bad_field", "binary frame carries no image bytes", fid)
    return FrameMessage(fid, ts, image, False, received_at)


def encode_binary_frame(frame_id: FrameId, ts: float | None, image: bytes) -> bytes:
    """Build a binary frame message (used by our clients: replay, bench, tests)."""
    header = orjson.dumps({"type": "frame", "id": frame_id, "ts": ts})
    return _LEN.pack(len(header)) + header + image


def encode_json_frame(frame_id: FrameId, ts: float | None, image: bytes | str) -> str:
    """Build a text (JSON) frame message (used by our clients: replay, bench, tests).

    ``image``: the raw JPEG/PNG bytes, base64-encoded here; or a ``str`` that already is
    the base64 text (or a data URL), sent as it is. ``ts`` None is sent as ``null``."""
    b64 = b64encode(image).decode("ascii") if isinstance(image, bytes) else image
    return orjson.dumps({"type": "frame", "id": frame_id, "ts": ts, "image": b64}).decode()
