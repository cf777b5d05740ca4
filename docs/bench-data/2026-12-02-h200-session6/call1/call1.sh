set -u
# session 6, call 1: inductor's cache (carried to later calls), the host path's OpenCV pool,
# decode.device_streams 1 against 2 on the compiled 12-worker GPU path
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 TORCHINDUCTOR_COMPILE_THREADS=4
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
git log -1 --format='tree %h %s' 2>/dev/null || true
mkdir -p "$OUT/c1"
echo "== $(date -u +%H:%M:%S) engine alone, compiled (builds inductor's cache)"
timeout 240 python3 -m edge_vision bench --engine-only --engine torch --set engine.torch.device=cuda:0 \
  --set engine.in_flight=3 --set engine.max_batch=16 --batches 4,8,16 --engine-seconds 3 \
  --set engine.torch.compile_cache="$PWD/.device/compile" --set engine.torch.compile=default \
  --out "$OUT/c1/engine-default" 2>&1 | grep -E "compile|ceiling|^ +[0-9]+ " | tail -12
tar -cJf "$OUT/compile-cache.txz" -C .device compile; ls -la "$OUT/compile-cache.txz"
left
H="--set decode.device=host --set engine.torch.device_post=false"
DUR=30 LOAD_TIMEOUT=150 ENGINE_ALONE=0 \
  VARIANTS="host-cv1:$H --set server.opencv_threads=1;host-cvdefault:$H" bash scripts/gpu-proof sweep
mv "$OUT/sweep.tgz" "$OUT/sweep-host.tgz"
left
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
MPS=1 DUR=30 LOAD_TIMEOUT=200 ENGINE_ALONE=0 \
  VARIANTS="streams2:$C;streams1:$C --set decode.device_streams=1" bash scripts/gpu-proof sweep
mv "$OUT/sweep.tgz" "$OUT/sweep-streams.tgz"
left
ls -la "$OUT"
