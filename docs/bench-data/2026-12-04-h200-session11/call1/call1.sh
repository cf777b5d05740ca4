set -u
# session 11, call 1 (a new machine: no compile cache carried): inductor's cache, then the
# same-run before/after for issue 11 with decode.device_window_min_frames (new: the
# adaptive window waits only while it should gather at least that many frames): the host
# path (host decode, DB's float map, 4 workers, no MPS) at 64 cameras x 30 fps x 60 s,
# then the compiled GPU path under MPS with 6 workers, the adaptive 20 ms window and
# min_frames 4.5, 64 then 32 cameras x 60 s on one server (at 32 it should not wait).
bash scripts/gpu-proof none cache
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
C="--set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=60 CAMS=64 AFTER_CAMS=64,32 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=260 \
  AFTER_SETS="--one-server --set server.workers=6 $C --set decode.device_window_ms=20 --set decode.device_window_min_frames=4.5" \
  bash scripts/gpu-proof before-after
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after cache && rm -rf "$OUT/before" "$OUT/after" "$OUT/cache"
ls -la "$OUT"
