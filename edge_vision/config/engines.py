"""The ``engine`` section: what every engine shares, and one subsection per engine kind
(its ``EngineSection``), from which the kinds ``engine.kind`` accepts are derived."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from .base import _Section


class EngineSection(_Section):
    """The section ``engine.<kind>`` of one engine kind: a field of :class:`EngineConfig`
    named after the kind, with what to install for it.

    Declaring one is what makes a kind known; the rest is derived from these fields
    (:func:`engine_sections`): the values ``engine.kind`` accepts, the lookup of the
    engine (:func:`edge_vision.engines.create_engine` takes the Engine subclass of module
    ``edge_vision.engines.<kind>`` whose ``kind`` it is, imported only then), the install
    hint when that import fails, the CLI's ``--engine`` help and the
    ``edge_vision_engine_active`` series. An engine's own metrics live in its module.
    """

    #: What ``pip install`` brings the backend's libraries (said when its import fails).
    install: ClassVar[str]


class OnnxRuntimeConfig(EngineSection):
    install = "onnxruntime"

    threads: int = Field(0, ge=0, description="Intra-op threads; 0 means one per CPU core.")
    providers: list[str] = Field(
        default_factory=lambda: ["CPUExecutionProvider"],
        description="Execution providers in order of preference.",
    )


class TorchConfig(EngineSection):
    install = "torch cuda-python"

    device: str = Field("cuda:0", description="Torch device for the converted ONNX graph.")
    fp16: bool = Field(True, description="Run in half precision.")
    cuda_graphs: bool = Field(True, description="Capture a CUDA graph per (batch, shape) bucket.")
    channels_last: bool = Field(
        False,
        description="On a CUDA device, convolutions run on NHWC tensors (the frames already "
        "arrive NHWC) and cuDNN picks each convolution's fastest algorithm at warm-up, "
        "before the CUDA graphs are captured. Off by default: the engine's ceiling with it "
        "is within noise of without (docs/benchmarks.md, 'what holds 64 cameras back, and "
        "the final before/after'), and the GPU tests against ONNX Runtime do not run "
        "with it.",
    )
    device_post: bool = Field(
        True,
        description="On a CUDA device, inside the captured graph: a DBNet model's "
        "probability map is binarised and quantised to one byte a pixel "
        "(post.DB_MAP_BYTES): 4x less to copy back and no threshold pass on the host; box "
        "scores stay within 0.003 of the float map's. A YOLO v8/v11 raw output comes back "
        "NMS'd: its yolo_candidates best-scoring anchors, each marked kept or suppressed "
        "(post.yolo_v8_device_nms; 25 bytes an anchor instead of 336 at 80 classes, and no "
        "NMS on the host): the same detections while no more anchors than that reach the "
        "confidence threshold. "
        "false: the model's outputs come back whole.",
    )
    compile: Literal["off", "default", "max-autotune"] = Field(
        "off",
        description="Compile the engine's forward with torch.compile (inductor), once per "
        "(batch, shape): the ONNX graph traced into one flat graph of torch operators, "
        "compiled whole so elementwise kernels fuse, then captured in the CUDA graphs "
        "(engines/torch_compile.py). Tens of seconds a shape at warm-up, cached on disk in "
        "compile_cache; max-autotune tries more kernels and takes longer. Compiled, the "
        "engine runs the default detector markedly faster, on a GPU and on a CPU "
        "(docs/benchmarks.md, 'the engine compiled' and 'On the 2-core machine, the same "
        "morning'). Off by default: the first start compiles for about a minute, and a "
        "Jetson's torch may lack Triton for its GPU (edge-vision doctor says).",
    )
    compile_cache: Path = Field(
        Path("engines/torch-compile"),
        description="Where inductor keeps compiled graphs across restarts (engine.torch.compile).",
    )

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_yaml_words(cls, v: object) -> object:
        """YAML reads a bare ``off`` / ``on`` (``--set engine.torch.compile=off``) as a
        boolean: off is off, on is ``default``."""
        if isinstance(v, bool):
            return "default" if v else "off"
        return v

    yolo_candidates: int = Field(
        1024,
        ge=1,
        description="With device_post, how many of a YOLO v8/v11 output's anchors (8,400 at "
        "640x640), best class score first, are NMS'd on the GPU and come back for the "
        "host's confidence filter; model.max_detections are kept after NMS.",
    )


class TensorRTConfig(EngineSection):
    install = "tensorrt cuda-python"

    engine_dir: Path = Field(Path("engines"), description="Where plans and their JSON live.")
    precision: Literal["fp32", "fp16", "int8"] = Field("fp16", description="Build precision.")
    workspace_mib: int = Field(2048, ge=64, description="Builder workspace limit.")
    dla_core: int | None = Field(None, ge=0, description="Jetson DLA core, GPU fallback on.")
    calibration_source: Path | None = Field(
        None, description="INT8 calibration frames: an image folder or a video."
    )
    calibration_frames: int = Field(256, ge=1, description="Frames used for INT8 calibration.")
    calibration_batch: int = Field(8, ge=1, description="Frames per INT8 calibration batch.")
    int8_min_agreement: float = Field(
        0.95,
        ge=0,
        le=1,
        description="INT8 accuracy gate: after an INT8 build, the plan's detections on "
        "held-back calibration frames must match ONNX Runtime's this well (the lower of "
        "recall and precision at IoU 0.5), else the plan is refused and FP16 is used. "
        "0 turns the gate off.",
    )
    int8_gate_frames: int = Field(
        32,
        ge=1,
        description="Frames of the calibration source, after those calibration used, that "
        "the INT8 gate runs on.",
    )
    build_if_missing: bool = Field(
        True, description="serve builds the plan once when none matches the current key."
    )
    opt_batch: int | None = Field(
        None,
        ge=1,
        description="Batch size the plan is tuned for (the profile's OPT; the profile spans "
        "1..engine.max_batch); default engine.max_batch.",
    )
    opt_shape: tuple[int, int] | None = Field(
        None,
        description="(height, width) the plan is tuned for (the profile's OPT; the profile "
        "spans every side the server can pick, model.min_side up to model.input_size); "
        "default: a 16:9 frame's input, e.g. (352, 640) with the default model's stretch, "
        "(384, 640) with letterbox.",
    )
    timing_cache: Path | None = Field(
        None,
        description="Timing cache reused across builds; default: one file per GPU and "
        "TensorRT version in engine_dir.",
    )


class TritonConfig(EngineSection):
    install = "tritonclient[grpc]"

    url: str = Field("localhost:8001", description="Triton gRPC endpoint host:port.")
    model_name: str = Field("ppocr_det", description="Model name in Triton's repository.")
    model_version: str = Field("", description="Model version; empty means Triton's policy.")
    timeout_s: float = Field(5.0, gt=0, description="Per-request deadline.")
    tls: bool = Field(False, description="Use TLS for gRPC.")
    root_certificates: Path | None = Field(None, description="CA bundle for TLS.")
    cuda_shared_memory: bool = Field(False, description="Pass tensors through CUDA shm.")
    in_flight: int = Field(4, ge=1, description="Requests in flight to Triton at once.")
    stats_interval_s: float = Field(
        5.0,
        ge=0,
        description="How often Triton's model statistics (queue and compute times) are read "
        "into /metrics; 0 turns that off.",
    )
    reconnect_backoff_s: float = Field(
        2.0,
        gt=0,
        description="Longest pause between gRPC reconnect attempts while Triton is down, so "
        "frames flow again within about this long after it is back.",
    )


class EngineConfig(_Section):
    kind: str = Field(
        "auto",
        description="Which engine runs the network: auto (TensorRT on an NVIDIA GPU where it "
        "is installed, else the torch engine on a CUDA GPU, else ONNX Runtime on the CPU; on "
        "a GPU the batching, decode and worker settings you did not set follow the engine: "
        "docs/configuration.md), or the name of one of the engine sections below to insist "
        "on it.",
    )
    fallback: Literal["onnxruntime", "none"] = Field(
        "onnxruntime",
        description="Engine to switch to when the configured one fails (degrade, don't die).",
    )
    retry_primary_s: float = Field(
        30.0,
        ge=0,
        description="While degraded to the fallback, try the configured engine again this often; "
        "0 retries only on POST /api/engine/retry.",
    )
    max_batch: int = Field(
        1,
        ge=1,
        description="Largest batch (the optimisation profile's max batch). 1 suits the CPU "
        "engine: batching does not raise ONNX Runtime's CPU throughput, it only adds latency "
        "(docs/benchmarks.md). GPU engines want 8-16.",
    )
    batch_window_ms: float = Field(
        2.0, ge=0, description="How long a ready frame waits for others of its shape."
    )
    in_flight: int = Field(1, ge=1, description="Batches in flight at once (streams/contexts).")
    keep_warm_idle_s: float = Field(
        30.0, ge=0, description="Re-run a warm-up inference after this long idle; 0 disables."
    )
    warmup_shapes: list[tuple[int, int]] = Field(
        default_factory=lambda: [(720, 1280), (480, 640), (1280, 720), (640, 640)],
        description="(height, width) of camera frames whose engine input shapes are warmed "
        "(and CUDA-graph captured) at start, before /readyz says ready: each goes through the "
        "shape stage at model.input_size and model.fit, so the default 16:9, 4:3, portrait "
        "and square frames warm 352x640, 480x640, 640x352 and 640x640 with the default "
        "model's stretch (384x640, 480x640, 640x384, 640x640 with letterbox).",
    )
    cuda_backend: Literal["auto", "cuda-python", "pycuda"] = Field(
        "auto", description="CUDA binding for GPU engines."
    )
    onnxruntime: OnnxRuntimeConfig = Field(default_factory=OnnxRuntimeConfig)
    torch: TorchConfig = Field(default_factory=TorchConfig)
    tensorrt: TensorRTConfig = Field(default_factory=TensorRTConfig)
    triton: TritonConfig = Field(default_factory=TritonConfig)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        kinds = ("auto", *engine_kinds())
        if kind not in kinds:
            raise ValueError(f"unknown engine {kind!r}; known: {', '.join(kinds)}")
        return kind


def engine_sections() -> dict[str, type[EngineSection]]:
    """Every engine kind and its config section: the :class:`EngineSection` fields of
    :class:`EngineConfig`, in their order there."""
    found: dict[str, type[EngineSection]] = {}
    for name, info in EngineConfig.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, EngineSection):
            found[name] = ann
    return found


def engine_kinds() -> tuple[str, ...]:
    """The values ``engine.kind`` accepts (:func:`engine_sections`)."""
    return tuple(engine_sections())
