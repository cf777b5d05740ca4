"""Who may connect, as a client sees it: real servers on loopback, real handshakes.

* no credential, a bad one, an expired one → 401 before the upgrade, the body says why;
* a credential without the scope → 403; a foreign ``Origin`` → 403, the page's own passes;
* a token that expires mid-session closes the socket with 4001 (1008 for protocol 1);
* the token travels as a header, a subprotocol entry (only ``edge-vision`` is echoed) or
  a query parameter, and appears in no log line;
* /metrics and /api/* need the admin scope; ``edge-vision token`` mints what the server
  accepts; replay's ``--token`` connects;
* the pure parts (token format, parsing, origins, redaction, close-code table).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_vision.cli import main as cli_main
from edge_vision.common.close_codes import CLOSE_REASONS, CloseCode
from edge_vision.config import ModelConfig
from edge_vision.model.spec import ModelSpec, load_model_spec
from edge_vision.serve import auth

from ..support.clients import connect
from ..support.server import RunningServer, make_config, running_server
from ..support.timing import T

REPO = Path(__file__).resolve().parents[2]
SECRET = b"k" * 16 + secrets.token_bytes(24).hex().encode()
API_KEY = "evk_" + "A1b2" * 10


@pytest.fixture(scope="module")
def small_spec() -> ModelSpec:
    """The default model at a 320-pixel input: quick on two shared CPU cores."""
    return load_model_spec(ModelConfig(input_size=320))


def auth_overrides(secret_file: Path, **auth_extra: Any) -> dict[str, Any]:
    return {
        "engine": {"warmup_shapes": [(192, 320)]},
        "auth": {
            "enabled": True,
            "token_secret_file": str(secret_file),
            "api_keys": [
                {"name": "cam-1", "sha256": auth.hash_api_key(API_KEY), "scopes": ["stream"]}
            ],
            **auth_extra,
        },
    }


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "token.secret"
    path.write_bytes(SECRET + b"\n")
    return path


@pytest.fixture
async def srv(small_spec: ModelSpec, secret_file: Path) -> AsyncIterator[RunningServer]:
    extra = {"allowed_origins": ["https://hmi.example"]}
    async with running_server(make_config(auth_overrides(secret_file, **extra)), small_spec) as s:
        yield s


def token(ttl: float = 600, scopes: tuple[str, ...] = ("stream",), **kw: Any) -> str:
    return auth.mint_token(SECRET, "alice", ttl, scopes, **kw)


async def handshake(
    port: int, headers: dict[str, str] | None = None, path: str = "/ws"
) -> tuple[int, dict[str, str], str]:
    """A raw RFC 6455 opening handshake: (status, response headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{k}: {v}" for k, v in (headers or {}).items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), T(10))
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        got = {}
        for line in header_lines:
            if ":" in line:
                k, v = line.split(":", 1)
                got[k.strip().lower()] = v.strip()
        body = b""
        if status != 101 and "content-length" in got:
            body = await asyncio.wait_for(reader.readexactly(int(got["content-length"])), T(10))
        return status, got, body.decode()
    finally:
        writer.close()
        await writer.wait_closed()


# -- refusals before the upgrade -------------------------------------------------------------


async def test_no_bad_or_expired_credential_is_refused_with_401_and_why(
    srv: RunningServer,
) -> None:
    cases = {
        "credentials required": {},
        "invalid credentials": {"Authorization": "Bearer not-a-key"},
        "invalid token signature": {
            "Authorization": "Bearer " + auth.mint_token(b"x" * 40, "alice", 60, ["stream"])
        },
        "token expired": {"Authorization": "Bearer " + token(ttl=10, now=time.time() - 100)},
        "malformed token": {"Authorization": "Bearer ev1.garbage"},
    }
    for why, headers in cases.items():
        status, got, body = await handshake(srv.port, headers)
        assert status == 401, (why, status, body)
        assert why in body and body.startswith("unauthorized:"), (why, body)
        assert got["www-authenticate"].startswith("Bearer")


async def test_wrong_scope_gets_403_and_admin_routes_need_the_admin_scope(
    srv: RunningServer,
) -> None:
    admin_only = token(scopes=("admin",))
    status, _, body = await handshake(srv.port, {"Authorization": f"Bearer {admin_only}"})
    assert status == 403 and "lacks the 'stream' scope" in body

    stream = token()
    async with aiohttp.ClientSession() as s:
        for path in ("/metrics", "/api/sessions", "/api/nodes"):
            async with s.get(srv.url + path) as r:
                assert r.status == 401, path
            async with s.get(srv.url + path, headers={"Authorization": f"Bearer {stream}"}) as r:
                assert r.status == 403 and "admin" in await r.text(), path
            async with s.get(
                srv.url + path, headers={"Authorization": f"Bearer {admin_only}"}
            ) as r:
                assert r.status == 200, path
        async with s.post(srv.url + "/api/engine/retry") as r:
            assert r.status == 401
        async with s.get(srv.url + "/healthz") as r:  # probes stay open
            assert r.status == 200
        async with s.get(srv.url + "/readyz") as r:
            assert r.status == 200


async def test_a_foreign_origin_is_refused_and_the_pages_own_is_not(srv: RunningServer) -> None:
    bearer = {"Authorization": f"Bearer {token()}"}
    status, _, body = await handshake(srv.port, {**bearer, "Origin": "https://evil.example"})
    assert status == 403 and "origin not allowed" in body
    # Judged before the credential: a foreign page learns nothing about it.
    status, _, _ = await handshake(srv.port, {"Origin": "https://evil.example"})
    assert status == 403
    for origin in (f"http://127.0.0.1:{srv.port}", "https://hmi.example"):
        status, _, body = await handshake(srv.port, {**bearer, "Origin": origin})
        assert status == 101, (origin, body)
    status, _, _ = await handshake(srv.port, bearer)  # no Origin: the credential decides
    assert status == 101


# -- credentials accepted -----------------------------------------------------------------------


async def test_every_way_of_presenting_a_credential_connects(srv: RunningServer) -> None:
    tok = token()
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, srv.ws_url, headers={"Authorization": f"Bearer {API_KEY}"})
        assert "auth" in hello.get("features", [])
        await ws.close()
        ws, _ = await connect(s, srv.ws_url + f"?access_token={tok}")
        await ws.close()
        # A browser's way: the token as a subprotocol entry; only the real one comes back.
        ws, _ = await connect(s, srv.ws_url, protocols=("edge-vision", f"edge-vision.token.{tok}"))
        assert ws.protocol == "edge-vision"
        await ws.close()
    status, got, _ = await handshake(
        srv.port, {"Sec-WebSocket-Protocol": f"edge-vision, edge-vision.token.{tok}"}
    )
    assert status == 101 and got["sec-websocket-protocol"] == "edge-vision"
    assert tok not in str(got)


async def test_resume_token_as_a_subprotocol_entry_resumes(srv: RunningServer) -> None:
    tok = token()
    entry = f"edge-vision.token.{tok}"
    async with aiohttp.ClientSession() as s:
        ws, hello = await connect(s, srv.ws_url, protocols=("edge-vision", entry))
        await ws.close(code=4000)  # not 1000: the session stays resumable
        resume = f"edge-vision.resume.{hello['resume_token']}"
        ws2, hello2 = await connect(s, srv.ws_url, protocols=("edge-vision", entry, resume))
        assert hello2["resumed"] is True and hello2["session_id"] == hello["session_id"]
        # Since protocol 3 the resume rotates the token (test_resume_rotation.py).
        assert hello2["resume_token"].split(".")[0] == hello["session_id"]
        assert hello2["resume_token"] != hello["resume_token"]
        assert ws2.protocol == "edge-vision"
        await ws2.close()


async def test_a_token_expiring_mid_session_closes_with_4001_and_1008_for_protocol_1(
    srv: RunningServer,
) -> None:
    async with aiohttp.ClientSession() as s:
        for query, code in (("", CloseCode.TOKEN_EXPIRED), ("?protocol=1", 1008)):
            tok = token(ttl=2)
            started = time.monotonic()
            ws, _ = await connect(s, srv.ws_url + query, headers={"Authorization": f"Bearer {tok}"})
            msg = await ws.receive(timeout=T(8))
            assert msg.type is aiohttp.WSMsgType.CLOSE, msg
            assert ws.close_code == code and "token expired" in (msg.extra or "")
            assert time.monotonic() - started < T(4)


async def test_the_token_appears_in_no_log_line(
    srv: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tok, expired = token(), token(ttl=10, now=time.time() - 100)
    async with aiohttp.ClientSession() as s:
        for url, kw in (
            (srv.ws_url + f"?access_token={tok}", {}),
            (srv.ws_url, {"headers": {"Authorization": f"Bearer {tok}"}}),
            (srv.ws_url, {"protocols": ("edge-vision", f"edge-vision.token.{tok}")}),
        ):
            ws, _ = await connect(s, url, **kw)
            await ws.close()
        for url, headers in (
            (srv.ws_url + f"?access_token={expired}", {}),
            (srv.ws_url, {"Authorization": f"Bearer {expired}x"}),
        ):
            with pytest.raises(aiohttp.WSServerHandshakeError):
                await s.ws_connect(url, headers=headers)
        async with s.get(srv.url + f"/metrics?access_token={tok}") as r:
            assert r.status == 403
    assert caplog.records, "the server logged nothing at all: the capture is not working"
    for record in caplog.records:
        line = record.getMessage() + (record.exc_text or "")
        for secret in (tok, expired, API_KEY, SECRET.decode()):
            assert secret not in line, line


async def test_replay_with_token_connects(srv: RunningServer, tmp_path: Path) -> None:
    from ..support.video import write_text_clip

    clip = await asyncio.to_thread(write_text_clip, tmp_path / "clip.mp4", 320, 192, 4, 10.0)
    summary = tmp_path / "summary.json"

    def run(*extra: str) -> int:
        from edge_vision.tools import replay

        argv = [str(clip.path), "--url", srv.ws_url, "--summary-json", str(summary)]
        return replay.main([*argv, "--no-progress", *extra])

    assert await asyncio.to_thread(run, "--token", token()) == 0
    done = json.loads(await asyncio.to_thread(summary.read_bytes))
    assert done["answered"] == done["frames"] == 4
    assert await asyncio.to_thread(run) == 2  # no token: refused, says so


async def test_auth_off_is_the_local_demo_but_origins_still_count(small_spec: ModelSpec) -> None:
    cfg = make_config({"engine": {"warmup_shapes": [(192, 320)]}})
    async with running_server(cfg, small_spec) as srv, aiohttp.ClientSession() as s:
        ws, hello = await connect(s, srv.ws_url)
        assert "auth" not in hello.get("features", [])
        await ws.close()
        async with s.get(srv.url + "/metrics") as r:
            assert r.status == 200
        status, _, _ = await handshake(srv.port, {"Origin": "https://evil.example"})
        assert status == 403


async def test_auth_on_without_any_credential_source_stops_start_up(
    small_spec: ModelSpec,
) -> None:
    from edge_vision.errors import ConfigError
    from edge_vision.serve.server import create_app

    cfg = make_config({"auth": {"enabled": True, "token_secret_env": "EV_TEST_NO_SUCH_VAR"}})
    with pytest.raises(ConfigError, match="no credential could ever pass"):
        await asyncio.to_thread(create_app, cfg, small_spec)


# -- the CLI and the pure parts -----------------------------------------------------------------


def test_edge_vision_token_mints_what_the_server_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGE_VISION_TOKEN_SECRET", SECRET.decode())
    assert cli_main(["token", "--subject", "cam-3", "--ttl", "15m", "--scope", "stream"]) == 0
    minted = capsys.readouterr().out.strip()
    p = auth.verify_token(SECRET, minted)
    assert p.subject == "cam-3" and p.scopes == {"stream"}
    assert p.expires_at is not None and 890 < p.expires_at - time.time() <= 900
    assert SECRET.decode() not in minted
    assert cli_main(["token", "--new-api-key", "cam-9"]) == 0
    out = capsys.readouterr()
    key = out.out.strip()
    assert auth.hash_api_key(key) in out.err and key not in out.err
    monkeypatch.setenv("EDGE_VISION_TOKEN_SECRET", "short")
    assert cli_main(["token", "--subject", "x"]) == 2
    assert "at least 32" in capsys.readouterr().err


def test_tokens_are_signed_expiring_and_scoped() -> None:
    t = token(ttl=60, scopes=("stream", "admin"))
    p = auth.verify_token(SECRET, t)
    assert p.subject == "alice" and p.kind == "token" and p.scopes == {"stream", "admin"}
    prefix, body, sig = t.split(".")
    forged_body = base64.urlsafe_b64encode(
        base64.urlsafe_b64decode(body + "==").replace(b"alice", b"admin")
    ).rstrip(b"=")
    for bad in (f"{prefix}.{forged_body.decode()}.{sig}", t[:-2], "ev1..", "ev2.a.b", t + ".x"):
        with pytest.raises(auth.AuthError) as e:
            auth.verify_token(SECRET, bad)
        assert e.value.status == 401
    with pytest.raises(auth.AuthError, match="expired"):
        auth.verify_token(SECRET, t, now=time.time() + 61)
    with pytest.raises(ValueError):
        auth.mint_token(SECRET, "alice", 60, ["root"])
    a = auth.Authenticator(
        [auth.ApiKey("cam-1", bytes.fromhex(auth.hash_api_key(API_KEY)), frozenset({"stream"}))],
        None,
    )
    assert a.authenticate(API_KEY).limit_key == "api_key:cam-1"
    with pytest.raises(auth.AuthError, match="no signed tokens"):
        a.authenticate(t)
    with pytest.raises(auth.AuthError, match="lacks the 'admin' scope"):
        a.authenticate(API_KEY).require("admin")


def test_credentials_are_found_header_first_then_subprotocol_then_query() -> None:
    h = {"Authorization": "Bearer H", "Sec-WebSocket-Protocol": "edge-vision, edge-vision.token.S"}
    assert auth.presented(h, {"access_token": "Q"}).credential == "H"
    p = auth.presented(
        {"Sec-WebSocket-Protocol": "edge-vision,edge-vision.token.S, edge-vision.resume.R"},
        {"access_token": "Q"},
    )
    assert (p.credential, p.source, p.resume_token, p.protocols) == (
        "S",
        "subprotocol",
        "R",
        ("edge-vision",),
    )
    assert auth.presented({}, {"access_token": "Q"}).source == "query"
    assert auth.presented({"Authorization": "Basic xyz"}, {}).credential is None


def test_origins() -> None:
    allowed = ["https://hmi.example"]
    assert auth.origin_allowed(None, "edge:8080", allowed)
    assert auth.origin_allowed("http://edge:8080", "edge:8080", allowed)
    assert auth.origin_allowed("https://edge", "edge", allowed)  # nginx's Host: $host
    assert auth.origin_allowed("https://HMI.example/", "edge:8080", allowed)
    assert not auth.origin_allowed("http://edge.evil:8080", "edge:8080", allowed)
    assert not auth.origin_allowed("http://edge:9999", "edge:8080", allowed)
    assert not auth.origin_allowed("null", "edge:8080", allowed)
    assert auth.origin_allowed("https://anything", "edge", ["*"])


def test_urls_are_redacted_for_logs() -> None:
    url = "/ws?mode=every&access_token=SECRET&resume=abc.def"
    red = auth.redact_text(f"GET {url} HTTP/1.1")
    assert "SECRET" not in red and "abc.def" not in red and "mode=every" in red


def test_every_close_code_is_distinct_and_documented() -> None:
    assert len({int(c) for c in CLOSE_REASONS}) == len(CLOSE_REASONS) == len(CloseCode)
    doc = (REPO / "docs" / "protocol.md").read_text()
    for code in CloseCode:
        assert re.search(rf"^\| {int(code)} \|", doc, re.M), f"{int(code)} not in protocol.md"


def test_the_store_holds_only_the_resume_secrets_hash_and_old_records_still_resume() -> None:
    from edge_vision.session.record import Session, new_session, secret_digest, token_matches

    s = new_session("node-a", "latest", 0.5, "127.0.0.1", "agent")
    rec = s.to_record()
    assert rec["schema"] == "2" and "secret" not in rec
    assert s.secret not in "".join(rec.values())
    stored = Session.from_record(rec)
    assert stored.secret == "" and token_matches(stored, s.secret)
    wrong = s.secret[:-1] + ("y" if s.secret.endswith("x") else "x")  # 1 in 64 ended in x
    assert not token_matches(stored, wrong)
    # A schema-1 record, written by a node before the upgrade, keeps its plain secret.
    old = {k: v for k, v in rec.items() if k not in ("schema", "secret_sha256")}
    old["secret"] = s.secret
    legacy = Session.from_record(old)
    assert token_matches(legacy, s.secret) and legacy.secret_sha256 == secret_digest(s.secret)


def test_log_lines_and_tracebacks_are_redacted_by_the_handler_filter() -> None:
    tok = token()
    record = logging.LogRecord(
        "aiohttp.server",
        logging.DEBUG,
        __file__,
        1,
        "bad line %r",
        (f"GET /ws?access_token={tok}",),
        None,
    )
    try:
        raise ValueError(f"Authorization: Bearer {tok}; offered edge-vision.token.{tok}")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert auth.RedactSecrets().filter(record)
    assert tok not in record.getMessage() and "access_token=REDACTED" in record.getMessage()
    assert record.exc_text is not None and tok not in record.exc_text
    assert "Bearer REDACTED" in record.exc_text and "edge-vision.token.REDACTED" in record.exc_text
    assert auth.redact_text("resume=abc.def&mode=every") == "resume=REDACTED&mode=every"
