set -u
# session 9, call 2: the adaptive decode window (decode.device_window_adaptive, new, on by
# default: a call waits only while the worker's recent frame gaps say another frame comes
# inside the window). Call 1 took the plain 12 ms window: 64 cameras 2.59 CPU-s per 1,000
# (2.67x less than the host path), but at 32 cameras p99 25 ms against 11 without a window.
# One call, so the rows compare: the host path (64 cameras x 30 s), then the compiled
# 12-worker GPU path under MPS with the adaptive 12 ms window on one server, 64 then 32
# cameras x 60 s; then the same at 64 cameras x 40 s with 8 workers instead of 12 (fewer
# workers: more cameras a worker, so fuller calls inside the same window).
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
C="--set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=30 CAMS=64 AFTER_CAMS=64,32 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=300 \
  AFTER_SETS="--one-server --set server.workers=12 $C --set decode.device_window_ms=12" \
  bash scripts/gpu-proof before-after
left
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
MPS=1 DUR=40 CAMS=64 LOAD_TIMEOUT=150 ENGINE_ALONE=0 \
  VARIANTS="w8:--set server.workers=8 $C --set decode.device_window_ms=12" \
  bash scripts/gpu-proof sweep
left
ls -la "$OUT"
