"""Message parsing (sans-I/O): literal inputs, literal expectations."""

from __future__ import annotations

import base64
import struct

import pytest

from edge_vision.common.messages import FrameMessage
from edge_vision.errors import ClientError
from edge_vision.frames.decode import decode_base64
from edge_vision.session.receive import (
    PingMessage,
    SettingsMessage,
    encode_binary_frame,
    encode_json_frame,
    parse_binary,
    parse_text,
)

JPEG = b"\xff\xd8\xff\xe0fake-jpeg"


def frame_text(**fields: object) -> bytes:
    import orjson

    return orjson.dumps({"type": "frame", **fields})


def test_json_frame_keeps_id_ts_and_base64_payload() -> None:
    msg = parse_text(frame_text(id=17, ts=1732950000123.4, image="QUJD"), 5.0)
    assert msg == FrameMessage(17, 1732950000123.4, b"QUJD", True, 5.0)


def test_data_url_prefix_is_stripped() -> None:
    msg = parse_text(frame_text(id="a", image="data:image/jpeg;base64,QUJD"), 0.0)
    assert isinstance(msg, FrameMessage) and msg.image == b"QUJD" and msg.ts is None


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{not json", "bad_json"),
        (b"[1, 2]", "bad_message"),
        (b'{"id": 1}', "bad_field"),
        (b'{"type": "video"}', "unknown_type"),
        (frame_text(image="QUJD"), "bad_field"),
        (frame_text(id=True, image="QUJD"), "bad_field"),
        (frame_text(id=1.5, image="QUJD"), "bad_field"),
        (frame_text(id=1), "bad_field"),
        (frame_text(id=1, image=""), "bad_field"),
        (frame_text(id=1, ts="yesterday", image="QUJD"), "bad_field"),
        (frame_text(id=1, image="data:image/jpeg,QUJD"), "bad_base64"),
        (frame_text(id="x" * 129, image="QUJD"), "bad_field"),
    ],
)
def test_bad_text_messages_get_stable_codes(raw: bytes, code: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_text(raw, 0.0)
    assert info.value.code == code


def test_error_carries_frame_id_when_known() -> None:
    with pytest.raises(ClientError) as info:
        parse_text(frame_text(id=9, ts="x", image="QUJD"), 0.0)
    assert info.value.frame_id == 9


def test_strict_base64() -> None:
    assert decode_base64(base64.b64encode(JPEG)) == JPEG
    with pytest.raises(ClientError) as info:
        decode_base64(b"@@not base64@@")
    assert info.value.code == "bad_base64"


def test_settings_and_ping() -> None:
    s = parse_text(b'{"type":"settings","mode":"every","confidence":0.25,"classes":[0,2]}', 0)
    assert s == SettingsMessage("every", 0.25, [0, 2], False)
    cleared = parse_text(b'{"type":"settings","classes":null}', 0)
    assert isinstance(cleared, SettingsMessage) and cleared.clear_classes
    assert parse_text(b'{"type":"ping","payload":{"t":1}}', 0) == PingMessage({"t": 1})


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"settings","confidence":1.5}',
        b'{"type":"settings","mode":"sometimes"}',
        b'{"type":"settings","classes":[-1]}',
        b'{"type":"settings","classes":"0"}',
        b'{"type":"settings","colour":"red"}',
    ],
)
def test_bad_settings(raw: bytes) -> None:
    with pytest.raises(ClientError) as info:
        parse_text(raw, 0)
    assert info.value.code == "bad_settings"


def test_binary_frame_round_trip() -> None:
    data = encode_binary_frame(42, 99.5, JPEG)
    (n,) = struct.unpack(">I", data[:4])
    assert data[4 : 4 + n].startswith(b"{")
    assert parse_binary(data, 1.0) == FrameMessage(42, 99.5, JPEG, False, 1.0)


def test_json_frame_round_trip() -> None:
    data = encode_json_frame(42, 99.5, JPEG)
    b64 = base64.b64encode(JPEG)
    assert data == f'{{"type":"frame","id":42,"ts":99.5,"image":"{b64.decode()}"}}'
    assert parse_text(data, 1.0) == FrameMessage(42, 99.5, b64, True, 1.0)
    # a str is already base64 (or a data URL) and goes out as it is; ts None goes as null
    data_url = encode_json_frame("a", None, "data:image/jpeg;base64,QUJD")
    assert parse_text(data_url, 0.0) == FrameMessage("a", None, b"QUJD", True, 0.0)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"\x00\x00", "bad_message"),
        (struct.pack(">I", 0) + JPEG, "bad_message"),
        (struct.pack(">I", 10_000) + b"{}", "bad_message"),
        (struct.pack(">I", 3) + b"{x}" + JPEG, "bad_json"),
        (struct.pack(">I", 2) + b"{}" + JPEG, "bad_field"),
        (encode_binary_frame(1, None, b""), "bad_field"),
        (struct.pack(">I", 15) + b'{"type":"ping"}' + JPEG, "unknown_type"),
    ],
)
def test_bad_binary_messages(raw: bytes, code: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_binary(raw, 0.0)
    assert info.value.code == code
