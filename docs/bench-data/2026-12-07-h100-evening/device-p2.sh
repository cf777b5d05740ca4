#!/bin/bash
# P2 (issue 32): no engine flags on a GPU: auto must pick torch on CUDA. Compile cache from P1
# (.device/compile-cache.txz) reached through auto's default dir, $XDG_CACHE_HOME/edge-vision/torch-compile.
set -u
cd .device/tree && ln -sfn ../../.whl .whl && mkdir -p .device && ln -sfn ../../models .device/models
date -u +"UTC start %FT%TZ"; nvidia-smi -L; echo "tree $(cat .rev)"
bash scripts/gpu-proof install   # no such phase: the wheels, the model and the carried compile cache only
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XDG_CACHE_HOME=/tmp/xdg
mkdir -p /tmp/xdg/edge-vision && ln -sfn $PWD/.device/compile /tmp/xdg/edge-vision/torch-compile
echo "cache files: $(find .device/compile -type f | wc -l)"
R=$OUT/p2; mkdir -p $R
ready() { python3 - "$1" <<'PY'
import re, sys, datetime
stamps = [(re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)", l), l) for l in open(sys.argv[1], errors="replace")]
stamps = [(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), l) for m, l in stamps if m]
ready = next((t for t, l in stamps if "node ready" in l), None)
print(f"ready {(ready - stamps[0][0]).total_seconds():.1f} s after the server's first log line" if ready and stamps else "never ready")
PY
}
nvidia-smi dmon -s um -d 1 > $R/auto.dmon 2>&1 & dm=$!
echo "== $(date +%T) first start: bench --cameras 16,64 --fps 30 --duration 30 --one-server (no engine flags)"
t0=$(date +%s.%N)
timeout $((420-SECONDS)) python3 -m edge_vision bench --cameras 16,64 --fps 30 --duration 30 --one-server \
  --cameras-per-process 8 --no-plots --out $R/auto 2>&1 | grep -v '/30 s,'
kill $dm
echo "bench wall $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
L=$R/auto/server.log; ready $L | tee $R/auto.ready
grep -hE "engine.kind|node ready|decode routes|compile|GPU process|died|Traceback|ERROR" $L | head -40 > $R/auto.lines; cat $R/auto.lines
tail -c 200000 $L > $R/auto.server.log; rm -f $L
echo "== $(date +%T) second start: serve alone, seconds to node ready (elapsed ${SECONDS}s)"
t0=$(date +%s.%N)
python3 -m edge_vision serve --host 127.0.0.1 --port 8791 > $R/second.server.log 2>&1 & sp=$!
while ! grep -q "node ready" $R/second.server.log && kill -0 $sp 2>/dev/null && [ $SECONDS -lt 575 ]; do sleep 0.25; done
echo "second start: node ready $(python3 -c "import time;print(round(time.time()-$t0,1))") s after launch" | tee $R/second.ready
ready $R/second.server.log | tee -a $R/second.ready
grep -hE "engine.kind|node ready|compile" $R/second.server.log | head -20
kill -TERM $sp; for i in $(seq 40); do kill -0 $sp 2>/dev/null || break; sleep 0.25; done; kill -KILL $sp 2>/dev/null
nvidia-smi --query-gpu=name,memory.used --format=csv
tar -czf $OUT/p2.tgz -C $OUT p2 && echo tarred
date -u +"UTC end %FT%TZ (elapsed ${SECONDS}s)"
