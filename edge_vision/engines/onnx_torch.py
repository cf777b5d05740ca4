"""Run an ONNX graph with torch ops: the ``torch`` engine's own small converter.

Why our own and not onnx2torch: the default model needs two things onnx2torch lacks
(docs/benchmarks.md, the first "Engine only" section): Conv/MaxPool with
``auto_pad=SAME_UPPER``, and Resize scales that stay host constants so CUDA graph
capture never reads a device tensor back to the host. The
interpreter covers the operators of PP-OCR det and rec and of Ultralytics YOLO v5/v8/v11 exports
(ONNX opset 11-17 semantics) and names any other operator in one clear error.

Shape arithmetic (``Shape``, ``Gather`` on shapes, ``Concat`` of shape pieces...) runs on
host ``int64`` tensors, computed from the input's static shape, so a captured graph holds
only device kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

from ..errors import ModelError

Value = Any  # torch.Tensor on the model device, or a host int64 tensor for shapes
Op = Callable[..., Any]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _same_pads(
    size: list[int], kernel: list[int], stride: list[int], dilation: list[int], upper: bool
) -> list[int]:
    """ONNX auto_pad SAME_UPPER/SAME_LOWER: output = ceil(in / stride), extra pad at the end
    (UPPER) or the beginning (LOWER). Returned in F.pad order (last dim first)."""
    pads: list[int] = []
    for n, k, s, d in zip(
        reversed(size), reversed(kernel), reversed(stride), reversed(dilation), strict=True
    ):
        out = math.ceil(n / s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        pads += [small, big] if upper else [big, small]
    return pads


def _explicit_pads(pads: list[int]) -> list[int]:
    """ONNX pads [b1, b2, ..., e1, e2, ...] → F.pad order (last dim first)."""
    half = len(pads) // 2
    out: list[int] = []
    for i in reversed(range(half)):
        out += [pads[i], pads[i + half]]
    return out


def _is_host(v: Value) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dtype == torch.int64


class OnnxGraphModule(torch.nn.Module):
    """``forward(x)`` evaluates the ONNX graph node by node with torch operators."""

    def __init__(self, path: Path, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        model = onnx.load(str(path))
        graph = model.graph
        self.compute_dtype = dtype
        init_names = {i.name for i in graph.initializer}
        inputs = [i.name for i in graph.input if i.name not in init_names]
        if len(inputs) != 1:
            raise ModelError(f"{path}: expected one input, found {inputs}")
        self.input_name = inputs[0]
        self.output_names = [o.name for o in graph.output]
        self.nodes = list(graph.node)
        unsupported = sorted({n.op_type for n in self.nodes} - set(_OPS))
        if unsupported:
            raise ModelError(
                f"{path}: the torch engine does not implement ONNX operators {unsupported}; "
                "use engine.kind onnxruntime or tensorrt for this model"
            )
        # Float weights become parameters (moved and cast with the module); integer
        # initialisers (shapes, axes, Resize scales/sizes) stay host constants.
        self._consts: dict[str, Value] = {}
        self.weights = torch.nn.ParameterDict()
        self._weight_keys: dict[str, str] = {}
        float_inputs = self._float_weight_names()
        for init in graph.initializer:
            arr = numpy_helper.to_array(init)
            if init.name in float_inputs and arr.dtype.kind == "f":
                key = f"w{len(self._weight_keys)}"
                self._weight_keys[init.name] = key
                self.weights[key] = torch.nn.Parameter(
                    torch.from_numpy(arr.copy()).to(dtype), requires_grad=False
                )
            else:
                self._consts[init.name] = torch.from_numpy(np.array(arr))
        for node in self.nodes:
            if node.op_type == "Constant":
                self._consts[node.output[0]] = torch.from_numpy(
                    np.array(numpy_helper.to_array(_attrs(node)["value"]))
                )
        self._attr_cache = [_attrs(n) for n in self.nodes]

    def _float_weight_names(self) -> set[str]:
        """Initialisers consumed as tensors by compute ops (not as shapes or scales)."""
        host_inputs = {
            ("Resize", 1),
            ("Resize", 2),
            ("Resize", 3),
            ("Reshape", 1),
            ("Slice", 1),
            ("Slice", 2),
            ("Slice", 3),
            ("Slice", 4),
            ("Unsqueeze", 1),
            ("Squeeze", 1),
            ("Split", 1),
            ("Expand", 1),
            ("Tile", 1),
            ("Pad", 1),
            ("Pad", 2),
            ("ReduceMean", 1),
            ("Range", 0),
            ("Range", 1),
            ("Range", 2),
            ("ConstantOfShape", 0),
        }
        names = set()
        for n in self.nodes:
            for i, name in enumerate(n.input):
                if (n.op_type, i) not in host_inputs:
                    names.add(name)
        return names

    def _value(self, env: dict[str, Value], name: str) -> Value:
        if name == "":
            return None
        if name in env:
            return env[name]
        if name in self._weight_keys:
            return self.weights[self._weight_keys[name]]
        if name in self._consts:
            return self._consts[name]
        raise ModelError(f"ONNX value {name!r} is used before it is produced")

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        env: dict[str, Value] = {self.input_name: x}
        for node, attrs in zip(self.nodes, self._attr_cache, strict=True):
            if node.op_type == "Constant":
                continue
            args = [self._value(env, n) for n in node.input]
            try:
                out = _OPS[node.op_type](self, args, attrs)
            except ModelError:
                raise
            except Exception as e:
                raise ModelError(
                    f"ONNX node {node.name or node.op_type} ({node.op_type}) failed: {e}"
                ) from e
            if isinstance(out, tuple | list) and len(node.output) > 1:
                for name, value in zip(node.output, out, strict=False):
                    env[name] = value
            else:
                env[node.output[0]] = out
        return [env[n] for n in self.output_names]

    def host_ints(self, v: Value) -> list[int]:
        """A shape-like value as Python ints (host constants only, never a device sync)."""
        if isinstance(v, torch.Tensor):
            if v.device.type != "cpu":
                raise ModelError("a shape operand lives on the device; cannot capture it")
            return [int(i) for i in v.reshape(-1).tolist()]
        return [int(i) for i in v]

    def host_floats(self, v: Value) -> list[float]:
        if isinstance(v, torch.Tensor):
            if v.device.type != "cpu":
                raise ModelError("a scale operand lives on the device; cannot capture it")
            return [float(i) for i in v.reshape(-1).tolist()]
        return [float(i) for i in v]


# -- operators: op(module, args, attrs) --------------------------------------------------


def _binary(fn: Callable[[Any, Any], Any]) -> Op:
    def op(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
        x, y = a
        if _is_host(x) and _is_host(y):
            return fn(x, y)  # shape arithmetic stays on the host
        dev = x if isinstance(x, torch.Tensor) and not _is_host(x) else y
        x = _to_dev(x, dev)
        y = _to_dev(y, dev)
        return fn(x, y)

    return op


def _to_dev(v: Value, like: torch.Tensor) -> torch.Tensor:
    if isinstance(v, torch.Tensor) and v.device == like.device:
        return v if v.dtype == like.dtype or not v.is_floating_point() else v.to(like.dtype)
    t = torch.as_tensor(v)
    if t.is_floating_point():
        t = t.to(like.dtype)
    return t.to(like.device)


def _conv(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    x, w = a[0], a[1]
    b = a[2] if len(a) > 2 else None
    k = list(at.get("kernel_shape", w.shape[2:]))
    s = list(at.get("strides", [1] * len(k)))
    d = list(at.get("dilations", [1] * len(k)))
    auto = at.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        x = F.pad(x, _same_pads(list(x.shape[2:]), k, s, d, auto == "SAME_UPPER"))
        pad: Any = 0
    else:
        pads = list(at.get("pads", [0] * 2 * len(k)))
        half = len(pads) // 2
        if pads[:half] == pads[half:]:
            pad = pads[:half]
        else:
            x = F.pad(x, _explicit_pads(pads))
            pad = 0
    conv = F.conv2d if len(k) == 2 else F.conv1d
    return conv(x, w, b, s, pad, d, at.get("group", 1))


def _conv_transpose(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    x, w = a[0], a[1]
    b = a[2] if len(a) > 2 else None
    k = list(at.get("kernel_shape", w.shape[2:]))
    pads = list(at.get("pads", [0] * 2 * len(k)))
    half = len(pads) // 2
    if pads[:half] != pads[half:]:
        raise ModelError("ConvTranspose with asymmetric pads is not supported")
    return F.conv_transpose2d(
        x,
        w,
        b,
        list(at.get("strides", [1] * len(k))),
        pads[:half],
        list(at.get("output_padding", [0] * len(k))),
        at.get("group", 1),
        list(at.get("dilations", [1] * len(k))),
    )


def _max_pool(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    x = a[0]
    k = list(at["kernel_shape"])
    s = list(at.get("strides", [1] * len(k)))
    d = list(at.get("dilations", [1] * len(k)))
    auto = at.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        x = F.pad(
            x, _same_pads(list(x.shape[2:]), k, s, d, auto == "SAME_UPPER"), value=float("-inf")
        )
        pad: Any = 0
    else:
        pads = list(at.get("pads", [0] * 2 * len(k)))
        half = len(pads) // 2
        if pads[:half] != pads[half:]:
            x = F.pad(x, _explicit_pads(pads), value=float("-inf"))
            pad = 0
        else:
            pad = pads[:half]
    return F.max_pool2d(x, k, s, pad, d, ceil_mode=bool(at.get("ceil_mode", 0)))


def _resize(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    x = a[0]
    scales = m.host_floats(a[2]) if len(a) > 2 and a[2] is not None and a[2].numel() else []
    sizes = m.host_ints(a[3]) if len(a) > 3 and a[3] is not None else []
    mode = at.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ctm = at.get("coordinate_transformation_mode", b"half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    if sizes:
        out_hw = sizes[2:]
    else:
        out_hw = [math.floor(n * f) for n, f in zip(x.shape[2:], scales[2:], strict=True)]
    if mode == "nearest":
        nm = at.get("nearest_mode", b"round_prefer_floor")
        nm = nm.decode() if isinstance(nm, bytes) else nm
        if ctm == "asymmetric" and nm == "floor":
            return F.interpolate(x, size=out_hw, mode="nearest")
        if ctm in ("half_pixel", "pytorch_half_pixel") and nm.startswith("round"):
            return F.interpolate(x, size=out_hw, mode="nearest-exact")
        return F.interpolate(x, size=out_hw, mode="nearest")
    if mode == "linear":
        return F.interpolate(x, size=out_hw, mode="bilinear", align_corners=ctm == "align_corners")
    raise ModelError(f"Resize mode {mode!r} is not supported")


def _hard_sigmoid(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    return torch.clamp(a[0] * at.get("alpha", 0.2) + at.get("beta", 0.5), 0.0, 1.0)


def _reduce_mean(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    axes = at.get("axes") or (m.host_ints(a[1]) if len(a) > 1 and a[1] is not None else None)
    keep = bool(at.get("keepdims", 1))
    if not axes:
        return a[0].mean() if not keep else a[0].mean(dim=tuple(range(a[0].dim())), keepdim=True)
    return a[0].mean(dim=tuple(axes), keepdim=keep)


def _concat(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    parts = [p for p in a if p is not None]
    if all(_is_host(p) for p in parts):
        return torch.cat(parts, dim=at["axis"])
    dev = next(p for p in parts if not _is_host(p))
    return torch.cat([_to_dev(p, dev) for p in parts], dim=at["axis"])


def _shape(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    shape = torch.tensor(list(a[0].shape), dtype=torch.int64)
    start, end = at.get("start", 0), at.get("end")
    return shape[start:end]


def _gather(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    x, idx = a
    axis = at.get("axis", 0)
    if _is_host(x):
        return torch.index_select(x, axis, idx.reshape(-1).long()).reshape(
            list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1 :])
        )
    idx_t = _to_dev(idx, x).long()
    out = torch.index_select(x, axis, idx_t.reshape(-1))
    return out.reshape(list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1 :]))


def _reshape(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    shape = m.host_ints(a[1])
    shape = [a[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return a[0].reshape(shape)


def _unsqueeze(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    axes = at.get("axes") or m.host_ints(a[1])
    x = a[0]
    for ax in sorted(ax % (x.dim() + len(axes)) for ax in axes):
        x = x.unsqueeze(ax)
    return x


def _squeeze(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    axes = at.get("axes") or (m.host_ints(a[1]) if len(a) > 1 and a[1] is not None else None)
    x = a[0]
    if axes is None:
        return x.squeeze()
    for ax in sorted((ax % x.dim() for ax in axes), reverse=True):
        x = x.squeeze(ax)
    return x


def _slice(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    x = a[0]
    starts, ends = m.host_ints(a[1]), m.host_ints(a[2])
    axes = m.host_ints(a[3]) if len(a) > 3 and a[3] is not None else list(range(len(starts)))
    steps = m.host_ints(a[4]) if len(a) > 4 and a[4] is not None else [1] * len(starts)
    index: list[Any] = [slice(None)] * x.dim()
    for st, en, ax, sp in zip(starts, ends, axes, steps, strict=True):
        n = x.shape[ax]
        en = min(en, n) if en >= 0 else en
        if sp < 0:
            raise ModelError("Slice with negative steps is not supported")
        index[ax] = slice(max(st, -n) if st < 0 else min(st, n), en, sp)
    return x[tuple(index)]


def _split(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    axis = at.get("axis", 0)
    split = at.get("split") or (m.host_ints(a[1]) if len(a) > 1 and a[1] is not None else None)
    if split is None:
        n = at["num_outputs"]
        return torch.chunk(a[0], n, dim=axis)
    return torch.split(a[0], list(split), dim=axis)


def _transpose(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    perm = at.get("perm") or list(reversed(range(a[0].dim())))
    return a[0].permute(*perm)


def _cast(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    to = onnx.helper.tensor_dtype_to_np_dtype(at["to"])
    x = a[0]
    if np.dtype(to).kind == "f":
        return x if _is_host(x) is False and x.is_floating_point() else x.to(m.compute_dtype)
    if _is_host(x):
        return x
    return x.to(torch.int64)


def _range(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    start, limit, delta = (float(m.host_floats(v)[0]) for v in a)
    return torch.arange(start, limit, delta)


def _expand(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    shape = m.host_ints(a[1])
    return a[0] * torch.ones(shape, dtype=a[0].dtype, device=a[0].device)


def _softmax(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    return torch.softmax(a[0], dim=at.get("axis", -1))


def _pow(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    base, exp = a
    if isinstance(exp, torch.Tensor) and exp.numel() == 1:
        return torch.pow(base, float(exp.reshape(-1)[0]))
    return torch.pow(base, _to_dev(exp, base))


def _matmul(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    return torch.matmul(a[0], _to_dev(a[1], a[0]))


def _average_pool(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    """ONNX AveragePool (2-D): explicit or SAME pads; ``count_include_pad`` as given."""
    x = a[0]
    k = list(at["kernel_shape"])
    s = list(at.get("strides", [1] * len(k)))
    include = bool(at.get("count_include_pad", 0))
    ceil = bool(at.get("ceil_mode", 0))
    auto = at.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(list(x.shape[2:]), k, s, [1] * len(k), auto == "SAME_UPPER")
    else:
        pads = _explicit_pads(list(at.get("pads", [0] * 2 * len(k))))
    if not any(pads):
        return F.avg_pool2d(x, k, s, 0, ceil_mode=ceil, count_include_pad=include)
    if include:  # padded zeros count: pad first, then average over whole windows
        return F.avg_pool2d(F.pad(x, pads), k, s, 0, ceil_mode=ceil, count_include_pad=True)
    # Padding excluded: the sum over each window divided by how many real pixels it holds.
    ones = torch.ones_like(x[:1, :1])
    total = F.avg_pool2d(F.pad(x, pads), k, s, 0, ceil_mode=ceil, count_include_pad=True)
    count = F.avg_pool2d(F.pad(ones, pads), k, s, 0, ceil_mode=ceil, count_include_pad=True)
    return total / count


def _batch_norm(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    """ONNX BatchNormalization in inference mode: (x - mean) / sqrt(var + eps) * scale + B."""
    x, scale, bias, mean, var = a[:5]
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, float(at.get("epsilon", 1e-5)))


def _global_avg_pool(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    return a[0].mean(dim=tuple(range(2, a[0].dim())), keepdim=True)


def _where(m: OnnxGraphModule, a: list[Value], at: dict[str, Any]) -> Value:
    c, x, y = a
    dev = x if isinstance(x, torch.Tensor) and not _is_host(x) else y
    return torch.where(_to_dev(c, dev).bool(), _to_dev(x, dev), _to_dev(y, dev))


_OPS: dict[str, Op] = {
    "Identity": lambda m, a, at: a[0],
    "Constant": lambda m, a, at: None,
    "Add": _binary(torch.add),
    "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul),
    "Div": _binary(lambda x, y: torch.div(x, y, rounding_mode="floor") if _is_host(x) else x / y),
    "Pow": _pow,
    "Sqrt": lambda m, a, at: torch.sqrt(a[0]),
    "Erf": lambda m, a, at: torch.erf(a[0]),
    "Relu": lambda m, a, at: F.relu(a[0]),
    "LeakyRelu": lambda m, a, at: F.leaky_relu(a[0], at.get("alpha", 0.01)),
    "Sigmoid": lambda m, a, at: torch.sigmoid(a[0]),
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda m, a, at: F.hardswish(a[0]),
    "Tanh": lambda m, a, at: torch.tanh(a[0]),
    "Softmax": _softmax,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _max_pool,
    "GlobalAveragePool": _global_avg_pool,
    "AveragePool": _average_pool,  # the PP-OCR recogniser's (read.py)
    "BatchNormalization": _batch_norm,
    "ReduceMean": _reduce_mean,
    "Resize": _resize,
    "Concat": _concat,
    "Shape": _shape,
    "Gather": _gather,
    "Reshape": _reshape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Split": _split,
    "Transpose": _transpose,
    "Cast": _cast,
    "Range": _range,
    "Expand": _expand,
    "MatMul": _matmul,
    "Where": _where,
}
