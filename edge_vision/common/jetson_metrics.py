"""Jetson board metrics on ``/metrics``: GPU and CPU load, temperatures, memory, power rails.

On a Jetson (an NVIDIA Tegra SoC: ``/proc/device-tree/compatible`` names ``nvidia,tegra…``,
or ``/etc/nv_tegra_release`` exists) every scrape of ``/metrics`` reads the board's own
files and adds::

    edge_vision_jetson_info{model="…"}                   1
    edge_vision_jetson_gpu_load_ratio                      0..1, the integrated GPU's busy share
    edge_vision_jetson_cpu_load_ratio                      0..1, all cores, since the last scrape
    edge_vision_jetson_temperature_celsius{zone="cpu"}     one per thermal zone
    edge_vision_jetson_power_watts{rail="VDD_IN"}          one per INA3221 channel
    edge_vision_jetson_memory_bytes{kind="used"}           total, used, available, swap_*

On any other machine there are no ``edge_vision_jetson_*`` series at all (absent, not 0),
so a dashboard shows "no data" rather than a board that idles at 0 °C.

Where each figure comes from (L4T r35/r36, Orin Nano / Orin NX / AGX Orin; earlier
boards where the same files exist):

- GPU load: ``/sys/class/devfreq/*/device/load`` of the device whose
  ``device/of_node/name`` is ``ga10b`` (Orin), ``gv11b`` (Xavier), ``gp10b`` (TX2) or
  ``gpu``; else ``/sys/devices/platform/gpu.0/load`` or ``/sys/devices/gpu.0/load``. The
  value is per mille (0..1000), the same counter ``tegrastats`` prints as ``GR3D_FREQ``.
- Temperatures: ``/sys/class/thermal/thermal_zone*/{type,temp}``, millidegrees Celsius.
  ``cpu-thermal`` becomes zone ``cpu`` (``CPU-therm`` on older boards too). A zone whose
  sensor is absent reads -256 °C (AGX Orin's ``CV0@-256C`` in ``tegrastats``) and is left out.
- Power: each I2C device whose ``name`` holds ``ina3221``
  (``/sys/bus/i2c/devices/1-0040`` on Orin), ``hwmon/hwmon*/in<N>_label`` with
  ``in<N>_input`` (bus mV) and ``curr<N>_input`` (mA), as the Linux ina3221 driver
  documents them. Channels labelled ``NC`` (not connected) and channel 7 (the sum of
  shunt voltages) are left out. Orin Nano / NX: VDD_IN (module input), VDD_CPU_GPU_CV,
  VDD_SOC. AGX Orin: VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0, VDDQ_VDD2_1V8AO.
- Memory: ``/proc/meminfo``; on a Jetson the GPU shares this memory with the CPU.
- CPU load: ``/proc/stat``, busy jiffies over all jiffies since the previous scrape.

``tegrastats`` prints the same figures once a second; :func:`parse_tegrastats` reads one
of its lines. Point ``JETSON_TEGRASTATS_LOG`` at a file that ``tegrastats --logfile``
writes and its last line fills in what the files above did not give (boards where the
power monitor is not exposed to the service's user, for instance).

Where the files are read from: ``/`` unless ``JETSON_METRICS_ROOT`` names another root
(the tests point it at a recorded tree of an Orin board). The variable is not an
``EDGE_VISION_*`` one because those are configuration keys.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

ROOT_ENV = "JETSON_METRICS_ROOT"
TEGRASTATS_LOG_ENV = "JETSON_TEGRASTATS_LOG"

PREFIX = "edge_vision_jetson_"
GPU_DEVICE_NAMES = ("ga10b", "gv11b", "gp10b", "gpu")
_GPU_LOAD_FALLBACKS = ("sys/devices/platform/gpu.0/load", "sys/devices/gpu.0/load")
# A thermal zone with no sensor behind it reads -256 °C; nothing real is that cold.
_NO_SENSOR_BELOW_C = -200.0


@dataclass
class JetsonReading:
    """One look at the board; a field is None (or empty) where the board did not say."""

    model: str | None = None
    gpu_load: float | None = None  # 0..1
    cpu_load: float | None = None  # 0..1
    temperatures: dict[str, float] = field(default_factory=dict)  # zone -> °C
    power_watts: dict[str, float] = field(default_factory=dict)  # rail -> W
    memory_bytes: dict[str, float] = field(default_factory=dict)  # kind -> bytes

    def fill_from(self, other: JetsonReading) -> None:
        """Take from ``other`` what this reading lacks (sysfs first, tegrastats second)."""
        self.model = self.model or other.model
        if self.gpu_load is None:
            self.gpu_load = other.gpu_load
        if self.cpu_load is None:
            self.cpu_load = other.cpu_load
        for mine, theirs in (
            (self.temperatures, other.temperatures),
            (self.power_watts, other.power_watts),
            (self.memory_bytes, other.memory_bytes),
        ):
            if not mine:
                mine.update(theirs)


# ---------------------------------------------------------------- pure parsers


def zone_name(thermal_type: str) -> str:
    """``cpu-thermal`` (r36) / ``CPU-therm`` (r35) / ``CPU`` (tegrastats) -> ``cpu``;
    ``Tboard_tegra`` -> ``tboard``: one label whichever source gave the figure."""
    name = thermal_type.strip().lower()
    for suffix in ("-thermal", "-therm", "_thermal", "_tegra"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def parse_millicelsius(text: str) -> float | None:
    """A thermal zone's ``temp`` file (millidegrees) in °C; None without a sensor."""
    try:
        celsius = int(text.strip()) / 1000.0
    except ValueError:
        return None
    return None if celsius < _NO_SENSOR_BELOW_C else celsius


def parse_gpu_load(text: str) -> float | None:
    """The GPU's ``load`` file: per mille busy (0..1000) -> 0..1."""
    try:
        per_mille = int(text.strip())
    except ValueError:
        return None
    return min(max(per_mille, 0), 1000) / 1000.0


def rail_watts(millivolts: str, milliamps: str) -> float | None:
    """One INA3221 channel: bus voltage (mV) times current (mA), in watts."""
    try:
        mv = int(millivolts.strip().split()[0])
        ma = int(milliamps.strip().split()[0])
    except (ValueError, IndexError):
        return None
    return mv * ma / 1e6


def parse_meminfo(text: str) -> dict[str, float]:
    """``/proc/meminfo`` -> bytes by kind: total, available, used, swap_total, swap_used."""
    kb: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[key.strip()] = int(parts[0])
    out: dict[str, float] = {}
    if "MemTotal" in kb:
        out["total"] = kb["MemTotal"] * 1024.0
        if "MemAvailable" in kb:
            out["available"] = kb["MemAvailable"] * 1024.0
            out["used"] = (kb["MemTotal"] - kb["MemAvailable"]) * 1024.0
    if "SwapTotal" in kb:
        out["swap_total"] = kb["SwapTotal"] * 1024.0
        if "SwapFree" in kb:
            out["swap_used"] = (kb["SwapTotal"] - kb["SwapFree"]) * 1024.0
    return out


def parse_proc_stat(text: str) -> tuple[int, int] | None:
    """``/proc/stat``'s aggregate ``cpu`` line -> (busy jiffies, all jiffies).

    Idle is ``idle`` + ``iowait`` (fields 4 and 5, proc(5)); guest time is already
    counted in ``user``/``nice`` and is not added twice."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            counted = values[:8]  # user nice system idle iowait irq softirq steal
            idle = sum(counted[3:5])
            total = sum(counted)
            return total - idle, total
    return None


def cpu_load_between(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    busy = after[0] - before[0]
    total = after[1] - before[1]
    if total <= 0:
        return None
    return min(max(busy / total, 0.0), 1.0)


_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)MB")
_CPU = re.compile(r"\bCPU \[([^\]]*)\]")
_GR3D = re.compile(r"\bGR3D_FREQ (\d+)%")
_TEMP = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C\b")
# "VDD_IN 4761mW/4778mW" (L4T r35+), "POM_5V_IN 2746/2911" and "VDD_IN 9273/9056" (older).
_POWER = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?=\s|$)")
_MIB = 1024.0 * 1024.0


def parse_tegrastats(line: str) -> JetsonReading:
    """One ``tegrastats`` line -> a reading (NVIDIA's "tegrastats Utility" report format).

    ``RAM used/totalMB``, ``SWAP used/totalMB`` (MiB), ``CPU [load%@MHz,…]`` (``off`` for a
    parked core), ``GR3D_FREQ load%``, ``<zone>@<°C>C``, ``<rail> <now>mW/<avg>mW``. The
    rail's current value is taken, not its running average."""
    r = JetsonReading()
    if m := _RAM.search(line):
        used, total = int(m.group(1)), int(m.group(2))
        r.memory_bytes.update(total=total * _MIB, used=used * _MIB, available=(total - used) * _MIB)
    if m := _SWAP.search(line):
        used, total = int(m.group(1)), int(m.group(2))
        r.memory_bytes.update(swap_total=total * _MIB, swap_used=used * _MIB)
    if m := _CPU.search(line):
        loads = [int(c.split("%")[0]) for c in m.group(1).split(",") if "%" in c]
        if loads:
            r.cpu_load = sum(loads) / len(loads) / 100.0
    if m := _GR3D.search(line):
        r.gpu_load = int(m.group(1)) / 100.0
    for name, value in _TEMP.findall(line):
        celsius = float(value)
        if celsius >= _NO_SENSOR_BELOW_C:
            r.temperatures[zone_name(name)] = celsius
    # Rails come after the temperatures; RAM/SWAP "used/total" carry MB and never match.
    for rail, now, _avg in _POWER.findall(line):
        if rail != "NC":
            r.power_watts[rail] = int(now) / 1000.0
    return r


# ---------------------------------------------------------------- the board's files


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:  # absent, or not readable by this user: that figure is left out
        return None


def is_jetson(root: Path) -> bool:
    compatible = _read(root / "proc/device-tree/compatible")
    if compatible is not None and "nvidia,tegra" in compatible:
        return True
    return (root / "etc/nv_tegra_release").is_file()


def read_model(root: Path) -> str | None:
    text = _read(root / "proc/device-tree/model")
    if text is None:
        return None
    return text.strip("\x00\n ") or None


def read_gpu_load(root: Path) -> float | None:
    devfreq = root / "sys/class/devfreq"
    for dev in sorted(devfreq.glob("*")) if devfreq.is_dir() else []:
        name = _read(dev / "device/of_node/name")
        if name is not None and name.strip("\x00\n ") in GPU_DEVICE_NAMES:
            text = _read(dev / "device/load")
            if text is not None:
                return parse_gpu_load(text)
    for rel in _GPU_LOAD_FALLBACKS:
        text = _read(root / rel)
        if text is not None:
            return parse_gpu_load(text)
    return None


def read_temperatures(root: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for zone in sorted((root / "sys/class/thermal").glob("thermal_zone*")):
        kind, temp = _read(zone / "type"), _read(zone / "temp")
        if kind is None or temp is None:
            continue
        celsius = parse_millicelsius(temp)
        if celsius is not None:
            out.setdefault(zone_name(kind), celsius)
    return out


def read_power(root: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for device in sorted((root / "sys/bus/i2c/devices").glob("*")):
        name = _read(device / "name")
        if name is None or "ina3221" not in name:
            continue
        for hwmon in sorted(device.glob("hwmon/hwmon*")):
            for label_file in sorted(hwmon.glob("in*_label")):
                channel = label_file.name[2 : -len("_label")]
                label = (_read(label_file) or "").strip()
                if not label or label == "NC" or channel == "7":
                    continue
                mv, ma = _read(hwmon / f"in{channel}_input"), _read(hwmon / f"curr{channel}_input")
                if mv is None or ma is None:
                    continue
                watts = rail_watts(mv, ma)
                if watts is not None:
                    out[label] = watts
    return out


def last_line(path: Path, tail_bytes: int = 4096) -> str | None:
    """The last complete line of a file that ``tegrastats --logfile`` keeps appending to."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    lines = [ln for ln in lines if ln.strip()]
    return lines[-1] if lines else None


class JetsonCollector(Collector):
    """A prometheus_client collector reading the board at every scrape (files only, no
    subprocess); register it only where :func:`is_jetson` holds."""

    def __init__(self, root: Path = Path("/"), tegrastats_log: Path | None = None) -> None:
        self.root = root
        self.tegrastats_log = tegrastats_log
        self._last_cpu: tuple[int, int] | None = None
        self._last_cpu_load: float | None = None

    def read(self) -> JetsonReading:
        root = self.root
        r = JetsonReading(
            model=read_model(root),
            gpu_load=read_gpu_load(root),
            temperatures=read_temperatures(root),
            power_watts=read_power(root),
        )
        meminfo = _read(root / "proc/meminfo")
        if meminfo is not None:
            r.memory_bytes = parse_meminfo(meminfo)
        stat_text = _read(root / "proc/stat")
        now = parse_proc_stat(stat_text) if stat_text is not None else None
        if now is not None:
            # First scrape: since boot (the counters' own start); later: since the last one.
            # Two scrapes within one jiffy (10 ms) see no time pass: keep the last figure.
            before = self._last_cpu or (0, 0)
            load = cpu_load_between(before, now)
            if load is not None or now[1] < before[1]:  # counters went back: a new start
                self._last_cpu = now
            if load is not None:
                self._last_cpu_load = load
            r.cpu_load = self._last_cpu_load
        if self.tegrastats_log is not None:
            line = last_line(self.tegrastats_log)
            if line is not None:
                r.fill_from(parse_tegrastats(line))
        return r

    def collect(self) -> Iterator[Metric]:
        return iter(reading_metrics(self.read()))

    def describe(self) -> Iterator[Metric]:
        return iter(())  # no I/O at registration: the series exist only once read


def reading_metrics(r: JetsonReading) -> list[Metric]:
    """Prometheus families for one reading; a figure the board did not give is absent."""
    out: list[Metric] = []
    if r.model is not None:
        info = GaugeMetricFamily(PREFIX + "info", "The Jetson board (1)", labels=["model"])
        info.add_metric([r.model], 1)
        out.append(info)
    for name, value, doc in (
        ("gpu_load_ratio", r.gpu_load, "Integrated GPU busy share (GR3D), 0..1"),
        ("cpu_load_ratio", r.cpu_load, "CPU busy share over all cores since the last scrape"),
    ):
        if value is not None and math.isfinite(value):
            out.append(GaugeMetricFamily(PREFIX + name, doc, value=value))
    for name, label, values, doc in (
        ("temperature_celsius", "zone", r.temperatures, "Thermal zone temperature"),
        ("power_watts", "rail", r.power_watts, "Power rail draw (INA3221 channel)"),
        ("memory_bytes", "kind", r.memory_bytes, "Memory shared by CPU and GPU, by kind"),
    ):
        if values:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=[label])
            for key, value in sorted(values.items()):
                family.add_metric([key], value)
            out.append(family)
    return out


def register_jetson_collector(
    registry: CollectorRegistry, environ: dict[str, str] | os._Environ[str] | None = None
) -> JetsonCollector | None:
    """Add a :class:`JetsonCollector` to ``registry`` when the root is a Jetson's.

    Reads a file or two (call it before the event loop runs, as ``create_app`` is)."""
    env = os.environ if environ is None else environ
    root = Path(env.get(ROOT_ENV) or "/")
    if not is_jetson(root):
        return None
    log = env.get(TEGRASTATS_LOG_ENV)
    collector = JetsonCollector(root, Path(log) if log else None)
    registry.register(collector)
    return collector
