"""deploy/triton and deploy/k8s/triton: what can be checked without a GPU, Docker or a cluster.

Every ``config.pbtxt`` parses as Triton's ``ModelConfig`` protobuf and declares what the
``triton`` engine expects of the model (the same check a node runs against Triton's
metadata at start); the compose file and the manifests parse, and every node's settings
form a valid edge_vision configuration pointing at the Triton service.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from edge_vision.common.metrics import Metrics
from edge_vision.config import load_config
from edge_vision.engines.triton import (
    ModelIO,
    TensorInfo,
    TritonMetrics,
    check_model_io,
    engine_max_batch,
    onnx_model_io,
    statistics_totals,
)
from edge_vision.model.spec import ModelSpec
from tests.support.triton import config_model_io

from ..support import kustomize

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MODELS = DEPLOY / "triton" / "model_repository"

# What an Ultralytics export (yolo export format=onnx dynamic=True) declares.
ULTRALYTICS_EXPORT = ModelIO(
    inputs=(TensorInfo("images", "FP32", (-1, 3, -1, -1)),),
    outputs=(TensorInfo("output0", "FP32", (-1, 84, -1)),),
)


def read_config(name: str) -> Any:
    return text_format.Parse(
        (MODELS / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )


@pytest.mark.parametrize(
    ("name", "backend", "platform", "model_file"),
    [
        ("ppocr_det", "onnxruntime", "", "model.onnx"),
        ("ppocr_det_trt", "", "tensorrt_plan", "model.plan"),
        ("yolo11n", "onnxruntime", "", "model.onnx"),
        ("yolo11n_trt", "", "tensorrt_plan", "model.plan"),
    ],
)
def test_every_config_pbtxt_is_a_batching_model_triton_can_load(
    name: str, backend: str, platform: str, model_file: str
) -> None:
    cfg = read_config(name)
    assert cfg.name == name  # Triton refuses a config whose name differs from its folder
    assert (cfg.backend, cfg.platform, cfg.default_model_filename) == (
        backend,
        platform,
        model_file,
    )
    assert (MODELS / name / "1").is_dir()
    assert cfg.max_batch_size >= 4  # a node's default engine.max_batch fits in one request
    batching = cfg.dynamic_batching
    assert cfg.HasField("dynamic_batching")
    assert list(batching.preferred_batch_size) == [4, 8]
    assert all(size <= cfg.max_batch_size for size in batching.preferred_batch_size)
    # Real-time frames: a request waits for company at most a couple of milliseconds.
    assert 0 < batching.max_queue_delay_microseconds <= 5000
    assert [
        (g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in cfg.instance_group
    ] == [(2, "KIND_GPU")]


@pytest.mark.parametrize("name", ["ppocr_det", "ppocr_det_trt"])
def test_ppocr_configs_agree_with_the_default_model(spec: ModelSpec, name: str) -> None:
    remote = config_model_io(read_config(name))
    assert check_model_io(name, remote, onnx_model_io(spec.path), spec.limits) == []
    assert engine_max_batch(remote, wanted=4) == 4
    assert engine_max_batch(remote, wanted=16) == 8  # never more than Triton accepts


@pytest.mark.parametrize("name", ["yolo11n", "yolo11n_trt"])
def test_yolo_configs_agree_with_an_ultralytics_export(spec: ModelSpec, name: str) -> None:
    remote = config_model_io(read_config(name))
    assert check_model_io(name, remote, ULTRALYTICS_EXPORT, spec.limits) == []


def test_a_renamed_input_is_reported_with_both_sides(spec: ModelSpec) -> None:
    cfg = read_config("ppocr_det")
    cfg.input[0].name = "images"
    problems = check_model_io(
        "ppocr_det", config_model_io(cfg), onnx_model_io(spec.path), spec.limits
    )
    assert problems == [
        "Triton model 'ppocr_det' input 'images' FP32 [-1,3,-1,-1] does not match the ONNX "
        "model input 'x' FP32 [-1,3,-1,-1]: the names differ"
    ]


def test_fixed_input_sides_are_refused_because_frames_keep_their_aspect(spec: ModelSpec) -> None:
    cfg = read_config("ppocr_det")
    del cfg.input[0].dims[:]
    cfg.input[0].dims.extend([3, 640, 640])
    (problem,) = check_model_io(
        "ppocr_det", config_model_io(cfg), onnx_model_io(spec.path), spec.limits
    )
    assert problem.startswith(
        "Triton model 'ppocr_det' input 'x' FP32 [-1,3,640,640] does not match the ONNX "
        "model input 'x' FP32 [-1,3,-1,-1]: edge_vision sends H from 32 to 1280"
    )


def test_other_outputs_and_datatypes_are_reported(spec: ModelSpec) -> None:
    cfg = read_config("ppocr_det")
    cfg.output[0].name = "maps"
    cfg.input[0].data_type = model_config_pb2.TYPE_FP16
    problems = check_model_io(
        "ppocr_det", config_model_io(cfg), onnx_model_io(spec.path), spec.limits
    )
    assert problems == [
        "Triton model 'ppocr_det' input 'x' FP16 [-1,3,-1,-1] does not match the ONNX model "
        "input 'x' FP32 [-1,3,-1,-1]: the datatypes differ",
        "Triton model 'ppocr_det' outputs 'maps' FP32 [-1,1,-1,-1] do not match the ONNX "
        "model outputs 'fetch_name_0' FP32 [-1,-1,-1,-1]",
    ]


def test_a_model_without_triton_batching_gets_batches_of_one(spec: ModelSpec) -> None:
    cfg = read_config("ppocr_det")
    cfg.max_batch_size = 0
    cfg.input[0].dims.insert(0, 1)
    cfg.output[0].dims.insert(0, 1)
    remote = config_model_io(cfg)
    assert check_model_io("m", remote, onnx_model_io(spec.path), spec.limits) == []
    assert engine_max_batch(remote, wanted=4) == 1


# -- Triton's statistics in /metrics ------------------------------------------------------


class _Stats:
    """The fields of a ModelStatisticsResponse that statistics_totals reads."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def _response(requests: int, inferences: int, executions: int, queue_ns: int) -> Any:
    def d(count: int, ns: int) -> _Stats:
        return _Stats(count=count, ns=ns)

    model = _Stats(
        name="ppocr_det",
        inference_count=inferences,
        execution_count=executions,
        inference_stats=_Stats(
            success=d(requests, 0),
            queue=d(requests, queue_ns),
            compute_input=d(executions, 1_000_000),
            compute_infer=d(executions, 100_000_000),
            compute_output=d(executions, 1_000_000),
        ),
    )
    return _Stats(model_stats=[model, _Stats(name="other")])


def test_triton_statistics_become_counters_that_survive_a_triton_restart() -> None:
    metrics = Metrics()
    tm = metrics.extension(TritonMetrics)
    assert metrics.extension(TritonMetrics) is tm  # a new engine after a degrade shares them

    def observe(*args: int) -> None:
        totals = statistics_totals(_response(*args), "ppocr_det")
        assert totals is not None
        tm.observe_server_statistics(totals)

    observe(100, 300, 90, 5_000_000_000)  # baseline: earlier work is not this node's news
    observe(110, 340, 95, 5_500_000_000)
    observe(4, 8, 2, 100_000_000)  # Triton restarted: its counters began again
    text = metrics.render().decode()
    assert "edge_vision_triton_server_requests_total 14.0" in text
    assert "edge_vision_triton_server_inferences_total 48.0" in text
    assert "edge_vision_triton_server_executions_total 7.0" in text
    assert 'edge_vision_triton_server_seconds_total{phase="queue"} 0.6' in text
    assert statistics_totals(_response(1, 1, 1, 1), "absent") is None


# -- compose and Kubernetes -----------------------------------------------------------------


def _node_config(env: dict[str, str], config_file: Path | None = None) -> Any:
    return load_config(config_file, environ={k: str(v) for k, v in env.items()})


def test_compose_runs_three_triton_nodes_behind_nginx_with_redis(tmp_path: Path) -> None:
    compose = yaml.safe_load((DEPLOY / "triton" / "docker-compose.yml").read_text())
    services = compose["services"]
    nodes = {name: s for name, s in services.items() if name.startswith("node-")}
    assert len(nodes) == 3
    for name, node in nodes.items():
        cfg = _node_config(node["environment"])
        assert cfg.engine.kind == "triton" and cfg.engine.triton.url == "triton:8001"
        assert cfg.engine.triton.model_name == "ppocr_det"
        assert cfg.state.redis_url == "redis://redis:6379/0" and cfg.state.node_id == name
    assert (
        DEPLOY / "triton" / nodes["node-1"]["build"]["context"] / "deploy/docker/Dockerfile"
    ).is_file()
    triton = services["triton"]
    loaded = [a.split("=", 1)[1] for a in triton["command"] if a.startswith("--load-model=")]
    assert loaded == ["ppocr_det"] and all((MODELS / m / "config.pbtxt").is_file() for m in loaded)
    # nginx renders deploy/nginx's template at start: run its command as compose would
    # ($$ is compose's escape for $), with the mounted files in a scratch /etc/nginx.
    nginx = services["nginx"]
    etc = tmp_path / "etc-nginx"
    (etc / "conf.d").mkdir(parents=True)
    for mount in nginx["volumes"]:
        source, target = mount.split(":")[:2]
        shutil.copy(DEPLOY / "triton" / source, etc / Path(target).relative_to("/etc/nginx"))
    script = nginx["command"][2].replace("$$", "$").replace("/etc/nginx/", f"{etc}/")
    script = script.split(" && exec nginx")[0]
    subprocess.run(["sh", "-c", script], env=nginx["environment"], check=True)
    site = (etc / "conf.d" / "default.conf").read_text()
    directives = [ln for ln in site.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in directives if "@" in ln]  # every placeholder filled
    assert "listen 80;" in site
    assert all(f"server {name}:8080 max_fails=1" in site for name in nodes)
    assert "include edge-vision-locations.conf;" in site  # nginx resolves it in /etc/nginx


def test_kubernetes_manifests_wire_nodes_to_triton_and_redis(tmp_path: Path) -> None:
    k8s = DEPLOY / "k8s" / "triton"
    # An overlay on deploy/k8s/base: what kustomize builds from both (generator files too).
    docs = kustomize.build(k8s)

    config_map = docs[("ConfigMap", "edge-vision-config")]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config_map["data"]["config.yaml"])
    cfg = _node_config({"EDGE_VISION_STATE__NODE_ID": "edge-vision-abc"}, config_file)
    assert cfg.engine.kind == "triton" and cfg.engine.triton.url == "triton:8001"
    assert cfg.state.redis_url == "redis://redis:6379/0"

    nodes = docs[("Deployment", "edge-vision")]["spec"]
    assert nodes["replicas"] > 1
    probe = nodes["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/readyz"
    triton_ports = {p["port"] for p in docs[("Service", "triton")]["spec"]["ports"]}
    assert 8001 in triton_ports
    assert ("Service", "redis") in docs and ("Deployment", "nginx") in docs
    triton_args = docs[("Deployment", "triton")]["spec"]["template"]["spec"]["containers"][0]
    assert "--load-model=ppocr_det" in triton_args["args"]
