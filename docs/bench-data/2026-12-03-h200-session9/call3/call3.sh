set -u
# session 9, call 3: the adaptive window as revised (a call waits out the whole window while
# the worker's frames come at least one a window) and fewer workers with longer windows,
# the levers left for issue 11's 4x: the host path (64 cameras x 30 s) first, then the
# compiled GPU path under MPS: 12 workers, 12 ms window, 64 then 32 cameras x 40 s on one
# server; then 64 cameras x 40 s with 8 workers and a 20 ms window, and 6 workers and 16 ms.
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
C="--set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=30 CAMS=64 AFTER_CAMS=64,32 AFTER_DUR=40 AFTER_MPS=1 AFTER_TIMEOUT=220 \
  AFTER_SETS="--one-server --set server.workers=12 $C --set decode.device_window_ms=12" \
  bash scripts/gpu-proof before-after
left
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
MPS=1 DUR=40 CAMS=64 LOAD_TIMEOUT=140 ENGINE_ALONE=0 \
  VARIANTS="w8win20:--set server.workers=8 $C --set decode.device_window_ms=20;w6win16:--set server.workers=6 $C --set decode.device_window_ms=16" \
  bash scripts/gpu-proof sweep
left
ls -la "$OUT"
