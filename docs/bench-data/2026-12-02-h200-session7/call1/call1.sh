set -u
# session 7, call 1: inductor's cache (carried to later calls), then the node's hand-over
# (server.worker_balance=least-clients, the default) at 64 cameras x 60 s, twice, on the
# compiled 12-worker GPU path under MPS: the cameras each worker served and the tail
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 TORCHINDUCTOR_COMPILE_THREADS=4
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
mkdir -p "$OUT/c1"
echo "== $(date -u +%H:%M:%S) engine alone, compiled (builds inductor's cache)"
timeout 240 python3 -m edge_vision bench --engine-only --engine torch --set engine.torch.device=cuda:0 \
  --set engine.in_flight=3 --set engine.max_batch=16 --batches 4,8,16 --engine-seconds 3 \
  --set engine.torch.compile_cache="$PWD/.device/compile" --set engine.torch.compile=default \
  --out "$OUT/c1/engine-default" 2>&1 | grep -E "compile|ceiling|^ +[0-9]+ " | tail -12
tar -cJf "$OUT/compile-cache.txz" -C .device compile; ls -la "$OUT/compile-cache.txz"
left
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
MPS=1 DUR=60 LOAD_TIMEOUT=250 ENGINE_ALONE=0 \
  VARIANTS="handover1:$C;handover2:$C" bash scripts/gpu-proof sweep
left
ls -la "$OUT"
