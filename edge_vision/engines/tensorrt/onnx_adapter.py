"""The ONNX graph TensorRT builds from, and what its parser says about it.

Plain code, tested on CPUs with ONNX Runtime (tests/integration/test_trt_plan.py):
:func:`wrap_uint8_input` folds the frame normalisation into the graph (see its docstring
for why); :func:`describe_parser_errors` names the failing nodes of a rejected model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelError
from ...model.shape import Normalisation

#: Name of the engine input of every plan edge_vision builds (see :func:`wrap_uint8_input`).
UINT8_INPUT_NAME = "edge_vision_frames_u8"
#: Prefix of the nodes and initialisers :func:`wrap_uint8_input` adds.
ADAPTER_PREFIX = "edge_vision_pre/"


def wrap_uint8_input(model: Any, input_name: str, norm: Normalisation) -> Any:
    """A copy of ``model`` whose input is uint8 ``[N, H, W, 3]`` BGR frames.

    The added first nodes do what :func:`edge_vision.model.shape.normalise_into` does on the CPU
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
    scale, shift = norm.scale_shift()
    inits = [
        numpy_helper.from_array(scale.reshape(1, 3, 1, 1), p + "scale"),
        numpy_helper.from_array(shift.reshape(1, 3, 1, 1), p + "shift"),
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


#: The outputs :func:`append_argmax` gives the recogniser: best class and its probability.
ARGMAX_OUTPUT = ADAPTER_PREFIX + "best_class"
MAX_OUTPUT = ADAPTER_PREFIX + "best_probability"


def append_argmax(model: Any) -> Any:
    """A copy of the text recogniser ``model`` (one output ``[N, T, C]`` of character
    probabilities) whose outputs are instead the arg-max class per column (``[N, T]``,
    int32) and its probability (``[N, T]``, float32), computed in the plan.

    What :class:`edge_vision.frames.read.TorchRecogniser` does on its device: only two ``[N, T]``
    arrays come back from the GPU, not ``[N, T, 18710]`` (a 6-crop batch at width 2560
    would copy 143 MB per run). ``ArgMax`` is cast to int32, the index type TensorRT
    computes it in. Opset-11 forms (axis/axes as attributes), the recogniser's opset.
    """
    import onnx
    from onnx import TensorProto, helper

    wrapped = onnx.ModelProto()
    wrapped.CopyFrom(model)
    graph = wrapped.graph
    if len(graph.output) != 1:
        raise ModelError(f"the recogniser has {len(graph.output)} outputs; expected one [N, T, C]")
    probs = graph.output[0].name
    p = ADAPTER_PREFIX
    graph.node.extend(
        [
            helper.make_node("ArgMax", [probs], [p + "argmax"], p + "argmax", axis=2, keepdims=0),
            helper.make_node(
                "Cast", [p + "argmax"], [ARGMAX_OUTPUT], p + "argmax_i32", to=TensorProto.INT32
            ),
            helper.make_node("ReduceMax", [probs], [MAX_OUTPUT], p + "max", axes=[2], keepdims=0),
        ]
    )
    del graph.output[:]
    graph.output.extend(
        [
            helper.make_tensor_value_info(ARGMAX_OUTPUT, TensorProto.INT32, ["N", "T"]),
            helper.make_tensor_value_info(MAX_OUTPUT, TensorProto.FLOAT, ["N", "T"]),
        ]
    )
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
