set -u
# session 11, call 2 (inductor's cache carried from call 1): call 1's same-run proof again
# on another machine, with 48 cameras between the two counts, where a worker's 8 cameras
# come about 4.8 a 20 ms window, near decode.device_window_min_frames 4.5: the host path
# (host decode, DB's float map, 4 workers, no MPS) at 64 cameras x 30 fps x 60 s, then the
# compiled GPU path under MPS with 6 workers, the adaptive 20 ms window and min_frames
# 4.5, 64, 48 and 32 cameras x 60 s on one server.
bash scripts/gpu-proof none cache
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
C="--set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=60 CAMS=64 AFTER_CAMS=64,48,32 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=330 \
  AFTER_SETS="--one-server --set server.workers=6 $C --set decode.device_window_ms=20 --set decode.device_window_min_frames=4.5" \
  bash scripts/gpu-proof before-after
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
ls -la "$OUT"
