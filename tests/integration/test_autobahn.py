"""RFC 6455 conformance: Autobahn|Testsuite against the test-only echo route.

``/ws`` speaks an application protocol (hello first, JSON replies), so the suite's echo
cases run against ``/test/echo`` (``server.test_echo_route``), which
:func:`edge_vision.serve.websocket.websocket_response` builds with exactly ``/ws``'s WebSocket
settings and close handling. Cases 1-7 (framing, pings, reserved bits and opcodes,
fragmentation, UTF-8, closing), 9.1.1-9.2.4 (text and binary messages of 64 KiB to
16 MiB) and 10 (auto-fragmentation). Every case must be OK, NON-STRICT or INFORMATIONAL,
or be listed in :data:`EXPECTED_OTHERWISE` with its reason.

The suite (Python 2.7 only) is installed by ``scripts/setup-autobahn``, which
``scripts/test`` runs.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from edge_vision.common.aio import with_timeout
from edge_vision.model.spec import ModelSpec
from edge_vision.serve.websocket import ECHO_PATH

from ..support.server import make_config, running_server
from ..support.timing import T

REPO = Path(__file__).resolve().parents[2]
WSTEST = REPO / ".autobahn" / "wstest"
CASES = ["1.*", "2.*", "3.*", "4.*", "5.*", "6.*", "7.*", "9.1.*", "9.2.1", "9.2.2"]
CASES += ["9.2.3", "9.2.4", "10.*"]
MAX_MESSAGE = 8 * 1024 * 1024  # server.max_message_bytes: the production default

#: Cases that may end otherwise, and why. A message above server.max_message_bytes is
#: refused with 1009 instead of echoed: the suite calls that FAILED.
EXPECTED_OTHERWISE: dict[str, str] = {
    "9.1.6": "a 16 MiB text message, above server.max_message_bytes (8 MiB): closed with 1009",
}
GOOD = {"OK", "NON-STRICT", "INFORMATIONAL"}

pytestmark = pytest.mark.timeout(420)
needs_wstest = pytest.mark.skipif(
    not WSTEST.exists(), reason="Autobahn|Testsuite not installed: run scripts/setup-autobahn"
)


def _read_reports(outdir: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    index = json.loads((outdir / "index.json").read_text())
    (agent,) = index.values()
    details = {
        case: json.loads((outdir / r["reportfile"]).read_text()) for case, r in agent.items()
    }
    return agent, details


@needs_wstest
async def test_autobahn_cases_1_to_7_9_1_to_9_2_and_10_pass(
    spec: ModelSpec, tmp_path: Path
) -> None:
    config = make_config({"server": {"test_echo_route": True, "max_message_bytes": MAX_MESSAGE}})
    async with running_server(config, spec) as srv:
        outdir = tmp_path / "reports"
        spec_file = tmp_path / "fuzzingclient.json"
        await asyncio.to_thread(
            spec_file.write_text,
            json.dumps(
                {
                    "outdir": str(outdir),
                    "servers": [
                        {"agent": "edge_vision", "url": f"ws://127.0.0.1:{srv.port}{ECHO_PATH}"}
                    ],
                    "cases": CASES,
                    "exclude-cases": [],
                    "exclude-agent-cases": {},
                }
            ),
        )
        proc = await asyncio.create_subprocess_exec(
            str(WSTEST),
            "-m",
            "fuzzingclient",
            "-s",
            str(spec_file),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await with_timeout(proc.communicate(), T(360))
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    agent, details = await asyncio.to_thread(_read_reports, outdir)

    summary = Counter(r["behavior"] for r in agent.values())
    print(f"Autobahn: {len(agent)} cases, {dict(summary)}")
    assert len(agent) >= 250, sorted(agent)  # the whole selection ran (257 cases)
    bad = {
        case: (r["behavior"], r["behaviorClose"], details[case].get("result"))
        for case, r in agent.items()
        if r["behavior"] not in GOOD and case not in EXPECTED_OTHERWISE
    }
    assert not bad, bad
    for case, why in EXPECTED_OTHERWISE.items():
        assert case in agent, case
        d = details[case]
        if agent[case]["behavior"] not in GOOD:  # refused as documented, with 1009
            assert d["remoteCloseCode"] == 1009, (case, why, d["remoteCloseCode"])
    # Closing behaviour is clean everywhere (no abrupt TCP drops, right close codes).
    unclean = {
        case: r["behaviorClose"]
        for case, r in agent.items()
        if r["behaviorClose"] not in GOOD and case not in EXPECTED_OTHERWISE
    }
    assert not unclean, unclean


async def test_the_echo_route_exists_only_when_the_test_flag_is_set(server: Any) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(server.url + ECHO_PATH) as r:
        assert r.status == 404


def test_close_codes_a_peer_must_not_send_are_answered_with_1002() -> None:
    from edge_vision.serve.websocket import reply_close_code

    for ok in (0, 1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 4000, 4999):
        assert reply_close_code(ok) == 1000, ok
    for bad in (1, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535):
        assert reply_close_code(bad) == 1002, bad
