set -u
# the final same-run before/after (issue 11); SYNC: "" or "--set engine.cuda_sync=blocking"
SYNC=${SYNC:-}
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s"; }
git log -1 --format='tree %h %s' 2>/dev/null || true
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300 $SYNC"
DUR=30 CAMS=32,64 AFTER_CAMS=64 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=330 \
  AFTER_SETS="--ceiling --batches 4,8,16 $C" bash scripts/gpu-proof before-after
left
MPS=1 CAMS=32 DUR=30 LOAD_TIMEOUT=200 ENGINE_ALONE=0 VARIANTS="after32:$C" bash scripts/gpu-proof sweep
left
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
ls -la "$OUT"
