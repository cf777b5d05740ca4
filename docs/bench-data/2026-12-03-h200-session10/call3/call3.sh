set -u
# session 10, call 3: the same-run proof for issue 11 with this session's cuts of the
# per-frame Python (the tracker in plain Python records, DB post-processing with fewer
# numpy calls; commit 8a990d4). The host path (host decode, DB's float map, 4 workers, no
# MPS) at 64 cameras x 30 fps x 60 s; then the compiled GPU path under MPS with 6 workers
# and the adaptive 20 ms decode window, 64 then 32 cameras x 60 s on one server; then 8
# workers, 20 ms, 64 cameras x 60 s (a server of its own). Inductor's cache carried.
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
C="--set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=60 CAMS=64 AFTER_CAMS=64,32 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=260 \
  AFTER_SETS="--one-server --set server.workers=6 $C --set decode.device_window_ms=20" \
  bash scripts/gpu-proof before-after
left
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
if [ $(( 570 - $(date +%s) + START )) -gt 150 ]; then
  MPS=1 DUR=60 CAMS=64 LOAD_TIMEOUT=145 ENGINE_ALONE=0 \
    VARIANTS="w8win20:--set server.workers=8 $C --set decode.device_window_ms=20" \
    bash scripts/gpu-proof sweep
  left
  [ -f "$OUT/sweep.tgz" ] || tar -czf "$OUT/sweep.tgz" -C "$OUT" sweep
  rm -rf "$OUT/sweep"
fi
ls -la "$OUT"
