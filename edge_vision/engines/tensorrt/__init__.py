"""The tensorrt engine: build, cache and run a TensorRT plan of the ONNX model.

``import tensorrt`` is lazy and happens in :mod:`.library` only. The modules:

* :mod:`.engine`: :class:`TensorRTEngine`, on the shared CUDA run path
  (:mod:`edge_vision.engines.gpu_base`) with an execution context per slot;
* :mod:`.build`: parsing and building plans, finding or building one once
  (:func:`ensure_plan`), loading one (:func:`load_plan`) — every TensorRT build call;
* :mod:`.profile`: the optimisation profile from the model's input limits;
* :mod:`.plan_store`: the key a plan depends on, its JSON record, lookup, atomic writes;
* :mod:`.onnx_adapter`: the uint8 input adapter folded into the graph, parser errors;
* :mod:`.calibration`: INT8 calibration frames and the TensorRT calibrator;
* :mod:`.recogniser`: the text recogniser's plan (a second plan, built the same way) and
  :class:`TensorRTRecogniser`, which :mod:`edge_vision.frames.read` runs it with;
* :mod:`.progress`: build progress as log lines (and systemd start-timeout extensions);
* :mod:`.library`: the lazy import and the process's one TensorRT logger.

Everything but the TensorRT calls is plain code tested on CPUs (tests/integration/test_trt_plan.py);
the calls are driven with a fake ``tensorrt`` module (tests/support/mock_tensorrt.py, used
by tests/integration/test_tensorrt_*_mocked.py).
Written against the TensorRT 10 Python API; not run against a real TensorRT here.
"""

from .build import (
    BuildResult,
    PlanReady,
    build_for_config,
    build_plan,
    current_key,
    ensure_plan,
    load_plan,
    validate_build_settings,
)
from .calibration import calibration_batches, calibration_frames
from .engine import TensorRTEngine
from .library import import_tensorrt
from .onnx_adapter import (
    ADAPTER_PREFIX,
    ARGMAX_OUTPUT,
    MAX_OUTPUT,
    UINT8_INPUT_NAME,
    ParserErrorInfo,
    adapter_node_count,
    append_argmax,
    describe_parser_errors,
    wrap_uint8_input,
)
from .plan_store import (
    RECORD_FORMAT,
    InputAdapter,
    PlanKey,
    PlanLookup,
    PlanRecord,
    build_lock,
    calibration_cache_path,
    explain_stale,
    lookup_plan,
    make_record,
    plan_paths,
    rebuild_command,
    refusal_message,
    timing_cache_path,
    write_cache_atomically,
    write_plan_atomically,
)
from .profile import (
    ShapeProfile,
    calibration_shape,
    derive_profile,
    profile_for,
    recogniser_profile,
)
from .progress import BuildProgress, LogBuildProgress

__all__ = [
    "ADAPTER_PREFIX",
    "ARGMAX_OUTPUT",
    "MAX_OUTPUT",
    "RECORD_FORMAT",
    "UINT8_INPUT_NAME",
    "BuildProgress",
    "BuildResult",
    "InputAdapter",
    "LogBuildProgress",
    "ParserErrorInfo",
    "PlanKey",
    "PlanLookup",
    "PlanReady",
    "PlanRecord",
    "ShapeProfile",
    "TensorRTEngine",
    "adapter_node_count",
    "append_argmax",
    "build_for_config",
    "build_lock",
    "build_plan",
    "calibration_batches",
    "calibration_cache_path",
    "calibration_frames",
    "calibration_shape",
    "current_key",
    "derive_profile",
    "describe_parser_errors",
    "ensure_plan",
    "explain_stale",
    "import_tensorrt",
    "load_plan",
    "lookup_plan",
    "make_record",
    "plan_paths",
    "profile_for",
    "rebuild_command",
    "recogniser_profile",
    "refusal_message",
    "timing_cache_path",
    "validate_build_settings",
    "wrap_uint8_input",
    "write_cache_atomically",
    "write_plan_atomically",
]
