"""Command line: ``python -m attnclimb build | bench | report | diff``."""

from __future__ import annotations

import argparse
import sys


def _cmd_build(args) -> int:
    from . import rungs
    from .runtime import CompileError, compile_rung

    selected = [rungs.get(n) for n in args.rung] if args.rung else list(rungs.RUNGS)
    rows, failed = [], []
    for r in selected:
        try:
            c = compile_rung(r, arch=args.arch, use_cache=not args.no_cache)
        except (CompileError, FileNotFoundError) as exc:
            print(exc, file=sys.stderr)
            failed.append(r.key)
            continue
        missing = set(r.kernel_names) - {res.kernel for res in c.resources}
        if missing:
            print(f"{r.key}: ptxas reported no resources for {sorted(missing)}", file=sys.stderr)
            failed.append(r.key)
        for res in c.resources:
            rows.append((r.key, res.kernel, res.registers, res.static_smem + r.smem_bytes, res.stack_frame,
                         res.spill_bytes, f"{c.compile_seconds:.2f}" + (" (cached)" if c.cached else "")))
        if args.verbose:
            print(c.log)
    from .runtime.compiler import nvrtc_version

    print(f"NVRTC {'.'.join(map(str, nvrtc_version()))}, target {args.arch}")
    hdr = ("rung", "kernel", "regs/thread", "smem B/CTA", "stack B", "spill B", "compile s")
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    for row in (hdr, *rows):
        print("  ".join(str(x).rjust(w) for x, w in zip(row, widths)))
    spills = [row for row in rows if row[5]]
    if spills:
        print(f"spills in: {', '.join(f'{r[0]}:{r[1]}' for r in spills)}", file=sys.stderr)
    if failed:
        print(f"failed to compile: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or (spills and args.strict) else 0


def _cmd_bench(args) -> int:
    from .bench import run

    return run.main(args)


def _cmd_report(args) -> int:
    from .bench import report

    return report.main(args)


def _unified_diff(a, b) -> list:
    """Unified diff lines of two files: git's (Myers) when git is installed, so the counts match the
    ``git diff --no-index --stat`` lines the rung pages quote; Python's difflib otherwise."""
    import difflib
    import shutil
    import subprocess

    if shutil.which("git"):
        res = subprocess.run(["git", "diff", "--no-index", "--no-color", "--diff-algorithm=myers", str(a), str(b)],
                             capture_output=True, text=True)
        if res.returncode in (0, 1):
            lines = res.stdout.splitlines(True)
            start = next((i for i, line in enumerate(lines) if line.startswith("--- ")), len(lines))
            return lines[start:]
    return list(difflib.unified_diff(a.read_text().splitlines(True), b.read_text().splitlines(True),
                                     f"a/{a.name}", f"b/{b.name}"))


def _cmd_diff(args) -> int:
    from . import rungs

    lower, upper = rungs.get(args.lower), rungs.get(args.upper)
    diff = _unified_diff(lower.source, upper.source)
    sys.stdout.writelines(diff)
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    idea = f" ({upper.idea})" if upper.number == lower.number + 1 else ""
    print(f"\n{lower.key} -> {upper.key}{idea}: {added} insertions(+), {removed} deletions(-)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnclimb", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile every rung (no GPU needed) and print their resources")
    b.add_argument("--rung", type=int, action="append", help="only this rung (repeatable)")
    b.add_argument("--arch", default="sm_90a")
    b.add_argument("--no-cache", action="store_true")
    b.add_argument("--strict", action="store_true", help="exit non-zero on any spill")
    b.add_argument("-v", "--verbose", action="store_true", help="print the ptxas log")
    from .bench import report as _report, run as _run

    d = sub.add_parser("diff", help="show the one idea between two rungs (default: RUNG and the rung above)")
    d.add_argument("lower", type=int)
    d.add_argument("upper", type=int, nargs="?")
    _run.add_arguments(sub.add_parser("bench", help="time every rung and peer on the H200 (needs a Hopper GPU)"))
    _report.add_arguments(sub.add_parser("report", help="README results table + chart from a results JSON"))
    args = p.parse_args(argv)
    from . import rungs

    if args.cmd == "diff" and args.upper is None:
        args.upper = args.lower + 1  # the rung above: the one idea it adds
    asked = (args.rung or []) if args.cmd == "build" else [args.lower, args.upper] if args.cmd == "diff" else []
    for n in asked:
        if n not in rungs.BY_NUMBER:
            p.error(f"unknown rung {n}; available: {min(rungs.BY_NUMBER)}..{max(rungs.BY_NUMBER)}")
    return {"build": _cmd_build, "bench": _cmd_bench, "report": _cmd_report, "diff": _cmd_diff}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
