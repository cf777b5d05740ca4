"""wss:// through the shipped TLS setup: real nginx, started by the compose image's own
entrypoint (deploy/compose/nginx/entrypoint.sh), which renders deploy/nginx/'s plain and
TLS templates and makes a self-signed certificate with openssl on first start, in front of
a real node; a real client that trusts that certificate gets a hello and a result."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from edge_vision.tools.bench.servers import stop_process

from ..support.clients import connect, frame_binary, recv_type
from ..support.cluster import LIGHT_NODE, NGINX_DIR, REPO, nginx_binary
from ..support.images import text_scene
from ..support.server import ServerProcess, free_port
from ..support.timing import T

ENTRYPOINT = REPO / "deploy/compose/nginx/entrypoint.sh"

pytestmark = pytest.mark.timeout(90)


def wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + T(15)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {log.read_text() if log.exists() else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nginx did not listen")


def start_site_nginx(folder: Path, node_port: int) -> tuple[subprocess.Popen[bytes], int, int]:
    """The compose nginx's start, run here: (process, plain port, TLS port)."""
    nginx = nginx_binary()
    if nginx is None or shutil.which("openssl") is None:
        pytest.fail("nginx and openssl are needed (scripts/test installs both)")
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    shutil.copy(NGINX_DIR / "nginx-local.conf", folder / "nginx.conf")
    plain, tls = free_port(), free_port()
    env = {
        "PATH": f"{Path(nginx).parent}:{os.environ.get('PATH', '')}",
        "TEMPLATE_DIR": str(NGINX_DIR),  # the shipped templates, not copies
        "SITE_DIR": str(folder),
        "NGINX_DIR": str(folder),
        "TLS_DIR": str(folder / "tls"),
        "LISTEN": f"127.0.0.1:{plain}",
        "TLS_LISTEN": f"127.0.0.1:{tls}",
        "UPSTREAM_SERVERS": f"server 127.0.0.1:{node_port} max_fails=1 fail_timeout=5s;",
        # Workers would run as 'nobody', who cannot enter tmp_path.
        "NGINX_GLOBALS": " user root;" if os.geteuid() == 0 else "",
    }
    args = ["sh", str(ENTRYPOINT), "-p", f"{folder}/", "-c", "nginx.conf", "-e", "error.log"]
    with open(folder / "entrypoint.log", "ab") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=out)
    wait_listening(tls, proc, folder / "error.log")
    return proc, plain, tls


async def test_a_wss_client_gets_hello_and_results_through_the_shipped_tls_config(
    tmp_path: Path,
) -> None:
    node = ServerProcess(*LIGHT_NODE, log_path=tmp_path / "node.log")
    await asyncio.to_thread(node.start)
    proc: subprocess.Popen[bytes] | None = None
    try:
        await node.wait_ready()
        proc, plain, tls = await asyncio.to_thread(start_site_nginx, tmp_path / "site", node.port)
        cert = tmp_path / "site/tls/cert.pem"
        made = await asyncio.to_thread((tmp_path / "site/entrypoint.log").read_text)
        assert "making a self-signed one" in made
        trusting = await asyncio.to_thread(ssl.create_default_context, cafile=str(cert))
        jpeg = text_scene(640, 360).jpeg()
        async with aiohttp.ClientSession() as http:
            ws, hello = await connect(http, f"wss://127.0.0.1:{tls}/ws", ssl=trusting)
            assert hello["type"] == "hello"
            await ws.send_bytes(frame_binary(7, 0.0, jpeg))
            result = await recv_type(ws, "result")
            assert result["id"] == 7 and result["detections"]  # the text in the frame
            await ws.close()
            # The same page over https, and a client that does not trust the certificate
            # is refused: it really is TLS with that certificate.
            async with http.get(f"https://127.0.0.1:{tls}/readyz", ssl=trusting) as r:
                assert r.status == 200
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await http.get(f"https://127.0.0.1:{tls}/readyz")
            async with http.get(f"http://127.0.0.1:{plain}/healthz") as r:
                assert r.status == 200  # the plain server of the same site still answers
    finally:
        if proc is not None:
            await asyncio.to_thread(stop_process, proc, signal.SIGQUIT, T(15))
        await asyncio.to_thread(node.stop)


def test_a_restart_keeps_the_certificate_of_the_first_start(tmp_path: Path) -> None:
    """Clients may have pinned the self-signed certificate: a restart must not replace it."""
    site = tmp_path / "site"
    certs = []
    for _ in range(2):
        proc, _plain, _tls = start_site_nginx(site, node_port=1)  # no node needed here
        stop_process(proc, signal.SIGQUIT, T(15))
        certs.append((site / "tls/cert.pem").read_bytes())
    assert certs[0] == certs[1]
    assert (site / "entrypoint.log").read_text().count("self-signed") == 1
