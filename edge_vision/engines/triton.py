"""Triton Inference Server engine: each batch is one gRPC inference request to a remote Triton.

edge_vision keeps pre- and post-processing on its nodes (letterbox, normalisation, the model
head, NMS); Triton runs the network only, so the request carries the normalised float32
NCHW batch and the response the raw outputs. The protocol is KServe's v2 inference protocol
over gRPC (``inference.GRPCInferenceService``: ModelInfer, ModelMetadata, ModelConfig,
ModelReady, ModelStatistics), on a ``grpc.aio`` channel with the protobuf messages that
``tritonclient`` ships. The event loop only moves bytes: normalising the batch, building
and serialising the ModelInfer request and parsing the response all run on worker threads.
(``tritonclient.grpc.aio.InferenceServerClient.infer`` builds and serialises the request on
the loop: about 35 ms of blocked loop per 4x640x384 batch on the 2-core CI machine.)

Start-up reads Triton's model metadata and config and compares them with the ONNX model
this node pre- and post-processes for (:func:`check_model_io`): names, dtypes, dims and
max batch. A difference raises :class:`~edge_vision.errors.EngineMismatch`, which stops
start-up; an unreachable Triton raises :class:`~edge_vision.errors.EngineUnavailable`, which
:class:`~edge_vision.frames.supervisor.EngineSupervisor` answers by degrading to the local engine
when one is configured. At run time a failed request raises the same two errors (timeouts and
``UNAVAILABLE`` as EngineUnavailable); the gRPC channel reconnects by itself, at most
``engine.triton.reconnect_backoff_s`` apart.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Histogram
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ..common.aio import cancel_and_wait
from ..common.metrics import LATENCY_BUCKETS, Metrics
from ..common.threads import role_pool
from ..config import Config
from ..errors import ConfigError, EngineError, EngineMismatch, EngineUnavailable
from ..model.shape import InputLimits, normalise_into
from ..model.spec import ModelSpec
from .base import Engine, U8Array

log = logging.getLogger(__name__)

F32Array = npt.NDArray[np.float32]

# gRPC statuses that mean "Triton is not there right now" rather than "Triton refused".
_OUTAGE_STATUSES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN"})

# ONNX TensorProto element type names -> KServe v2 datatype names (what Triton reports).
_ONNX_DATATYPES = {
    "FLOAT": "FP32",
    "FLOAT16": "FP16",
    "DOUBLE": "FP64",
    "BFLOAT16": "BF16",
    "UINT8": "UINT8",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
}


# -- model I/O descriptions and the comparison (pure) -----------------------------------


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One input or output: KServe v2 datatype name, batch-first shape, -1 for any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"'{self.name}' {self.datatype} [{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True, slots=True)
class ModelIO:
    """A model's inputs and outputs, as Triton reports them or as an ONNX file declares them.

    ``max_batch_size`` is Triton's: above 0, Triton batches and the shapes start with its
    ``-1`` batch dimension; 0 means the shapes are taken literally (ONNX files say 0).
    """

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    max_batch_size: int = 0


def onnx_model_io(path: Path) -> ModelIO:
    """The inputs and outputs an ONNX file declares (symbolic dims as -1). Reads the file."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    initialisers = {i.name for i in graph.initializer}

    def info(value: Any) -> TensorInfo:
        tensor = value.type.tensor_type
        kind = onnx.TensorProto.DataType.Name(tensor.elem_type)
        dims = tuple(int(d.dim_value) if d.dim_value else -1 for d in tensor.shape.dim)
        return TensorInfo(value.name, _ONNX_DATATYPES.get(kind, kind), dims)

    return ModelIO(
        inputs=tuple(info(i) for i in graph.input if i.name not in initialisers),
        outputs=tuple(info(o) for o in graph.output),
    )


def triton_model_io(metadata: Any, config: Any) -> ModelIO:
    """From Triton's ``ModelMetadataResponse`` and ``ModelConfig`` (gRPC protobufs)."""

    def info(t: Any) -> TensorInfo:
        return TensorInfo(str(t.name), str(t.datatype), tuple(int(d) for d in t.shape))

    return ModelIO(
        inputs=tuple(info(t) for t in metadata.inputs),
        outputs=tuple(info(t) for t in metadata.outputs),
        max_batch_size=int(config.max_batch_size),
    )


def _dims_agree(remote: Sequence[int], local: Sequence[int]) -> bool:
    return len(remote) == len(local) and all(
        r == -1 or lo == -1 or r == lo for r, lo in zip(remote, local, strict=True)
    )


def _input_problem(remote: TensorInfo, local: TensorInfo, limits: InputLimits) -> str | None:
    """Why Triton cannot take the [N,3,H,W] batches edge_vision sends, or None."""
    if remote.datatype != local.datatype:
        return "the datatypes differ"
    if len(remote.shape) != 4 or not _dims_agree(remote.shape, local.shape):
        return "the dims differ"
    batch, channels, height, width = remote.shape
    if batch not in (-1, 1):
        return f"Triton wants batches of exactly {batch} frames"
    if channels not in (-1, 3):
        return "edge_vision sends 3 channels"
    sizes = {limits.min_side, limits.max_side}
    for side, dim in (("H", height), ("W", width)):
        if dim != -1 and sizes != {dim}:
            return (
                f"edge_vision sends {side} from {limits.min_side} to {limits.max_side} "
                f"(multiples of {limits.stride}), Triton accepts only {dim}"
            )
    return None


def check_model_io(
    model_name: str, remote: ModelIO, local: ModelIO, limits: InputLimits
) -> list[str]:
    """Every way Triton's model differs from the ONNX model this node processes for.

    Each message names both sides, e.g. ``Triton model 'ppocr_det' input 'images' FP32
    [-1,3,-1,-1] does not match the ONNX model input 'x' FP32 [-1,3,-1,-1]``.
    """
    who = f"Triton model {model_name!r}"
    problems: list[str] = []
    if len(local.inputs) != 1:
        raise RuntimeError("edge_vision models have exactly one image input")
    want = local.inputs[0]
    if len(remote.inputs) != 1:
        listed = ", ".join(str(t) for t in remote.inputs) or "none"
        problems.append(f"{who} has inputs {listed}; the ONNX model has one input {want}")
    else:
        got = remote.inputs[0]
        why = "the names differ" if got.name != want.name else _input_problem(got, want, limits)
        if why is not None:
            problems.append(f"{who} input {got} does not match the ONNX model input {want}: {why}")

    remote_out = {t.name: t for t in remote.outputs}
    local_out = {t.name: t for t in local.outputs}
    if set(remote_out) != set(local_out):
        problems.append(
            f"{who} outputs {', '.join(map(str, remote.outputs)) or 'none'} do not match the "
            f"ONNX model outputs {', '.join(map(str, local.outputs))}"
        )
    for name, want_out in local_out.items():
        got_out = remote_out.get(name)
        if got_out is None:
            continue
        if got_out.datatype != want_out.datatype or not _dims_agree(got_out.shape, want_out.shape):
            problems.append(
                f"{who} output {got_out} does not match the ONNX model output {want_out}"
            )
    return problems


def engine_max_batch(remote: ModelIO, wanted: int) -> int:
    """The largest batch to send: edge_vision's own limit within what Triton accepts."""
    if remote.max_batch_size > 0:
        return max(1, min(wanted, remote.max_batch_size))
    return wanted if remote.inputs and remote.inputs[0].shape[0] == -1 else 1


def statistics_totals(response: Any, model_name: str) -> dict[str, int] | None:
    """Triton's cumulative counters for the model, summed over its versions, from a
    ``ModelStatisticsResponse``: requests, inferences, executions and ``<phase>_ns``."""
    totals: dict[str, int] = {}
    found = False
    for m in response.model_stats:
        if m.name != model_name:
            continue
        found = True
        s = m.inference_stats
        add = {
            "requests": s.success.count,
            "inferences": m.inference_count,
            "executions": m.execution_count,
            "queue_ns": s.queue.ns,
            "compute_input_ns": s.compute_input.ns,
            "compute_infer_ns": s.compute_infer.ns,
            "compute_output_ns": s.compute_output.ns,
        }
        for key, value in add.items():
            totals[key] = totals.get(key, 0) + int(value)
    return totals if found else None


class TritonMetrics:
    """The Triton engine's own metrics, made once per app (:meth:`Metrics.extension`).

    Client side: the round trip of every request. Server side: Triton's per-model
    statistics (``ModelStatistics`` of the KServe v2 statistics extension: cumulative
    nanoseconds in queue and in compute, request/inference/execution counts), read every
    ``engine.triton.stats_interval_s`` and added as deltas, so they are ordinary counters.
    They cover every client of that Triton model, not only this node.
    """

    PHASES = ("queue", "compute_input", "compute_infer", "compute_output")

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "edge_vision_triton_"
        r = registry
        self.request_seconds = Histogram(
            p + "request_seconds",
            "Round trip of one inference request to Triton (send, queue, compute, receive)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_failures = Counter(
            p + "request_failures",
            "Inference requests to Triton that failed, by gRPC status",
            ["status"],
            registry=r,
        )
        self.server_seconds = Counter(
            p + "server_seconds",
            "Time Triton spent on this model's successful requests, by phase (all clients)",
            ["phase"],
            registry=r,
        )
        self.server_requests = Counter(
            p + "server_requests", "Successful requests Triton served for the model", registry=r
        )
        self.server_inferences = Counter(
            p + "server_inferences",
            "Frames Triton inferred for the model (a batch of 4 counts 4)",
            registry=r,
        )
        self.server_executions = Counter(
            p + "server_executions",
            "Model executions; inferences / executions is the batch size Triton ran",
            registry=r,
        )
        self._last: dict[str, int] | None = None

    def observe_server_statistics(self, totals: dict[str, int]) -> None:
        """Add the growth of Triton's cumulative counters since the previous reading.

        ``totals`` holds ``requests``, ``inferences``, ``executions`` and ``<phase>_ns``.
        The first reading only sets the baseline; a counter that went down means Triton
        restarted, and then its whole new value is growth.
        """
        last, self._last = self._last, dict(totals)
        if last is None:
            return

        def grown(key: str) -> int:
            now, before = totals.get(key, 0), last.get(key, 0)
            return now - before if now >= before else now

        self.server_requests.inc(grown("requests"))
        self.server_inferences.inc(grown("inferences"))
        self.server_executions.inc(grown("executions"))
        for phase in self.PHASES:
            self.server_seconds.labels(phase).inc(grown(phase + "_ns") / 1e9)


def _status(e: grpc.RpcError) -> str:
    code = e.code() if hasattr(e, "code") else None
    return str(getattr(code, "name", "UNKNOWN"))


def _message(e: grpc.RpcError) -> str:
    details = e.details() if hasattr(e, "details") else None
    return f"{_status(e)}: {details or e}"


# ModelInfer's full method name, from the protocol's own descriptor.
_MODEL_INFER = "/{}/{}".format(
    *service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    .methods_by_name["ModelInfer"]
    .full_name.rsplit(".", 1)
)


@dataclass(slots=True)
class _Channel:
    """The gRPC channel and what calls through it."""

    channel: Any
    stub: Any  # GRPCInferenceServiceStub: the small control calls
    model_infer: Any  # ModelInfer taking and returning serialised bytes


# -- the engine -------------------------------------------------------------------------


class TritonEngine(Engine):
    """Sends each batch to Triton as one request; ``engine.triton.in_flight`` at once."""

    kind = "triton"

    def __init__(self, spec: ModelSpec, config: Config) -> None:
        super().__init__(spec, config)
        self.triton = config.engine.triton
        self._grpc: _Channel | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._metrics: TritonMetrics | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self._server_version = ""

    @property
    def max_in_flight(self) -> int:
        return self.triton.in_flight

    @property
    def _model(self) -> str:
        version = f" version {self.triton.model_version}" if self.triton.model_version else ""
        return f"{self.triton.model_name!r}{version}"

    def bind_metrics(self, metrics: Metrics) -> None:
        self._metrics = metrics.extension(TritonMetrics)

    def _call_timeout(self) -> float:
        """Deadline for the small control calls (readiness, metadata, statistics)."""
        return min(self.triton.timeout_s, 2.0)

    async def _connect(self) -> _Channel:
        backoff_ms = max(100, int(self.triton.reconnect_backoff_s * 1000))
        options = [
            # A 4x3x1280x1280 float32 batch is 79 MB; gRPC's default limit is 4 MB.
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
            # gRPC's default reconnect backoff grows to 120 s; a Triton restart would then
            # leave frames failing for minutes after it is back.
            ("grpc.initial_reconnect_backoff_ms", min(1000, backoff_ms)),
            ("grpc.min_reconnect_backoff_ms", min(1000, backoff_ms)),
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ]
        if self.triton.tls:
            root = None
            if self.triton.root_certificates is not None:
                try:
                    root = await asyncio.to_thread(self.triton.root_certificates.read_bytes)
                except OSError as e:
                    raise ConfigError(
                        f"engine.triton.root_certificates: cannot read "
                        f"{self.triton.root_certificates}: {e.strerror}"
                    ) from e
            creds = grpc.ssl_channel_credentials(root_certificates=root)
            channel = grpc.aio.secure_channel(self.triton.url, creds, options=options)
        else:
            channel = grpc.aio.insecure_channel(self.triton.url, options=options)
        # No serialisers: ModelInfer takes and returns bytes made on worker threads.
        return _Channel(
            channel,
            service_pb2_grpc.GRPCInferenceServiceStub(channel),
            channel.unary_unary(_MODEL_INFER),
        )

    async def start(self) -> None:
        if self.triton.cuda_shared_memory:
            raise ConfigError(
                "engine.triton.cuda_shared_memory: true is not supported yet; tensors go in "
                "the gRPC messages (set it to false)"
            )
        self._executor = role_pool(self.max_in_flight, "triton")
        self._grpc = await self._connect()
        stub, timeout = self._grpc.stub, self._call_timeout()
        name, version, where = self.triton.model_name, self.triton.model_version, self.triton.url
        model = {"name": name, "version": version}
        try:
            ready = await stub.ModelReady(service_pb2.ModelReadyRequest(**model), timeout=timeout)
            if not ready.ready:
                raise EngineUnavailable(f"Triton at {where} has no ready model {self._model}")
            metadata = await stub.ModelMetadata(
                service_pb2.ModelMetadataRequest(**model), timeout=timeout
            )
            config = await stub.ModelConfig(
                service_pb2.ModelConfigRequest(**model), timeout=timeout
            )
            server = await stub.ServerMetadata(service_pb2.ServerMetadataRequest(), timeout=timeout)
        except grpc.RpcError as e:
            raise EngineUnavailable(f"Triton at {where} is unreachable: {_message(e)}") from e
        self._server_version = str(server.version)
        try:
            local = await asyncio.to_thread(onnx_model_io, self.spec.path)
        except Exception as e:  # onnx raises DecodeError and friends without a common base
            raise EngineError(f"cannot read {self.spec.path} to check Triton's model: {e}") from e
        remote = triton_model_io(metadata, config.config)
        problems = check_model_io(name, remote, local, self.spec.limits)
        if problems:
            raise EngineMismatch("; ".join(problems))
        self.narrow_max_batch(engine_max_batch(remote, self.max_batch))
        if self._metrics is not None and self.triton.stats_interval_s > 0:
            self._stats_task = asyncio.create_task(self._poll_statistics(), name="triton-stats")
        log.info(
            "Triton %s at %s: model %s, max batch %d, %d requests in flight",
            self._server_version,
            where,
            self._model,
            self.max_batch,
            self.max_in_flight,
        )

    # -- one batch (the two halves run on worker threads) ------------------------------

    def _request_bytes(self, frames: Sequence[U8Array]) -> bytes:
        """Normalise into this thread's reusable buffer and serialise the ModelInfer request."""
        n = len(frames)
        h, w = frames[0].shape[:2]
        need = n * 3 * h * w
        buf: F32Array | None = getattr(self._local, "buf", None)
        if buf is None or buf.size < need:  # grows to the largest batch seen, then stays
            buf = np.empty(need, np.float32)
            self._local.buf = buf
        x = buf[:need].reshape(n, 3, h, w)
        normalise_into(x, list(frames), self.spec.normalisation)
        request = service_pb2.ModelInferRequest(
            model_name=self.triton.model_name, model_version=self.triton.model_version
        )
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = self.spec.input_name, "FP32"
        tensor.shape.extend([n, 3, h, w])
        for name in self.spec.output_names:
            request.outputs.add().name = name
        request.raw_input_contents.append(x.tobytes())
        return bytes(request.SerializeToString())

    def _outputs_from(self, raw: bytes, n: int) -> list[np.ndarray]:
        """Parse the ModelInferResponse into batch-first arrays, in the ONNX output order."""
        response = service_pb2.ModelInferResponse.FromString(raw)
        found: dict[str, np.ndarray] = {}
        for tensor, data in zip(response.outputs, response.raw_output_contents, strict=False):
            if tensor.datatype != "FP32":
                raise EngineError(
                    f"Triton model {self._model} answered output {tensor.name!r} as "
                    f"{tensor.datatype}, not FP32"
                )
            shape = tuple(int(d) for d in tensor.shape)
            # A copy: own, writable memory rather than a view of the response's bytes.
            found[tensor.name] = np.frombuffer(data, np.float32).reshape(shape).copy()
        outputs: list[np.ndarray] = []
        for name in self.spec.output_names:
            out = found.get(name)
            if out is None or out.ndim == 0 or out.shape[0] != n:
                got = "none" if out is None else list(out.shape)
                raise EngineError(
                    f"Triton model {self._model} answered a batch of {n} with output "
                    f"{name!r} of shape {got}"
                )
            outputs.append(out)
        return outputs

    async def infer(self, frames: Sequence[U8Array]) -> list[np.ndarray]:
        if self._grpc is None or self._executor is None:
            raise RuntimeError("engine not started")
        loop = asyncio.get_running_loop()
        n = len(frames)
        h, w = frames[0].shape[:2]
        request = await loop.run_in_executor(self._executor, self._request_bytes, frames)
        t0 = time.perf_counter()
        try:
            raw = await self._grpc.model_infer(request, timeout=self.triton.timeout_s)
        except grpc.RpcError as e:
            status = _status(e)
            if self._metrics is not None:
                self._metrics.request_failures.labels(status).inc()
            if status in _OUTAGE_STATUSES:
                raise EngineUnavailable(
                    f"Triton at {self.triton.url} did not answer a {n}x{h}x{w} batch: {_message(e)}"
                ) from e
            raise EngineError(
                f"Triton model {self._model} failed on a {n}x{h}x{w} batch: {_message(e)}"
            ) from e
        if self._metrics is not None:
            self._metrics.request_seconds.observe(time.perf_counter() - t0)
        return await loop.run_in_executor(self._executor, self._outputs_from, raw, n)

    # -- health and statistics ---------------------------------------------------------

    async def health(self) -> str | None:
        """Triton's model readiness, asked on every /readyz."""
        if self._grpc is None:
            return "the Triton engine is not started"
        request = service_pb2.ModelReadyRequest(
            name=self.triton.model_name, version=self.triton.model_version
        )
        try:
            ready = await self._grpc.stub.ModelReady(request, timeout=self._call_timeout())
        except grpc.RpcError as e:
            return f"Triton at {self.triton.url} is unreachable: {_message(e)}"
        if ready.ready:
            return None
        return f"Triton at {self.triton.url}: model {self._model} is not ready"

    async def _poll_statistics(self) -> None:
        metrics, connection = self._metrics, self._grpc
        if metrics is None or connection is None:
            return
        request = service_pb2.ModelStatisticsRequest(
            name=self.triton.model_name, version=self.triton.model_version
        )
        while True:
            try:
                response = await connection.stub.ModelStatistics(
                    request, timeout=self._call_timeout()
                )
            except grpc.RpcError as e:
                # An outage shows in the request metrics and /readyz; keep polling quietly.
                log.debug("Triton statistics unavailable: %s", _message(e))
            else:
                totals = statistics_totals(response, self.triton.model_name)
                if totals is not None:
                    metrics.observe_server_statistics(totals)
            await asyncio.sleep(self.triton.stats_interval_s)

    async def close(self) -> None:
        await cancel_and_wait(self._stats_task)
        self._stats_task = None
        if self._grpc is not None:
            box = [self._grpc]
            self._grpc = None
            await box[0].channel.close()
            # grpc.aio stops its poller thread (a thread join) when the process's last
            # channel is freed: free ours on a worker thread so that join never blocks the
            # event loop.
            await asyncio.to_thread(box.clear)
        if self._executor is not None:
            # Joining worker threads blocks: do it off the loop.
            await asyncio.to_thread(self._executor.shutdown, True)
            self._executor = None

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "url": self.triton.url,
            "model": self.triton.model_name,
            "model_version": self.triton.model_version or "latest",
            "triton_version": self._server_version,
        }
