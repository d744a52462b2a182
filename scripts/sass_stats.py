"""Static SASS instruction counts per rung (no GPU needed): ``python scripts/sass_stats.py [RUNG ...]``.

Used to check that a change costs what it should (e.g. issue 6's fix: the same FFMA/MUFU per score) and
that a pure refactor leaves the machine code alone (``--hash`` prints a digest of each rung's SASS).
"""

import argparse
import collections
import re

from attnclimb import rungs
from attnclimb.runtime import compile_rung
from attnclimb.runtime.sass import sass, sass_body, sass_digest

OPS = ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "FSEL", "FSETP", "HMMA", "HGMMA", "SHFL", "BRA", "LDL", "STL")


def stats(rung):
    cubin = compile_rung(rung).cubin
    body = sass_body(sass(cubin))
    ops = collections.Counter()
    for ln in body:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", ln)
        if m:
            ops[m.group(1)] += 1
    return len(body), ops, sass_digest(cubin)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("rung", type=int, nargs="*")
    ap.add_argument("--hash", action="store_true", help="also print a digest of the SASS text")
    args = ap.parse_args()
    sel = [rungs.get(n) for n in args.rung] if args.rung else rungs.RUNGS
    print("rung   total " + " ".join(f"{o:>6}" for o in OPS) + ("  sass-digest" if args.hash else ""))
    for r in sel:
        n, ops, digest = stats(r)
        print(f"{r.key} {n:6d} " + " ".join(f"{ops[o]:6d}" for o in OPS) + (f"  {digest}" if args.hash else ""))


if __name__ == "__main__":
    main()
