#!/usr/bin/env bash
# The device calls of one GPU session, each one short command for the device tool (2 000 characters at
# most per command; the machine stays warm 30 s after a call, so each call must follow the last at once):
#   bash scripts/device_calls.sh verify     carry .peers/q1:  stage FA4 part 1, the whole GPU suite, the top rung's timeline
#   bash scripts/device_calls.sh sanitize   carry .peers/q2:  stage FA4 part 2, compute-sanitizer on the feature and fp16 variants and the top two rungs
#   bash scripts/device_calls.sh sanitize-below  (no carry) compute-sanitizer on the feature and fp16 variants of the
#                                           rung below the top
#   bash scripts/device_calls.sh stage q3   carry .peers/q3:  stage FA4 part 3 (nothing else; between sanitize and peers)
#   bash scripts/device_calls.sh peers      carry .peers/q4:  install FA4, A/B of the top three rungs and
#                                           make_variants.py's variants, with FA4 in the same run, ncu of
#                                           the top rung and FA4, the full bench
#   bash scripts/device_calls.sh peers-bench  carry .peers/q4: install FA4 and run the full bench only (no A/B, no ncu)
#   bash scripts/device_calls.sh capstone   (FA4 installed by `peers`; carry .peers/video): docs/capstone.md
#   bash scripts/device_calls.sh ab-17      (no carry, ~5 min) rung 17 against s3, wgarrive, sleep (and pdb0 causal)
# (ab-18, ab-18b, ab-wg3: the staged epilogue's rung, 18 when they ran, 19 since the fifteenth session's re-cut)
#   bash scripts/device_calls.sh ab-18     (no carry, ~5 min) rung 17 against rung 18 with the SM clock and power sampled
#                                           (why rung 18 gains +3 % where its epilogue is 1 % of the time: rung 18's page),
#                                           and rung 18 against wgarrive18 and vfirst18 (make_variants.VARIANTS_OF_18), causal too
#   bash scripts/device_calls.sh ab-18b    (no carry, ~6 min) rung 18 against wgarrive18, vfirst18 and three-warpgroup tiles
#                                           (192 x 80, 192 x 64) at 1k-32k, clocks sampled; wgarrive18 causal
#   bash scripts/device_calls.sh ab-wg3    (no carry, ~3 min) three-warpgroup tiles from 4k keys, non-causal and causal
#                                           (ab-18b and ab-wg3 measured rung 18 before its long-K/V bound moved to 6 144 keys,
#                                           at c356831 / 35ae4f4; on later commits the 192 x 80 variant equals rung 18 from 6k)
#   bash scripts/device_calls.sh ab-l2      (no carry, ~2 min) the top rung against itself with TMA maps that
#                                           fill L2 in 256-B / 128-B units (Rung.l2_promotion), on contiguous
#                                           inputs and on BSHD views (issue 9's view/contiguous goal)
#   bash scripts/device_calls.sh ab-d64     (no carry, ~3 min) head_dim 64 (issue 8: d64 >= cuDNN): the top rung's
#                                           d64 variant against BLOCK_N 192, 3 stages, both, and BLOCK_N 128 with
#                                           3 stages, non-causal and causal; FA4 too if an earlier call installed it
#   bash scripts/device_calls.sh ab-short   (no carry, ~2 min) short K/V (issue 13: 1k and the 512-key cross-attention,
#                                           where cuDNN leads): rung 14 against BLOCK_N 128 with 2 and 3 stages; and
#                                           rung 13 against rung 14 causal at 1k-16k (rung 14's causal gain, unmeasured)
#   bash scripts/device_calls.sh ab-exp2    (no carry, ~4 min) rung 14 against `lround` (l from every rounded P), the
#                                           poly2/poly4/poly8 variants on it (a share of the exponentials on the FMA pipe,
#                                           smx::poly_exp2) and `sleep` (FA4's producer wait), head_dim 128 and 64 (lround,
#                                           poly4, poly8); predictions on rung 14's page
#   bash scripts/device_calls.sh diag [ARGS]  (carry any of .peers/q1-q4 in turn: stages that FA4 part; FA4 is
#                                           timed once q4 is in) the diagnostics noload / noexp / nomax (make_variants.py,
#                                           wrong results, timing only) against the top rung, cuDNN (and FA4) with the SM
#                                           clock and power sampled; ARGS go to ab_rungs.py (e.g. --head-dim 64)
#   bash scripts/device_calls.sh ab-swap    (no carry, ~5 min) rungs 17-19 and rung 17 + rung 19's diff (turns kept): the 18/19 order
#   bash scripts/device_calls.sh ab-10      (no carry, ~5 min) rungs 9, 10 and the top against three placements of the turn
#                                           (make_variants.py sonly10, sonlytop, vfirst10, latearrive10; sixteenth session)
#   bash scripts/device_calls.sh ab-epi11   (no carry, ~3 min) rung 11 with the top rung's staged epilogue, with and without
#                                           the turns, against rungs 9-11 with and without them (sixteenth session)
#   bash scripts/device_calls.sh recut      (~5 min; carry .ab if the machine has no `patch`) the other orders of the ladder:
#                                           ab-epi11's builds and rungs 13-17 with the staged epilogue, with and without
#                                           the turns (make_recut.sh), the top rung without the turns
#   bash scripts/device_calls.sh recut-first  (no carry, ~1.5 min) recut's first step alone: rung 9 against epin and epi
#   bash scripts/device_calls.sh recut-last   (~3 min; carry .ab if the machine has no `patch`) the turns-last order alone,
#                                           8 rounds, with the top rung's long-K/V bound at 6 144 and 32 000 keys
#   bash scripts/device_calls.sh ab-dims    (no carry, ~4 min) head_dim 64 / 256 tiles of the top rung (thirteenth session)
#   bash scripts/device_calls.sh ladder-nopp / d64-ncu / stage q3 / d64-fa4   (carry .peers/q1 / q2 / q3 / q4, back to back) the ladder
#                                           without turns; Nsight Compute of the top rung and FA4 at head_dim 64 (thirteenth session)
#   bash scripts/device_calls.sh ab-top V  (no carry, ~3 min) the top rung against make_variants.py's variant V of it
#                                           (sleeptop: the producer's waits with a suspend hint; treetop: row reductions
#                                           in four chains per row), head_dim 64 and 128
#   bash scripts/device_calls.sh bshd       (no carry, ~2 min) BSHD view vs contiguous, 6 interleaved rounds (issue 9)
# FA4's wheels travel in four parts (.peers/q1-q4, each < 29 MB, since the tracked tree is 31 MB of the 64 MiB a
# call may carry); scripts/split_peers.sh makes them from ../shared/tools/fa4-wheels.sh's .peers/p1 and p2.
# Logs and results under $OUT (at most 8 files come back: the steps pack their folders).
# AB_VARIANTS (default none; e.g. "s3=.ab/base@NUM_STAGES=3" or "lround=.ab/lround", written there by
# make_variants.py) names A/B variants of the top rung for `peers` (other folders under .ab can be carried).
# lround, poly2/4/8 and sleep were measured at 8ac76ca (ab-exp2; rung 14's page), s3, wgarrive, sleep, vfirst and
# latearrive on rung 17 (ab-17; its page): none kept.
set -uo pipefail
# git on the device reports the checkout the session started in (HEAD and "-dirty"), not the tree sent:
# the commit recorded in every JSON comes from ATTNCLIMB_GIT_COMMIT, which each call must set.
: "${ATTNCLIMB_GIT_COMMIT:?set ATTNCLIMB_GIT_COMMIT=<the commit whose tree this call runs>}"
export ATTNCLIMB_GIT_COMMIT OUT=${OUT:-/tmp/out} PYTHONUNBUFFERED=1
TOP=$(PYTHONPATH=. python3 -c "from attnclimb import rungs; print(rungs.TOP.number)")
fa4_path=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site
# The top rung's source with three consumer warpgroups of 64 rows (ab-18b, ab-wg3 add the K/V tile after a comma).
wg3=.ab/base@block_m=192,threads=512,q_box_rows=192
# The fourth call's step: .peers/q4 joined to the parts already in /tmp/fa4, the split wheel put back together, all
# installed into /tmp/site (put on PYTHONPATH with fa4_path). Prints why when it fails; the caller goes on without FA4.
install_fa4() {
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
    if [ -n "${SANITIZE:-}" ]; then   # e.g. SANITIZE="features 15;fp16 15": those sets instead of the top rung's
      IFS=';' read -ra sets <<<"$SANITIZE"; a=(); for x in "${sets[@]}"; do a+=(sanitize "$x"); done
      bash scripts/device_job.sh "${a[@]}"
    else bash scripts/device_job.sh sanitize features sanitize fp16 sanitize "$((TOP - 1)) $TOP"; fi
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs $((TOP - 2)),$((TOP - 1)),$TOP --causal --rounds 3 --no-errors \
      --shapes 16x16x1024,8x16x2048,4x16x4096,2x16x8192,1x16x16384 --out "$OUT/ab_causal.json" 2>&1 | tail -6
    ;;
  stage)   # stage q3 (carry .peers/q3): one part of FA4's wheels into /tmp/fa4, nothing else
    mkdir -p /tmp/fa4 && cp ".peers/${2:?stage which part, e.g. q3}"/* /tmp/fa4/ && ls /tmp/fa4
    ;;
  sanitize-below)   # (no carry) compute-sanitizer on the feature and fp16 variants of the rung below the top
    bash scripts/device_job.sh sanitize "features $((TOP - 1))" sanitize "fp16 $((TOP - 1))"
    ;;
  peers)
    install_fa4 "the A/B and the bench run without it"
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab || echo "make_variants failed: the A/B runs without its variants"
    args=(); for v in ${AB_VARIANTS-}; do
      d=${v#*=}; [ -d "${d%%@*}" ] && args+=(--variant "$v"); done
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $((TOP - 2)),$((TOP - 1)),$TOP "${args[@]}" --rounds 3 \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384,1x12x32760,1x40x75600,1x40x75600x512 --out "$OUT/ab_variants.json" 2>&1 | tail -12
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
  ab-17)     # (no carry, ~5 min) the fourth session's A/B of rung 17 (its page, "Tried on this rung"): three K/V
             # stages, one arrival per consumer warpgroup, the producer's waits with a suspend hint; causal with
             # one P buffer too; head_dim 64 for the arrivals (vfirst and latearrive: --variant vfirst=.ab/vfirst)
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1
    vs=(--variant "s3=.ab/base17@NUM_STAGES=3" --variant wgarrive=.ab/wgarrive --variant sleep=.ab/sleep17)
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 17 "${vs[@]}" --rounds 3 \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384,1x12x32760,1x40x75600,1x40x75600x512 --out "$OUT/ab_top.json" 2>&1 | tail -14
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 17 "${vs[@]}" --variant "pdb0=.ab/base17@P_DOUBLE_BUFFER=0" --causal \
      --rounds 3 --no-errors --shapes 16x16x1024,8x16x2048,4x16x4096,2x16x8192,1x16x16384 --out "$OUT/ab_top_causal.json" 2>&1 | tail -7
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 17 --variant wgarrive=.ab/wgarrive --head-dim 64 --rounds 3 --no-errors \
      --shapes 4x32x4096,1x32x16384 --out "$OUT/ab_top_d64.json" 2>&1 | tail -4
    ;;
  ab-18)
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1
    sh=16x16x1024,4x16x4096,2x16x8192,1x16x16384,1x12x32760,1x40x75600,1x40x75600x512
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 18,19 --clocks --rounds 3 --no-errors --shapes 16x16x1024,1x16x16384,1x40x75600x512 \
      --out "$OUT/ab_18_clocks.json" 2>&1 | tail -6
    vs=(--variant wgarrive18=.ab/wgarrive18 --variant vfirst18=.ab/vfirst18)
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 19 "${vs[@]}" --rounds 3 --shapes $sh --out "$OUT/ab_18.json" 2>&1 | tail -10
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 19 "${vs[@]}" --causal --rounds 3 --no-errors \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384 --out "$OUT/ab_18_causal.json" 2>&1 | tail -6
    ;;
  ab-18b)   # (no carry, ~6 min) rung 18 against wgarrive18, vfirst18 and its three-warpgroup long-K/V tiles (192-row,
            # 80- or 64-key) at every length, with the SM clock sampled; wgarrive18 causal too (seventh session)
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1
    vs=(--variant wgarrive18=.ab/wgarrive18 --variant vfirst18=.ab/vfirst18
      --variant "wg3n80=$wg3,block_n=80,kv_box_rows=80" --variant "wg3n64=$wg3,block_n=64,kv_box_rows=64")
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 19 "${vs[@]}" --rounds 3 --clocks \
      --shapes 16x16x1024,8x16x2048,4x16x4096,2x16x8192,1x16x16384,1x12x32760,1x40x75600x512 --out "$OUT/ab_18b.json" 2>&1 | tail -12
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 19 "${vs[@]:0:2}" --causal --rounds 3 --no-errors \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384 --out "$OUT/ab_18b_causal.json" 2>&1 | tail -6
    ;;
  ab-wg3)   # (no carry, ~3 min) the three-warpgroup tiles from 4k keys: rung 18 against 192 x 80 and 192 x 64 with two
            # P buffers, non-causal (4 rounds, 4k-16k) and causal (192 x 80; 4k-16k) (seventh session)
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1
    vs=(--variant "wg3n80=$wg3,block_n=80,kv_box_rows=80" --variant "wg3n64pdb=$wg3,block_n=64,kv_box_rows=64,P_DOUBLE_BUFFER=1")
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 19 "${vs[@]}" --rounds 4 --clocks --no-errors \
      --shapes 4x16x4096,3x16x6144,2x16x8192,1x16x16384,2x32x8192 --out "$OUT/ab_wg3.json" 2>&1 | tail -14
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 19 "${vs[@]:0:2}" --causal --rounds 3 \
      --shapes 4x16x4096,2x16x8192,1x16x16384 --out "$OUT/ab_wg3_causal.json" 2>&1 | tail -6
    ;;
  ab-l2)
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1
    vs=(--variant "l2p256=.ab/base@l2_promotion=256" --variant "l2p128=.ab/base@l2_promotion=128")
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs $TOP "${vs[@]}" --rounds 4 --no-errors \
      --shapes 16x16x1024,4x16x4096,1x16x16384,1x12x32760,1x40x75600,1x40x75600x512 --out "$OUT/ab_l2p.json" 2>&1 | tail -8
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs $TOP "${vs[@]}" --rounds 6 --no-errors --bshd \
      --shapes 1x12x32760,4x16x4096 --out "$OUT/ab_l2p_bshd.json" 2>&1 | tail -4
    ;;
  ab-d64)
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    b=.ab/base; vs=(--variant "n192=$b@block_n=192,kv_box_rows=192" --variant "s3=$b@NUM_STAGES=3"
      --variant "n192s3=$b@block_n=192,kv_box_rows=192,NUM_STAGES=3" --variant "n128s3=$b@block_n=128,kv_box_rows=128,NUM_STAGES=3")
    for c in "" --causal; do
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP "${vs[@]}" --head-dim 64 --rounds 3 --no-errors $c \
        --shapes 4x32x4096,2x32x8192,1x32x16384 --out "$OUT/ab_d64${c#--}.json" 2>&1 | tail -5
    done
    ;;
  ab-short)
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    b=.ab/base; L=block_n=128,kv_box_rows=128
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --variant "b128s2=$b@$L,NUM_STAGES=2" \
      --variant "b128s3=$b@$L,NUM_STAGES=3" --rounds 4 --no-errors \
      --shapes 16x16x1024,8x16x2048,1x40x75600x512,16x40x1024x512 --out "$OUT/ab_short.json" 2>&1 | tail -6
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs 14,15 --causal --rounds 3 --no-errors \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384 --out "$OUT/ab_causal.json" 2>&1 | tail -6
    ;;
  ab-exp2)   # (no carry, ~4 min; FA4 too if `peers` installed it) issue 13 item 6 and issue 8's head_dim 64
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    vs=(--variant lround=.ab/lround --variant poly4=.ab/poly4 --variant poly8=.ab/poly8 --variant poly2=.ab/poly2
      --variant sleep=.ab/sleep)
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs 14 "${vs[@]}" --rounds 3 \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384,1x12x32760,1x40x75600x512 --out "$OUT/ab_exp2.json" 2>&1 | tail -9
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs 14 "${vs[@]:0:6}" --head-dim 64 --rounds 3 --no-errors \
      --shapes 4x32x4096,2x32x8192,1x32x16384 --out "$OUT/ab_exp2_d64.json" 2>&1 | tail -5
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
        --shapes 4x32x4096,2x32x8192,1x32x16384 --out "$OUT/ab_dims_d64${c#--}.json" 2>&1 | tail -5
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --variant "n80=$b@block_n=80,kv_box_rows=80" --head-dim 256 \
        --rounds 3 --no-errors $c --shapes 4x8x4096,2x8x8192,1x8x16384 --out "$OUT/ab_dims_d256${c#--}.json" 2>&1 | tail -5
    done
    ;;
  ladder-nopp)   # (carry .peers/q1, ~6 min) every rung from 9 to the top against itself without the ping-pong turns
                 # (make_variants.py nopp_ladder): the data for a ladder whose turns come last (thirteenth session)
    [ -d .peers/q1 ] && mkdir -p /tmp/fa4 && cp .peers/q1/* /tmp/fa4/
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1
    # (at b713b2e it also timed `x`, rung 17 without turns + the exponentials first: since the fifteenth session's
    # re-cut that is nopp_ladder's rung 18, so the variant is gone; benchmarks/ab/variants/README.md)
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs $(seq -s, 9 "$TOP") --variant nopp=.ab/nopp_ladder --rounds 3 \
      --shapes 4x16x4096,2x16x8192,1x16x16384,1x12x32760 --out "$OUT/ab_ladder_nopp.json" 2>&1 | tail -26
    ;;
  d64-ncu)   # (carry .peers/q2, right after ladder-nopp) Nsight Compute of the top rung at head_dim 64, B2 H32 S8192
    mkdir -p /tmp/fa4 && cp .peers/q2/* /tmp/fa4/
    bash scripts/device_job.sh ncu "r${TOP}d64 rung$TOP 2x32x8192 --head-dim 64"
    ;;
  d64-fa4)   # (carry .peers/q4, right after d64-ncu and stage q3) FA4 installed; Nsight Compute of FA4 at head_dim 64, and the top
             # rung against cuDNN and FA4 at head_dim 64 with the SM clock sampled, non-causal and causal
    install_fa4 "FA4 not profiled"
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    bash scripts/device_job.sh ncu "fa4d64 fa4 2x32x8192 --head-dim 64"
    for c in "" --causal; do
      PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --head-dim 64 --rounds 3 --no-errors --clocks $c \
        --shapes 4x32x4096,2x32x8192,1x32x16384 --out "$OUT/ab_d64_fa4${c#--}.json" 2>&1 | tail -8
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
        --no-errors $c --shapes 4x32x4096,2x32x8192,1x32x16384 --out "$OUT/ab_${v}_d64${c#--}.json" 2>&1 | tail -5
    done
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --variant "$v=.ab/$v" --rounds 3 \
      --shapes 16x16x1024,4x16x4096,2x16x8192,1x16x16384,1x12x32760 --out "$OUT/ab_$v.json" 2>&1 | tail -28
    ;;
  ab-swap)   # (no carry, ~5 min; fifteenth session) the re-cut's A/B: rungs 17, 18, 19 and `xt`, rung 18's source as a
             # variant of rung 17 (at e26351a, before the re-cut, `xt` was rung 17 + the then rung 19's diff and rungs 18
             # and 19 were the staged epilogue and the exponentials first on it); 5 rounds with the error table; causal 3
    mkdir -p .ab/rung17-xt && cp attnclimb/kernels/18_exp_first.cu .ab/rung17-xt/17_uniform_warp.cu
    x=(--variant xt=.ab/rung17-xt)
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 17,18,19 "${x[@]}" --rounds 5 \
      --shapes 4x16x4096,2x16x8192,1x16x16384,16x16x1024,1x12x32760 --out "$OUT/ab_swap.json" 2>&1 | tail -22
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 17,18,19 "${x[@]}" --causal --rounds 3 --no-errors \
      --shapes 4x16x4096,1x16x16384 --out "$OUT/ab_swap_causal.json" 2>&1 | tail -5
    ;;
  ab-10)   # (no carry, ~5 min; sixteenth session) where the turn sits: rungs 9, 10 and the top against sonly (the turn
           # covers S only), vfirst10 (V waited for before the turn) and latearrive10 (turn handed over after S
           # completes), make_variants.py; 4 rounds with the error table at the headline shapes
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1
    x=(--variant sonly=.ab/sonly10 --variant sonlyt=.ab/sonlytop --variant vfirst=.ab/vfirst10 --variant late=.ab/latearrive10)
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 9,10,"$TOP" "${x[@]}" --rounds 4 \
      --shapes 4x16x4096,2x16x8192,1x16x16384,1x12x32760 --out "$OUT/ab_10.json" 2>&1 | tail -24
    ;;
  ab-epi11)   # (no carry, ~3 min; sixteenth session) issue 13's item 3 on rung 9's kernel: rungs 9, 10, 11, each without the
              # turns (nopp; rung 10 without them is rung 9's schedule: the run's noise), and rung 11 with the top rung's
              # epilogue through shared memory (benchmarks/ab/variants/rung11-epi), with and without the turns
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1   # .ab/epin among them
    st=@smem_layout=tma_ring_staged_o
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 9,10,11 --variant nopp=.ab/nopp_ladder \
      --variant epi=benchmarks/ab/variants/rung11-epi$st --variant epin=.ab/epin$st --rounds 4 \
      --shapes 4x16x4096,2x16x8192,1x16x16384,1x12x32760 --out "$OUT/ab_epi11.json" 2>&1 | tail -24
    ;;
  recut)   # (~5 min; sixteenth and seventeenth sessions) the two other orders of issue 13's ladder (scripts/make_recut.sh;
           # rung 10's page): rung 9 and the top rung against rung 11 + the staged epilogue with and without the turns
           # (epi, epin), rungs 13-17 + the staged epilogue with the turns (e13, e) and without (en13, en), and the top
           # rung without the turns (nopp); rungs 11, 13-17 only carry their variants. 4 rounds with the error table.
           # make_recut.sh needs `patch`: where the machine lacks it, run it here and carry .ab
    if command -v patch > /dev/null; then bash scripts/make_recut.sh .ab || exit 1; else [ -d .ab/recut-en ] || exit 1; fi
    [ -d .ab/nopptop ] || exit 1
    st=smem_layout=tma_ring_staged_o; t128=block_n=128,kv_box_rows=128
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 9,11,13,14,15,16,17,"$TOP" --carriers 11,13,14,15,16,17 \
      --variant epi=benchmarks/ab/variants/rung11-epi@$st --variant epin=.ab/epin@$st \
      --variant e13=.ab/recut-e13@$st,$t128 --variant e=.ab/recut-e@$st,$t128 \
      --variant en13=.ab/recut-en13@$st,$t128 --variant en=.ab/recut-en@$st,$t128 --variant nopp=.ab/nopptop \
      --rounds "${RECUT_ROUNDS:-4}" \
      --shapes 4x16x4096,2x16x8192,1x16x16384,1x12x32760 --out "$OUT/ab_recut.json" 2>&1 | tail -30
    ;;
  recut-last)   # (~3 min; eighteenth session) the turns-last order alone, 8 rounds: rung 9, epin, rungs 13-17 + the staged
                # epilogue without the turns (en13, en), the top rung without them with its long-K/V tiles from 6 144 keys
                # (nopp) and from 32 000 (nopp2: the two-warpgroup tiles at 8k and 16k), the top rung with its tiles from
                # 32 000 (pp2: the turns alone) and as it is (the turns and the three-warpgroup tiles from 6 144 keys)
    if command -v patch > /dev/null; then bash scripts/make_recut.sh .ab > /dev/null || exit 1; else [ -d .ab/recut-en ] || exit 1; fi
    st=smem_layout=tma_ring_staged_o; t128=block_n=128,kv_box_rows=128
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 9,11,13,14,15,16,17,"$TOP" --carriers 11,13,14,15,16,17 \
      --variant epin=.ab/epin@$st --variant en13=.ab/recut-en13@$st,$t128 --variant en=.ab/recut-en@$st,$t128 \
      --variant nopp=.ab/nopptop --variant nopp2=.ab/nopptop@long_kv_from=32000 --variant pp2=.ab/base@long_kv_from=32000 \
      --rounds "${RECUT_ROUNDS:-8}" --no-errors --shapes 4x16x4096,2x16x8192,1x16x16384 --out "$OUT/ab_recut_last.json" 2>&1 | tail -8
    ;;
  recut-first)   # (no carry, ~1.5 min; seventeenth session) the first step of both orders of `recut` alone: rung 9
                 # against rung 11 + the staged epilogue without the turns (epin) and with them (epi), 4 rounds
    PYTHONPATH=. python3 scripts/make_variants.py .ab > /dev/null || exit 1   # .ab/epin among them
    st=@smem_layout=tma_ring_staged_o
    PYTHONPATH=. python3 scripts/ab_rungs.py --rungs 9,11 --carriers 11 --variant epi=benchmarks/ab/variants/rung11-epi$st \
      --variant epin=.ab/epin$st --rounds "${RECUT_ROUNDS:-4}" --shapes 4x16x4096,2x16x8192,1x16x16384,1x12x32760 \
      --out "$OUT/ab_recut_first.json" 2>&1 | tail -30
    ;;
  diag)
    shift
    mkdir -p /tmp/fa4; for q in .peers/q1 .peers/q2 .peers/q3; do [ -d $q ] && cp $q/* /tmp/fa4/; done
    [ -d .peers/q4 ] && install_fa4 "the diagnostics run without it"
    export PYTHONPATH=$fa4_path${PYTHONPATH:+:$PYTHONPATH}
    PYTHONPATH=.:$PYTHONPATH python3 scripts/make_variants.py .ab > /dev/null || exit 1
    PYTHONPATH=.:$PYTHONPATH python3 scripts/ab_rungs.py --rungs $TOP --variant noload=.ab/noload --variant noexp=.ab/noexp \
      --variant nomax=.ab/nomax \
      --rounds 3 --no-errors --clocks --out "$OUT/diag$(date +%H%M%S).json" "$@" 2>&1 | tail -12
    ;;
  bshd)      # (no carry, ~2 min) issue 9's view/contiguous ratio with 6 interleaved rounds (one bench has 2-3)
    PYTHONPATH=. python3 -c "import json,sys; from attnclimb.bench.dropin import run_bshd_view
json.dump(run_bshd_view(rounds=6), open(sys.argv[1], 'w'), indent=1)" "$OUT/bshd_view_6rounds.json" &&
      python3 -c "import json,sys; [print(r) for r in json.load(open(sys.argv[1])).get('rows', [])]" "$OUT/bshd_view_6rounds.json"
    ;;
  *) sed -n 2,30p "$0"; exit 2 ;;
esac
rm -f "$OUT/.start"
