set -u
# session 7, call 2: what the device decode costs the host a frame, stage by stage
# (python -m edge_vision.bench.device_decode), then the final same-run before/after on this
# tree: host path (4 workers) against the compiled 12-worker GPU path under MPS with the
# node's hand-over, 32 and 64 cameras, 60 s each for the after, the ceiling in the same run
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
echo "== $(date -u +%H:%M:%S) device decode, host CPU a frame by stage"
timeout 150 python3 -m edge_vision.bench.device_decode --batches 1 2 3 4 8 --seconds 1.0 \
  --json "$OUT/device-decode.json" 2>&1 | grep -v Warning
left
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=30 CAMS=32,64 AFTER_CAMS=32,64 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=360 \
  AFTER_SETS="--ceiling --batches 4,8,16 $C" bash scripts/gpu-proof before-after
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
left
ls -la "$OUT"
