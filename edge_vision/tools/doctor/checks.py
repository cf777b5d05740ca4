"""The checks themselves: :class:`Doctor` runs each in turn and keeps its verdict."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ... import __version__
from ...config import Config
from ...engines.choice import engine_choice_of, resolve_engine
from .probes import (
    FAIL,
    GPU_BATCH,
    INFO,
    NA,
    PASS,
    Check,
    U8Array,
    compare_with_reference,
    cuda_version,
    jetpack_for_l4t,
    mps_pipe_dir,
    parse_l4t_release,
    serve_one_frame,
    short_error,
    torch_cuda_problem,
    torch_gpu,
)

log = logging.getLogger(__name__)


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
        self.config = resolve_engine(config)  # what serve would run on this machine
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
            ("engine choice", self.check_engine_choice),
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
                got = Check(name, NA, short_error(e))
            except Exception as e:  # a broken check is a FAIL line, never a traceback
                log.debug("check %s failed", name, exc_info=True)
                got = Check(name, FAIL, short_error(e))
            for check in got if isinstance(got, list) else [got]:
                self.checks.append(check)
                self.out(check.line())
        return self.checks

    # -- the board ----------------------------------------------------------------------

    def check_engine_choice(self) -> Check:
        """Which engine ``serve`` runs here, and why (engine.kind auto, or as configured)."""
        choice = engine_choice_of(self.config)
        derived = choice.get("derived") or {}
        shown = ", ".join(f"{k}={v}" for k, v in derived.items() if k != "engine.kind")
        summary = f"{choice['kind']}: {choice['reason']}" + (f"; derives {shown}" if shown else "")
        return Check("engine choice", INFO, summary, choice)

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
            details["driver_api"] = cuda_version(drv)
            details["runtime"] = cuda_version(rtv)
        except Exception as e:  # noqa: BLE001 - ImportError, or no driver: reported
            reasons.append(f"cuda-python: {short_error(e)}")
        gpu = torch_gpu(details, reasons)
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
                "where this environment's CUDA_MPS_PIPE_DIRECTORY points): under MPS they "
                "share it and each batch's infer stage is shorter (docs/benchmarks.md, 'MPS, "
                "eight workers and the stream hand-off'); "
                "start it with deploy/systemd/nvidia-mps.service"
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
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...engines.cuda import open_runtime
        from ...engines.cuda.base import _BACKENDS

        for name in _BACKENDS:
            try:
                rt = open_runtime(name)
            except Exception as e:  # noqa: BLE001 - whatever a binding raises is the reason
                why = short_error(e).removeprefix("EngineError: ")
                self._layers[name] = why.removeprefix(f"no usable CUDA binding: {name}: ")
                continue
            self._layers[name] = None
            self._layer_gpu = (
                f"{rt.device_name()} (sm_{''.join(map(str, rt.compute_capability()))})"
            )
            rt.close()

    def check_cuda_layers(self) -> Check:
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...engines.cuda import open_runtime

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
                # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
                from ...engines.tensorrt import import_tensorrt

                self._trt = import_tensorrt()
            except Exception as e:  # noqa: BLE001 - reported as "not available: ..."
                self._trt_error = short_error(e).removeprefix("EngineError: ")
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
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...engines.tensorrt.library import trt_logger

        builder = trt.Builder(trt_logger(trt))
        cores = int(builder.num_DLA_cores)
        return Check("dla cores", INFO, f"{cores} DLA core(s)", {"dla_cores": cores})

    def check_decoder(self) -> Check:
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...frames.decode import pick_decoder

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
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...engines.cuda import open_runtime
        from ...engines.tensorrt import (
            LogBuildProgress,
            current_key,
            ensure_plan,
            explain_stale,
            lookup_plan,
        )
        from ...model.spec import load_model_spec

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
                # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
                from ..bench.frames import encode_jpegs, generated_frames

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
        return asyncio.run(serve_one_frame(config, *self._real_frame()))

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
            torch_why = torch_cuda_problem()
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
                checks.append(Check(name, FAIL, short_error(e)))
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
        # On demand, not at the top: CLI start-up (docs/architecture.md, "Imports").
        from ...model.spec import load_model_spec
        from ..bench.engine_only import measure_engine

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
                checks.append(Check(name, FAIL, short_error(e)))
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
