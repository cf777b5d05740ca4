set -u
# the GPU tests on the final tree, then the push: 96 cameras with the ceiling in the same run
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( ${BUDGET:-450} - $(date +%s) + START )) s"; }
bash scripts/gpu-proof decode-tests gpu-tests
left
if [ $(( ${BUDGET:-450} - $(date +%s) + START )) -lt 190 ]; then echo "== no time left for the push"; exit 0; fi
C="--ceiling --batches 4,8,16 --set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
MPS=1 CAMS=${PUSH_CAMS:-96} DUR=30 LOAD_TIMEOUT=240 ENGINE_ALONE=0 VARIANTS="push:$C" bash scripts/gpu-proof sweep
left
ls -la "$OUT"
