set -u
# session 7, call 3: the push with the node's hand-over: 64, 96 and 128 cameras x 30 fps x
# 45 s on one compiled 12-worker GPU-path server under MPS, the engine's ceiling first in
# the same run (--ceiling): the largest count still >= 95 % answered, as a fraction of it
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
MPS=1 DUR=45 CAMS=64,96,128 LOAD_TIMEOUT=400 ENGINE_ALONE=0 \
  VARIANTS="push:--ceiling --batches 4,8,16 $C" bash scripts/gpu-proof sweep
ls -la "$OUT"
