"""Markdown table of a same-process A/B file (``scripts/ab_rungs.py`` JSON) for a rung page.

``python scripts/ab_table.py FILE BEFORE AFTER [BEFORE AFTER ...]``: one row per shape, TFLOP/s of each
pair (``rung09-old`` and ``rung09``, say), the gain of AFTER over BEFORE, and cuDNN from the same run.
"""

import json
import sys

NAMES = {
    (16, 16, 1024): "1k (B16 H16)",
    (4, 16, 4096): "4k (B4 H16)",
    (2, 16, 8192): "8k (B2 H16)",
    (1, 16, 16384): "16k (B1 H16)",
    (1, 12, 32760): "Wan2.1-1.3B (B1 H12 S32760)",
    (1, 40, 75600): "Wan2.1-14B (B1 H40 S75600)",
}


def main(argv):
    doc = json.load(open(argv[0]))
    pairs = list(zip(argv[1::2], argv[2::2]))
    causal = " causal" if doc["meta"].get("causal") else ""
    head = ["shape"] + [f"{b} → {a}" for b, a in pairs] + ["cuDNN"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for row in doc["tflops"]:
        shape = tuple(row["shape"])
        cells = [NAMES.get(shape, "x".join(map(str, shape))) + causal]
        for b, a in pairs:
            cells.append(f"{row[b]:.0f} → {row[a]:.0f} ({(row[a] / row[b] - 1) * 100:+.1f} %)")
        cells.append(f"{row['cudnn']:.0f}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
