"""Jetson board metrics: the parsers on recorded tegrastats lines and sysfs layouts of Orin
Nano / NX / AGX boards (tests/data/jetson/SOURCES.md says where each comes from), the
collector's Prometheus series, and a real server that shows them on /metrics when pointed
at a recorded board and shows none on this machine, which is not a Jetson."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edge_vision.common.jetson_metrics import (
    ROOT_ENV,
    TEGRASTATS_LOG_ENV,
    JetsonCollector,
    is_jetson,
    parse_meminfo,
    parse_proc_stat,
    parse_tegrastats,
    register_jetson_collector,
    zone_name,
)
from edge_vision.model.spec import ModelSpec

from ..support.scrape import metrics_text
from ..support.server import make_config, running_server

DATA = Path(__file__).parents[1] / "data" / "jetson"
MIB = 1024.0 * 1024.0
BOARDS = ("orin_nano_8gb_r36", "agx_orin_64gb_r35", "orin_nx_16gb_r36")
# The tegrastats line each recorded sysfs tree took its values from.
TEGRASTATS_OF = {
    "orin_nano_8gb_r36": "tegrastats_orin_nano_8gb_r36.txt",
    "agx_orin_64gb_r35": "tegrastats_agx_orin_64gb.txt",
    "orin_nx_16gb_r36": "tegrastats_orin_nx_16gb_r36.txt",
}

pytestmark = pytest.mark.timeout(60)


def recorded_line(name: str, index: int = 0) -> str:
    return (DATA / name).read_text().splitlines()[index]


def build_recorded_tree(board: str, root: Path) -> Path:
    """Write the recorded sysfs/procfs layout of ``board`` under ``root``; returns root."""
    layout = json.loads((DATA / f"sysfs_{board}.json").read_text())
    for rel, content in layout["files"].items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def sample(text: str, name: str) -> float:
    """The value of the one sample line starting with ``name`` (labels included)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported:\n{text}")


# ------------------------------------------------------------ tegrastats lines


def test_orin_nano_tegrastats_line_gives_load_temperatures_rails_and_memory() -> None:
    r = parse_tegrastats(recorded_line("tegrastats_orin_nano_8gb_r36.txt"))
    assert r.gpu_load == 0.0
    assert r.cpu_load == pytest.approx(1 / 6 / 100)  # one core at 1 %, five idle
    assert r.temperatures == {
        "cpu": 48.468,
        "soc2": 47.531,
        "soc0": 48.062,
        "gpu": 48.562,
        "tj": 49.156,
        "soc1": 49.156,
    }
    # The current reading of each rail, not tegrastats' running average after the slash.
    assert r.power_watts == {"VDD_IN": 4.761, "VDD_CPU_GPU_CV": 0.515, "VDD_SOC": 1.428}
    assert r.memory_bytes["total"] == 7620 * MIB
    assert r.memory_bytes["used"] == 775 * MIB
    assert r.memory_bytes["swap_total"] == 3810 * MIB


def test_jetson_clocks_raises_the_orin_nano_rails_in_the_second_recorded_line() -> None:
    idle = parse_tegrastats(recorded_line("tegrastats_orin_nano_8gb_r36.txt", 0))
    clocked = parse_tegrastats(recorded_line("tegrastats_orin_nano_8gb_r36.txt", 1))
    assert clocked.power_watts["VDD_IN"] == 6.626 > idle.power_watts["VDD_IN"]
    assert clocked.power_watts["VDD_CPU_GPU_CV"] == 1.228


def test_agx_orin_line_drops_absent_sensors_and_not_connected_channels() -> None:
    r = parse_tegrastats(recorded_line("tegrastats_agx_orin_64gb.txt"))
    # CV0/CV1/CV2 and GPU read -256C there: no sensor, so no zone (not a -256 °C board).
    assert set(r.temperatures) == {"cpu", "tboard", "soc2", "tdiode", "soc0", "tj", "soc1"}
    assert r.temperatures["tj"] == 44.343
    assert r.power_watts == {
        "VDD_GPU_SOC": 2.34,
        "VDD_CPU_CV": 0.39,
        "VIN_SYS_5V0": 4.025,
        "VDDQ_VDD2_1V8AO": 0.301,
    }
    assert r.memory_bytes["total"] == 62801 * MIB
    assert r.memory_bytes["swap_used"] == 19 * MIB
    assert r.cpu_load == 0.0 and r.gpu_load == 0.0  # GR3D_FREQ 0%@[0,0]: two GPCs, idle


def test_orin_nx_line_with_only_some_fields_gives_only_those() -> None:
    r = parse_tegrastats(recorded_line("tegrastats_orin_nx_16gb_r36.txt"))
    assert r.temperatures == {"gpu": 55.406}
    assert r.power_watts == {"VDD_IN": 9.156}
    assert r.cpu_load == pytest.approx((2 + 3 + 3 + 1 + 8 + 1 + 1 + 1) / 8 / 100)
    assert r.memory_bytes["total"] == 15656 * MIB


def test_older_boards_lines_rails_without_mw_and_parked_cores() -> None:
    nano = parse_tegrastats(recorded_line("tegrastats_older_boards.txt", 0))
    assert nano.gpu_load == 0.07
    assert nano.cpu_load == pytest.approx((90 + 16 + 0 + 9) / 4 / 100)
    assert nano.power_watts == {"POM_5V_IN": 2.746, "POM_5V_GPU": 0.159, "POM_5V_CPU": 0.796}
    assert nano.temperatures["thermal"] == 30.25
    tx2 = parse_tegrastats(recorded_line("tegrastats_older_boards.txt", 1))
    assert tx2.cpu_load == pytest.approx((2 + 0 + 1 + 0) / 4 / 100)  # the two "off" cores
    assert tx2.power_watts == {}  # this board printed no rails: none invented
    assert tx2.temperatures["bcpu"] == 50.5


def test_zone_names_agree_between_sysfs_and_tegrastats() -> None:
    assert zone_name("cpu-thermal") == zone_name("CPU-therm") == zone_name("CPU") == "cpu"
    assert zone_name("Tboard_tegra") == zone_name("Tboard") == "tboard"
    assert zone_name("tj-thermal") == zone_name("Tj-therm") == zone_name("tj") == "tj"


def test_procfs_parsers() -> None:
    meminfo = "MemTotal: 1000 kB\nMemAvailable: 250 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
    mem = parse_meminfo(meminfo)
    assert mem == {
        "total": 1024000.0,
        "available": 256000.0,
        "used": 768000.0,
        "swap_total": 0.0,
        "swap_used": 0.0,
    }
    # user nice system idle iowait irq softirq steal guest guest_nice
    assert parse_proc_stat("cpu  10 0 5 80 5 0 0 0 3 0\ncpu0 1 2 3 4\n") == (15, 100)


# ------------------------------------------------------------ recorded sysfs trees


@pytest.mark.parametrize("board", BOARDS)
def test_sysfs_tree_gives_the_same_figures_as_the_boards_tegrastats_line(
    board: str, tmp_path: Path
) -> None:
    root = build_recorded_tree(board, tmp_path)
    assert is_jetson(root)
    from_files = JetsonCollector(root).read()
    from_line = parse_tegrastats(recorded_line(TEGRASTATS_OF[board]))
    assert from_files.gpu_load == from_line.gpu_load
    assert from_files.temperatures == from_line.temperatures
    assert from_files.power_watts.keys() == from_line.power_watts.keys()
    for rail, watts in from_line.power_watts.items():
        assert from_files.power_watts[rail] == pytest.approx(watts, rel=0.01), rail
    assert from_files.memory_bytes["total"] == pytest.approx(
        from_line.memory_bytes["total"], rel=0.001
    )
    assert from_files.model is not None and "Orin" in from_files.model


def test_cpu_load_is_measured_between_two_scrapes(tmp_path: Path) -> None:
    # The recorded trees' /proc/stat counters are made up (SOURCES.md); here two readings
    # 100 jiffies apart of which 25 were busy must give exactly 0.25.
    root = build_recorded_tree("orin_nano_8gb_r36", tmp_path)
    collector = JetsonCollector(root)
    collector.read()
    (root / "proc/stat").write_text("cpu  1000 0 0 2000 0 0 0 0 0 0\n")
    collector.read()
    (root / "proc/stat").write_text("cpu  1020 0 5 2075 0 0 0 0 0 0\n")
    assert collector.read().cpu_load == pytest.approx(0.25)
    # A scrape that sees no jiffy pass (the same counters) keeps the last figure.
    assert collector.read().cpu_load == pytest.approx(0.25)


def test_collector_exports_prometheus_names_with_labels(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    env = {ROOT_ENV: str(build_recorded_tree("agx_orin_64gb_r35", tmp_path))}
    assert register_jetson_collector(registry, env) is not None
    text = generate_latest(registry).decode()
    assert sample(text, 'edge_vision_jetson_info{model="Jetson AGX Orin Developer Kit"}') == 1
    assert sample(text, "edge_vision_jetson_gpu_load_ratio") == 0.0
    assert 0 <= sample(text, "edge_vision_jetson_cpu_load_ratio") <= 1
    assert sample(text, 'edge_vision_jetson_temperature_celsius{zone="tj"}') == 44.343
    assert sample(text, 'edge_vision_jetson_power_watts{rail="VIN_SYS_5V0"}') == 4.025
    assert sample(text, 'edge_vision_jetson_memory_bytes{kind="total"}') == 64308224 * 1024
    assert 'zone="gpu"' not in text  # its sensor reads -256 °C on this board
    assert 'rail="NC"' not in text


def test_a_tegrastats_log_fills_in_what_sysfs_did_not_give(tmp_path: Path) -> None:
    # A board whose power monitor the service's user cannot read: rails from the log.
    root = build_recorded_tree("orin_nano_8gb_r36", tmp_path / "root")
    for f in sorted((root / "sys/bus/i2c/devices").rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    log = tmp_path / "tegrastats.log"
    lines = (DATA / "tegrastats_orin_nano_8gb_r36.txt").read_text()
    log.write_text(lines)  # the newest line (with jetson_clocks) is the one to use
    registry = CollectorRegistry()
    register_jetson_collector(registry, {ROOT_ENV: str(root), TEGRASTATS_LOG_ENV: str(log)})
    text = generate_latest(registry).decode()
    assert sample(text, 'edge_vision_jetson_power_watts{rail="VDD_IN"}') == 6.626
    # Figures the files did give still come from the files (48.468, not the log's 50.125).
    assert sample(text, 'edge_vision_jetson_temperature_celsius{zone="cpu"}') == 48.468


def test_no_collector_at_all_where_the_root_is_not_a_jetson(tmp_path: Path) -> None:
    # This machine's own files first, then a tree that has thermal zones and /proc like
    # any PC but no Tegra device tree.
    assert not is_jetson(Path("/")), "this test machine looks like a Jetson"
    (tmp_path / "sys/class/thermal/thermal_zone0").mkdir(parents=True)
    (tmp_path / "sys/class/thermal/thermal_zone0/type").write_text("x86_pkg_temp\n")
    (tmp_path / "sys/class/thermal/thermal_zone0/temp").write_text("41000\n")
    for env in ({}, {ROOT_ENV: str(tmp_path)}):
        registry = CollectorRegistry()
        assert register_jetson_collector(registry, env) is None
        assert b"jetson" not in generate_latest(registry)


# ------------------------------------------------------------ a real server


async def test_a_server_on_a_recorded_orin_nano_shows_the_board_on_metrics(
    spec: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = await asyncio.to_thread(build_recorded_tree, "orin_nano_8gb_r36", tmp_path)
    monkeypatch.setenv(ROOT_ENV, str(root))
    async with running_server(make_config(), spec) as srv, aiohttp.ClientSession() as s:
        text = await metrics_text(s, srv.url)
    assert sample(text, 'edge_vision_jetson_power_watts{rail="VDD_CPU_GPU_CV"}') == (
        pytest.approx(0.515, rel=0.01)
    )
    assert sample(text, 'edge_vision_jetson_temperature_celsius{zone="soc1"}') == 49.156
    assert sample(text, "edge_vision_jetson_gpu_load_ratio") == 0.0
    assert "edge_vision_frames_received_total" in text  # next to the service's own


async def test_a_server_on_this_machine_exports_no_jetson_series(spec: ModelSpec) -> None:
    async with running_server(make_config(), spec) as srv, aiohttp.ClientSession() as s:
        text = await metrics_text(s, srv.url)
    assert "edge_vision_frames_received_total" in text
    assert "edge_vision_jetson" not in text  # absent, not zeros
