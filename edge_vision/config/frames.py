"""The frame path's sections: ``decode`` and ``read``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from .base import _Section


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
        "device stream is free. A device call's host cost is mostly a cost per call, not "
        "per frame, so a few milliseconds here buy fewer, fuller calls, and fuller engine "
        "batches after them, for that much latency: much less server CPU a frame where the "
        "host's CPU is the limit (docs/benchmarks.md, 'the moved decoder, the push on one "
        "server, and the decode window'; docs/deployment.md).",
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
        "limits the node; below that load frames go at once. With 6 workers, 20 ms and 30 "
        "fps a camera, 4.5 waits at 64 cameras (about 6 frames a window a worker), where "
        "the window saves CPU, and seldom at 32 (about 3), where it would only add latency "
        "(docs/benchmarks.md, 'one configuration for 64 and 32 cameras'; "
        "docs/deployment.md).",
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
