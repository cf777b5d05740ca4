set -u
# session 6, call 3: engine.in_flight 3 (default) / 2 / 1 at 12 workers compiled, and the tree
# before this session's changes (a5bbfd6, .device/old) at the defaults, in one call
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 560 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
MPS=1 DUR=30 LOAD_TIMEOUT=200 ENGINE_ALONE=0 \
  VARIANTS="inflight2:$C --set engine.in_flight=2;inflight3:$C" bash scripts/gpu-proof sweep
mv "$OUT/sweep.tgz" "$OUT/sweep-a.tgz"
left
if [ $(( 560 - $(date +%s) + START )) -gt 120 ]; then
  ( cd .device/old && MPS=1 DUR=30 LOAD_TIMEOUT=200 ENGINE_ALONE=0 OUT="$OUT/old" \
      PYTHONPATH=/tmp/site:$PWD VARIANTS="old-inflight3:$C" bash scripts/gpu-proof sweep )
  mv "$OUT/old/sweep.tgz" "$OUT/sweep-old.tgz"; rm -rf "$OUT/old"
fi
left
if [ $(( 560 - $(date +%s) + START )) -gt 120 ]; then
  MPS=1 DUR=30 LOAD_TIMEOUT=200 ENGINE_ALONE=0 \
    VARIANTS="inflight1:$C --set engine.in_flight=1" bash scripts/gpu-proof sweep
  mv "$OUT/sweep.tgz" "$OUT/sweep-b.tgz"
fi
left
ls -la "$OUT"
