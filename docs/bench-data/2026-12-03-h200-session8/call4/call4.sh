set -u
# session 8, call 4 (did not run: the device refused it; the next session's first call):
# the final same-run before/after with the decode window, through scripts/gpu-proof's
# before-after phase: the host path (host decode, DB's float map, 4 workers, no MPS) at 64
# cameras x 30 s, then the compiled 12-worker GPU path under MPS with
# decode.device_window_ms=12 on one server, 64 then 32 cameras x 30 fps x 60 s (each
# count's results are written as it ends). Carry .device/compile-cache.txz from call 1.
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=30 CAMS=64 AFTER_CAMS=64,32 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=300 \
  AFTER_SETS="--one-server $C --set decode.device_window_ms=12" bash scripts/gpu-proof before-after
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
ls -la "$OUT"
