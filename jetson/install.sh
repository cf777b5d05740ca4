#!/usr/bin/env bash
# Install edge_vision as a systemd service on a Jetson (JetPack 6: TensorRT 10, CUDA 12),
# build its TensorRT plan now (not at the first start), and start it.
#
#   sudo jetson/install.sh [--precision fp16|int8] [--calibration FOLDER_OR_VIDEO]
#                          [--dla-core N] [--model MODEL.onnx] [--port PORT] [--dry-run]
#
#   sudo jetson/install.sh                          # FP16 on the GPU, embedded model
#   sudo jetson/install.sh --dla-core 0             # FP16 on DLA core 0, GPU fallback
#   sudo jetson/install.sh --precision int8 --calibration /data/site-frames
#   jetson/install.sh --dry-run --dla-core 0        # print the plan; change nothing
#
# What it does:
#   1. checks JetPack's TensorRT Python bindings (apt: python3-libnvinfer) are there;
#   2. makes a system user 'edge-vision' (groups video, render) and
#      /opt/edge-vision/venv, a virtual environment that sees the system site-packages
#      (so JetPack's tensorrt is importable) with edge-vision and pycuda installed;
#   3. writes /etc/edge-vision/config.yaml from jetson/config.yaml with the options above
#      (an existing one is kept and only those options are updated);
#   4. runs `edge-vision build-engine --config /etc/edge-vision/config.yaml` as the
#      service user: the plan and its JSON land in /var/lib/edge-vision/engines;
#   5. installs jetson/edge-vision.service, enables and starts it, waits for /readyz.
#
# --dry-run prints every command that changes the system, in order ("+ command"), and
# runs none of them; it needs neither root nor TensorRT.
#
# Written for JetPack 6; NOT run on a Jetson in this repository's environment.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
prefix=/opt/edge-vision
etc=/etc/edge-vision
state=/var/lib/edge-vision
user=edge-vision

precision="" calibration="" dla_core="" model="" port="" dry_run=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --precision) precision="$2"; shift 2 ;;
    --calibration) calibration="$(realpath "$2")"; shift 2 ;;
    --dla-core) dla_core="$2"; shift 2 ;;
    --model) model="$(realpath "$2")"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

# run CMD...: run it, or with --dry-run print it (shell-quoted) as a step of the plan.
run() {
  if [ -n "$dry_run" ]; then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

if [ -z "$dry_run" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (sudo)" >&2
  exit 2
fi
case "$precision" in
  ""|fp16|int8|fp32) ;;
  *) echo "install.sh: --precision is fp16, int8 or fp32, not $precision" >&2; exit 2 ;;
esac
if [ "$precision" = "int8" ] && [ -z "$calibration" ]; then
  echo "install.sh: --precision int8 needs --calibration FOLDER_OR_VIDEO (frames of the site)" >&2
  exit 2
fi

echo "== 1/5 JetPack's TensorRT"
if [ -n "$dry_run" ]; then
  echo "(dry run) would check: python3 -c 'import tensorrt'"
elif ! trt_version="$(python3 -c 'import tensorrt; print(tensorrt.__version__)' 2>/dev/null)"; then
  echo "install.sh: python3 cannot import tensorrt; install JetPack's bindings:" >&2
  echo "  sudo apt-get install python3-libnvinfer python3-libnvinfer-dev" >&2
  exit 1
else
  echo "TensorRT $trt_version"
fi
if [ -r /etc/nv_tegra_release ]; then head -1 /etc/nv_tegra_release; fi

echo "== 2/5 user and virtual environment"
if ! id "$user" >/dev/null 2>&1; then
  run useradd --system --home-dir "$state" --no-create-home --shell /usr/sbin/nologin "$user"
fi
run usermod -a -G video,render "$user" 2>/dev/null || run usermod -a -G video "$user"
run install -d -o "$user" -g "$user" "$state" "$state/engines" "$state/cuda-cache"
run install -d "$prefix" "$etc"
run rm -rf "$prefix/src"
run cp -a "$repo" "$prefix/src"
if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  run apt-get install -y -q python3-venv python3-pip
fi
if [ -n "$dry_run" ] || [ ! -x "$prefix/venv/bin/python" ]; then
  run python3 -m venv --system-site-packages "$prefix/venv"
fi
# JetPack 6's TensorRT bindings come from Ubuntu 22.04's world of NumPy 1.x; keep the venv
# on NumPy 1 so they and the pip wheels share one NumPy (pip picks matching versions).
if [ -n "$dry_run" ]; then
  printf '%s\n' "+ printf 'numpy<2\\n' > $prefix/constraints.txt"
else
  printf 'numpy<2\n' > "$prefix/constraints.txt"
fi
pip=("$prefix/venv/bin/pip" install -q -c "$prefix/constraints.txt")
run "$prefix/venv/bin/pip" install -q --upgrade pip
run "${pip[@]}" "$prefix/src"
# The CUDA layer: pycuda builds against JetPack's CUDA (nvcc in /usr/local/cuda/bin);
# cuda-python is tried too and preferred by engine.cuda_backend: auto when it works.
run env PATH="/usr/local/cuda/bin:$PATH" "${pip[@]}" pycuda
run "${pip[@]}" cuda-python || echo "(cuda-python not installed; pycuda is used)"
run "$prefix/venv/bin/python" -c 'import tensorrt, edge_vision; print("venv sees TensorRT", tensorrt.__version__)'

echo "== 3/5 configuration"
if [ -n "$dry_run" ] || [ ! -f "$etc/config.yaml" ]; then
  run install -m 0644 "$here/config.yaml" "$etc/config.yaml"  # only when there is none
fi
# auth.token_secret_file of config.yaml (docs/security.md): made once, read by the service
# user only; mint tokens with it: sudo -u edge-vision edge-vision token --config ... --subject X
if [ -n "$dry_run" ] || [ ! -f "$etc/token.secret" ]; then
  run sh -c "umask 077 && '$prefix/venv/bin/edge-vision' token --new-secret > '$etc/token.secret'"
  run chown "$user:$user" "$etc/token.secret"
fi
# Options given here go into the config serve reads, so serve wants the plan built below.
if [ -n "$dry_run" ]; then
  echo "+ set in $etc/config.yaml: precision=${precision:--} calibration=${calibration:--}" \
    "dla_core=${dla_core:--} model=${model:--} port=${port:--} (empty: unchanged)"
else
"$prefix/venv/bin/python" - "$etc/config.yaml" "$precision" "$calibration" "$dla_core" \
  "$model" "$port" <<'PY'
import sys

import yaml

from edge_vision.config import load_config

path, precision, calibration, dla_core, model, port = sys.argv[1:]
with open(path) as f:
    tree = yaml.safe_load(f) or {}
if not any((precision, calibration, dla_core, model, port)):
    load_config(path, environ={})  # nothing to change: keep the file (and its comments)
    sys.exit(0)
trt = tree.setdefault("engine", {}).setdefault("tensorrt", {})
if precision:
    trt["precision"] = precision
if calibration:
    trt["calibration_source"] = calibration
if dla_core:
    trt["dla_core"] = int(dla_core)
    tree.setdefault("model", {}).update(min_side=640, max_side=640)  # DLA: static shapes
if model:
    tree.setdefault("model", {})["path"] = model
if port:
    tree.setdefault("server", {})["port"] = int(port)
load_config(None, environ={}, cli=tree)  # refuse a bad config before writing it
with open(path, "w") as f:
    yaml.safe_dump(tree, f, sort_keys=False)
print(f"{path}: engine.tensorrt = {trt}")
PY
fi

echo "== 4/5 TensorRT plan (minutes; progress below)"
run sudo -u "$user" env CUDA_CACHE_PATH="$state/cuda-cache" HOME="$state" \
  "$prefix/venv/bin/edge-vision" build-engine --config "$etc/config.yaml"

echo "== 5/5 systemd unit"
run install -m 0644 "$here/edge-vision.service" /etc/systemd/system/edge-vision.service
run systemctl daemon-reload
run systemctl enable edge-vision.service
run systemctl restart edge-vision.service
if [ -n "$dry_run" ]; then
  echo "+ wait up to 120 s for http://127.0.0.1:PORT/readyz (PORT: server.port of $etc/config.yaml)"
  echo "(dry run: nothing was changed)"
  exit 0
fi
listen_port="$("$prefix/venv/bin/python" -c "
from edge_vision.config import load_config
print(load_config('$etc/config.yaml', environ={}).server.port)")"
for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$listen_port/readyz" >/dev/null 2>&1; then
    echo "edge-vision is ready: http://$(hostname -I | awk '{print $1}'):$listen_port/"
    curl -fsS "http://127.0.0.1:$listen_port/readyz"; echo
    exit 0
  fi
  sleep 1
done
echo "install.sh: not ready after 120 s; see: journalctl -u edge-vision -e" >&2
systemctl --no-pager status edge-vision.service || true
exit 1
