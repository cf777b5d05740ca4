"""``edge-vision doctor``: what this board can do, checked on the board itself.

The project is built and tested on machines without a Jetson and without TensorRT, so a
user's first run on their own board is where those parts meet real hardware. ``doctor``
checks what the tests here could not and prints a short pass/fail table; ``--json FILE``
writes the same as a report to attach to an issue (docs/jetson.md says what to send).

Checks, in order: the platform; JetPack / L4T (``/etc/nv_tegra_release``,
``/proc/device-tree/model``); CUDA (driver, runtime, GPU, multiprocessors); each CUDA layer
(:mod:`edge_vision.engines.cuda`: cuda-python, pycuda) and the one in use; TensorRT and the DLA
cores; the JPEG decoder in use (host, and the GPU decoder when ``decode.device`` allows);
whether a TensorRT plan for this board exists and matches its key (``--build`` builds a
small one, with the INT8 accuracy gate when the precision is int8); ONNX Runtime on the
CPU on a real frame; the GPU engine (configured, or TensorRT / torch on CUDA when
present, once per CUDA layer) on the same frame against ONNX Runtime — relative error of
the raw output (the probability map) and the agreement of the detections
(:mod:`edge_vision.common.agreement`); single-frame latency and batch throughput.

A check that cannot run says ``not available: <reason>``; one that breaks says ``fail``
with the error's message; none prints a traceback. The exit code is 0 when nothing
failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import re
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import __version__
from ..config import Config
from .args import add_config_args, config_from_args, setup_logging

log = logging.getLogger(__name__)

PASS, FAIL, INFO, NA = "pass", "fail", "info", "not available"
U8Array = npt.NDArray[np.uint8]

#: Relative error ‖engine − ONNX Runtime‖ / ‖ONNX Runtime‖ of the raw output allowed per
#: precision (tests/gpu measured FP16 at about 1e-3 on camera-like frames). INT8 is judged
#: by its detections (the INT8 gate), its raw error only reported.
REL_ERROR_LIMIT = {"fp32": 1e-3, "fp16": 1e-2, "int8": math.inf}
#: Detections of the engine under test must match ONNX Runtime's this well (IoU >= 0.5).
MIN_AGREEMENT = 0.95

#: The batch size of the throughput measurement on GPU engines (at least; more if configured).
GPU_BATCH = 8

#: L4T release -> JetPack (NVIDIA's JetPack archive); longest prefix wins.
L4T_TO_JETPACK = {
    "36.4.4": "6.2.1",
    "36.4.3": "6.2",
    "36.4": "6.1",
    "36.3": "6.0",
    "36.2": "6.0 DP",
    "35.6": "5.1.4",
    "35.5": "5.1.3",
    "35.4": "5.1.2",
    "35.3": "5.1.1",
    "35.2": "5.1",
    "35.1": "5.0.2",
}


@dataclass
class Check:
    name: str
    status: str  # pass | fail | info | not available
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        summary = f"{NA}: {self.summary}" if self.status == NA else self.summary
        return f"{self.status.upper() if self.status != NA else 'N/A':<5} {self.name:<34} {summary}"


# -- pure helpers (unit-tested with literal inputs) ---------------------------------------


def parse_l4t_release(text: str) -> str | None:
    """``# R36 (release), REVISION: 3.0, ...`` -> ``36.3.0``; None when not that format."""
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def jetpack_for_l4t(l4t: str) -> str | None:
    for prefix in sorted(L4T_TO_JETPACK, key=len, reverse=True):
        if l4t == prefix or l4t.startswith(prefix + "."):
            return L4T_TO_JETPACK[prefix]
    return None


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """‖got − ref‖ / ‖ref‖ over the whole array, in float64."""
    ref64 = ref.astype(np.float64)
    norm = float(np.linalg.norm(ref64))
    diff = float(np.linalg.norm(got.astype(np.float64) - ref64))
    return diff / norm if norm else (0.0 if diff == 0 else float("inf"))


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# -- the checks ---------------------------------------------------------------------------


@dataclass
class DoctorOptions:
    build: bool = False
    image: Path | None = None
    seconds: float = 3.0
    engine: str | None = None  # the engine to test against ONNX Runtime; None picks one
    latency: bool = True  # measure latency and throughput (seconds per batch size)


class Doctor:
    """Runs every check once; ``checks`` holds the results in order."""

    def __init__(
        self, config: Config, options: DoctorOptions, out: Callable[[str], object] = print
    ) -> None:
        self.config = config
        self.options = options
        self.out = out
        self.checks: list[Check] = []
        self._trt: Any = None
        self._trt_error: str | None = None
        self._layers: dict[str, str | None] = {}  # CUDA layer -> None (opens) or why not
        self._layer_gpu: str | None = None
        self._frame: tuple[U8Array, bytes] | None = None
        self._reference: dict[str, Any] | None = None  # ONNX Runtime on the real frame
        self._gpu_pairs: list[tuple[str, str | None]] = []
        self._plan_missing: str | None = None  # why no TensorRT plan is there to run
        self._gpu: str | None = None  # the CUDA GPU check_cuda found

    # The runner: every check in its own try, so one broken check is one FAIL line.
    def run(self) -> list[Check]:
        # (the name a check gets when it breaks, the check)
        steps: list[tuple[str, Callable[[], Check | list[Check]]]] = [
            ("platform", self.check_platform),
            ("jetpack / l4t", self.check_jetson),
            ("cuda", self.check_cuda),
            ("cuda layer", self.check_cuda_layers),
            ("gpu sharing (mps)", self.check_gpu_sharing),
            ("tensorrt", self.check_tensorrt),
            ("dla cores", self.check_dla),
            ("jpeg decoder", self.check_decoder),
            ("tensorrt plan", self.check_plan),
            ("onnxruntime (cpu) on a real frame", self.check_onnxruntime),
            ("engine vs onnxruntime", self.check_engines),
            ("latency", self.check_latency),
        ]
        for name, step in steps:
            try:
                got = step()
            except ImportError as e:
                got = Check(name, NA, _short(e))
            except Exception as e:  # a broken check is a FAIL line, never a traceback
                log.debug("check %s failed", name, exc_info=True)
                got = Check(name, FAIL, _short(e))
            for check in got if isinstance(got, list) else [got]:
                self.checks.append(check)
                self.out(check.line())
        return self.checks

    # -- the board ----------------------------------------------------------------------

    def check_platform(self) -> Check:
        import onnxruntime

        details = {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "machine": platform.machine(),
            "edge_vision": __version__,
            "numpy": np.__version__,
            "onnxruntime": onnxruntime.__version__,
        }
        summary = (
            f"Python {details['python']} on {details['machine']}, edge-vision {__version__}, "
            f"onnxruntime {details['onnxruntime']}"
        )
        return Check("platform", INFO, summary, details)

    def check_jetson(self) -> Check:
        release = Path("/etc/nv_tegra_release")
        model_file = Path("/proc/device-tree/model")
        model = (
            model_file.read_bytes().rstrip(b"\0").decode(errors="replace")
            if model_file.is_file()
            else None
        )
        if not release.is_file():
            why = "not a Jetson (no /etc/nv_tegra_release)"
            return Check("jetpack / l4t", NA, why, {"device_tree_model": model})
        text = release.read_text(errors="replace")
        l4t = parse_l4t_release(text)
        jetpack = jetpack_for_l4t(l4t) if l4t else None
        details = {
            "nv_tegra_release": text.splitlines()[0] if text else "",
            "l4t": l4t,
            "jetpack": jetpack,
            "device_tree_model": model,
        }
        summary = f"L4T {l4t or '?'} (JetPack {jetpack or 'unknown'}), {model or 'model unknown'}"
        return Check("jetpack / l4t", INFO, summary, details)

    def check_cuda(self) -> Check:
        details: dict[str, Any] = {}
        reasons = []
        version_json = Path("/usr/local/cuda/version.json")
        if version_json.is_file():
            try:
                details["toolkit"] = json.loads(version_json.read_text())["cuda"]["version"]
            except (ValueError, KeyError, TypeError):
                pass
        try:
            from cuda.bindings import runtime as cudart

            _, drv = cudart.cudaDriverGetVersion()
            _, rtv = cudart.cudaRuntimeGetVersion()
            details["driver_api"] = _cuda_version(drv)
            details["runtime"] = _cuda_version(rtv)
        except Exception as e:  # noqa: BLE001 - ImportError, or no driver: reported
            reasons.append(f"cuda-python: {_short(e)}")
        gpu = _torch_gpu(details, reasons)
        if gpu is None and not self._open_any_layer(details):
            return Check("cuda", NA, "no CUDA GPU: " + "; ".join(reasons), details)
        name = details.get("gpu", "GPU")
        self._gpu = str(name)
        extra = f", {details['multiprocessors']} SMs" if "multiprocessors" in details else ""
        versions = ", ".join(
            f"{k} {details[k]}"
            for k in ("driver_api", "runtime", "torch_cuda", "toolkit")
            if k in details
        )
        return Check(
            "cuda", PASS, f"{name} (sm_{details.get('sm', '?')}{extra}); {versions}", details
        )

    def check_gpu_sharing(self) -> Check:
        """Whether the worker processes (``server.workers``) share the GPU through NVIDIA's
        Multi-Process Service, or take turns on it (one CUDA context each). It looks where
        doctor's own environment points: run it with the service's environment."""
        if self._gpu is None:
            return Check("gpu sharing (mps)", NA, "no CUDA GPU (see the cuda check)")
        workers = self.config.server.workers
        pipe = mps_pipe_dir(os.environ)
        details = {"workers": workers, "mps_pipe_directory": str(pipe) if pipe else None}
        if pipe is not None:
            summary = f"MPS is running ({pipe}): {workers} worker(s) share one GPU context"
        elif workers > 1:
            summary = (
                f"{workers} workers take turns on the GPU (no MPS control daemon found "
                "where this environment's CUDA_MPS_PIPE_DIRECTORY points): on the H200 at "
                "64 cameras a batch's infer stage fell from 24 to 15 ms p50 under MPS "
                "(docs/benchmarks.md); start it with deploy/systemd/nvidia-mps.service"
            )
        else:
            summary = "one worker process: nothing to share, MPS not needed"
        return Check("gpu sharing (mps)", INFO, summary, details)

    def _open_any_layer(self, details: dict[str, Any]) -> bool:
        self._probe_layers()
        if any(why is None for why in self._layers.values()):
            details.setdefault("gpu", self._layer_gpu)
            return True
        return False

    def _probe_layers(self) -> None:
        if self._layers:
            return
        from ..engines.cuda import open_runtime
        from ..engines.cuda.base import _BACKENDS

        for name in _BACKENDS:
            try:
                rt = open_runtime(name)
            except Exception as e:  # noqa: BLE001 - whatever a binding raises is the reason
                why = _short(e).removeprefix("EngineError: ")
                self._layers[name] = why.removeprefix(f"no usable CUDA binding: {name}: ")
                continue
            self._layers[name] = None
            self._layer_gpu = (
                f"{rt.device_name()} (sm_{''.join(map(str, rt.compute_capability()))})"
            )
            rt.close()

    def check_cuda_layers(self) -> Check:
        from ..engines.cuda import open_runtime

        self._probe_layers()
        usable = [n for n, why in self._layers.items() if why is None]
        details: dict[str, Any] = {n: why or "opens device 0" for n, why in self._layers.items()}
        configured = self.config.engine.cuda_backend
        details["configured"] = configured
        if not usable:
            why = "; ".join(f"{n}: {w}" for n, w in self._layers.items())
            return Check("cuda layer", NA, why, details)
        rt = open_runtime(configured)
        in_use = type(rt).__module__.rsplit(".", 1)[-1]
        rt.close()
        in_use = {"cudart": "cuda-python", "pycuda_rt": "pycuda"}.get(in_use, in_use)
        details["in_use"] = in_use
        others = ", ".join(f"{n}: {w}" for n, w in self._layers.items() if w) or "none"
        summary = f"{in_use} in use (engine.cuda_backend {configured}); usable: {', '.join(usable)}"
        return Check("cuda layer", PASS, f"{summary}; unusable: {others}", details)

    def _tensorrt(self) -> Any:
        if self._trt is None and self._trt_error is None:
            try:
                from ..engines.tensorrt import import_tensorrt

                self._trt = import_tensorrt()
            except Exception as e:  # noqa: BLE001 - reported as "not available: ..."
                self._trt_error = _short(e).removeprefix("EngineError: ")
        return self._trt

    def check_tensorrt(self) -> Check:
        trt = self._tensorrt()
        if trt is None:
            return Check("tensorrt", NA, str(self._trt_error))
        return Check("tensorrt", PASS, f"TensorRT {trt.__version__}", {"version": trt.__version__})

    def check_dla(self) -> Check:
        trt = self._tensorrt()
        if trt is None:
            return Check("dla cores", NA, f"needs TensorRT ({self._trt_error})")
        from ..engines.tensorrt.library import trt_logger

        builder = trt.Builder(trt_logger(trt))
        cores = int(builder.num_DLA_cores)
        return Check("dla cores", INFO, f"{cores} DLA core(s)", {"dla_cores": cores})

    def check_decoder(self) -> Check:
        from ..frames.decode import pick_decoder

        cfg = self.config.decode
        host = pick_decoder(cfg.decoder)
        device_mode = str(getattr(cfg, "device", "host"))
        details: dict[str, Any] = {
            "host": type(host).__name__,
            "configured": cfg.decoder,
            "device_setting": device_mode,
        }
        # The GPU decoder joins only next to a CUDA engine: the engine checks below say
        # which decoder served their frame.
        summary = (
            f"host {details['host']} (decode.decoder {cfg.decoder}); decode.device {device_mode}"
        )
        return Check("jpeg decoder", INFO, summary, details)

    # -- TensorRT plan --------------------------------------------------------------------

    def check_plan(self) -> Check:
        trt = self._tensorrt()
        if trt is None:
            return Check("tensorrt plan", NA, f"needs TensorRT ({self._trt_error})")
        from ..engines.cuda import open_runtime
        from ..engines.tensorrt import (
            LogBuildProgress,
            current_key,
            ensure_plan,
            explain_stale,
            lookup_plan,
        )
        from ..model.spec import load_model_spec

        config = self._plan_config()
        spec = load_model_spec(config.model)
        rt = open_runtime(config.engine.cuda_backend)
        try:
            key = current_key(trt, rt, spec, config)
            engine_dir = config.engine.tensorrt.engine_dir
            found = lookup_plan(engine_dir, key)
            details: dict[str, Any] = {
                "engine_dir": str(engine_dir),
                "key": key.digest,
                "stem": key.stem,
                "machine": key.machine(),
                "precision": key.precision,
                "lookup": found.status,
            }
            if found.status == "found" and not self.options.build:
                details["plan"] = str(found.plan_path)
                summary = f"{found.plan_path} matches {key.stem}"
                gate = found.record.extra.get("int8_gate") if found.record else None
                if gate:
                    details["int8_gate"] = gate
                    summary += f"; {gate['summary']}"
                return Check("tensorrt plan", PASS, summary, details)
            if not self.options.build:
                why = [f"no plan for key {key.stem} in {engine_dir}"]
                for other in found.others[:1]:
                    why += explain_stale(other, key)
                details["why"] = why
                self._plan_missing = why[0]
                return Check(
                    "tensorrt plan", INFO, "; ".join(why) + " (doctor --build builds one)", details
                )
            ready = ensure_plan(trt, rt, spec, config, LogBuildProgress(notify=False), force=True)
        finally:
            rt.close()
        rec = ready.record
        details.update(plan=str(ready.plan_path), build_seconds=rec.build_seconds)
        gate = ready.int8_gate or rec.extra.get("int8_gate")
        precision = ready.key.precision
        summary = f"built {ready.plan_path.name} in {rec.build_seconds:.1f} s ({precision})"
        if gate:  # an INT8 build: the accuracy gate's figures (FP16 is used when it refused)
            details["int8_gate"] = gate
            summary += f"; {gate['summary']}"
        return Check("tensorrt plan", PASS, summary, details)

    def _plan_config(self) -> Config:
        """The configured TensorRT settings; with --build, a small profile (fast to build)."""
        config = self.config.model_copy(deep=True)
        if self.options.build:
            config.engine.max_batch = min(config.engine.max_batch, 4)
        return config

    # -- engines on a real frame ----------------------------------------------------------

    def _real_frame(self) -> tuple[U8Array, bytes]:
        """A BGR frame with text on it and its JPEG (``--image``, or a generated one)."""
        if self._frame is None:
            if self.options.image is not None:
                import cv2

                data = self.options.image.read_bytes()
                bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
                if bgr is None:
                    raise ValueError(f"cannot decode {self.options.image}")
                ok, enc = cv2.imencode(".jpg", bgr)
                self._frame = (np.ascontiguousarray(bgr), bytes(enc) if ok else data)
            else:
                from .bench.frames import encode_jpegs, generated_frames

                rgb = generated_frames(1280, 720, 1)[0]
                self._frame = (np.ascontiguousarray(rgb[:, :, ::-1]), encode_jpegs([rgb])[0])
        return self._frame

    def _engine_config(self, kind: str, cuda_backend: str | None = None) -> Config:
        config = self.config.model_copy(deep=True)
        config.engine.kind = kind
        config.engine.fallback = "none"
        config.engine.keep_warm_idle_s = 0
        config.engine.retry_primary_s = 0
        if cuda_backend is not None:
            config.engine.cuda_backend = cuda_backend  # type: ignore[assignment]
        # doctor runs the plan that is there (or that --build made); it never builds one
        # behind the user's back while measuring.
        config.engine.tensorrt.build_if_missing = False
        if kind in ("torch", "tensorrt") and config.decode.device == "host":
            # Next to a CUDA engine, try the GPU JPEG decoder too (auto: when torchvision
            # can decode on this GPU): the report says which decoder served the frame.
            config.decode.device = "auto"
        if kind == "torch" and self.config.engine.kind != "torch":
            config.engine.torch.device = "cuda:0"
            config.engine.torch.fp16 = True
        return config

    def _run_on_frame(self, config: Config) -> dict[str, Any]:
        return asyncio.run(_serve_one_frame(config, *self._real_frame()))

    def check_onnxruntime(self) -> Check:
        got = self._run_on_frame(self._engine_config("onnxruntime"))
        self._reference = got
        n = len(got["detections"])
        details = {"detections": n, "input": got["input"], "frame_ms": got["frame_ms"]}
        if not n:
            return Check(
                "onnxruntime (cpu) on a real frame",
                FAIL,
                "no detections on a frame with text on it",
                details,
            )
        return Check(
            "onnxruntime (cpu) on a real frame",
            PASS,
            f"{n} detections at input {got['input']}, {got['frame_ms']:.0f} ms for the frame",
            details,
        )

    def _engines_to_test(self) -> tuple[list[tuple[str, str | None]], list[str]]:
        """(engine kind, CUDA layer) pairs to compare with ONNX Runtime, and why others not."""
        wanted = self.options.engine or self.config.engine.kind
        why_not: list[str] = []
        if wanted not in ("onnxruntime", None):
            kinds = [wanted]
        else:
            kinds = []
            if self._tensorrt() is not None:
                kinds.append("tensorrt")
            else:
                why_not.append(f"tensorrt: {self._trt_error}")
            torch_why = _torch_cuda_problem()
            if torch_why is None:
                kinds.append("torch")
            else:
                why_not.append(f"torch: {torch_why}")
        pairs: list[tuple[str, str | None]] = []
        for kind in kinds:
            if kind == "tensorrt" and self._tensorrt() is None:
                why_not.append(f"tensorrt: {self._trt_error}")
                continue
            on_cpu = kind == "torch" and self.config.engine.torch.device.startswith("cpu")
            if kind in ("torch", "tensorrt") and not on_cpu:
                self._probe_layers()
                layers = [n for n, w in self._layers.items() if w is None]
                if not layers:
                    why_not.append(f"{kind}: no CUDA layer opens the GPU")
                pairs += [(kind, layer) for layer in layers]
            else:
                pairs.append((kind, None))
        return pairs, why_not

    def check_engines(self) -> list[Check]:
        pairs, why_not = self._engines_to_test()
        self._gpu_pairs = pairs
        if not pairs:
            return [Check("engine vs onnxruntime", NA, "no GPU engine here: " + "; ".join(why_not))]
        ref = self._reference or self._run_on_frame(self._engine_config("onnxruntime"))
        checks = []
        for kind, layer in pairs:
            name = f"{kind} vs onnxruntime" + (f" ({layer})" if layer else "")
            if kind == "tensorrt" and self._plan_missing:
                checks.append(Check(name, NA, f"{self._plan_missing}; doctor --build builds one"))
                continue
            try:
                got = self._run_on_frame(self._engine_config(kind, layer))
            except Exception as e:  # noqa: BLE001 - one engine's failure is one FAIL line
                checks.append(Check(name, FAIL, _short(e)))
                continue
            checks.append(compare_with_reference(name, got, ref, self._precision_of(kind, got)))
        return checks

    def _precision_of(self, kind: str, got: dict[str, Any]) -> str:
        if kind == "tensorrt":
            return self.config.engine.tensorrt.precision
        if kind == "torch":
            fp16 = got["engine"].get("fp16", self._engine_config("torch").engine.torch.fp16)
            return "fp16" if fp16 else "fp32"
        return "fp32"

    def check_latency(self) -> list[Check]:
        from ..model.spec import load_model_spec
        from .bench.engine_only import measure_engine

        if not self.options.latency:
            return [Check("latency", NA, "skipped (--skip-latency)")]
        pairs = [p for p in self._gpu_pairs if p[0] != "onnxruntime"][:1]
        runs = [("onnxruntime", None), *pairs]
        checks = []
        for kind, layer in runs:
            config = self._engine_config(kind, layer)
            if kind == "tensorrt" and self._plan_missing:
                continue  # said above
            if kind == "torch":  # a GPU's throughput shows at batch sizes above 1 (a plan's
                # profile is fixed at build time: TensorRT keeps the configured batch)
                config.engine.max_batch = max(config.engine.max_batch, GPU_BATCH)
            spec = load_model_spec(config.model)
            name = f"latency {kind}" + (f" ({layer})" if layer else "")
            try:
                got = asyncio.run(
                    measure_engine(
                        spec,
                        config,
                        1280,
                        720,
                        seconds=self.options.seconds,
                        batch_sizes=sorted({1, config.engine.max_batch}),
                        log=lambda _line: None,
                    )
                )
            except Exception as e:  # noqa: BLE001 - one engine's failure is one FAIL line
                checks.append(Check(name, FAIL, _short(e)))
                continue
            rows = {r["batch"]: r for r in got["rows"]}
            single = rows[1]["serial"]["batch_ms"]
            big = rows[max(rows)]
            best = max(big["serial"]["frames_per_s"], big["pipelined"]["frames_per_s"])
            details = {"input": got["input"], "rows": got["rows"], "engine": got["engine"]}
            h, w = got["input"]
            p95 = single.get("p95", single["p50"])
            summary = (
                f"1 frame: p50 {single['p50']:.1f} ms, p95 {p95:.1f} ms; "
                f"batch {max(rows)}: {best:.0f} frames/s (input {w}x{h})"
            )
            checks.append(Check(name, INFO, summary, details))
        return checks


def compare_with_reference(
    name: str, got: dict[str, Any], ref: dict[str, Any], precision: str
) -> Check:
    """The engine under test against ONNX Runtime: raw output error and detections."""
    from ..common.agreement import match_detections

    got_raw, ref_raw = got["raw"], ref["raw"]
    if got_raw.dtype == np.uint8:  # DB's byte map, made on the GPU (engine.torch.device_post)
        got_raw, ref_raw = _as_byte_maps(got_raw, ref_raw, got["byte_map_threshold"])
    # YOLO NMS'd on the device (engine.torch.device_post: its best anchors, kept or not)
    # cannot be matched element by element: the detections are the comparison.
    err = relative_error(got_raw, ref_raw) if got_raw.shape == ref_raw.shape else None
    agreement = match_detections(ref["detections"], got["detections"], iou_threshold=0.5)
    limit = REL_ERROR_LIMIT.get(precision, 1e-2)
    details = {
        "precision": precision,
        "relative_error": err,
        "relative_error_limit": limit if limit != math.inf else None,
        "agreement": agreement.as_dict(),
        "engine": got["engine"],
        "frame_ms": got["frame_ms"],
        "jpeg_decoder": got.get("jpeg_decoder"),
        "gpu_jpeg_decoder": got.get("gpu_jpeg_decoder"),
    }
    ok = (err is None or err <= limit) and agreement.score >= MIN_AGREEMENT
    if err is None:
        raw = (
            f"{precision}: NMS on the device, best {got_raw.shape[-2]} anchors of "
            f"{ref_raw.shape[-1]} back"
        )
    else:
        raw = f"{precision}: relative error {err:.2e}" + (
            f" (limit {limit:g})" if limit != math.inf else ""
        )
    summary = (
        raw
        + f"; detections {agreement.describe()}"
        + (f"; GPU JPEG decoder {got['gpu_jpeg_decoder']}" if got.get("gpu_jpeg_decoder") else "")
    )
    # engine.torch.compile: did inductor compile the warm-up shapes here (on a Jetson it
    # needs Triton for the board)? A shape that failed runs uncompiled, which serves but
    # is not what was asked for.
    compile_mode = got["engine"].get("compile", "off")
    if compile_mode != "off":
        n = got["engine"].get("compiled_shapes", 0)
        summary += f"; torch compile {compile_mode}: {n} shape(s) compiled"
        if not n:
            ok = False
            summary += " (none: the engine runs its interpreter; the log says why)"
    return Check(name, PASS if ok else FAIL, summary, details)


def _as_byte_maps(got: np.ndarray, ref: np.ndarray, threshold: float) -> tuple[Any, Any]:
    """The engine's byte map and ONNX Runtime's float map made a byte map the same way,
    both read back as probabilities: what differs is then the engine's own arithmetic (a
    pixel whose value crossed a step), not the byte map's rounding."""
    import torch

    from ..model.device_post import db_map_bytes, db_map_levels

    levels = db_map_levels(threshold)
    ref_bytes = db_map_bytes(torch, torch.from_numpy(np.ascontiguousarray(ref)), threshold)
    return levels[got], levels[ref_bytes.numpy()]


async def _serve_one_frame(config: Config, bgr: U8Array, jpeg: bytes) -> dict[str, Any]:
    """One engine, one real frame: its raw output on the letterboxed frame and the
    detections the service answers for the JPEG (decoder, letterbox, engine, head)."""
    from ..common.messages import FrameMessage
    from ..frames.infer import InferenceService
    from ..frames.pipeline import FramePipeline, FrameSettings
    from ..model.shape import letterbox_into, plan_for_frame
    from ..model.spec import load_model_spec

    spec = await asyncio.to_thread(load_model_spec, config.model)
    lb = plan_for_frame(bgr.shape[1], bgr.shape[0], spec.limits)
    config.engine.warmup_shapes = [(lb.shape[0], lb.shape[1])]
    boxed = np.empty((*lb.shape, 3), np.uint8)
    letterbox_into(bgr, lb, boxed, spec.pad_value)
    service = InferenceService(spec, config)
    await service.start()
    pipeline = FramePipeline(config, service)
    try:
        engine = service.engine
        if engine is None:
            raise RuntimeError("the engine did not start")
        raw = (await engine.infer([boxed]))[0][0]
        t0 = time.perf_counter()
        result = await pipeline.process(
            FrameMessage(0, 0.0, jpeg, False, time.perf_counter()),
            FrameSettings(config.model.confidence),
        )
        frame_ms = (time.perf_counter() - t0) * 1000
        device_decoder = getattr(getattr(pipeline, "decoding", None), "device", None)
        return {
            "raw": np.asarray(raw),
            "byte_map_threshold": config.model.dbnet.bin_threshold,
            "detections": np.asarray(result.detections),
            "input": f"{lb.shape[1]}x{lb.shape[0]}",
            "frame_ms": frame_ms,
            "engine": engine.describe(),
            "jpeg_decoder": type(pipeline.decoder).__name__,
            "gpu_jpeg_decoder": getattr(device_decoder, "name", None),
        }
    finally:
        await pipeline.close()
        await service.close()


def mps_pipe_dir(env: Mapping[str, str]) -> Path | None:
    """The pipe directory of a running MPS control daemon (``CUDA_MPS_PIPE_DIRECTORY``, by
    default /tmp/nvidia-mps), when its ``control`` FIFO is there; CUDA clients started
    with the same environment join it. None: no MPS."""
    pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    control = pipe / "control"
    try:
        return pipe if stat.S_ISFIFO(control.stat().st_mode) else None
    except OSError:
        return None


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _torch_gpu(details: dict[str, Any], reasons: list[str]) -> str | None:
    why = _torch_cuda_problem()
    if why is not None:
        reasons.append(f"torch: {why}")
        return None
    import torch

    props = torch.cuda.get_device_properties(0)
    details.update(
        gpu=props.name,
        sm=f"{props.major}{props.minor}",
        multiprocessors=props.multi_processor_count,
        memory_gib=round(props.total_memory / 2**30, 1),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
    )
    return str(props.name)


def _torch_cuda_problem() -> str | None:
    """None when torch sees a CUDA GPU; otherwise why not."""
    try:
        import torch
    except ImportError as e:
        return _short(e)
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    return None


# -- report -----------------------------------------------------------------------------


def summary_table(checks: Sequence[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, FAIL, NA, INFO)}
    verdict = "FAILED" if counts[FAIL] else "OK"
    lines = ["", f"{'check':<34} result", "-" * 48]
    lines += [f"{c.name:<34} {c.status}" for c in checks]
    lines.append("-" * 48)
    lines.append(
        f"{verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, "
        f"{counts[NA]} not available, {counts[INFO]} info"
    )
    return "\n".join(lines)


def report(checks: Sequence[Check], config: Config) -> dict[str, Any]:
    return {
        "tool": "edge-vision doctor",
        "edge_vision": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "engine_configured": config.engine.kind,
        "checks": [asdict(c) for c in checks],
        "failed": [c.name for c in checks if c.status == FAIL],
        "not_available": [c.name for c in checks if c.status == NA],
    }


def cmd_doctor(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    setup_logging("WARNING" if not args.verbose else "INFO")
    options = DoctorOptions(
        build=args.build,
        image=args.image,
        seconds=args.seconds,
        engine=args.engine,
        latency=not args.skip_latency,
    )
    doctor = Doctor(config, options, out=lambda line: print(line, flush=True))
    checks = doctor.run()
    print(summary_table(checks))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report(checks, config), indent=2, default=str) + "\n")
        print(f"report: {args.json}")
    return 1 if any(c.status == FAIL for c in checks) else 0


def register_cli(subparsers: Any) -> None:
    """``edge-vision doctor`` (picked up by :mod:`edge_vision.cli`)."""
    p = subparsers.add_parser(
        "doctor",
        help="check this board: JetPack, CUDA, TensorRT, engines against ONNX Runtime",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_config_args(p)  # --config, --model, --engine (the engine to test), --set
    p.add_argument("--build", action="store_true", help="build a small TensorRT plan now")
    p.add_argument("--image", type=Path, help="the real frame to run (default: a generated one)")
    p.add_argument(
        "--seconds", type=float, default=3.0, help="time per latency/throughput measurement"
    )
    p.add_argument("--skip-latency", action="store_true", help="no latency/throughput runs")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the report here")
    p.add_argument("--verbose", action="store_true", help="log at INFO")
    p.set_defaults(func=cmd_doctor)
