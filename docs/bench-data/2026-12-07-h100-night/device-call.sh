#!/bin/bash
# Issue 34: the GPU process with the workers posting (HEAD) at 64/96/128 cameras x 20 s,
# then c62a5ca's 12-worker MPS recipe on the same load, one call, one warm machine.
set -u
R=$PWD
cd .device/tree && ln -sfn ../../.whl .whl && ln -sfn ../../../.device/models .device/models
date -u +"UTC start %FT%TZ"; nvidia-smi -L; echo "tree $(cat .rev 2>/dev/null)"
bash scripts/gpu-proof cache 2>&1 | tail -8
export GPU_PROOF_READY=1 PYTHONPATH=/tmp/site:$PWD
echo "== decode routes (the GPU process's hw-only and cuda-only decoders beside a worker's)"
timeout 45 python3 -m benchmarks.device_decode --libraries nvimgcodec --backends hw+cuda hw cuda \
    --batches 16 64 --cpu-threads 1 --seconds 0.5 --json "$OUT/decode-routes.json" 2>&1 \
    | grep -vE "nvjpeg2k|nvtiff" | tail -24
left=$((${CALL_S:-420}-SECONDS)); echo "== new: GPU process, ${left}s for it"
OUT=$OUT/new GP_CAMS=64,96,128 GP_DUR=20 GP_TIMEOUT=$left bash scripts/gpu-proof gpu-process 2>&1 | tail -32
if [ -n "${OLD:-}" ]; then cd $R/.device && ln -sfn tree/.device/compile compile && cd old
left=$((${TOTAL_S:-580}-SECONDS)); echo "== old: c62a5ca recipe, ${left}s left"
[ $left -gt 100 ] && OUT=$OUT/old GP_CAMS=64,96,128 GP_DUR=20 GP_TIMEOUT=$((left-8)) bash scripts/gpu-proof gpu-process-old 2>&1 | tail -24; fi
date -u +"UTC end %FT%TZ (elapsed ${SECONDS}s)"
cd $OUT && tar -czf all.tgz --exclude=all.tgz --exclude=run.log --exclude=compile-cache.txz * && find . -mindepth 1 ! -name all.tgz ! -name run.log ! -name compile-cache.txz -delete; ls -la $OUT
