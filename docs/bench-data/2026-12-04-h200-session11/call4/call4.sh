set -u
# session 11, call 4: tests/gpu on this session's final code (the GPU decode tests, then
# the engine and CUDA-layer tests, cuda-python), last run on 2026-12-03 morning, before
# the tracker, DB post-processing and adaptive-window changes since.
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
bash scripts/gpu-proof decode-tests gpu-tests
ls -la "$OUT"
