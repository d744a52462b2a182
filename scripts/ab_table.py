"""Markdown table of a same-process A/B file (``scripts/ab_rungs.py`` JSON) for a rung page.

``python scripts/ab_table.py FILE BEFORE AFTER [BEFORE AFTER ...]``: one row per shape, TFLOP/s of each
pair (``rung09-old`` and ``rung09``, say), the gain of AFTER over BEFORE, and cuDNN from the same run.
"""

import json
import sys

from attnclimb.bench.shapes import shape_detail


def main(argv):
    doc = json.load(open(argv[0]))
    pairs = list(zip(argv[1::2], argv[2::2]))
    causal = " causal" if doc["meta"].get("causal") else ""
    head = ["shape"] + [f"{b} → {a}" for b, a in pairs] + ["cuDNN"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for row in doc["tflops"]:
        b, h, sq, *sk = row["shape"]
        cells = [shape_detail(b, h, sq, sk[0] if sk else sq) + causal]
        for b, a in pairs:
            cells.append(f"{row[b]:.0f} → {row[a]:.0f} ({(row[a] / row[b] - 1) * 100:+.1f} %)")
        cells.append(f"{row['cudnn']:.0f}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
