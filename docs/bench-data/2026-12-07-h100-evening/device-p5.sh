#!/bin/bash
# Issue 34 after 2a73760 + the concurrent routes: decode.gpu_routes hw, then auto, on one call.
set -u
cd .device/tree && ln -sfn ../../.whl .whl && ln -sfn ../../../.device/models .device/models
date -u +"UTC start %FT%TZ"; nvidia-smi -L; echo "tree $(cat .rev)"
bash scripts/gpu-proof cache   # installs, unpacks the carried cache (nothing to compile)
for v in hw auto; do
  left=$((255-SECONDS)); [ $left -lt 70 ] && { echo "no time left for $v"; break; }
  cams=64,128; [ $v = auto ] && cams=64
  echo "== variant $v, ${cams} cameras, ${left}s left"
  mkdir -p $OUT/$v
  OUT=$OUT/$v GPU_PROOF_READY=1 GP_CAMS=$cams GP_DUR=20 GP_TIMEOUT=$((left-15)) \
    GP_SETS="--set decode.gpu_routes=$v" bash scripts/gpu-proof gpu-process
  mkdir -p /tmp/gp-$v && tar -xzf $OUT/$v/gpu-process.tgz -C /tmp/gp-$v
  cp /tmp/gp-$v/gpu-process/new.routes $OUT/$v/routes.txt 2>/dev/null; cat $OUT/$v/routes.txt
  cp /tmp/gp-$v/gpu-process/new/results.json $OUT/$v/results.json 2>/dev/null
  cp /tmp/gp-$v/gpu-process/new.dmon /tmp/gp-$v/gpu-process/new.ready $OUT/$v/ 2>/dev/null
  grep -hE "WARNING|ERROR|GPU process" /tmp/gp-$v/gpu-process/new.server.log | head -20 > $OUT/$v/server-warnings.txt
  rm -f $OUT/$v/gpu-process.tgz
done
date -u +"UTC end %FT%TZ (elapsed ${SECONDS}s)"
