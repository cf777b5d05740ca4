"""Everything about a TensorRT plan that is not a TensorRT call: plain, CPU-tested functions.

:mod:`edge_vision.engines.tensorrt` holds every TensorRT call; this module holds what
surrounds them, so CI (no GPU, no TensorRT) tests it:

* :func:`derive_profile`: the optimisation profile (TensorRT ``IOptimizationProfile``:
  MIN/OPT/MAX of batch, height and width) from the model's input limits and the config,
  so every shape :func:`edge_vision.shape.choose_input_shape` can pick lies inside it;
* :class:`PlanKey`: what a plan depends on (model SHA-256, TensorRT version, GPU name and
  compute capability, precision, profile, DLA core, input adapter) and the file name
  derived from it;
* :func:`lookup_plan`, :func:`explain_stale`, :func:`write_plan_atomically`,
  :func:`build_lock`: finding the plan for the current key under ``engine_dir``, saying
  why an existing one does not fit, writing plan + JSON so a reader never sees half;
* :func:`wrap_uint8_input`: the ONNX graph TensorRT builds from, with the frame
  normalisation folded in (see its docstring for why);
* :func:`calibration_batches`, :func:`calibration_frames`: INT8 calibration input, real
  frames letterboxed exactly as serving does;
* :func:`describe_parser_errors`: ONNX parser errors with node names and operators;
* :class:`LogBuildProgress`: TensorRT ``IProgressMonitor`` phases as log lines (and
  systemd start-timeout extensions), for builds that happen inside ``serve``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from ..config import TensorRTConfig
from ..errors import ConfigError, EngineError, ModelError
from ..models import file_sha256
from ..shape import InputLimits, Normalisation, choose_input_shape, letterbox_into, plan_letterbox

log = logging.getLogger(__name__)

U8Array = npt.NDArray[np.uint8]
Precision = Literal["fp32", "fp16", "int8"]

#: Version of the JSON record written beside each plan; a change makes old records stale.
RECORD_FORMAT = 1
#: Name of the engine input of every plan edge_vision builds (see :func:`wrap_uint8_input`).
UINT8_INPUT_NAME = "edge_vision_frames_u8"
#: Prefix of the nodes and initialisers :func:`wrap_uint8_input` adds.
ADAPTER_PREFIX = "edge_vision_pre/"


# ---------------------------------------------------------------------------------------
# The optimisation profile


@dataclass(frozen=True, slots=True)
class ShapeProfile:
    """MIN/OPT/MAX of batch, height and width: one TensorRT optimisation profile.

    The engine input is ``[N, H, W, 3]`` uint8 (:func:`wrap_uint8_input`), so the shapes
    given to ``IOptimizationProfile.set_shape`` are ``(N, H, W, 3)``.
    """

    batch: tuple[int, int, int]
    height: tuple[int, int, int]
    width: tuple[int, int, int]

    def __post_init__(self) -> None:
        for name, (lo, opt, hi) in (
            ("batch", self.batch),
            ("height", self.height),
            ("width", self.width),
        ):
            if not 1 <= lo <= opt <= hi:
                raise ConfigError(
                    f"TensorRT profile {name} must satisfy 1 <= min <= opt <= max, "
                    f"got {lo}/{opt}/{hi}"
                )

    def shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """``(min, opt, max)`` input shapes ``(N, H, W, 3)`` for ``set_shape``."""
        return (
            (self.batch[0], self.height[0], self.width[0], 3),
            (self.batch[1], self.height[1], self.width[1], 3),
            (self.batch[2], self.height[2], self.width[2], 3),
        )

    @property
    def static(self) -> bool:
        """True when min == opt == max for every dimension (what DLA requires)."""
        return all(lo == hi for lo, _, hi in (self.batch, self.height, self.width))

    def run_batch(self, n: int) -> int:
        """The batch actually run for ``n`` frames: padded up to the profile's minimum."""
        return max(n, self.batch[0])

    def check(self, n: int, height: int, width: int) -> None:
        """Raise EngineError unless an ``n × height × width`` batch fits the profile."""
        b = self.run_batch(n)
        if not (
            b <= self.batch[2]
            and self.height[0] <= height <= self.height[2]
            and self.width[0] <= width <= self.width[2]
        ):
            raise EngineError(
                f"a batch of {n} at {width}x{height} is outside the TensorRT profile (batch "
                f"{self.batch[0]}..{self.batch[2]}, height {self.height[0]}..{self.height[2]}, "
                f"width {self.width[0]}..{self.width[2]}); rebuild the plan for these limits"
            )

    def as_json(self) -> dict[str, list[int]]:
        lo, opt, hi = self.shapes()
        return {"min": list(lo), "opt": list(opt), "max": list(hi)}

    @classmethod
    def from_shapes(cls, lo: Sequence[int], opt: Sequence[int], hi: Sequence[int]) -> ShapeProfile:
        """From three ``(N, H, W, 3)`` shapes (a JSON record, or an engine's profile)."""
        return cls(
            (int(lo[0]), int(opt[0]), int(hi[0])),
            (int(lo[1]), int(opt[1]), int(hi[1])),
            (int(lo[2]), int(opt[2]), int(hi[2])),
        )


def side_range(limits: InputLimits) -> tuple[int, int]:
    """Smallest and largest side :func:`~edge_vision.shape.choose_input_shape` can return.

    The long side goes to the target, so no side exceeds the stride-rounded target even
    when ``max_side`` allows more; a profile no larger than that keeps the execution
    contexts' device memory small (it is sized for the profile's maximum), which counts
    on a Jetson. Same arithmetic as ``choose_input_shape``'s clamp, checked by a test that
    sweeps frame sizes, so the profile and the shapes the server picks never disagree.
    """
    stride = limits.stride
    lo = -(-limits.min_side // stride) * stride
    hi = limits.max_side - limits.max_side % stride
    target = -(-limits.target // stride) * stride
    return min(lo, hi), min(max(target, lo), hi)


def derive_profile(
    limits: InputLimits,
    max_batch: int,
    *,
    opt_batch: int | None = None,
    opt_shape: tuple[int, int] | None = None,
    dla: bool = False,
) -> ShapeProfile:
    """The optimisation profile for a model's input limits and the engine config.

    * batch: ``1 .. max_batch``, tuned for ``opt_batch`` (default ``max_batch``: when
      several cameras keep the batcher full, that is the load that matters);
    * height and width: every side ``choose_input_shape`` can produce (``side_range``),
      tuned for ``opt_shape`` (default: the input of a 16:9 landscape frame, 640×384 with
      the default limits, since most cameras are 16:9).

    ``dla``: TensorRT's DLA restrictions say "DLA does not support dynamic dimensions, so
    the profile's min, max, and opt values must be equal". Then every dimension must
    be static: the sides must already be (``model.min_side == model.max_side`` makes every
    frame run at one square size) and the batch is fixed at ``max_batch`` (smaller batches
    are padded; use ``engine.max_batch: 1`` for the lowest latency on DLA).
    """
    if max_batch < 1:
        raise ConfigError(f"engine.max_batch must be >= 1, got {max_batch}")
    lo, hi = side_range(limits)
    if dla:
        if lo != hi:
            raise ConfigError(
                "a DLA plan needs static input shapes (TensorRT: DLA does not support dynamic "
                f"dimensions), but model.min_side/max_side allow {lo}..{hi}; set both to one "
                "value (e.g. model.min_side: 640, model.max_side: 640) so every frame runs at "
                "that square size"
            )
        return ShapeProfile((max_batch, max_batch, max_batch), (lo, lo, lo), (lo, lo, lo))
    ob = max_batch if opt_batch is None else opt_batch
    if not 1 <= ob <= max_batch:
        raise ConfigError(
            f"engine.tensorrt.opt_batch must lie in 1..engine.max_batch ({max_batch}), got {ob}"
        )
    if opt_shape is None:
        oh, ow = choose_input_shape(1920, 1080, limits)  # (height, width) of a 16:9 frame
    else:
        oh, ow = opt_shape
        for name, side in (("height", oh), ("width", ow)):
            if not lo <= side <= hi or side % limits.stride:
                raise ConfigError(
                    f"engine.tensorrt.opt_shape {name} {side} must be a multiple of "
                    f"{limits.stride} within {lo}..{hi} (model.min_side/max_side)"
                )
    return ShapeProfile((1, ob, max_batch), (lo, oh, hi), (lo, ow, hi))


def profile_for(limits: InputLimits, max_batch: int, tcfg: TensorRTConfig) -> ShapeProfile:
    """:func:`derive_profile` with the ``engine.tensorrt`` settings."""
    return derive_profile(
        limits,
        max_batch,
        opt_batch=tcfg.opt_batch,
        opt_shape=tcfg.opt_shape,
        dla=tcfg.dla_core is not None,
    )


def calibration_shape(profile: ShapeProfile, batch: int) -> tuple[int, int, int]:
    """``(batch, H, W)`` of INT8 calibration batches: the profile's OPT sides.

    TensorRT calibrates a network with dynamic shapes at one fixed shape (the calibration
    profile's OPT; ``IBuilderConfig.set_calibration_profile``), so every calibration frame
    is letterboxed to the sides the plan is tuned for. The batch is capped by the profile.
    """
    b = min(max(1, batch), profile.batch[2])
    b = max(b, profile.batch[0])
    return b, profile.height[1], profile.width[1]


# ---------------------------------------------------------------------------------------
# The key


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
) -> Path:
    """The INT8 calibration cache for this model, input adapter, frames and shape.

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


# ---------------------------------------------------------------------------------------
# The ONNX graph TensorRT builds from


def wrap_uint8_input(model: Any, input_name: str, norm: Normalisation) -> Any:
    """A copy of ``model`` whose input is uint8 ``[N, H, W, 3]`` BGR frames.

    The added first nodes do what :func:`edge_vision.shape.normalise_into` does on the CPU
    — ``Cast`` to float, ``Transpose`` NHWC→NCHW, reorder channels to RGB when the model
    wants it (``Gather``), ``Mul`` by ``1/std``, ``Add`` ``-mean/std`` — and write the
    tensor the original graph reads (``input_name``), so the graph is otherwise untouched.

    Why normalise *inside* the plan rather than on the CPU or with a separate kernel:
    the pinned frame bytes the decoder wrote are uploaded as they are (4x fewer bytes
    than float32), no host time is spent per frame, no CuPy or runtime compiler is needed
    (JetPack images have neither by default), and TensorRT fuses these steps into the
    first layers. And this graph is checked on the CPU here, with ONNX Runtime against
    ``normalise_into`` + the original model — the one numeric part of the TensorRT path
    CI can prove. TensorRT 10's ONNX parser accepts UINT8 as a network input with Cast to
    float (onnx-tensorrt's operator matrix); UINT8 cannot feed other ops, hence Cast first.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    wrapped = onnx.ModelProto()
    wrapped.CopyFrom(model)
    graph = wrapped.graph
    index = next((i for i, v in enumerate(graph.input) if v.name == input_name), None)
    if index is None:
        raise ModelError(f"the model has no input named {input_name!r}")
    original = graph.input[index]
    dims = list(original.type.tensor_type.shape.dim)
    if len(dims) != 4:
        raise ModelError(f"input {input_name!r} has rank {len(dims)}; expected [N, 3, H, W]")

    def dim(d: Any) -> int | str | None:
        if d.HasField("dim_value"):
            return int(d.dim_value)
        return d.dim_param or None

    n, _, h, w = (dim(d) for d in dims)
    new_input = helper.make_tensor_value_info(UINT8_INPUT_NAME, TensorProto.UINT8, [n, h, w, 3])
    p = ADAPTER_PREFIX
    scale = np.asarray([1.0 / s for s in norm.std], np.float32).reshape(1, 3, 1, 1)
    shift = np.asarray(
        [-m / s for m, s in zip(norm.mean, norm.std, strict=True)], np.float32
    ).reshape(1, 3, 1, 1)
    inits = [
        numpy_helper.from_array(scale, p + "scale"),
        numpy_helper.from_array(shift, p + "shift"),
    ]
    nodes = [
        helper.make_node(
            "Cast", [UINT8_INPUT_NAME], [p + "float"], p + "cast", to=TensorProto.FLOAT
        ),
        helper.make_node("Transpose", [p + "float"], [p + "nchw"], p + "nchw", perm=[0, 3, 1, 2]),
    ]
    chw = p + "nchw"
    if norm.rgb:
        inits.append(numpy_helper.from_array(np.asarray([2, 1, 0], np.int64), p + "bgr_to_rgb"))
        nodes.append(
            helper.make_node("Gather", [chw, p + "bgr_to_rgb"], [p + "rgb"], p + "rgb", axis=1)
        )
        chw = p + "rgb"
    nodes += [
        helper.make_node("Mul", [chw, p + "scale"], [p + "scaled"], p + "scale"),
        helper.make_node("Add", [p + "scaled", p + "shift"], [input_name], p + "shift"),
    ]
    graph.input.remove(original)
    graph.input.insert(index, new_input)
    graph.initializer.extend(inits)
    old_nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + old_nodes)
    return wrapped


def adapter_node_count(norm: Normalisation) -> int:
    """How many nodes :func:`wrap_uint8_input` puts in front of the model's own."""
    return 5 if norm.rgb else 4


# ---------------------------------------------------------------------------------------
# ONNX parser errors


@dataclass(frozen=True)
class ParserErrorInfo:
    """One ``IParserError`` of TensorRT's ONNX parser, as plain values."""

    code: str
    desc: str
    node_index: int  # -1 when the error is not about one node
    node_name: str
    node_operator: str
    file: str = ""
    line: int = 0
    func: str = ""


def describe_parser_errors(
    model_path: Path, errors: Sequence[ParserErrorInfo], adapter_nodes: int
) -> str:
    """One message naming every failing node (name, operator, position in the model)."""
    lines = [f"TensorRT's ONNX parser rejected {model_path} ({len(errors)} error(s)):"]
    for e in errors:
        if e.node_index >= 0:
            if e.node_index < adapter_nodes or e.node_name.startswith(ADAPTER_PREFIX):
                where = f"edge_vision input adapter node {e.node_name!r} ({e.node_operator})"
            else:
                name = e.node_name or "<unnamed>"
                where = f"node {name!r} ({e.node_operator or '?'}, #{e.node_index - adapter_nodes})"
        else:
            where = "model"
        lines.append(f"  {where}: {e.code}: {e.desc}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# INT8 calibration input


def calibration_batches(
    frames: Iterable[U8Array], batch_size: int, limit: int
) -> Iterator[U8Array]:
    """Group letterboxed frames into ``[batch_size, H, W, 3]`` arrays, at most ``limit``
    frames in all. A last partial batch is dropped: TensorRT's calibrator asks for batches
    of exactly ``get_batch_size()`` frames."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    usable = (limit // batch_size) * batch_size
    if usable == 0:
        return
    batch: list[U8Array] = []
    for taken, frame in enumerate(frames, 1):
        if batch and frame.shape != batch[0].shape:
            raise ValueError(f"calibration frame {taken} is {frame.shape}, not {batch[0].shape}")
        batch.append(frame)
        if len(batch) == batch_size:
            yield np.stack(batch)
            batch = []
            if taken >= usable:  # stop before reading (decoding) another frame
                return


def calibration_frames(
    source: Path, height: int, width: int, pad_value: int, limit: int
) -> Iterator[U8Array]:
    """Real frames from an image folder or a video, letterboxed to ``height × width``
    exactly as serving does (:func:`~edge_vision.shape.plan_letterbox` +
    :func:`~edge_vision.shape.letterbox_into`). Blocking: run in a worker thread.

    The source is opened here, so a missing or unreadable one is a ConfigError before
    the build starts, not in the middle of it. A video longer than ``limit`` frames is
    sampled evenly over its length rather than read from the start only, so calibration
    sees the scene's variety.
    """
    from ..sources import Cut, SourceError, open_source

    try:
        src = open_source(str(source), Cut())
    except SourceError as e:
        raise ConfigError(f"engine.tensorrt.calibration_source: {e}") from None
    total = src.info.frame_count
    step = max(1, math.floor(total / limit)) if total and total > limit else 1

    def frames() -> Iterator[U8Array]:
        with src:
            given = 0
            index = 0
            while given < limit:
                frame = src.read()
                if frame is None:
                    break
                index += 1
                if (index - 1) % step:
                    continue
                h0, w0 = frame.pixels.shape[:2]
                out = np.empty((height, width, 3), np.uint8)
                letterbox_into(frame.pixels, plan_letterbox(w0, h0, height, width), out, pad_value)
                given += 1
                yield out

    return frames()


# ---------------------------------------------------------------------------------------
# Build progress


class BuildProgress(Protocol):
    """Receives TensorRT ``IProgressMonitor`` callbacks (from TensorRT's build threads)."""

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None: ...

    def step_complete(self, phase: str, step: int) -> bool:
        """False asks TensorRT to stop the build."""
        ...

    def phase_finish(self, phase: str) -> None: ...


class LogBuildProgress:
    """Build progress as log lines, for plans built by ``serve``.

    Logs each top-level phase and, at most every ``interval_s``, where the innermost one is.
    Under systemd it extends the unit's start timeout while the build runs
    (``EXTEND_TIMEOUT_USEC``) and shows the phase in ``systemctl status`` (``STATUS=``), so
    a build after a JetPack upgrade is not killed as a hung start. ``cancel()`` makes
    TensorRT stop at its next step (the engine is closed during a build).
    """

    def __init__(self, interval_s: float = 5.0, notify: bool = True) -> None:
        self._interval = interval_s
        self._notify = notify
        self._lock = threading.Lock()
        self._phases: dict[str, tuple[str | None, int, int, float]] = {}
        self._last_log = 0.0
        self._cancelled = threading.Event()
        self.lines: list[str] = []  # what was logged, newest last (kept short)

    def cancel(self) -> None:
        self._cancelled.set()

    def _emit(self, text: str) -> None:
        log.info("TensorRT build: %s", text)
        self.lines = [*self.lines[-49:], text]
        if self._notify:
            from .. import systemd

            with contextlib.suppress(OSError):
                systemd.notify(
                    f"EXTEND_TIMEOUT_USEC=120000000\nSTATUS=building TensorRT plan: {text}"
                )

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        with self._lock:
            self._phases[phase] = (parent, 0, max(1, steps), time.monotonic())
            if parent is None:
                self._emit(f"{phase} ({steps} steps)")

    def step_complete(self, phase: str, step: int) -> bool:
        now = time.monotonic()
        with self._lock:
            if phase in self._phases:
                parent, _, steps, t0 = self._phases[phase]
                self._phases[phase] = (parent, step + 1, steps, t0)
            if now - self._last_log >= self._interval:
                self._last_log = now
                self._emit(self.describe())
        return not self._cancelled.is_set()

    def phase_finish(self, phase: str) -> None:
        with self._lock:
            entry = self._phases.pop(phase, None)
            if entry is not None and entry[0] is None:
                self._emit(f"{phase} done in {time.monotonic() - entry[3]:.1f} s")

    def describe(self) -> str:
        """``"Building engine 3/10 > Tactic timing 40/120"``: the open phases, outermost first."""
        return " > ".join(
            f"{name} {done}/{steps}" for name, (_, done, steps, _) in self._phases.items()
        )


def validate_build_settings(
    precision: str, dla_core: int | None, calibration_source: Path | None
) -> None:
    """Settings TensorRT would reject late (after parsing) or silently ignore, refused early."""
    if dla_core is not None and precision == "fp32":
        raise ConfigError(
            "DLA runs FP16 or INT8 layers only: use precision fp16 or int8 with --dla-core"
        )
    if precision == "int8" and calibration_source is None:
        raise ConfigError(
            "INT8 needs calibration frames: set engine.tensorrt.calibration_source (or "
            "--calibration) to an image folder or a video of the scenes the camera sees"
        )
