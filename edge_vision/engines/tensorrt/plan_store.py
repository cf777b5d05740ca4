"""Plans on disk: the key a plan depends on, its JSON record, finding and writing them.

Plain code, tested on CPUs (tests/integration/test_trt_plan.py):

* :class:`PlanKey`: what a plan depends on (model SHA-256, TensorRT version, GPU name and
  compute capability, precision, profile, DLA core, input adapter) and the file name
  derived from it;
* :func:`lookup_plan`, :func:`explain_stale`, :func:`write_plan_atomically`,
  :func:`build_lock`: finding the plan for the current key under ``engine_dir``, saying
  why an existing one does not fit, writing plan + JSON so a reader never sees half;
* the timing and INT8 calibration cache paths, and atomic cache writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from ...model.shape import Normalisation
from ...model.spec import file_sha256
from .profile import ShapeProfile

Precision = Literal["fp32", "fp16", "int8"]

#: Version of the JSON record written beside each plan; a change makes old records stale.
RECORD_FORMAT = 1


def slug(text: str) -> str:
    """File-name-safe lower-case form: ``"NVIDIA H200"`` → ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


@dataclass(frozen=True)
class InputAdapter:
    """What the plan's input expects; part of the key (a different one is another plan)."""

    layout: str  # "NHWC uint8 BGR"
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rgb: bool

    @classmethod
    def for_normalisation(cls, norm: Normalisation) -> InputAdapter:
        return cls("NHWC uint8 BGR", tuple(norm.mean), tuple(norm.std), norm.rgb)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PlanKey:
    """Everything a serialized plan depends on. Equal keys ⇒ the plan can be reused.

    TensorRT plans are specific to the TensorRT version and the GPU model they were built
    with (the developer guide: "engines are specific to the exact GPU model they were
    built on" and to the TensorRT version), and of course to the model, precision and
    optimisation profile. The DLA core is part of it because a DLA plan runs on that core.
    """

    model_name: str
    model_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: tuple[int, int]
    precision: Precision
    profile: ShapeProfile
    dla_core: int | None
    adapter: InputAdapter

    def fields(self) -> dict[str, Any]:
        """The fields that decide reuse, as JSON values (the digest is over these); the
        JSON round trip makes them compare equal to a record read back from disk."""
        fields = {
            "format": RECORD_FORMAT,
            "model_sha256": self.model_sha256,
            "tensorrt_version": self.tensorrt_version,
            "gpu_name": self.gpu_name,
            "compute_capability": f"{self.compute_capability[0]}.{self.compute_capability[1]}",
            "precision": self.precision,
            "profile": self.profile.as_json(),
            "dla_core": self.dla_core,
            "input_adapter": asdict(self.adapter),
        }
        normalised: dict[str, Any] = json.loads(json.dumps(fields))
        return normalised

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def sm(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def stem(self) -> str:
        """File stem: readable parts first (what a person scans ``ls`` for), digest last."""
        dla = f"-dla{self.dla_core}" if self.dla_core is not None else ""
        return (
            f"{slug(self.model_name)}-{self.precision}-{slug(self.gpu_name)}-"
            f"{self.sm.replace('_', '')}-trt{slug(self.tensorrt_version)}{dla}-{self.digest}"
        )

    def machine(self) -> str:
        return f"{self.gpu_name} ({self.sm})/TensorRT {self.tensorrt_version}"


def plan_paths(engine_dir: Path, key: PlanKey) -> tuple[Path, Path]:
    """``(plan, json)`` paths of the plan for ``key``."""
    return engine_dir / f"{key.stem}.plan", engine_dir / f"{key.stem}.json"


def timing_cache_path(engine_dir: Path, key: PlanKey, configured: Path | None = None) -> Path:
    """The timing cache reused across builds: the configured file, else one per GPU and
    TensorRT version (TensorRT rejects a cache from another device), so several devices
    may share one ``engine_dir``."""
    if configured is not None:
        return configured
    return (
        engine_dir / f"timing-{slug(key.gpu_name)}-{key.sm}-trt{slug(key.tensorrt_version)}.cache"
    )


def calibration_cache_path(
    engine_dir: Path,
    key: PlanKey,
    source: Path,
    frames: int,
    shape: tuple[int, int, int],
    fit: str = "letterbox",
) -> Path:
    """The INT8 calibration cache for this model, input adapter, frames, shape and fit
    (a stretched frame is another picture than a letterboxed one).

    Independent of the GPU and profile, so a rebuild for another profile or a DLA core
    reuses it; it holds the TensorRT version because the cache format is versioned.
    """
    ident = json.dumps(
        [
            key.model_sha256,
            asdict(key.adapter),
            key.tensorrt_version,
            str(source.expanduser().resolve()),
            frames,
            list(shape),
            *([] if fit == "letterbox" else [fit]),  # letterbox caches keep their names
        ],
        sort_keys=True,
    )
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return engine_dir / f"{slug(key.model_name)}-int8-calibration-{digest}.cache"


# ---------------------------------------------------------------------------------------
# The JSON record beside each plan


@dataclass
class PlanRecord:
    """The JSON written beside a plan: the key's fields plus how and when it was built."""

    key: str
    plan_file: str
    model_name: str
    model_path: str
    fields: dict[str, Any]
    plan_sha256: str
    plan_bytes: int
    built_at: str
    build_seconds: float
    workspace_mib: int
    timing_cache: str | None = None
    calibration: dict[str, Any] | None = None
    edge_vision_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        data = {"record_format": RECORD_FORMAT, **asdict(self)}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PlanRecord:
        """Parse a record; ValueError when it is not one this version wrote."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON: {e}") from None
        if not isinstance(data, dict) or data.pop("record_format", None) != RECORD_FORMAT:
            raise ValueError("not a plan record of this edge_vision version")
        try:
            return cls(**data)
        except TypeError as e:
            raise ValueError(f"unexpected fields: {e}") from None

    def machine(self) -> str:
        f = self.fields
        cc = str(f.get("compute_capability", "?")).replace(".", "")
        return f"{f.get('gpu_name', '?')} (sm_{cc})/TensorRT {f.get('tensorrt_version', '?')}"


def make_record(
    key: PlanKey,
    model_path: Path,
    plan: bytes,
    *,
    build_seconds: float,
    workspace_mib: int,
    timing_cache: Path | None,
    calibration: dict[str, Any] | None,
    edge_vision_version: str,
) -> PlanRecord:
    return PlanRecord(
        key=key.digest,
        plan_file=f"{key.stem}.plan",
        model_name=key.model_name,
        model_path=str(model_path),
        fields=key.fields(),
        plan_sha256=hashlib.sha256(plan).hexdigest(),
        plan_bytes=len(plan),
        built_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        build_seconds=round(build_seconds, 3),
        workspace_mib=workspace_mib,
        timing_cache=str(timing_cache) if timing_cache else None,
        calibration=calibration,
        edge_vision_version=edge_vision_version,
    )


def _write_atomically(path: Path, data: bytes) -> None:
    """tmp file in the same folder, fsync, rename: readers see the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_plan_atomically(
    engine_dir: Path, key: PlanKey, plan: bytes, record: PlanRecord
) -> tuple[Path, Path]:
    """Write the plan, then its JSON, each atomically. The JSON is written last because a
    plan counts only with its record (:func:`lookup_plan`), so a crash between the two
    leaves an unused plan, never a record pointing at a half-written one."""
    engine_dir.mkdir(parents=True, exist_ok=True)
    plan_path, json_path = plan_paths(engine_dir, key)
    _write_atomically(plan_path, plan)
    _write_atomically(json_path, record.to_json().encode())
    return plan_path, json_path


def write_cache_atomically(path: Path, data: bytes) -> None:
    """Timing and calibration caches: written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, data)


@contextlib.contextmanager
def build_lock(engine_dir: Path, key: PlanKey) -> Iterator[None]:
    """Hold an exclusive lock for building ``key`` (blocks: call from a worker thread).

    Two servers starting on one device, or ``serve`` and ``build-engine`` at once, then
    build the plan once: the second waits and finds the first one's plan.
    """
    import fcntl

    engine_dir.mkdir(parents=True, exist_ok=True)
    lock_path = engine_dir / f".{key.stem}.lock"
    with lock_path.open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------
# Finding the plan for a key


@dataclass
class PlanLookup:
    """What :func:`lookup_plan` found for a key."""

    status: Literal["found", "missing", "damaged"]
    plan_path: Path
    json_path: Path
    record: PlanRecord | None = None
    problem: str | None = None  # why a damaged plan cannot be used
    others: list[PlanRecord] = field(default_factory=list)  # same model, another key


def read_record(path: Path) -> PlanRecord | None:
    try:
        return PlanRecord.from_json(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def lookup_plan(engine_dir: Path, key: PlanKey) -> PlanLookup:
    """Find the plan for ``key`` under ``engine_dir`` (blocking file I/O).

    ``found``: its JSON record names this key and the plan's SHA-256 matches the record.
    ``damaged``: a record or plan exists for this key but they disagree (a copy cut
    short, a plan replaced by hand): rebuild. ``missing``: nothing for this key;
    ``others`` lists records of the same model built for another key, newest first, so
    the caller can say *why* (another GPU, TensorRT version, precision, profile).
    """
    plan_path, json_path = plan_paths(engine_dir, key)
    others = []
    if engine_dir.is_dir():
        for p in sorted(engine_dir.glob("*.json")):
            if p == json_path:
                continue
            rec = read_record(p)
            if rec is not None and rec.model_name == key.model_name:
                others.append(rec)
    others.sort(key=lambda r: r.built_at, reverse=True)
    if not json_path.exists():
        return PlanLookup("missing", plan_path, json_path, others=others)
    record = read_record(json_path)
    problem = None
    if record is None:
        problem = f"{json_path.name} is not a readable plan record"
    elif record.key != key.digest or record.fields != key.fields():
        problem = f"{json_path.name} records another key ({record.key})"
    elif not plan_path.is_file():
        problem = f"{plan_path.name} is missing"
    elif plan_path.stat().st_size != record.plan_bytes or file_sha256(plan_path) != (
        record.plan_sha256
    ):
        problem = f"{plan_path.name} differs from the plan its record describes"
    if problem is not None:
        return PlanLookup("damaged", plan_path, json_path, record, problem, others)
    return PlanLookup("found", plan_path, json_path, record, None, others)


def rebuild_command(model_path: Path | None, precision: str, dla_core: int | None) -> str:
    """The command that builds the plan the current config wants."""
    parts = ["edge-vision build-engine"]
    if model_path is not None:
        parts.append(str(model_path))
    parts.append(f"--precision {precision}")
    if dla_core is not None:
        parts.append(f"--dla-core {dla_core}")
    return " ".join(parts) + " (with the same --config as serve)"


def explain_stale(record: PlanRecord, key: PlanKey) -> list[str]:
    """What differs between an existing plan's record and the key wanted now."""
    was, now = record.fields, key.fields()
    diffs = []
    if was.get("model_sha256") != now["model_sha256"]:
        diffs.append(
            f"model file changed (sha256 {str(was.get('model_sha256'))[:12]}… → "
            f"{now['model_sha256'][:12]}…)"
        )
    machine_was = (was.get("gpu_name"), was.get("compute_capability"), was.get("tensorrt_version"))
    machine_now = (now["gpu_name"], now["compute_capability"], now["tensorrt_version"])
    if machine_was != machine_now:
        diffs.append(f"this machine is {key.machine()}")
    for name in ("precision", "dla_core", "profile", "input_adapter", "format"):
        if was.get(name) != now[name]:
            diffs.append(f"{name} {was.get(name)!r} → {now[name]!r}")
    return diffs


def refusal_message(record: PlanRecord, key: PlanKey, model_path: Path | None) -> str:
    """Why an existing plan is not used, and the command that builds the right one."""
    diffs = explain_stale(record, key) or ["its key differs"]
    cmd = rebuild_command(model_path, key.precision, key.dla_core)
    return (
        f"{record.plan_file}: plan built for {record.machine()} does not fit "
        f"({'; '.join(diffs)}); rebuild with {cmd}"
    )
