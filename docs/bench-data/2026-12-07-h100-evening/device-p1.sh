#!/bin/bash
# P1 (issue 34): cache + gpu-process in one call, from the clean tree of HEAD in .device/tree.
set -u
cd .device/tree && ln -sfn ../../.whl .whl && mkdir -p .device && ln -sfn ../../models .device/models
date -u +"UTC start %FT%TZ"; nvidia-smi -L; git_rev=$(cat .rev 2>/dev/null); echo "tree $git_rev"
bash scripts/gpu-proof cache
echo "compile cache files after cache: $(find .device/compile -type f 2>/dev/null | wc -l), $(du -sh .device/compile 2>/dev/null | cut -f1); elapsed ${SECONDS}s"
n0=$(find .device/compile -type f 2>/dev/null | wc -l)
GPU_PROOF_READY=1 GP_CAMS=${GP_CAMS:-64,96,128} GP_DUR=${GP_DUR:-20} GP_TIMEOUT=$((565-SECONDS)) bash scripts/gpu-proof gpu-process
n1=$(find .device/compile -type f 2>/dev/null | wc -l)
echo "compile cache files after gpu-process: $n1 (was $n0); elapsed ${SECONDS}s"
mkdir -p /tmp/gpx && tar -xzf $OUT/gpu-process.tgz -C /tmp/gpx && cp /tmp/gpx/gpu-process/new.routes $OUT/routes.txt
echo "== routes"; cat $OUT/routes.txt
if [ "$n1" != "$n0" ] && [ $SECONDS -lt 560 ]; then
  XZ_OPT=-T0 timeout $((590-SECONDS)) tar -cJf $OUT/compile-cache-after.txz -C .device compile && ls -la $OUT/compile-cache-after.txz
fi
date -u +"UTC end %FT%TZ (elapsed ${SECONDS}s)"
