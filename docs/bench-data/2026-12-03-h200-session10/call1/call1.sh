set -u
# session 10, call 1 (a new machine: no compile cache carried): inductor's cache for the
# compiled engine, built by the engine-only ceiling (compiled, batch 4/8/16), then the
# same-run before/after at 60 s for the CPU-limited recipe of session 9's call 3 (3.34x at
# 40 s): the host path (host decode, DB's float map, 4 workers, no MPS) at 64 cameras x 30 s,
# then the compiled GPU path under MPS with 8 workers and the adaptive 20 ms decode window,
# 64 cameras x 30 fps x 60 s on one server.
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
C="--set server.workers=8 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=30 CAMS=64 AFTER_CAMS=64 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=240 \
  AFTER_SETS="--one-server $C --set decode.device_window_ms=20" bash scripts/gpu-proof before-after
left
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
ls -la "$OUT"
