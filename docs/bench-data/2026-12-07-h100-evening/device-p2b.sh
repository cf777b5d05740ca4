#!/bin/bash
# P2b: the no-flag server started twice alone, auto's compile cache dir pointed at P1's carried cache.
set -u
cd .device/tree && ln -sfn ../../.whl .whl && mkdir -p .device && ln -sfn ../../models .device/models
date -u +"UTC start %FT%TZ"; nvidia-smi -L
rm -rf .device/compile; bash scripts/gpu-proof install
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg2
mkdir -p /tmp/xdg2/edge-vision && ln -sfn $PWD/.device/compile /tmp/xdg2/edge-vision/torch-compile
rm -rf /tmp/torchinductor_root
R=$OUT/p2b; mkdir -p $R
for n in 1 2; do
  echo "== $(date +%T) start $n: cache files $(find .device/compile/ -type f | wc -l)"
  t0=$(date +%s.%N)
  python3 -m edge_vision serve --host 127.0.0.1 --port 879$n > $R/start$n.server.log 2>&1 & sp=$!
  while ! grep -q "node ready" $R/start$n.server.log && kill -0 $sp 2>/dev/null && [ $SECONDS -lt 570 ]; do sleep 0.25; done
  echo "start $n: node ready $(python3 -c "import time;print(round(time.time()-$t0,1))") s after launch" | tee -a $R/ready.txt
  grep -hE "engine.kind|node ready|compiled in|WARNING|ERROR" $R/start$n.server.log | head -30
  kill -TERM $sp; for i in $(seq 60); do kill -0 $sp 2>/dev/null || break; sleep 0.25; done; kill -KILL $sp 2>/dev/null; sleep 1
done
ls /tmp/torchinductor_root 2>/dev/null | head -3
date -u +"UTC end %FT%TZ (elapsed ${SECONDS}s)"
