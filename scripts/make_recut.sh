#!/usr/bin/env bash
# The other order of issue 13's ladder (sixteenth session; rung 10's page, "Revisited"), as A/B variants:
#   rung 9 -> persistent grid + epilogue through shared memory, no turns (issue 13's item 3: `epin`) -> the ping-pong
#   turns (`epi`) -> rungs 13-17's ideas, each with the top rung's epilogue (`e13`, `e`) -> the top rung
# `bash scripts/make_recut.sh [OUT]` (default .ab) writes
#   OUT/epin/11_persistent.cu     benchmarks/ab/variants/rung11-epi without the turns (make_variants.py writes it, with
#                                 its other variants)
#   OUT/recut-e13/13_const_desc.cu, OUT/recut-e/{14..17}_*.cu
#                                 rungs 13-17 with rung 19's diff over rung 18 (the staged epilogue) applied by patch
#   OUT/recut-en13, OUT/recut-en  the same without the turns (make_variants.py's nopp; seventeenth session): the order
#                                 with the turns last, rung 9 -> epin -> en13 -> en 14-17 -> nopptop -> the top rung
#   OUT/recut-e12, OUT/recut-en12 rung 12 the same way (eighteenth session): with 128-key tiles, the kernel a re-cut's
#                                 first rung would be (persistent grid + staged epilogue, and rung 12's compile-time
#                                 features); its plain build is epin's machine code, a few prologue lines placed or
#                                 allocated otherwise
# Time them with `scripts/device_calls.sh recut` (its overrides: smem_layout=tma_ring_staged_o, 128-key tiles where a
# rung had 176; each rung keeps its long-K/V bound, 32 000 keys, so that the P double buffer and the exponentials
# first, which the three-warpgroup tiles lack, run at 8k and 16k). Rung 12's 176-key tiles do not fit beside the
# staging tile (246 784 B), so that order has no wide-tiles step: the top rung does not use them at head_dim 128
# either. Its last step is the top rung itself: the exponentials first, with the long-K/V bound at 6 144 keys as the
# staged epilogue's rung has it now (the bound pays only with the epilogue: rung 19's page).
set -euo pipefail
out=${1:-.ab}
K=attnclimb/kernels
mkdir -p "$out/recut-e12" "$out/recut-e13" "$out/recut-e" "$out/recut-en12" "$out/recut-en13" "$out/recut-en"
PYTHONPATH=. python3 scripts/make_variants.py "$out" > /dev/null  # writes $out/epin among its variants
diff -u "$K/18_exp_first.cu" "$K/19_smem_epilogue.cu" > "$out/epilogue.diff" || [ $? -eq 1 ]
for f in 12_wide_tiles 13_const_desc 14_lazy_rescale 15_kept_reference 16_p_double_buffer 17_uniform_warp; do
  d="$out/recut-e"; [ "$f" = 13_const_desc ] && d="$out/recut-e13"; [ "$f" = 12_wide_tiles ] && d="$out/recut-e12"
  cp "$K/$f.cu" "$d/"
  patch -s --no-backup-if-mismatch -F3 "$d/$f.cu" < "$out/epilogue.diff"
  # the fuzz lets the header's hunk apply over another header: check that exactly the diff's lines changed
  changed() { grep -E '^[-+]' | grep -vE '^(\+\+\+|---) ' | sort; }
  if ! cmp -s <(changed < "$out/epilogue.diff") <(diff -u "$K/$f.cu" "$d/$f.cu" | changed); then
    echo "make_recut: rung 19's epilogue diff did not apply to $f line for line" >&2
    exit 1
  fi
  sed -i "1i // A/B VARIANT (scripts/make_recut.sh), not a rung: $f.cu + rung 19's diff over rung 18 (the epilogue\\
// through shared memory). The header below is rung 19's; this kernel has rung $((10#${f%%_*}))'s ideas, not the exponentials first." "$d/$f.cu"
done
# the turns-last order: the same kernels without the turns
PYTHONPATH=. python3 - "$out" <<'PY'
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("make_variants", "scripts/make_variants.py")
mv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mv)
out = Path(sys.argv[1])
for d in ("recut-e12", "recut-e13", "recut-e"):
    for f in (out / d).glob("*.cu"):
        note = "// Without the ping-pong turns (make_variants.py's nopp): the turns-last order.\n"
        (out / d.replace("recut-e", "recut-en") / f.name).write_text(note + mv.nopp(f.read_text()))
PY
echo "wrote $out/epin $out/recut-e12 $out/recut-e13 $out/recut-e $out/recut-en12 $out/recut-en13 $out/recut-en"
