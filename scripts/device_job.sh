#!/usr/bin/env bash
# One device call: build every rung, run the GPU tests, sanitizers, the bench and/or measured timelines,
# logs under $OUT.
# Usage (on the device machine, repo root):
#   bash scripts/device_job.sh [info] [build] [test FILTER|all] [sanitize "RUNGS"|features] [bench "ARGS"] [trace "RUNGS"]
#                              [ncu "LABEL IMPL SHAPE [--causal]"] ...
# The device tool brings back 8 files at most: trace packs its folder into timelines.tgz.
# trace: python -m attnclimb trace for each rung (default 5-16; $TRACE_ARGS is passed on, e.g. "--clock sm"),
# JSON + SVG + PNG into $OUT/timelines (to be copied into docs/figures/timelines/).
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; touch "$OUT/.start"
export ATTNCLIMB_CACHE_DIR=${ATTNCLIMB_CACHE_DIR:-/tmp/attnclimb-cache}
while [ $# -gt 0 ]; do
  case "$1" in
    info) nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
          python3 -c "import torch,cuda.core,triton;print('torch',torch.__version__,'cudnn',torch.backends.cudnn.version(),'cuda.core',cuda.core.__version__,'triton',triton.__version__)";;
    build) python3 -m attnclimb build 2>&1 | tee "$OUT/build.txt";;
    test) shift; k=(); [ "${1:-all}" != all ] && k=(-k "$1")   # test FILTER ('all' = every GPU test); a test
          # that hangs (a kernel deadlock blocks the signal-based timeout) ends the run after 120 s with its stack
          ATTNCLIMB_ERRLOG=$OUT/errors.json python3 -m pytest tests -m gpu -q --maxfail=40 --timeout=120 --timeout-method=thread \
            -p no:cacheprovider "${k[@]}" -rf 2>&1 | tee "$OUT/gpu_tests.txt" | grep -v "^tests/.*PASSED" | tail -45;;
    sanitize) shift   # the whole report of each tool into the file (the first 20 errors in full), its end on stdout
          f="$OUT/sanitize-$(echo "${1:-all}" | tr ' ' '_').txt"; : > "$f"
          for tool in memcheck racecheck synccheck; do
            echo "== $tool" | tee -a "$f"
            compute-sanitizer --tool $tool --report-api-errors no --print-limit 20 python3 scripts/sanitize_small.py ${1:-} 2>&1 |
              tee -a "$f" | tail -4
          done;;
    bench) shift   # bench "ARGS" (one quoted word, may be empty)
           python3 -m attnclimb bench ${1:-} 2>&1 | tee "$OUT/bench.txt" | tail -60
           for f in benchmarks/results/*.json; do [ "$f" -nt "$OUT/.start" ] && cp "$f" "$OUT/"; done  # this run's only
           cp benchmarks/results/*.png "$OUT/" 2>/dev/null;;
    trace) shift; mkdir -p "$OUT/timelines"
           for r in ${1:-5 6 7 8 9 10 11 12 13 14 15 16}; do
             python3 -m attnclimb trace "$r" --out "$OUT/timelines" ${TRACE_ARGS:-} || echo "trace $r: exit $?"
           done 2>&1 | tee "$OUT/trace.txt" | tail -60
           tar -C "$OUT" -czf "$OUT/timelines.tgz" timelines && rm -rf "$OUT/timelines";;  # one file back, not 3 per rung
    ncu) shift   # ncu "LABEL IMPL SHAPE [--causal]": full-set profile of the 2nd launch, per-SASS-line stall samples
         read -r lab impl shp rest <<<"$1"
         ncu --set full --clock-control none --import-source no -k 'regex:attn_fwd|flash|sdpa|fmha' -s 1 -c 1 -f -o "$OUT/ncu_$lab" \
           python3 scripts/profile_one.py "$impl" "$shp" $rest > "$OUT/ncu_$lab.log" 2>&1 || echo "ncu $lab: exit $?"
         ncu -i "$OUT/ncu_$lab.ncu-rep" --page details > "$OUT/ncu_$lab.txt"
         ncu -i "$OUT/ncu_$lab.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${lab}_sass.csv"
         grep -E "Duration|SM Frequency|Issue Slots Busy|Compute \(SM\) Thr|Warp Cycles Per Issued" "$OUT/ncu_$lab.txt"
         tar -C "$OUT" -czf "$OUT/ncu_$lab.tgz" "ncu_$lab.txt" "ncu_${lab}_sass.csv" "ncu_$lab.log" &&
           rm -f "$OUT/ncu_$lab.txt" "$OUT/ncu_${lab}_sass.csv" "$OUT/ncu_$lab.log" "$OUT/ncu_$lab.ncu-rep";;
  esac
  shift
done
