set -u
# session 9, call 1 (a new machine: no compile cache carried): inductor's cache for the
# compiled engine, built by the engine-only ceiling (compiled, batch 4/8/16), then in the same
# call session 8's call 4, which the device refused: the same-run before/after with the
# 12 ms decode window through scripts/gpu-proof's before-after phase: the host path (host
# decode, DB's float map, 4 workers, no MPS) at 64 cameras x 30 s, then the compiled
# 12-worker GPU path under MPS with decode.device_window_ms=12 on one server, 64 then 32
# cameras x 30 fps x 60 s (each count's results are written as it ends).
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
mkdir -p "$OUT/c1"
echo "== $(date -u +%H:%M:%S) engine alone, compiled (builds inductor's cache)"
TORCHINDUCTOR_COMPILE_THREADS=4 timeout 240 python3 -m edge_vision bench --engine-only --engine torch \
  --set engine.torch.device=cuda:0 --set engine.in_flight=3 --set engine.max_batch=16 \
  --batches 4,8,16 --engine-seconds 3 \
  --set engine.torch.compile_cache="$PWD/.device/compile" --set engine.torch.compile=default \
  --out "$OUT/c1/engine-default" 2>&1 | grep -E "compile|ceiling|^ +[0-9]+ " | tail -12
tar -cJf "$OUT/compile-cache.txz" -C .device compile; ls -la "$OUT/compile-cache.txz"
left
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=30 CAMS=64 AFTER_CAMS=64,32 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=300 \
  AFTER_SETS="--one-server $C --set decode.device_window_ms=12" bash scripts/gpu-proof before-after
left
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
ls -la "$OUT"
