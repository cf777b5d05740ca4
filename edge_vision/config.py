"""All configuration, in one place.

Sources, lowest precedence first:

1. the defaults below;
2. a YAML file (``--config FILE`` or ``EDGE_VISION_CONFIG=FILE``);
3. environment variables ``EDGE_VISION_<SECTION>__<KEY>`` (``EDGE_VISION_SERVER__PORT=9000``,
   nested deeper with more ``__``); values are read as YAML scalars, so ``true``, ``12`` and
   ``[0, 2]`` have their types;
4. CLI flags: the named ones (``--port 9000``) and ``--set section.key=value``.

Every key is validated at start; an unknown key or a bad value stops start-up with a
:class:`~edge_vision.errors.ConfigError` that names the key and the allowed values.
``edge-vision serve --print-config`` prints the effective result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .common.settings import Mode
from .errors import ConfigError

ENV_PREFIX = "EDGE_VISION_"
ENV_CONFIG_FILE = "EDGE_VISION_CONFIG"
#: The token secret's default variable (AuthConfig.token_secret_env): not a config key.
ENV_TOKEN_SECRET = "EDGE_VISION_TOKEN_SECRET"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class ServerConfig(_Section):
    host: str = Field("0.0.0.0", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    max_message_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Largest WebSocket message accepted; larger closes the socket with 1009.",
    )
    max_pixels: int = Field(
        40_000_000,
        ge=1,
        description="Largest image (width x height) accepted, checked from the header before "
        "decoding; larger is answered with image_too_large.",
    )
    max_decoded_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Most bytes one frame may decode to (BGR, after any DCT downscale), "
        "checked from the header before decoding; more is answered with decoded_too_large. "
        "64 MiB takes a 20 MP PNG or any JPEG up to max_pixels, and refuses a 116 KB PNG "
        "of 6,320 x 6,320 zeros that would cost 120-230 MB to decode.",
    )
    memory_budget_bytes: int = Field(
        512 * 1024 * 1024,
        ge=16 * 1024 * 1024,
        description="Bytes held by frames (encoded, decoding, in flight) and the decode "
        "buffer pool, across all connections of the node; divided evenly between "
        "server.workers. A frame without room waits (every mode, up to memory_wait_s) or is "
        "answered with over_memory_budget. 512 MiB holds 64 maximal 8 MiB frames, or "
        "thousands of 720p ones, and fits an 8 GB Jetson beside the model.",
    )
    memory_wait_s: float = Field(
        1.0,
        ge=0,
        description="How long an 'every' frame without room in the memory budget waits "
        "(its connection's reading paused: TCP back-pressure) before it is answered with "
        "over_memory_budget. 'latest' frames never wait: a stale frame is worth less.",
    )
    max_connections: int = Field(256, ge=1, description="Open WebSockets above this get 503.")
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes serving the port, each with its own event loop and engine "
        "(server.worker_balance says how connections reach them). More than one lifts one "
        "Python interpreter's limit on frames per second (a fast GPU can serve more than "
        "one process can decode and post-process). Sessions resume across workers only "
        "with a shared state store (state.redis_url).",
    )
    worker_balance: Literal["least-clients", "reuse-port"] = Field(
        "least-clients",
        description="With server.workers > 1, how connections are spread over the workers: "
        "least-clients, the node's main process accepts each and hands it to the worker "
        "with the fewest clients (among those whose engine is warm); reuse-port, every "
        "worker listens (SO_REUSEPORT) and the kernel picks by a hash of the client's "
        "address, which put 2 cameras on one worker and 8 on another at 64 cameras on 12 "
        "workers (edge_vision/serve/balance.py, docs/benchmarks.md).",
    )
    ping_interval_s: float = Field(
        20.0, gt=0, description="WebSocket ping period (RFC 6455 5.5.2)."
    )
    idle_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Close a connection after this long without any message from it, with "
        "4003 (protocol 1: 1001).",
    )
    send_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A reply that cannot be written for this long means the client stopped "
        "reading: the connection is closed with 4002 (protocol 1: 1008).",
    )
    shutdown_grace_s: float = Field(
        5.0, ge=0, description="On SIGTERM, time given to frames in flight before sockets close."
    )
    admin_token: str | None = Field(
        None, description="Bearer token required by /api/*; none means the admin API is open."
    )
    web_root: Path | None = Field(
        None, description="Folder served at / (the overlay page); default: the repo's web/."
    )
    close_linger_s: float = Field(
        2.0,
        ge=0,
        description="After closing with 1009 (message too large), keep reading and "
        "discarding for at most this long, so a client still writing its message receives "
        "the close frame instead of a connection reset; 0 closes at once.",
    )
    mmap_threshold_bytes: int | None = Field(
        256 * 1024,
        ge=0,
        le=32 * 1024 * 1024,
        description="Each worker process serves every allocation of this size or more "
        "with its own mmap (glibc mallopt M_MMAP_THRESHOLD, fixed), so a large message or "
        "frame goes back to the system when it is freed instead of staying in the heap. "
        "glibc starts at 128 KiB and raises it up to 32 MiB as big blocks are freed. With "
        "64 connections of 8 MiB frames the peak was about 200 MiB lower at 256 KiB "
        "(docs/benchmarks.md, 'Memory budget'); none keeps glibc's rising threshold.",
    )
    opencv_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Threads OpenCV may use inside one call (cv2.setNumThreads), in each "
        "worker process. None: 1 while a CUDA engine serves (frames letterboxed on the GPU "
        "or the host), else OpenCV's one per core. On the H200 (16 cores) OpenCV's pool "
        "under each worker's frame threads took 6x the CPU of one thread for the same DB "
        "post-processing, and with the host letterbox one thread used 21 % less CPU a "
        "frame and answered 21 % more (docs/benchmarks.md). On the 2-core CPU path "
        "(ONNX Runtime) 1 answered 15-28 % fewer frames than the default.",
    )
    gil_switch_ms: float | None = Field(
        None,
        gt=0,
        le=100,
        description="Each worker process's GIL switch interval (sys.setswitchinterval), in "
        "ms; none keeps Python's 5 ms. A thread back from native code (OpenCV, the GPU "
        "decoder, a CUDA wait) can wait up to this long for the GIL while another thread "
        "runs Python. For tuning: 0.5 ms made no difference at 64 cameras on the H200 "
        "(docs/benchmarks.md).",
    )
    event_loop: Literal["asyncio", "uvloop"] = Field(
        "asyncio",
        description="Each serving process's event loop: asyncio (Python's own) or uvloop "
        "(libuv, pip install uvloop). uvloop took 10 % less server CPU a WebSocket message "
        "on the 2-core machine, under 1 % of a frame's cost on the GPU path "
        "(python -m benchmarks.loop, docs/benchmarks.md).",
    )
    test_echo_route: bool = Field(
        False,
        description="Tests only: serve a WebSocket echo route at /test/echo with /ws's "
        "WebSocket settings (for Autobahn|Testsuite). Never enable in production.",
    )


class DbnetConfig(_Section):
    """DB post-processing (Liao et al., Real-time Scene Text Detection with DB, 2020)."""

    bin_threshold: float = Field(0.3, gt=0, lt=1, description="Probability map binarisation.")
    unclip_ratio: float = Field(1.6, gt=0, description="Box expansion: area * ratio / perimeter.")
    max_candidates: int = Field(1000, ge=1, description="Contours examined per frame.")
    min_size: float = Field(3.0, ge=0, description="Shortest box side kept, input pixels.")
    dilate: bool = Field(
        True,
        description="Dilate the binarised map with a 2x2 kernel before finding contours, as "
        "the reference pipeline does: joins small text that a thin gap splits.",
    )
    max_height_fraction: float = Field(
        0.9,
        gt=0,
        description="Drop a box whose text height (short side, after unclip) is more than "
        "this fraction of the frame's short side: the model's whole-image response to "
        "textless photos, not text (docs/results.md).",
    )


class ModelConfig(_Section):
    path: Path | None = Field(
        None, description="ONNX model; none means the embedded PP-OCRv6 text detector."
    )
    preset: Literal["auto", "ppocr_det", "yolo"] = Field(
        "auto",
        description="Pre-processing preset: ppocr_det (BGR, (x/255-0.5)/0.5), yolo (RGB, x/255).",
    )
    head: Literal["auto", "dbnet", "yolo_v5", "yolo_v8", "end_to_end", "efficient_nms"] = Field(
        "auto", description="Output decoder; auto picks it from the model's output shapes."
    )
    labels: list[str] | None = Field(
        None, description="Class names; default from the model's metadata."
    )
    input_size: int = Field(
        640, ge=32, description="Target long side of the engine input, before stride rounding."
    )
    input_sizes: list[int] = Field(
        default_factory=lambda: [640, 960, 1280],
        description="Long sides a session may choose instead (settings.input_size, since "
        "protocol 2): a small set, so batches, CUDA graphs and TensorRT profiles stay "
        "bounded. Sizes above max_side are not offered; with engine.kind tensorrt neither "
        "are sizes above input_size (the plan's profile ends there). docs/results.md "
        "gives agreement and CPU frames/s per size.",
    )
    fit: Literal["letterbox", "stretch", "preset"] = Field(
        "preset",
        description="How a frame fills the engine input: letterbox (aspect kept, sides rounded "
        "up to the stride, padded), stretch (sides rounded to the nearest stride multiple, "
        "frame resized to fill it, as PP-OCR's own DetPreProcess) or preset (the model "
        "family's own: stretch for ppocr_det, letterbox for yolo; the default). "
        "docs/results.md: on 16:9 frames stretch matches the reference pipeline's boxes "
        "1.000/1.000, letterbox 0.90-0.94/0.83-0.90.",
    )
    stride: int = Field(32, ge=1, description="Input sides are multiples of this.")
    min_side: int = Field(32, ge=1, description="Smallest input side the engine accepts.")
    max_side: int = Field(1280, ge=32, description="Largest input side the engine accepts.")
    confidence: float = Field(
        0.5, ge=0, le=1, description="Default score threshold; sessions may change theirs."
    )
    nms_iou: float = Field(0.45, gt=0, le=1, description="IoU above which NMS suppresses a box.")
    max_detections: int = Field(300, ge=1, description="Detections kept per frame.")
    dbnet: DbnetConfig = Field(default_factory=DbnetConfig)


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
    install = "torch onnx2torch cuda-python"

    device: str = Field("cuda:0", description="Torch device for the converted ONNX graph.")
    fp16: bool = Field(True, description="Run in half precision.")
    cuda_graphs: bool = Field(True, description="Capture a CUDA graph per (batch, shape) bucket.")
    channels_last: bool = Field(
        False,
        description="On a CUDA device, convolutions run on NHWC tensors (the frames already "
        "arrive NHWC) and cuDNN picks each convolution's fastest algorithm at warm-up, "
        "before the CUDA graphs are captured. Off by default: on the H200 it changed the "
        "engine's ceiling by -4 % at batch 8 and +2 % at batch 16 (docs/benchmarks.md), "
        "and the GPU tests against ONNX Runtime have not run with it.",
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
        "compile_cache; max-autotune tries more kernels and takes longer. On the H200 the "
        "default detector ran 2.0-2.3x faster alone (batch 4-16, FP16), after ~12 s of "
        "compile a batch bucket; on the 2-core CPU machine 1.7x (docs/benchmarks.md). Off "
        "by default: the first start compiles for about a minute, and a Jetson's torch may "
        "lack Triton for its GPU (edge-vision doctor says).",
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
        "onnxruntime",
        description="Which engine runs the network: the name of one of the engine sections "
        "below (engine_kinds()).",
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
    cuda_sync: Literal["auto", "blocking"] = Field(
        "auto",
        description="How this process's threads wait for the GPU, for every library in it "
        "(torch, nvImageCodec, TensorRT): auto, CUDA's choice, which spins a core for the "
        "whole wait while the process has fewer CUDA contexts than the machine has cores "
        "(always, for a worker); blocking, the device's primary context is made with "
        "CU_CTX_SCHED_BLOCKING_SYNC, so a waiting thread sleeps (needs cuda-python). The "
        "service's own waits already sleep (blocking-sync events). On an H200 at 64 cameras "
        "blocking saved no CPU (docs/benchmarks.md, 2026-12-02 midday), so auto stays.",
    )
    onnxruntime: OnnxRuntimeConfig = Field(default_factory=OnnxRuntimeConfig)
    torch: TorchConfig = Field(default_factory=TorchConfig)
    tensorrt: TensorRTConfig = Field(default_factory=TensorRTConfig)
    triton: TritonConfig = Field(default_factory=TritonConfig)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        kinds = engine_kinds()
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


class DecodeConfig(_Section):
    decoder: Literal["auto", "simplejpeg", "turbojpeg", "opencv", "pillow"] = Field(
        "auto", description="JPEG decoder; auto takes the fastest installed."
    )
    dct_downscale: bool = Field(
        True, description="Let libjpeg scale by 1/2..1/8 while decoding big frames."
    )
    workers: int = Field(
        0, ge=0, description="Threads for decode, shape and post; 0 means one per CPU core."
    )
    device: Literal["host", "cuda", "auto"] = Field(
        "host",
        description="Where JPEGs are decoded and letterboxed: host (libjpeg-turbo), cuda "
        "(batched on the GPU with decode.device_library, when a CUDA engine is active; other "
        "frames still go the host way), auto (cuda when torch sees a GPU and nvImageCodec or "
        "torchvision is there, else host).",
    )
    device_library: Literal["auto", "nvimgcodec", "torchvision"] = Field(
        "auto",
        description="The GPU JPEG decoder behind decode.device cuda: nvimgcodec (NVIDIA's "
        "nvImageCodec: the GPU's hardware JPEG engine where it has one - A100, H100, H200, "
        "Jetson Orin - then its CUDA decoder; pip install nvidia-nvimgcodec-cu13, or "
        "nvidia-nvimgcodec-tegra-cu12 on a Jetson), torchvision (nvJPEG's batched decode, "
        "whose Huffman stage runs on the host CPU), or auto (nvimgcodec when installed).",
    )
    device_batch: int = Field(
        64, ge=1, le=256, description="Most frames in one device decode call (decode.device)."
    )
    device_streams: int = Field(
        2, ge=1, le=8, description="Device decode calls in flight at once, one stream each."
    )
    device_window_ms: float = Field(
        0.0,
        ge=0,
        le=100,
        description="How long the oldest frame waiting for a GPU decode (decode.device cuda, "
        "or auto when a GPU decoder started) waits for others before its call goes, counted "
        "from its arrival, so a frame that already waited that long for a busy stream goes "
        "at once; decode.device_batch waiting frames go at once. 0: a frame goes as soon as a "
        "device stream is free. A device call's host cost is mostly a cost per call (5x less "
        "a frame at batch 8 than at 1, docs/benchmarks.md), so a few milliseconds here buy "
        "fewer, fuller calls, and fuller engine batches after them, for that much latency: "
        "at 64 cameras on an H200, 12 ms took 40 % off the server's CPU a frame, and 20 ms "
        "with 6 workers left a quarter of the host path's (docs/deployment.md).",
    )
    device_window_adaptive: bool = Field(
        True,
        description="With decode.device_window_ms above 0: a device decode call waits out "
        "the window only while this worker's device frames have lately come at least one a "
        "window (the average of the last 32 gaps between them, each gap counted at most two "
        "windows, is no longer than the window), so a worker whose frames come further "
        "apart (one camera, a light load) adds no latency for calls that would carry one "
        "frame anyway, once the average has caught up after a busier spell (17-19 "
        "frames of one camera at 30 fps and 20 ms) "
        "(decode.device_window_min_frames asks for more frames a window). false: the "
        "plain window (every call waits until its oldest frame has waited the window, "
        "unless decode.device_batch frames wait).",
    )
    device_window_min_frames: float = Field(
        1.0,
        ge=1,
        le=64,
        description="With decode.device_window_adaptive: how many device frames the window "
        "must be expected to gather (the window over the average gap between this worker's "
        "device frames) before a call waits it out. 1: wait whenever another frame should "
        "come within it. More: wait only while this worker is busy enough that its calls "
        "would otherwise stay small, where the per-call host cost the window saves is what "
        "limits the node; below that load frames go at once. On the H200 with 6 workers and "
        "20 ms, 4.5 waited at 64 cameras (about 6 frames a window a worker: 4.6x less server "
        "CPU a frame than the host path, p99 44 ms) and seldom at 32 (about 3: p99 17 ms; "
        "37 without min_frames in a run of 2026-12-03) (docs/deployment.md).",
    )
    device_wait: Literal["host", "stream"] = Field(
        "host",
        description="Who waits for a device decode (decode.device cuda): host, the decode "
        "thread waits for the decoder's stream before the frame goes on; stream, the "
        "engine's CUDA stream waits on the GPU for each canvas's event, so the decode "
        "thread is free at once. On the H200 at 64 cameras stream answered within noise "
        "of host and took 8-28 % more server CPU a frame (docs/benchmarks.md).",
    )
    pool_idle_bytes: int = Field(
        16 * 1024 * 1024,
        ge=0,
        description="Idle decode buffers kept after a quiet period (pool_idle_s); the rest "
        "are freed and their memory handed back to the system. 16 MiB keeps a few 720p-1080p "
        "frames' buffers warm.",
    )
    pool_idle_s: float = Field(
        5.0,
        gt=0,
        description="A pool unused this long shrinks to pool_idle_bytes (checked this often).",
    )
    trim_heap: bool = Field(
        True,
        description="After the pool shrinks, hand free heap pages back to the system "
        "(glibc malloc_trim; a no-op elsewhere). Without it glibc keeps what a burst of "
        "8 MiB messages left (docs/benchmarks.md, 'Memory budget').",
    )


class SessionConfig(_Section):
    default_mode: Mode = Field("latest", description="latest: newest frame wins; every: all.")
    every_queue: int = Field(
        8, ge=1, description="Frames waiting per 'every' connection before reads pause."
    )
    every_in_flight: int = Field(
        2, ge=1, description="Frames of one 'every' connection processed at once (in order)."
    )
    latest_in_flight: int = Field(
        3,
        ge=2,
        le=16,
        description="Most frames of one 'latest' connection between its waiting slot and its "
        "reply (decoding, waiting for the engine, inferring, sending). One is decoded at a "
        "time and the newest decoded frame takes the place of one still waiting for the "
        "engine, so this only bounds work, never latency.",
    )
    max_messages_per_s: float = Field(
        120.0,
        ge=0,
        description="Read budget of one connection: messages read per second, up to "
        "message_burst at once: frames in latest mode, settings, pings and bad messages (a "
        "frame admitted in every mode is paced by that queue's back-pressure instead). Over "
        "it the server stops reading that socket (TCP back-pressure) until the budget "
        "refills, so a flooding client costs what a 120 fps camera costs; in latest mode the "
        "frames it reads are replaced by newer ones and counted as dropped. 0: no budget.",
    )
    message_burst: int = Field(
        60,
        ge=1,
        description="Messages one connection may send at once above max_messages_per_s "
        "before its reading pauses (the token bucket's size).",
    )


class StateConfig(_Section):
    """Shared connection state (docs/state.md): where it lives, key TTLs, heartbeat."""

    redis_url: str | None = Field(
        None,
        pattern=r"^(redis|rediss|unix)://",
        description="redis://[[user]:password@]host:port/db, rediss:// (TLS) or "
        "unix:///path/redis.sock?db=0; none keeps state in this process.",
    )
    redis_password: str | None = Field(
        None, description="Redis password (AUTH); overrides one given in the URL."
    )
    redis_tls_ca: Path | None = Field(
        None, description="CA bundle that signed the Redis server's certificate (rediss://)."
    )
    redis_tls_cert: Path | None = Field(
        None, description="Client certificate, when Redis asks for one (tls-auth-clients)."
    )
    redis_tls_key: Path | None = Field(None, description="Private key of redis_tls_cert.")
    key_prefix: str = Field(
        "ev:",
        pattern=r"^[A-Za-z0-9._:-]{0,32}$",
        description="Prefix of every key, so several services can share one Redis.",
    )
    node_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="This node's id (letters, digits, . _ -); default host-pid.",
    )
    advertise_url: str | None = Field(None, description="Address other nodes see for this node.")
    node_ttl_s: float = Field(
        15.0,
        gt=0,
        description="Node key TTL, refreshed by heartbeat; a dead node vanishes "
        "after this long. Must exceed heartbeat_s.",
    )
    session_ttl_s: float = Field(
        120.0, gt=0, description="How long a disconnected session can be resumed."
    )
    heartbeat_s: float = Field(
        5.0,
        gt=0,
        description="Heartbeat and state flush period; while Redis is unreachable, "
        "writes are retried at least this often (and at least every 2 s).",
    )
    op_timeout_s: float = Field(1.0, gt=0, description="Deadline for one Redis operation.")

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> StateConfig:
        if self.node_ttl_s <= self.heartbeat_s:
            raise ValueError(
                f"state.node_ttl_s ({self.node_ttl_s}) must be longer than state.heartbeat_s "
                f"({self.heartbeat_s}), or live nodes would expire between heartbeats"
            )
        return self


class ApiKeyConfig(_Section):
    name: str = Field(
        ..., pattern=r"^[A-Za-z0-9._:@-]{1,128}$", description="Who holds the key (the subject)."
    )
    sha256: str = Field(
        ...,
        pattern=r"^[0-9a-f]{64}$",
        description="Hex SHA-256 of the key (edge-vision token --new-api-key prints both); "
        "the key itself is never in the config.",
    )
    scopes: list[Literal["stream", "admin"]] = Field(
        default_factory=lambda: list[Literal["stream", "admin"]](["stream"]),
        description="stream: /ws; admin: /metrics, /api/*.",
    )


class AuthConfig(_Section):
    """Who may connect (docs/security.md). Off for the local demo; on in every shipped
    deployment config."""

    enabled: bool = Field(
        False,
        description="Require a credential (API key or signed token) on /ws, and the admin "
        "scope on /metrics and /api/*. Off: anyone who reaches the port may connect.",
    )
    api_keys: list[ApiKeyConfig] = Field(
        default_factory=list, description="Static API keys, stored as their SHA-256."
    )
    token_secret_file: Path | None = Field(
        None,
        description="File holding the HMAC secret that signs tokens (at least 32 bytes); "
        "read at start, never logged. Unset: the variable named by token_secret_env.",
    )
    token_secret_env: str = Field(
        ENV_TOKEN_SECRET,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="Environment variable holding the token secret when no file is named "
        "(not another EDGE_VISION_ name: those are config keys).",
    )

    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins (scheme://host[:port]) allowed to open /ws besides the "
        "page's own; '*' allows any. Checked whenever a handshake carries Origin, auth on "
        "or off; clients that send no Origin are judged by their credential alone.",
    )
    allow_query_token: bool = Field(
        True,
        description="Accept ?access_token= as a last resort (redacted from logs); prefer "
        "Authorization: Bearer or the subprotocol entry.",
    )

    @model_validator(mode="after")
    def _secret_env_is_not_config(self) -> AuthConfig:
        env = self.token_secret_env
        if env.startswith(ENV_PREFIX) and env != ENV_TOKEN_SECRET:
            raise ValueError(f"auth.token_secret_env {env!r} would be read as a config key")
        return self


class LimitsConfig(_Section):
    """Fair shares of connections (docs/security.md, "Limits"); server.max_connections is
    the total."""

    max_connections_per_address: int = Field(
        64, ge=1, description="Open WebSockets from one client address above this get 503."
    )
    max_connections_per_token: int = Field(
        128,
        ge=1,
        description="Open WebSockets of one API key, or of all tokens of one subject, above "
        "this get 503.",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Peers (addresses or CIDRs, e.g. 127.0.0.1 or 10.0.0.0/8) whose "
        "X-Forwarded-For names the client; from any other peer the header is ignored.",
    )
    handshake_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A TCP connection that has not sent a complete HTTP request this long "
        "after it opened (or after its last one) is closed; also bounds the work before "
        "the WebSocket upgrade (credential check, resume claim).",
    )

    @model_validator(mode="after")
    def _proxies_parse(self) -> LimitsConfig:
        import ipaddress

        for entry in self.trusted_proxies:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"limits.trusted_proxies: {entry!r} is not an address or CIDR"
                ) from None
        return self


class ReadConfig(_Section):
    """Reading the text in the boxes (edge_vision.frames.read; since protocol 2, per session
    ``settings.read``, off by default)."""

    enabled: bool = Field(
        True,
        description="Server-wide switch: false refuses settings.read true (bad_settings). The "
        "recogniser is loaded when the first session turns reading on.",
    )
    max_boxes: int = Field(
        16,
        ge=1,
        description="Most boxes read per frame (best score first); the others come back "
        "unread (text null) and are read by the next frames.",
    )
    model_path: Path | None = Field(
        None, description="Recogniser ONNX; none means rapidocr's PP-OCRv6_rec_small.onnx."
    )
    engine: Literal["auto", "onnxruntime", "torch", "tensorrt"] = Field(
        "auto",
        description="Engine kind of the recogniser; auto: the detector's engine.kind when it "
        "is torch (on engine.torch.device, in FP32) or tensorrt (a second plan in "
        "engine.tensorrt.engine_dir, built like the detector's; ONNX Runtime, with a log "
        "line, when TensorRT is absent or the plan cannot be had), else ONNX Runtime on "
        "the CPU.",
    )
    threads: int = Field(
        0, ge=0, description="ONNX Runtime intra-op threads of the recogniser; 0: one per core."
    )
    batch: int = Field(
        6,
        ge=1,
        description="Crops per recogniser run, sorted by width; a batch is padded to its "
        "widest crop and this model's attention sees the padding, so 6, the reference's "
        "rec_batch_num, gives the reference's strings for the same boxes.",
    )
    max_width: int = Field(
        2560,
        ge=320,
        description="Widest recogniser batch (pixels at height 48; the TensorRT plan's "
        "profile ends there): a crop whose width at height 48 is larger is squeezed to it. "
        "2560 holds a line 53 times as wide as it is tall.",
    )
    reread_size_change: float = Field(
        0.15,
        ge=0,
        description="A label already read is read again when its box's width or height "
        "changed by more than this fraction since; otherwise its text is carried on its track.",
    )


class LoggingConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")


class Config(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    decode: DecodeConfig = Field(default_factory=DecodeConfig)
    session: SessionConfig = Field(default_factory=SessionConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    read: ReadConfig = Field(default_factory=ReadConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)


# ---------------------------------------------------------------------------------------
# Loading


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(model.model_fields)


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(e["loc"]))
            lines.append(f"unknown config key '{key}'; allowed keys here: {allowed}")
        else:
            lines.append(f"config key '{key}': {e['msg']} (got {e.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"empty config key in {dotted!r}")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key '{dotted}': '{p}' is not a section")
        node = child
    node[parts[-1]] = value


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _scalar(text: str) -> Any:
    """A value given as text (env var or --set) read as YAML, so it gets its natural type."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """``EDGE_VISION_SECTION__KEY=value`` entries as a nested dict."""
    tree: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in (ENV_CONFIG_FILE, ENV_TOKEN_SECRET):
            continue
        dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        _set_path(tree, dotted, _scalar(value))
    return tree


def cli_overrides(assignments: list[str]) -> dict[str, Any]:
    """``section.key=value`` strings (from ``--set``) as a nested dict."""
    tree: dict[str, Any] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        _set_path(tree, key.strip(), _scalar(value))
    return tree


def load_config(
    file: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
) -> Config:
    """Build the effective configuration: defaults < YAML file < environment < CLI."""
    environ = os.environ if environ is None else environ
    file = file or environ.get(ENV_CONFIG_FILE) or None
    tree: dict[str, Any] = {}
    if file is not None:
        path = Path(file)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        tree = loaded
    tree = _merge(tree, env_overrides(environ))
    tree = _merge(tree, dict(cli or {}))
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_errors(e)) from None


def session_input_sizes(config: Config) -> list[int]:
    """The input sizes a session may choose (``model.input_sizes``, with the configured
    ``model.input_size`` always among them) that the configured engine can run."""
    m = config.model
    top = m.input_size if config.engine.kind == "tensorrt" else m.max_side
    return sorted({s for s in m.input_sizes if 32 <= s <= top} | {m.input_size})


def dump_config(config: Config) -> str:
    """The effective configuration as YAML (what ``--print-config`` shows)."""
    data = config.model_dump(mode="json")
    return str(yaml.safe_dump(data, sort_keys=False))
