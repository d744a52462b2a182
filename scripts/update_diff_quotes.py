"""Rewrite the ``git diff --no-index --stat`` block that each rung page quotes from the kernel files as they
are now (``python scripts/update_diff_quotes.py``; ``--check`` only reports stale pages, exit 1 if any).

The pages quote the size of the one idea a rung adds; ``tests/test_api_cpu.py`` fails when a quote no
longer matches, and this script is how a change to the kernels refreshes them.
"""

import argparse
import re
import subprocess
import sys

from attnclimb import rungs

ROOT = rungs.KERNEL_DIR.parent.parent


def stat_block(lower, upper) -> str:
    a, b = (str(r.source.relative_to(ROOT)) for r in (lower, upper))
    res = subprocess.run(
        ["git", "diff", "--no-index", "--stat", "--diff-algorithm=myers", a, b],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if res.returncode != 1:
        raise SystemExit(f"git diff failed: {res.stderr}")
    return f"$ git diff --no-index --stat {a} {b}\n{res.stdout.rstrip()}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    stale = []
    for lower, upper in zip(rungs.RUNGS, rungs.RUNGS[1:]):
        page = ROOT / upper.page
        text = page.read_text()
        pat = re.compile(r"\$ git diff --no-index --stat \S+ \S+\n(?: .*\n){2}")
        if not pat.search(text):
            raise SystemExit(f"{page}: no quoted diff stat block")
        block = stat_block(lower, upper)
        new = pat.sub(lambda _, block=block: block, text, count=1)
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if not args.check:
                page.write_text(new)
    print(("stale: " if args.check else "updated: ") + (", ".join(stale) or "none"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
