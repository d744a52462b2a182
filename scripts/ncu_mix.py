"""Instruction mix and stall reasons of an Nsight Compute source page: ``python scripts/ncu_mix.py LABEL=FILE.csv ...``.

FILE.csv is ``ncu -i REPORT --page source --csv --print-source sass`` (what ``scripts/device_job.sh ncu`` writes
into its tgz). Prints, per file, the executed warp instructions by opcode (the part before the first dot) and
the warp-stall samples by reason, as a share of all samples.
"""

import csv
import sys
from collections import Counter


def mix(path):
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], rows[head + 1 :]
    i_src, i_exe = hdr.index("Source"), hdr.index("Instructions Executed")
    i_smp = hdr.index("Warp Stall Sampling (All Samples)")
    stall_cols = [i for i, c in enumerate(hdr) if c.startswith("stall_") and "Not Issued" not in c]
    ops, stalls, samples = Counter(), Counter(), 0
    for r in data:
        if len(r) <= i_exe or not r[i_exe] or not r[i_src]:
            continue
        words = r[i_src].split()
        op = words[1] if words[0].startswith("@") else words[0]
        ops[op.split(".")[0]] += int(r[i_exe].replace(",", ""))
        samples += int(r[i_smp].replace(",", "") or 0)
        for i in stall_cols:
            if r[i]:
                stalls[hdr[i][len("stall_") :]] += int(r[i].replace(",", ""))
    return ops, stalls, samples


def main(argv):
    for spec in argv:
        label, path = spec.split("=", 1)
        ops, stalls, samples = mix(path)
        total = sum(ops.values())
        print(f"== {label}: {total / 1e6:.1f} M warp instructions executed, {samples} stall samples")
        print("  by opcode (M):", ", ".join(f"{k} {v / 1e6:.1f}" for k, v in ops.most_common(24)))
        print("  stalls (% of samples):", ", ".join(f"{k} {100 * v / samples:.1f}" for k, v in stalls.most_common(10)))


if __name__ == "__main__":
    main(sys.argv[1:])
