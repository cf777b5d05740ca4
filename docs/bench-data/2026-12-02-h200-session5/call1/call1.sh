set -u
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
START=$(date +%s)
left() { echo "== left: $(( 570 - $(date +%s) + START )) s"; }
bash scripts/gpu-proof compile
tar -cJf "$OUT/compile-cache.txz" -C .device compile; ls -la "$OUT"
left
C="--set engine.torch.compile=default --set engine.torch.compile_cache=$PWD/.device/compile --server-ready-s 300 --set server.workers=12"
MPS=1 DUR=45 LOAD_TIMEOUT=230 ENGINE_ALONE=0 VARIANTS="block:$C --set engine.cuda_sync=blocking;auto:$C" bash scripts/gpu-proof sweep
left
