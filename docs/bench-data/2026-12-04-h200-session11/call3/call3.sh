set -u
# session 11, call 3 (inductor's cache carried from call 1): call 2 again, with the
# adaptive window's average over the last 32 gaps between a worker's frames instead of
# about the last 8 (in call 2, 32 cameras after 48 on the same server had p99 27 ms and
# engine batches of 1.23: a few frames read back to back pulled the short average under
# min_frames' threshold, and calls waited that should have gone). The host path at 64
# cameras x 30 fps x 60 s, then 6 workers, the adaptive 20 ms window and min_frames 4.5,
# 64, 48 and 32 cameras x 60 s on one server, under MPS.
bash scripts/gpu-proof none cache
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
C="--set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=60 CAMS=64 AFTER_CAMS=64,48,32 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=330 \
  AFTER_SETS="--one-server --set server.workers=6 $C --set decode.device_window_ms=20 --set decode.device_window_min_frames=4.5" \
  bash scripts/gpu-proof before-after
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
ls -la "$OUT"
