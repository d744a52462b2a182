#!/usr/bin/env bash
# The device calls of one GPU session, each one short command for the device tool (2 000 characters at
# most per command; the machine stays warm 30 s after a call, so each call must follow the last at once):
#   bash scripts/device_calls.sh verify     carry .peers/q1:  stage FA4 part 1, the whole GPU suite, the top rung's timeline
#   bash scripts/device_calls.sh sanitize   carry .peers/q2:  stage FA4 part 2, compute-sanitizer on the top rung's feature
#                                           and fp16 variants and on every rung from 10 to the top, plain; then a
#                                           causal A/B timing of the top three rungs (3 rounds, ab_causal.json)
#   bash scripts/device_calls.sh first      carry .peers/x1: a session's first call: stage FA4's first half; on a card
#                                           other than an H200, the fp16 sanitizers and ab-causal-order too
#   bash scripts/device_calls.sh sanitize-below  (no carry) compute-sanitizer on the feature, fp16 and long-K/V sets
#                                           of the rungs below the top that have them (10-15; long K/V 12-15)
#   bash scripts/device_calls.sh stage q3   carry .peers/q3:  stage FA4 part 3 (nothing else; between sanitize and peers);
#                                           `stage x1` (carry .peers/x1): the first half of scripts/pack_peers.sh's FA4
#   bash scripts/device_calls.sh peers      carry .peers/q4 (or x2):  install FA4, A/B of the top three rungs and
#                                           AB_VARIANTS, with FA4 in the same run, ncu of the top rung and FA4,
#                                           the full bench
#   bash scripts/device_calls.sh peers-bench  carry .peers/q4 (or .peers/x2 after `stage x1`): install FA4 and run the
#                                           full bench only (no A/B, no ncu)
#   bash scripts/device_calls.sh capstone   (FA4 installed by `peers`; carry .peers/video): docs/capstone.md
#   bash scripts/device_calls.sh ab-l2      (no carry, ~2 min) the top rung against itself with TMA maps that
#                                           fill L2 in 256-B / 128-B units (Rung.l2_promotion), on contiguous
#                                           inputs and on BSHD views (issue 9's view/contiguous goal)
#   bash scripts/device_calls.sh ab-d64     (no carry, ~3 min) head_dim 64 (issue 8: d64 >= cuDNN): the top rung's
#                                           d64 variant against BLOCK_N 192, 3 stages, both, and BLOCK_N 128 with
#                                           3 stages, non-causal and causal; FA4 too if an earlier call installed it
#   bash scripts/device_calls.sh diag [ARGS]  (carry any of .peers/q1-q4 or x1, x2 in turn: stages that FA4 part; FA4
#                                           is timed once q4 or x2 is in) the diagnostics noload / noexp / nomax (make_variants.py,
#                                           wrong results, timing only) against the top rung, cuDNN (and FA4) with the SM
#                                           clock and power sampled; ARGS go to ab_rungs.py (e.g. --head-dim 64)
#   bash scripts/device_calls.sh ab-dims    (no carry, ~4 min) head_dim 64 / 256 tiles of the top rung (thirteenth session)
#   bash scripts/device_calls.sh ab-top V  (no carry, ~3 min) the top rung against make_variants.py's variant V of it
#                                           (e.g. sleeptop: the producer's waits with a suspend hint; treetop: row
#                                           reductions in four chains per row; wgarrive18, vfirst18, sonlytop,
#                                           nopptop, hint, hintq), head_dim 64 and 128
#   bash scripts/device_calls.sh bshd       (no carry, ~2 min) BSHD view vs contiguous, 6 interleaved rounds (issue 9)
#   bash scripts/device_calls.sh ab-bshd    (no carry, ~6 min) the BSHD views' cost: the top rung against `l2pf` (K/V
#                                           tiles asked of L2 4 loads ahead) and `hgroup` / `hgroup4` (heads fastest in
#                                           groups of 12 / 4), on BSHD views and on contiguous inputs
#   bash scripts/device_calls.sh ncu-bshd   (no carry, ~4 min) Nsight Compute of the top rung on Wan2.1-1.3B, contiguous
#                                           and BSHD views (after ab-bshd, if neither variant explains the views' cost)
#   bash scripts/device_calls.sh ab-causal-order  (no carry, ~7 min) causal tile order: pairs (today) vs `snake`,
#                                           `dynsched` and `hwsched`, head_dim 64, 128 and 256
#   bash scripts/device_calls.sh trace-d64  (no carry, ~1 min) timelines of the top rung at head_dim 64, causal and not
#   bash scripts/device_calls.sh ladder     (no carry, ~3-4 min) rungs 9 to the top in one process, 4 rounds: issue 13's steps
# The plan since the twenty-fifth session (D=scripts/device_calls.sh; J=scripts/device_job.sh; FA4 packed in two
# halves by scripts/pack_peers.sh, .peers/x1 and .peers/x2; every call right after the last, the machine is released
# 30 s after one): (1) carry .peers/x1, timeout 600: `bash $D first`: on an H200 it stages and runs the ladder
# (~4 min); on any other card (an H100 came after eleven failed starts in the twenty-fourth session) it runs the fp16
# sanitizers and the causal-order A/B instead, and the bench waits for an H200. (2) on an H200, carry .peers/x2:
# `bash $D peers-bench; timeout 240 bash $J sanitize fp16` (the bench with FA4, then the top rung's fp16 set under
# the three tools, issue 13's "done when"; its feature set passed them on an H100 in the twenty-fourth session).
# (3) no carry: `bash $J test "one_cta_per_tile or test_variants_gpu"; bash $D ab-causal-order` (~9 min: the new GPU tests, then
# snake, dynsched, hwsched at head_dim 64, 128, 256); (4) no carry: `bash $D ab-bshd views` (the BSHD views' cost,
# twenty-third session); (5) whatever time is left: `bash $D sanitize-below`, `bash $D ab-bshd contiguous; bash $D
# trace-d64`, the trace tests. Then `python scripts/after_device.py <files_at dirs>` and the ratio markers.
# Before pack_peers.sh, with the wheels in four parts: four back-to-back calls, FA4
# staged alongside (D=scripts/device_calls.sh; J=scripts/device_job.sh): (1) carry .peers/q1:
# `bash $D stage q1 && bash $D ladder; bash $D ab-causal-order` (~7 min); (2) .peers/q2: `bash $D stage q2 &&
# bash $J test trace trace "10 11 12 13 14 15 16"; bash $D trace-d64`; (3) .peers/q3: `bash $D stage q3 && bash $J sanitize
# features sanitize fp16` (the top rung's sets); (4) .peers/q4: `bash $D peers-bench`. The whole GPU suite
# (`verify`) takes 5.5 min on an H100: skip it when no kernel changed since a passing run.
# The modes that timed the rungs the re-cut removed or renumbered (ab-17, ab-18, ab-18b, ab-wg3, ab-short, ab-exp2,
# ladder-nopp, d64-ncu, d64-fa4, ab-swap, ab-10, ab-epi11, recut, recut-first, recut-last) are in git at 8cedb83, with
# scripts/make_recut.sh and the variants they used; their A/B files under benchmarks/ab name the old rung numbers.
# FA4's wheels travel in four parts (.peers/q1-q4, each < 29 MB, since the tracked tree is 31 MB of the 64 MiB a
# call may carry); scripts/split_peers.sh makes them from ../shared/tools/fa4-wheels.sh's .peers/p1 and p2.
# Logs and results under $OUT (at most 8 files come back: the steps pack their folders).
# AB_VARIANTS (default none; e.g. "s3=.ab/base@NUM_STAGES=3" or "tree=.ab/treetop", written there by
# make_variants.py) names A/B variants of the top rung for `peers` (other folders under .ab can be carried).
set -uo pipefail
# git on the device reports the checkout the session started in (HEAD and "-dirty"), not the tree sent:
# the commit recorded in every JSON comes from ATTNCLIMB_GIT_COMMIT, which each call must set.
: "${ATTNCLIMB_GIT_COMMIT:?set ATTNCLIMB_GIT_COMMIT=<the commit whose tree this call runs>}"
export ATTNCLIMB_GIT_COMMIT OUT=${OUT:-/tmp/out} PYTHONUNBUFFERED=1
TOP=$(PYTHONPATH=. python3 -c "from attnclimb import rungs; print(rungs.TOP.number)")
fa4_path=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site
# The last FA4 call's step, into /tmp/site (put on PYTHONPATH with fa4_path); prints why when it fails and the caller
# goes on without FA4. With .peers/x2 carried (scripts/pack_peers.sh; `stage x1` one call before): the two halves of
# the packed site checked against their SHA-256 and unpacked. Else .peers/q4 joined to q1-q3 already in /tmp/fa4, the
# split wheel put back together, all installed with pip.
install_fa4() {
  if [ -d /tmp/site/flash_attn ]; then echo "FA4 already in /tmp/site"; return; fi
  if [ -d .peers/x2 ]; then
    [ -f /tmp/fa4/fa4site.tar.xz.aa ] || { echo "FA4 unpack failed: no first half (run \`stage x1\` with .peers/x1 carried one call before): $1"; return; }
    cp .peers/x2/* /tmp/fa4/ && (cd /tmp/fa4 && sha256sum -c --quiet SHA256SUMS && mkdir -p /tmp/site &&
      cat fa4site.tar.xz.aa fa4site.tar.xz.ab | python3 -c "import sys, tarfile
tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp/site', filter='data')" && rm fa4site.tar.xz.*) ||
      echo "FA4 unpack failed: $1"
    return
  fi
  cp .peers/q4/* /tmp/fa4/ && (cd /tmp/fa4 && cat cu13part.aa cu13part.ab cu13part.ac cu13part.ad > "$(cat WHEEL_NAME)" &&
    rm cu13part.* WHEEL_NAME && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ./*.whl) ||
    echo "FA4 install failed: $1"
}
case "${1:-}" in
  verify)
    mkdir -p /tmp/fa4 && cp .peers/q1/* /tmp/fa4/
    bash scripts/device_job.sh info test all trace "${TRACE_RUNGS:-$TOP}"
    ;;
  sanitize)   # between verify and peers (the machine keeps /tmp/fa4 while warm)
    mkdir -p /tmp/fa4 && cp .peers/q2/* /tmp/fa4/
    if [ -n "${SANITIZE:-}" ]; then   # e.g. SANITIZE="features 15;fp16 15": those sets instead of the default
      IFS=';' read -ra sets <<<"$SANITIZE"; a=(); for x in "${sets[@]}"; do a+=(sanitize "$x"); done
      bash scripts/device_job.sh "${a[@]}"
    else   # the top rung's feature and fp16 variants, then every rung from 10 to the top, plain
      bash scripts/device_job.sh sanitize features sanitize fp16 sanitize "$(seq -s ' ' 10 "$TOP")"; fi
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs $((TOP - 2)),$((TOP - 1)),$TOP --causal --rounds 3 --no-errors \
      --shapes 16x16x1024,8x16x2048,4x16x4096,2x16x8192,1x16x16384 --out "$OUT/ab_causal.json" 2>&1 | tail -8
    ;;
  stage)   # stage q3 (carry .peers/q3): one part of FA4's wheels into /tmp/fa4, nothing else
    mkdir -p /tmp/fa4 && cp ".peers/${2:?stage which part, e.g. q3}"/* /tmp/fa4/ && ls /tmp/fa4
    ;;
  first)   # (carry .peers/x1) the first call of a session whatever card comes: stage FA4's first half; on an H200
           # then the ladder (3 rounds, ~4 min: it needs no FA4), and the bench call, carrying .peers/x2, must follow
           # at once; on any other card (an H100 when
           # no H200 started) the card-independent work instead: the top rung's fp16 set under the sanitizers and
           # the causal-order A/B cut at 300 s (head_dim 64 and most of 128 of its ~7 min; an H100's ratios only
           # point the way for the H200's), ~10 min in all, so give the call 600 s: the bench must wait for an H200
    mkdir -p /tmp/fa4 && cp .peers/x1/* /tmp/fa4/ && ls /tmp/fa4
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $gpu"
    case $gpu in
      *H200*) LADDER_ROUNDS=3 timeout 420 bash "$0" ladder
              echo "H200: next, at once, carry .peers/x2: bash scripts/device_calls.sh peers-bench; timeout 240 bash scripts/device_job.sh sanitize fp16" ;;
      *) timeout 270 bash scripts/device_job.sh sanitize fp16; timeout 300 bash "$0" ab-causal-order ;;
    esac
    ;;
  sanitize-below)   # (no carry) compute-sanitizer on the feature, fp16 and long-K/V sets of the rungs below the top
                    # that have them (rungs 10-15 since the re-cut: features without the turns; 12-15 with
                    # three consumer warpgroups at head_dim 64 and on the long-K/V tiles)
    below=$(PYTHONPATH=. python3 -c "from attnclimb import rungs; print(*[r.number for r in rungs.RUNGS if r.features and r is not rungs.TOP])")
    long=$(PYTHONPATH=. python3 -c "from attnclimb import rungs; print(*[r.number for r in rungs.RUNGS if r.long_kv and r is not rungs.TOP])")
    bash scripts/device_job.sh sanitize "features $below" sanitize "fp16 $below" sanitize "long $long"
    ;;
  peers)
    install_fa4 "the A/B and the bench run without it"
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab || echo "make_variants failed: the A/B runs without its variants"
    args=(); for v in ${AB_VARIANTS-}; do
      d=${v#*=}; [ -d "${d%%@*}" ] && args+=(--variant "$v"); done
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $((TOP - 2)),$((TOP - 1)),$TOP "${args[@]}" --rounds 3 \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384,1x12x32760,1x40x75600,1x40x75600x512 --out "$OUT/ab_variants.json" 2>&1 | tail -13
    if [ -n "${SKIP_NCU:-}" ]; then bash scripts/device_job.sh bench "--rounds 2"   # SKIP_NCU=1: the bench only
    else bash scripts/device_job.sh ncu "r$TOP rung$TOP 1x16x16384" ncu "fa4 fa4 1x16x16384" bench "--rounds 2"; fi
    ;;
  peers-bench)   # (carry .peers/q4, after verify, sanitize and stage q3) install FA4, then the full bench only
    install_fa4 "the bench runs without it"
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    bash scripts/device_job.sh bench "--rounds ${BENCH_ROUNDS:-2}"   # BENCH_ROUNDS=3: a median of three (~1.4x the time)
    ;;
  capstone)
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    python3 -m pip install -q --no-index --find-links .peers/video diffusers imageio-ffmpeg imageio &&
      PYTHONPATH=.:$PYTHONPATH python3 -m attnclimb capstone --config wan2.1-1.3b --out "$OUT" 2>&1 | tee "$OUT/capstone-1.3b.log" | tail -20
    ;;
  ab-l2)
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1
    vs=(--variant "l2p256=.ab/base@l2_promotion=256" --variant "l2p128=.ab/base@l2_promotion=128")
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs $TOP "${vs[@]}" --rounds 4 --no-errors \
      --shapes 16x16x1024,4x16x4096,1x16x16384,1x12x32760,1x40x75600,1x40x75600x512 --out "$OUT/ab_l2p.json" 2>&1 | tail -10
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs $TOP "${vs[@]}" --rounds 6 --no-errors --bshd \
      --shapes 1x12x32760,4x16x4096 --out "$OUT/ab_l2p_bshd.json" 2>&1 | tail -6
    ;;
  ab-d64)
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    b=.ab/base; vs=(--variant "n192=$b@block_n=192,kv_box_rows=192" --variant "s3=$b@NUM_STAGES=3"
      --variant "n192s3=$b@block_n=192,kv_box_rows=192,NUM_STAGES=3" --variant "n128s3=$b@block_n=128,kv_box_rows=128,NUM_STAGES=3")
    for c in "" --causal; do
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP "${vs[@]}" --head-dim 64 --rounds 3 --no-errors $c \
        --shapes 4x32x4096,2x32x8192,1x32x16384 --out "$OUT/ab_d64${c#--}.json" 2>&1 | tail -7
    done
    ;;
  ab-dims)   # (no carry, ~4 min; FA4 too if installed) the top rung's head_dim 64 and 256 tiles (thirteenth session):
             # d64 two consumer warpgroups (128 x 128, so P double-buffered and exponentials first; 3 stages; 128 x 176)
             # and three with 64-key tiles and two P buffers; d256 80-key tiles; non-causal and causal
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1   # .ab/base: the top rung's source
    b=.ab/base; w2=block_m=128,threads=384,q_box_rows=128
    vs=(--variant "wg2=$b@$w2" --variant "wg2s3=$b@$w2,NUM_STAGES=3" --variant "wg2n176=$b@$w2,block_n=176,kv_box_rows=176"
      --variant "wg3n64pdb=$b@block_n=64,kv_box_rows=64,P_DOUBLE_BUFFER=1")
    for c in "" --causal; do
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP "${vs[@]}" --head-dim 64 --rounds 3 --no-errors $c \
        --shapes 4x32x4096,2x32x8192,1x32x16384 --out "$OUT/ab_dims_d64${c#--}.json" 2>&1 | tail -7
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --variant "n80=$b@block_n=80,kv_box_rows=80" --head-dim 256 \
        --rounds 3 --no-errors $c --shapes 4x8x4096,2x8x8192,1x8x16384 --out "$OUT/ab_dims_d256${c#--}.json" 2>&1 | tail -7
    done
    ;;
  ab-bshd)   # (no carry, ~6 min; FA4 too if an earlier call installed it) why BSHD views cost 5-7 % on Wan2.1-1.3B
             # (twenty-third session, docs/dropin.md "Strides"): the top rung against `l2pf` (make_variants.py: the
             # producer asks L2 for the K/V tiles 4 loads ahead: first-touch latency) and `hgroup` / `hgroup4` (heads
             # fastest in groups of 12 / 4: the CTAs in flight read neighbouring rows of a BSHD view), on BSHD views,
             # then on contiguous inputs (`ab-bshd views` or `ab-bshd contiguous`: one of them; each builds 8 kernels)
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    case "${2:-both}" in views) layouts=(--bshd) ;; contiguous) layouts=("") ;; both) layouts=(--bshd "") ;;
      *) echo "ab-bshd: views, contiguous or both, not '$2'"; exit 2 ;; esac
    for layout in "${layouts[@]}"; do
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs "$TOP" --variant l2pf=.ab/l2pf \
        --variant hgroup=.ab/hgroup --variant "hgroup4=.ab/hgroup@HEAD_GROUP=4" $layout --rounds 4 --no-errors \
        --shapes 4x16x4096,1x16x16384,1x12x32760 --out "$OUT/ab_bshd_order${layout:+_views}.json" 2>&1 | tail -7
    done
    ;;
  ncu-bshd)   # (no carry, ~4 min) Nsight Compute of the top rung on Wan2.1-1.3B, contiguous and on BSHD views (L2 and
              # DRAM counters, stall reasons): the measurement after ab-bshd if neither variant explains the views' cost
    bash scripts/device_job.sh ncu "top_wan $(printf 'rung%02d' "$TOP") 1x12x32760" \
      ncu "top_wan_bshd $(printf 'rung%02d' "$TOP") 1x12x32760 --bshd"
    for l in top_wan top_wan_bshd; do
      tar -xzOf "$OUT/ncu_$l.tgz" "ncu_$l.txt" | grep -E "Duration|L2 Hit Rate|DRAM Throughput|L2 Cache Throughput|Mem Busy"
    done
    ;;
  ab-top)   # ab-top VARIANT (no carry, ~3 min): the top rung against make_variants.py's VARIANT of it (thirteenth session:
            # sleeptop, its producer's slot waits with a suspend hint; treetop, its tile max and softmax row sums in four
            # chains per row) at head_dim 64 (non-causal and causal) and 128 (with the error table)
    v=${2:?ab-top which variant, e.g. treetop}
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    [ -d ".ab/$v" ] || { echo "ab-top: make_variants.py wrote no variant $v"; exit 2; }
    for c in "" --causal; do
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --variant "$v=.ab/$v" --head-dim 64 --rounds 3 \
        --no-errors $c --shapes 4x32x4096,2x32x8192,1x32x16384 --out "$OUT/ab_${v}_d64${c#--}.json" 2>&1 | tail -7
    done
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --variant "$v=.ab/$v" --rounds 3 \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384,1x12x32760 --out "$OUT/ab_$v.json" 2>&1 | tail -29
    ;;
  diag)
    shift
    mkdir -p /tmp/fa4; for q in .peers/q1 .peers/q2 .peers/q3 .peers/x1; do [ -d $q ] && cp $q/* /tmp/fa4/; done
    { [ -d .peers/q4 ] || [ -d .peers/x2 ]; } && install_fa4 "the diagnostics run without it"
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --variant noload=.ab/noload --variant noexp=.ab/noexp \
      --variant nomax=.ab/nomax \
      --rounds 3 --no-errors --clocks --out "$OUT/diag$(date +%H%M%S).json" "$@" 2>&1 | tail -13
    ;;
  bshd)      # (no carry, ~2 min) issue 9's view/contiguous ratio with 6 interleaved rounds (one bench has 2-3)
    PYTHONPATH=. python3 -c "import json,sys; from attnclimb.bench.dropin import run_bshd_view
json.dump(run_bshd_view(rounds=6), open(sys.argv[1], 'w'), indent=1)" "$OUT/bshd_view_6rounds.json" &&
      python3 -c "import json,sys; [print(r) for r in json.load(open(sys.argv[1])).get('rows', [])]" "$OUT/bshd_view_6rounds.json"
    ;;
  ab-causal-order)   # (no carry, ~7 min; FA4 too if an earlier call installed it) the top rung against `snake`, itself
                     # with CAUSAL_L2_BYTES past any K/V (the heaviest-first snake at every size instead of the pairs),
                     # `dynsched` (works handed out at run time from a counter, heaviest first in L2-sized head groups:
                     # FA4's causal order, persistent) and `hwsched` (the same order, one CTA per tile, the hardware
                     # handing them out: FA4's causal dispatch); scripts/causal_order_model.py predicts +2-9 % at
                     # head_dim 64 where the pairs leave CTAs idle, +2-3 % at 128 and 256 (dynsched; hwsched the same
                     # less a pipeline fill per tile). CAUSAL_ORDER_VARIANTS (default "snake dynsched hwsched") picks
                     # them; `headpairs` (pairs inside each head, the last rounds in a snake) is the fourth
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    vargs=(); for v in ${CAUSAL_ORDER_VARIANTS:-snake dynsched hwsched}; do case $v in
      snake) vargs+=(--variant "snake=.ab/base@CAUSAL_L2_BYTES=1099511627776") ;;
      hwsched) vargs+=(--variant "hwsched=.ab/hwsched@causal_per_tile=1") ;;
      dynsched) vargs+=(--variant "dynsched=.ab/dynsched@sched_slot=1") ;;   # its counters' slot per stream
      *) vargs+=(--variant "$v=.ab/$v") ;; esac; done
    for d in 64 128 256; do
      case $d in 64) shp=4x32x4096,2x32x8192,1x32x16384 ;; 128) shp=16x16x1024,4x16x4096,2x16x8192,1x16x16384 ;;
        256) shp=4x8x4096,2x8x8192,1x8x16384 ;; esac
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs "$TOP" "${vargs[@]}" --head-dim $d --causal --rounds 4 \
        --shapes $shp --out "$OUT/ab_causal_order_d$d.json" 2>&1 | tail -8
    done
    ;;
  trace-d64)   # (no carry, ~1 min) the top rung's head_dim 64 timelines, non-causal and causal, 1x36x4096x4096 (K/V of
               # all heads above CAUSAL_L2_BYTES: the causal tiles go in pairs, as on the bench's 8k d64 causal shape,
               # the one shape where FA4 leads): where the causal build spends the time the non-causal one does not
    mkdir -p "$OUT/timelines-d64"
    for c in "" --causal; do
      PYTHONPATH=. python3 -m attnclimb trace "$TOP" --shape 1x36x4096x4096 --head-dim 64 $c --out "$OUT/timelines-d64" 2>&1 | tail -3
    done
    tar -C "$OUT" -czf "$OUT/timelines-d64.tgz" timelines-d64 && rm -rf "$OUT/timelines-d64"   # not unpacked by after_device.py
    ;;
  ladder)   # (no carry, ~3-4 min) every step of issue 13's ladder in one process: rungs 9 to the top at the headline
            # shapes and Wan2.1-1.3B, 4 rounds (LADDER_ROUNDS), cuDNN beside them, the error table with every rung
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs "$(seq -s , 9 "$TOP")" --rounds "${LADDER_ROUNDS:-4}" \
      --shapes 4x16x4096,2x16x8192,1x16x16384,1x12x32760 --out "$OUT/ab_ladder.json" 2>&1 | tail -31
    ;;
  *) sed -n '2,/^set -uo/p' "$0" | grep '^#'; exit 2 ;;
esac
rm -f "$OUT/.start"
