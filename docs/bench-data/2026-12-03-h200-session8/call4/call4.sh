set -u
# session 8, call 4: the final same-run before/after with the decode window: the host path
# (host decode, DB's float map, 4 workers, no MPS) at 64 cameras x 30 s, then the compiled
# 12-worker GPU path under MPS with decode.device_window_ms=12 on one server, 64 then 32
# cameras x 30 fps x 60 s (the last of this session's device time: each count's results
# are written as it ends)
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 330 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
mkdir -p "$OUT/sweep"
echo "== $(date -u +%H:%M:%S) before: host path, 64 cameras x 30 fps x 30 s"
timeout 100 python3 -m edge_vision bench --engine torch --set engine.torch.device=cuda:0 \
  --set engine.fallback=none --set engine.in_flight=3 --set 'engine.warmup_shapes=[[720,1280]]' \
  --set engine.max_batch=16 --set engine.batch_window_ms=2 --set session.latest_in_flight=2 \
  --set server.workers=4 --set decode.workers=4 --fps 30 --no-plots --cameras-per-process 8 \
  --set decode.device=host --set engine.torch.device_post=false \
  --cameras 64 --duration 30 --out "$OUT/sweep/before" 2>&1 | tail -4
rm -f "$OUT/sweep/before/server.log"
left
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
MPS=1 DUR=60 CAMS=64,32 LOAD_TIMEOUT=220 ENGINE_ALONE=0 \
  VARIANTS="win12:--one-server $C --set decode.device_window_ms=12" bash scripts/gpu-proof sweep
left
ls -la "$OUT"
