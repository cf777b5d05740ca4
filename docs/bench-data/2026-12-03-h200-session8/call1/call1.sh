set -u
# session 8, call 1: the GPU tests on the decoder as moved into edge_vision/decode_gpu.py
# (never run there before), then inductor's cache for the compiled engine (carried to the
# later calls)
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
bash scripts/gpu-proof decode-tests gpu-tests
left
mkdir -p "$OUT/c1"
echo "== $(date -u +%H:%M:%S) engine alone, compiled (builds inductor's cache)"
TORCHINDUCTOR_COMPILE_THREADS=4 timeout 240 python3 -m edge_vision bench --engine-only --engine torch \
  --set engine.torch.device=cuda:0 --set engine.in_flight=3 --set engine.max_batch=16 \
  --batches 4,8,16 --engine-seconds 3 \
  --set engine.torch.compile_cache="$PWD/.device/compile" --set engine.torch.compile=default \
  --out "$OUT/c1/engine-default" 2>&1 | grep -E "compile|ceiling|^ +[0-9]+ " | tail -12
tar -cJf "$OUT/compile-cache.txz" -C .device compile; ls -la "$OUT/compile-cache.txz"
left
ls -la "$OUT"
