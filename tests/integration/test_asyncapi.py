"""docs/asyncapi.yaml is the protocol's contract: it validates with the real AsyncAPI parser,
every message a running server sends validates against its schema, and the server's own
parser (edge_vision/session/receive.py) and the schemas agree on valid and invalid client messages.

The validator is @asyncapi/parser from npm, installed by scripts/test into .npm-tools/.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from edge_vision.common.close_codes import CloseCode
from edge_vision.errors import ERROR_CODES, ClientError
from edge_vision.frames.decode import decode_base64
from edge_vision.model.spec import ModelSpec
from edge_vision.session.receive import (
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    encode_binary_frame,
    parse_binary,
    parse_text,
    strip_data_url,
)

from ..support.clients import connect, frame_binary, frame_json, recv, recv_type
from ..support.images import blank_scene, text_scene
from ..support.server import RunningServer, make_config, running_server
from ..support.timing import T

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
DOC_PATH = REPO / "docs" / "asyncapi.yaml"
VALIDATE_JS = REPO / "tests" / "support" / "asyncapi_validate.mjs"
NPM_TOOLS = REPO / ".npm-tools"
DOC: dict[str, Any] = yaml.safe_load(DOC_PATH.read_text())
_REGISTRY: Registry[Any] = Registry().with_resource(
    "urn:edge-vision:asyncapi", Resource.from_contents(DOC, default_specification=DRAFT7)
)


def validator(pointer: str) -> Draft7Validator:
    """A JSON Schema validator for the schema at ``pointer`` inside the document."""
    return Draft7Validator({"$ref": f"urn:edge-vision:asyncapi#{pointer}"}, registry=_REGISTRY)


def schema_errors(pointer: str, instance: Any) -> list[str]:
    return [e.message for e in validator(pointer).iter_errors(instance)]


#: Which schema a server message is checked against, by its ``type``.
SERVER_MESSAGE = {
    "hello": "/components/schemas/Hello",
    "result": "/components/schemas/Result",
    "error": "/components/schemas/Error",
    "settings": "/components/schemas/SettingsAck",
    "pong": "/components/schemas/Pong",
    "closing": "/components/schemas/Closing",
    "event": "/components/schemas/Event",
}
#: A text message from a client is valid when it is one of these.
CLIENT_TEXT = {
    "oneOf": [
        {"$ref": "urn:edge-vision:asyncapi#/components/schemas/FrameText"},
        {"$ref": "urn:edge-vision:asyncapi#/components/schemas/Settings"},
        {"$ref": "urn:edge-vision:asyncapi#/components/schemas/Ping"},
    ]
}


def run_validator(path: Path) -> tuple[int, dict[str, Any]]:
    node = shutil.which("node")
    assert node, "node is not installed; scripts/test installs it"
    assert (NPM_TOOLS / "node_modules" / "@asyncapi" / "parser").is_dir(), (
        "@asyncapi/parser is not installed in .npm-tools/; run scripts/test"
    )
    done = subprocess.run(
        [node, str(VALIDATE_JS), str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=T(60),
        check=False,
    )
    assert done.stdout, f"validator printed nothing: {done.stderr}"
    return done.returncode, json.loads(done.stdout)


# -- the document itself ------------------------------------------------------------------


def test_document_validates_with_the_asyncapi_parser() -> None:
    code, out = run_validator(DOC_PATH)
    errors = [d for d in out["diagnostics"] if d["severity"] == 0]
    assert code == 0 and not errors, errors
    warnings = [d for d in out["diagnostics"] if d["severity"] == 1]
    assert not warnings, warnings
    assert out["parsed"] == {"version": "3.0.0", "messages": 11}


def test_the_validator_refuses_a_broken_document(tmp_path: Path) -> None:
    """The parser really checks: a dangling message reference is an error, not a pass."""
    broken = yaml.safe_load(DOC_PATH.read_text())
    del broken["components"]["messages"]["hello"]
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    code, out = run_validator(path)
    assert code == 1
    assert any(d["severity"] == 0 for d in out["diagnostics"])


def test_document_states_this_releases_versions_and_error_codes() -> None:
    assert DOC["info"]["version"] == str(PROTOCOL_VERSION)
    hello = DOC["components"]["schemas"]["Hello"]["properties"]
    assert hello["protocol"]["enum"] == list(SUPPORTED_VERSIONS)
    query = DOC["channels"]["session"]["bindings"]["ws"]["query"]["properties"]
    assert query["protocol"]["enum"] == [str(v) for v in SUPPORTED_VERSIONS]
    assert DOC["components"]["schemas"]["ErrorCode"]["enum"] == list(ERROR_CODES)
    closes = DOC["info"]["description"].split("**Close codes**", 1)[1].split("**", 1)[0]
    for code in CloseCode:  # every code the server sends, in the document's close codes
        assert str(int(code)) in closes, f"close code {int(code)} ({code.name}) undocumented"


def test_every_example_validates_against_its_message_schema() -> None:
    checked = 0
    for name, message in DOC["components"]["messages"].items():
        for example in message.get("examples", []):
            errors = schema_errors(f"/components/messages/{name}/payload", example["payload"])
            assert not errors, (name, errors)
            checked += 1
    assert checked >= 9


# -- real messages from a running server -------------------------------------------------


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = DOC
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def undeclared(schema: dict[str, Any], instance: Any, where: str) -> list[str]:
    """Fields of ``instance`` its schema does not name, where the schema leaves
    ``additionalProperties`` unsaid: a field a server sends must be in the document.
    The parts of an ``allOf`` name fields together."""
    schema = _resolve(schema)
    parts = [schema] + [_resolve(p) for p in schema.get("allOf", [])]
    found: list[str] = []
    for variant in schema.get("oneOf", []):
        found += undeclared(variant, instance, where)
    if isinstance(instance, list):
        for part in parts:
            for item in instance if "items" in part else []:
                found += undeclared(part["items"], item, f"{where}[]")
    named = [p for p in parts if "properties" in p]
    if not isinstance(instance, dict) or not named:
        return found
    props: dict[str, Any] = {}
    for part in named:
        props.update(part["properties"])
    if not any("additionalProperties" in p for p in parts):
        found += [f"{where}.{k}" for k in instance if k not in props]
    for key, sub in props.items():
        if key in instance:
            found += undeclared(sub, instance[key], f"{where}.{key}")
    return found


def assert_valid_server_message(obj: dict[str, Any]) -> None:
    kind = obj.get("type")
    assert kind in SERVER_MESSAGE, f"the document has no server message {kind!r}: {obj}"
    errors = schema_errors(SERVER_MESSAGE[kind], obj)
    assert not errors, (kind, errors, obj)
    missing = undeclared({"$ref": "#" + SERVER_MESSAGE[kind]}, obj, kind)
    assert not missing, f"fields the server sends that docs/asyncapi.yaml lacks: {missing}"


async def test_real_messages_of_a_session_validate(server: RunningServer) -> None:
    scene = text_scene(960, 540, texts=[("LOT 0042", (300, 200))])
    seen: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession() as s:
        for url in (server.ws_url + "?mode=every", server.ws_url + "?protocol=1&mode=every"):
            ws, hello = await connect(s, url)
            seen["hello"] = hello
            assert_valid_server_message(hello)
            await ws.send_str(orjson.dumps({"type": "settings", "confidence": 0.4}).decode())
            await ws.send_str(frame_json("a", 1.5, scene.jpeg()))
            await ws.send_bytes(frame_binary(2, None, blank_scene(320, 240).jpeg()))
            await ws.send_bytes(frame_binary(3, 2.0, scene.jpeg()[:400]))  # truncated
            await ws.send_bytes(frame_binary(4, 2.5, b"not an image"))
            await ws.send_str("{not json")
            await ws.send_str(orjson.dumps({"type": "nope"}).decode())
            await ws.send_str(orjson.dumps({"type": "settings", "mode": "x"}).decode())
            await ws.send_str(orjson.dumps({"type": "ping", "payload": {"k": [1]}}).decode())
            for _ in range(9):
                obj = await recv(ws)
                assert_valid_server_message(obj)
                seen.setdefault(obj["type"], obj)
                seen[f"{obj['type']}:{obj.get('code', obj.get('id'))}"] = obj
            await ws.close()
    assert seen["result:a"]["detections"], "the text scene's result has boxes to check"
    assert seen["result:2"]["ts"] is None
    codes = {k.split(":", 1)[1] for k in seen if k.startswith("error:")}
    assert {"bad_image", "unsupported_image", "bad_json", "unknown_type", "bad_settings"} <= codes
    assert {"hello", "settings", "result", "error", "pong"} <= set(seen)
    known = DOC["components"]["schemas"]["Hello"]["properties"]["features"]["x-known-features"]
    assert set(seen["hello"]["features"]) <= set(known), "a feature the document does not name"


async def test_a_result_with_text_read_validates(server: RunningServer) -> None:
    """Reading (feature ``read``) adds fields to detections and timing: documented too."""
    scene = text_scene(960, 540, texts=[("LOT 0042", (300, 200))])
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, server.ws_url)
        assert "read" in hello["features"], "the default server reads text on request"
        await ws.send_str(orjson.dumps({"type": "settings", "read": True}).decode())
        answer = await recv_type(ws, "settings")
        await ws.send_bytes(frame_binary(1, 1.0, scene.jpeg()))
        res = await recv_type(ws, "result", timeout=60)
        await ws.close()
    assert answer["read"] is True
    assert res["detections"] and all("text" in d for d in res["detections"])
    assert "read_ms" in res["timing"]
    for obj in (answer, res):
        assert_valid_server_message(obj)


async def test_closing_before_a_shutdown_validates(spec: ModelSpec) -> None:
    got: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as s:
        async with running_server(make_config(), spec) as srv:
            ws, hello = await connect(s, srv.ws_url)

            async def read_until_closed() -> None:
                while True:
                    msg = await ws.receive(timeout=T(30))
                    if msg.type is not aiohttp.WSMsgType.TEXT:
                        return
                    got.append(orjson.loads(msg.data))

            reader = asyncio.create_task(read_until_closed())
        await asyncio.wait_for(reader, T(30))  # the server shut down: closing, then 1001
        assert ws.close_code == 1001
    assert [m["type"] for m in got] == ["closing"]
    assert got[0]["resume_token"] == hello["resume_token"]
    assert_valid_server_message(got[0])


# -- the server's parser and the schemas agree -------------------------------------------

JPEG_B64 = "/9j/4AAQSkZJRg=="
# (description, message, valid): text messages a client may send.
TEXT_CASES: list[tuple[str, Any, bool]] = [
    ("frame", {"type": "frame", "id": 1, "ts": 2.5, "image": JPEG_B64}, True),
    ("string id, no ts", {"type": "frame", "id": "cam/1", "image": JPEG_B64}, True),
    ("null ts", {"type": "frame", "id": 0, "ts": None, "image": JPEG_B64}, True),
    ("data url", {"type": "frame", "id": 1, "image": "data:image/png;base64," + JPEG_B64}, True),
    ("extra field", {"type": "frame", "id": 1, "image": JPEG_B64, "camera": "c3"}, True),
    ("128-char id", {"type": "frame", "id": "x" * 128, "image": JPEG_B64}, True),
    ("129-char id", {"type": "frame", "id": "x" * 129, "image": JPEG_B64}, False),
    ("no id", {"type": "frame", "image": JPEG_B64}, False),
    ("bool id", {"type": "frame", "id": True, "image": JPEG_B64}, False),
    ("list id", {"type": "frame", "id": [1], "image": JPEG_B64}, False),
    ("null id", {"type": "frame", "id": None, "image": JPEG_B64}, False),
    ("string ts", {"type": "frame", "id": 1, "ts": "now", "image": JPEG_B64}, False),
    ("bool ts", {"type": "frame", "id": 1, "ts": False, "image": JPEG_B64}, False),
    ("no image", {"type": "frame", "id": 1}, False),
    ("empty image", {"type": "frame", "id": 1, "image": ""}, False),
    ("image not a string", {"type": "frame", "id": 1, "image": 5}, False),
    ("not base64", {"type": "frame", "id": 1, "image": "not base64!"}, False),
    ("unpadded base64", {"type": "frame", "id": 1, "image": "AAA"}, False),
    ("base64 with a newline", {"type": "frame", "id": 1, "image": "AAAA\nAAAA"}, False),
    ("non-ascii image", {"type": "frame", "id": 1, "image": "AAAé"}, False),
    ("data url without base64", {"type": "frame", "id": 1, "image": "data:image/png,AAAA"}, False),
    ("settings", {"type": "settings", "mode": "every", "confidence": 0.3, "classes": [0]}, True),
    ("settings, none", {"type": "settings"}, True),
    ("settings, clear classes", {"type": "settings", "classes": None}, True),
    ("settings, null keeps", {"type": "settings", "mode": None, "confidence": None}, True),
    ("settings, confidence 0 and 1", {"type": "settings", "confidence": 1}, True),
    ("settings, bad mode", {"type": "settings", "mode": "fast"}, False),
    ("settings, confidence > 1", {"type": "settings", "confidence": 1.5}, False),
    ("settings, confidence < 0", {"type": "settings", "confidence": -0.1}, False),
    ("settings, bool confidence", {"type": "settings", "confidence": True}, False),
    ("settings, unknown key", {"type": "settings", "speed": 3}, False),
    ("settings, negative class", {"type": "settings", "classes": [-1]}, False),
    ("settings, bool class", {"type": "settings", "classes": [True]}, False),
    ("settings, classes not a list", {"type": "settings", "classes": 3}, False),
    ("settings, 1001 classes", {"type": "settings", "classes": list(range(1001))}, False),
    ("settings, track off", {"type": "settings", "track": False}, True),
    ("settings, track null", {"type": "settings", "track": None}, True),
    ("settings, track a string", {"type": "settings", "track": "no"}, False),
    ("settings, input size", {"type": "settings", "input_size": 960}, True),
    ("settings, input size null", {"type": "settings", "input_size": None}, True),
    ("settings, input size 0", {"type": "settings", "input_size": 0}, False),
    ("settings, input size bool", {"type": "settings", "input_size": True}, False),
    ("settings, input size text", {"type": "settings", "input_size": "960"}, False),
    ("settings, read on", {"type": "settings", "read": True}, True),
    ("settings, read null", {"type": "settings", "read": None}, True),
    ("settings, read a number", {"type": "settings", "read": 1}, False),
    ("settings, rules null", {"type": "settings", "rules": None, "zones": None}, True),
    ("settings, rules a mapping", {"type": "settings", "rules": {"r": 1}}, False),
    ("settings, zones a list", {"type": "settings", "zones": [[0, 0]]}, False),
    ("settings, lines a number", {"type": "settings", "lines": 3}, False),
    ("ping", {"type": "ping", "payload": {"any": ["thing"]}}, True),
    ("ping, no payload", {"type": "ping"}, True),
    ("unknown type", {"type": "hello"}, False),
    ("no type", {"id": 1, "image": JPEG_B64}, False),
    ("not an object", [1, 2], False),
    ("a number", 3, False),
]
# (description, binary header, valid)
BINARY_CASES: list[tuple[str, Any, bool]] = [
    ("header", {"type": "frame", "id": 7, "ts": 1.0}, True),
    ("type omitted", {"id": "cam-1/9"}, True),
    ("extra field", {"id": 1, "camera": 3}, True),
    ("other type", {"type": "settings", "id": 1}, False),
    ("null type", {"type": None, "id": 1}, False),
    ("no id", {"type": "frame"}, False),
    ("float ts ok, string ts not", {"id": 1, "ts": "1"}, False),
    ("long id", {"id": "y" * 129}, False),
    ("not an object", ["frame", 1], False),
]


def server_accepts_text(message: Any) -> bool:
    """What the server does with the message: parse it, then (for a frame) decode its base64."""
    try:
        parsed = parse_text(orjson.dumps(message), 0.0)
        if parsed.__class__.__name__ == "FrameMessage":
            image = message["image"]
            decode_base64(strip_data_url(image).encode("ascii"))
    except ClientError:
        return False
    return True


@pytest.mark.parametrize(("what", "message", "valid"), TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_parser_and_schema_agree_on_text_messages(what: str, message: Any, valid: bool) -> None:
    schema_ok = not list(Draft7Validator(CLIENT_TEXT, registry=_REGISTRY).iter_errors(message))
    assert server_accepts_text(message) is valid, f"server: {what}"
    assert schema_ok is valid, f"schema: {what}"


@pytest.mark.parametrize(
    ("what", "header", "valid"), BINARY_CASES, ids=[c[0] for c in BINARY_CASES]
)
def test_parser_and_schema_agree_on_binary_headers(what: str, header: Any, valid: bool) -> None:
    raw = orjson.dumps(header)
    try:
        parse_binary(struct.pack(">I", len(raw)) + raw + b"\xff\xd8jpeg", 0.0)
        server_ok = True
    except ClientError:
        server_ok = False
    schema_ok = not schema_errors("/components/schemas/BinaryFrameHeader", header)
    assert server_ok is valid, f"server: {what}"
    assert schema_ok is valid, f"schema: {what}"


def test_our_encoders_write_what_the_schemas_describe() -> None:
    header_len = struct.unpack_from(">I", encode_binary_frame(3, 1.5, b"\xff\xd8"))[0]
    header = orjson.loads(encode_binary_frame(3, 1.5, b"\xff\xd8")[4 : 4 + header_len])
    assert not schema_errors("/components/schemas/BinaryFrameHeader", header)
    text = orjson.loads(frame_json(4, None, b"\xff\xd8\xff"))
    assert not schema_errors("/components/schemas/FrameText", text)


def test_the_one_known_difference_is_documented() -> None:
    """JSON Schema cannot tell 1 from 1.0 (the same number); the server takes only 1 as an
    integer id or class. The schema's description says so; this pins both sides."""
    message = {"type": "frame", "id": 1.0, "image": JPEG_B64}
    assert not server_accepts_text(message)
    assert not list(Draft7Validator(CLIENT_TEXT, registry=_REGISTRY).iter_errors(message))
    assert "not 17.0" in DOC["components"]["schemas"]["FrameId"]["description"]
