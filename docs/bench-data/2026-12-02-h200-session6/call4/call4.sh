set -u
# session 6, call 4: the GPU tests other than decode on this tree (GpuEngine.infer's slot now
# goes back on the loop): FP16 against ONNX Runtime, batches in flight, the event loop free
bash scripts/gpu-proof none
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
bash scripts/gpu-proof gpu-tests
ls -la "$OUT"
