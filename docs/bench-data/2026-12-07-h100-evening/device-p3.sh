#!/bin/bash
# P3 (issue 34 before): c62a5ca's 12-worker MPS recipe at 64 cameras, compile cache from P1.
set -u
cd .device/tree && ln -sfn ../../.whl .whl && mkdir -p .device && ln -sfn ../../models .device/models
date -u +"UTC start %FT%TZ"; nvidia-smi -L
bash scripts/gpu-proof install
echo "cache files: $(find .device/compile -type f | wc -l)"
cd .device/old && GPU_PROOF_READY=1 GP_CAMS=64 GP_DUR=20 GP_TIMEOUT=$((560-SECONDS)) OUT=$OUT bash scripts/gpu-proof gpu-process-old
mkdir -p /tmp/gpo && tar -xzf $OUT/gpu-process-old.tgz -C /tmp/gpo && cp /tmp/gpo/gpu-process-old/old.routes $OUT/routes-old.txt; cat $OUT/routes-old.txt
date -u +"UTC end %FT%TZ (elapsed ${SECONDS}s)"
