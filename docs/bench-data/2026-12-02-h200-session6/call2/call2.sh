set -u
# session 6, call 2: the same-run before/after on this tree (the host path now with OpenCV's
# one thread a call under a CUDA engine), then py-spy on the compiled 12-worker GPU path
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
git log -1 --format='tree %h %s' 2>/dev/null || true
C="--set server.workers=12 --set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=30 CAMS=64 AFTER_CAMS=64 AFTER_DUR=60 AFTER_MPS=1 AFTER_TIMEOUT=300 \
  AFTER_SETS="--ceiling --batches 4,8,16 $C" bash scripts/gpu-proof before-after
tar -czf "$OUT/before-after.tgz" -C "$OUT" before after && rm -rf "$OUT/before" "$OUT/after"
left
if [ $(( 570 - $(date +%s) + START )) -lt 170 ]; then echo "== no time left for the profile"; exit 0; fi
MPS=1 PTIMEOUT=230 PSETS="$C" bash scripts/gpu-proof profile
left
tar -czf "$OUT/profile.tgz" -C "$OUT" profile 2>/dev/null && rm -rf "$OUT/profile"
ls -la "$OUT"
