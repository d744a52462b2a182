"""Compile the turns-last re-cut's kernels over a feature matrix (CPU, NVRTC; eighteenth session).

``python scripts/check_recut_builds.py [DIR] [NAME ...]`` with DIR written by ``bash scripts/make_recut.sh DIR``
(default ``.ab``): rung 12 + the staged epilogue without the turns (``en12``) and rungs 13, 15, 16, 17 the same way
(``en13`` ... ``en17``), with the staged layout and the 128-key tiles that ``scripts/device_calls.sh recut-last``
gives rungs 13-17 (``en12`` is timed through ``epin``, whose machine code it builds). At head_dim 64 and 256 each
keeps the rung's own tiles, as a re-cut would: 128 keys where rungs 12-13 had 176, 64 keys at 256. The sixth is the
top rung without the turns with its long-K/V tiles from 32 000 keys (``nopp2``). Together they are the kernels a
re-cut in that order would make rungs 10-15 (rung 10's page, "Eighteenth session"). Each is built plain, with each
feature alone, all features, head_dim 64 and 256, and the long-K/V tiles (where the rung has them), in bf16 and
fp16, and reported with its spills, stack frame and whether ptxas serialized a wgmma. Exit status 1 if any build
has one.
"""

import dataclasses
import itertools
import sys
from pathlib import Path

from attnclimb import rungs
from attnclimb.runtime.compiler import SERIALIZED_WGMMA, compile_source
from attnclimb.runtime.launch import feature_variant

# (causal, gqa, lse, strided, head_dim, seqlen_k)
CASES = [
    (0, 0, 0, 0, 128, None),
    (1, 0, 0, 0, 128, None),
    (0, 1, 0, 0, 128, None),
    (0, 0, 1, 0, 128, None),
    (0, 0, 0, 1, 128, None),
    (1, 1, 1, 1, 128, None),
    (1, 1, 1, 1, 64, None),
    (1, 1, 1, 1, 256, None),
    (0, 0, 0, 0, 64, None),
    (0, 0, 0, 0, 256, None),
    (0, 0, 0, 0, 128, 40000),
]


def builds(d: Path) -> dict:
    """name -> (Rung, source text): the re-cut's kernels with the overrides that ``recut-last`` times them with."""
    t128 = {"block_n": 128, "kv_box_rows": 128}

    def mk(n, path, tiles=True, **fields):
        r = rungs.get(n)
        # rungs 12-13's head_dim 64 tiles are their plain ones (176 keys): they take the 128-key override too
        dims = {h: {**t, **t128} if tiles and not t else t for h, t in r.head_dims.items()}
        r = dataclasses.replace(r, smem_layout="tma_ring_staged_o", head_dims=dims, **(t128 if tiles else {}), **fields)
        return r, (d / path).read_text()

    top = rungs.get(19)
    return {
        "en12": mk(12, "recut-en12/12_wide_tiles.cu"),
        "en13": mk(13, "recut-en13/13_const_desc.cu"),
        "en15": mk(15, "recut-en/15_kept_reference.cu"),
        "en16": mk(16, "recut-en/16_p_double_buffer.cu"),
        "en17": mk(17, "recut-en/17_uniform_warp.cu"),
        "nopp2": mk(19, "nopptop/19_smem_epilogue.cu", tiles=False, long_kv=(32000, top.long_kv[1])),
    }


def main(argv):
    d = Path(argv[0]) if argv else Path(".ab")
    every = builds(d)
    bad = 0
    for name in argv[1:] or list(every):
        r, src = every[name]
        for (causal, gqa, lse, strided, head_dim, seqlen_k), fp16 in itertools.product(CASES, (False, True)):
            if seqlen_k is not None and not r.long_kv:
                continue
            v = feature_variant(r, bool(causal), bool(gqa), bool(lse), bool(strided), head_dim, seqlen_k, fp16)
            c = compile_source(v, src)
            spills = [(x.spill_bytes, x.stack_frame) for x in c.resources]
            serial = SERIALIZED_WGMMA in c.log
            ok = all(s == 0 and f == 0 for s, f in spills) and not serial
            bad += not ok
            verdict = "ok" if ok else f"SPILLS (bytes, stack) {spills}" + (" SERIALIZED WGMMA" if serial else "")
            flags = f"c{causal}g{gqa}l{lse}s{strided} d{head_dim} k{seqlen_k} {'fp16' if fp16 else 'bf16'}"
            tiles = f"{v.block_m}x{v.block_n}"
            print(f"{name:6} {flags:28} {tiles:8} {verdict}", flush=True)
    print(f"{bad} build(s) with spills, stack or serialized wgmmas")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
