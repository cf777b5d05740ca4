"""The monitoring we ship, against a real Prometheus (Debian's ``prometheus``).

A real node (``edge-vision serve``, pointed at a recorded Orin Nano sysfs tree so the
Jetson panels have data too) serves frames from a real client while Prometheus scrapes
it; then every PromQL expression of the Grafana dashboard must return a finite value from
Prometheus's own query API. Grafana itself is not in Debian and is not run here: its
provisioning files and the dashboard are checked by parsing them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from edge_vision.common.jetson_metrics import ROOT_ENV
from edge_vision.tools.bench.servers import stop_process

from ..support.clients import connect, frame_binary, frame_json, recv
from ..support.cluster import LIGHT_NODE
from ..support.images import text_scene
from ..support.server import ServerProcess, free_port
from ..support.timing import T
from .test_jetson_metrics import build_recorded_tree

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_YML = REPO / "deploy/prometheus/prometheus.yml"
GRAFANA = REPO / "deploy/grafana"
DASHBOARD = GRAFANA / "dashboards/edge-vision.json"

pytestmark = pytest.mark.timeout(120)


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows included."""
    dash = json.loads(DASHBOARD.read_text())
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            walk(p.get("panels", []))
            out.extend((p["title"], t["expr"]) for t in p.get("targets", []))

    walk(dash["panels"])
    return out


def needs(binary: str) -> str:
    found = shutil.which(binary)
    if found is None:  # scripts/test installs it; a bare checkout says what is missing
        pytest.fail(f"{binary} is not installed (scripts/test installs Debian's prometheus)")
    return found


def test_the_shipped_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "edge-vision")
    # Auth is on in the compose site, so /metrics needs an admin token: Prometheus reads it
    # from the compose secret. promtool insists the file exists, so check a copy whose
    # secret path points at a stand-in file.
    secret = job["authorization"]["credentials_file"]
    assert job["authorization"]["type"] == "Bearer"
    token = tmp_path / "token"
    token.write_text("ev1.stand-in\n")
    checked = tmp_path / "prometheus.yml"
    checked.write_text(PROMETHEUS_YML.read_text().replace(secret, str(token)))
    out = subprocess.run(
        [needs("promtool"), "check", "config", str(checked)],
        capture_output=True,
        text=True,
        timeout=T(30),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # Every replica of the compose service, by DNS, on the port the image listens on.
    assert job["dns_sd_configs"][0]["names"] == ["edge-vision"]
    assert job["dns_sd_configs"][0]["port"] == 8080


def test_grafana_provisioning_points_the_dashboard_at_the_provisioned_prometheus() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/edge-vision.yml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    dash = json.loads(DASHBOARD.read_text())
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for shown in ("in, answered, dropped", "rejected", "latency p99", "batch size",
                  "connections", "engine", "gpu", "temperatures", "power", "memory"):  # fmt: skip
        assert shown in titles, shown
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == source["uid"], p["title"]
            ref_ids = [t["refId"] for t in p["targets"]]
            assert ref_ids == [chr(65 + i) for i in range(len(ref_ids))], p["title"]


class Prometheus:
    """Debian's prometheus in the foreground, scraping ``targets`` every second."""

    def __init__(self, folder: Path, targets: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "edge-vision", "static_configs": [{"targets": targets}]}
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = folder / "prometheus.log"
        self.args = [
            needs("prometheus"),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=out)
        return self

    async def wait_ready(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + T(30)
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(self.url + "/-/ready") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.2)
        raise TimeoutError("prometheus not ready")

    async def query(self, http: aiohttp.ClientSession, expr: str) -> list[dict[str, Any]]:
        async with http.get(self.url + "/api/v1/query", params={"query": expr}) as r:
            body = await r.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGTERM, T(10))  # a clean TSDB shutdown


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    return [float(s["value"][1]) for s in result if math.isfinite(float(s["value"][1]))]


async def keep_streaming(ws: aiohttp.ClientWebSocketResponse, jpeg: bytes) -> None:
    """Frames one after the other (mode=every), plus a broken message now and then, so
    every counter and histogram keeps moving between scrapes."""
    i = 0
    while True:
        await ws.send_bytes(frame_binary(i, 0.0, jpeg))
        await recv(ws)
        if i % 5 == 0:
            await ws.send_str(frame_json(i, 0.0, b"not a jpeg"))
            await recv(ws)
        i += 1


async def test_every_dashboard_expression_returns_data_from_a_real_prometheus(
    tmp_path: Path,
) -> None:
    def prepare() -> tuple[ServerProcess, Prometheus, list[tuple[str, str]]]:
        tree = build_recorded_tree("orin_nano_8gb_r36", tmp_path / "board")
        node = ServerProcess(*LIGHT_NODE, env={ROOT_ENV: str(tree)}, log_path=tmp_path / "n.log")
        prom = Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{node.port}"])
        node.start()
        prom.start()
        return node, prom, dashboard_expressions()

    node, prom, expressions = await asyncio.to_thread(prepare)
    assert len(expressions) >= 20
    jpeg = text_scene(640, 360).jpeg()
    try:
        async with aiohttp.ClientSession() as http:
            await node.wait_ready()
            await prom.wait_ready(http)
            ws, _ = await connect(http, node.ws_url + "?mode=every")
            streaming = asyncio.create_task(keep_streaming(ws, jpeg))
            missing: list[tuple[str, str]] = expressions
            deadline = time.monotonic() + T(45)
            while missing and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                assert not streaming.done(), streaming.exception()
                missing = [
                    (title, expr)
                    for title, expr in missing
                    if not finite_values(await prom.query(http, expr))
                ]
            streaming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await streaming
            # Spot checks a person reading the dashboard would make.
            (conns,) = await prom.query(http, "sum(edge_vision_connections)")
            assert float(conns["value"][1]) == 1.0
            rejected = await prom.query(
                http, "sum by (code) (rate(edge_vision_frames_rejected_total[1m]))"
            )
            assert {s["metric"]["code"] for s in rejected} == {"unsupported_image"}
            (vdd_in,) = await prom.query(http, 'edge_vision_jetson_power_watts{rail="VDD_IN"}')
            assert float(vdd_in["value"][1]) == pytest.approx(4.761, rel=0.01)
            await ws.close()
    finally:
        await asyncio.to_thread(prom.stop)
        await asyncio.to_thread(node.stop)
    assert not missing, "no data for: " + "; ".join(f"{t}: {e}" for t, e in missing)
