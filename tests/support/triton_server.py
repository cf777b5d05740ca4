"""A real Triton Inference Server on the CPU, for the Triton tests.

Runs with the Python of ``.triton-venv`` (``scripts/setup-triton-env``), never imported by
the main environment. The ``nvidia-pytriton`` wheel starts a real ``tritonserver`` 2.51
binary; the network is bound as a Python-backend model whose function runs the ONNX
model with ONNX Runtime. Tensor names, dims, ``max_batch_size`` and the dynamic batcher
come from the repository's ``config.pbtxt``, so the tests serve exactly what
``deploy/triton/`` declares.

    .triton-venv/bin/python tests/support/triton_server.py --model-file PP-OCRv6.onnx \
        --config deploy/triton/model_repository/ppocr_det/config.pbtxt \
        --grpc-port 8001 --http-port 8000 --metrics-port 8002 \
        --wrong-model ppocr_det_wrong_name:images:3,-1,-1

``--wrong-model NAME:INPUT:DIMS`` binds one more model that differs from the config in its
input name and dims; the tests point edge_vision at it to see a metadata mismatch.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from google.protobuf import text_format
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
from tritonclient.grpc import model_config_pb2

DTYPES: dict[str, Any] = {"TYPE_FP32": np.float32, "TYPE_FP16": np.float16}


def read_model_config(path: Path) -> Any:
    """``config.pbtxt`` parsed into Triton's ModelConfig protobuf."""
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def tensors(entries: Any) -> list[Tensor]:
    return [
        Tensor(
            name=e.name,
            dtype=DTYPES[model_config_pb2.DataType.Name(e.data_type)],
            shape=tuple(e.dims),
        )
        for e in entries
    ]


def make_infer(session: ort.InferenceSession, input_name: str, output_names: list[str]) -> Any:
    onnx_input = session.get_inputs()[0].name

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        outputs = session.run(None, {onnx_input: inputs[input_name]})
        return dict(zip(output_names, outputs, strict=True))

    return infer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-file", type=Path, required=True)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--workspace", type=Path, default=None, help="pytriton's working folder")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--wrong-model", action="append", default=[], metavar="NAME:INPUT:DIMS")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cfg = read_model_config(args.config)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(args.model_file), opts, providers=["CPUExecutionProvider"])
    inputs, outputs = tensors(cfg.input), tensors(cfg.output)
    output_names = [t.name for t in outputs]
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=cfg.dynamic_batching.max_queue_delay_microseconds,
        preferred_batch_size=list(cfg.dynamic_batching.preferred_batch_size) or None,
    )
    instances = sum(g.count for g in cfg.instance_group) or 1

    triton = Triton(
        workspace=args.workspace,
        config=TritonConfig(
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            metrics_port=args.metrics_port,
            grpc_address="127.0.0.1",
            http_address="127.0.0.1",
            allow_gpu_metrics=False,
            exit_timeout_secs=2,
        ),
        # edge_vision reads per-model statistics (queue and compute times) for /metrics;
        # pytriton guards that endpoint by default, so leave it open on this loopback server.
        security_config=TritonSecurityConfig(
            restricted_endpoints=["shared-memory", "model-repository", "trace", "logging"]
        ),
    )

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    with triton:
        triton.bind(
            model_name=cfg.name,
            infer_func=[make_infer(session, inputs[0].name, output_names)] * instances,
            inputs=inputs,
            outputs=outputs,
            config=ModelConfig(max_batch_size=cfg.max_batch_size, batcher=batcher),
            strict=True,
        )
        for spec in args.wrong_model:
            name, input_name, dims = spec.split(":")
            wrong = Tensor(
                name=input_name,
                dtype=inputs[0].dtype,
                shape=tuple(int(d) for d in dims.split(",")),
            )
            triton.bind(
                model_name=name,
                infer_func=make_infer(session, input_name, output_names),
                inputs=[wrong],
                outputs=outputs,
                config=ModelConfig(max_batch_size=cfg.max_batch_size, batcher=batcher),
            )
        print("triton serving", flush=True)
        # Returns soon after tritonserver dies (the tests kill it), so the workspace and
        # shared memory are cleaned up on the way out.
        triton.serve(monitoring_period_s=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
