set -u
# session 10, call 2: fewer worker processes with the 20 ms adaptive decode window (each
# worker then gathers more frames a device call and a batch: fewer calls for the same
# frames, if its one interpreter keeps up), then where the server's CPU goes on the best
# recipe so far (8 workers, 20 ms: 3.34x in session 9's call 3), by py-spy on every
# process. The host path (host decode, DB's float map, 4 workers, no MPS) 64 cameras x 30 s
# first, for the same-call ratio; the GPU path compiled (inductor's cache carried from
# call 1), under MPS, 64 cameras x 30 fps x 40 s a variant.
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s $(date -u +%H:%M:%S)"; }
C="--set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300"
DUR=30 CAMS=64 AFTER_CAMS=none bash scripts/gpu-proof before-after
left
MPS=1 DUR=40 CAMS=64 LOAD_TIMEOUT=150 ENGINE_ALONE=0 \
  VARIANTS="w4win20:--set server.workers=4 $C --set decode.device_window_ms=20;w6win20:--set server.workers=6 $C --set decode.device_window_ms=20" \
  bash scripts/gpu-proof sweep
left
if [ $(( 570 - $(date +%s) + START )) -gt 165 ]; then
  MPS=1 PCAMS=64 PTIMEOUT=155 PSETS="--set server.workers=8 $C --set decode.device_window_ms=20" \
    bash scripts/gpu-proof profile
  left
fi
tar -czf "$OUT/before.tgz" -C "$OUT" before && rm -rf "$OUT/before"
ls -la "$OUT"
