"""Command line: ``python -m attnclimb build | diff | bench | report | figures | trace | capstone | video |
cp-bench``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

DESCRIPTION = "A ladder of attention forward kernels for NVIDIA Hopper: compile, compare, benchmark and report them."
EPILOG = """examples:
  python -m attnclimb build --strict     compile every rung for sm_90a, fail on any spill or serialised wgmma
  python -m attnclimb diff 7             what rung 8 adds to rung 7 (its .cu diff and its rungs.py entry)
  python -m attnclimb bench --quick      time the rungs and the peers (needs a Hopper GPU)
  python -m attnclimb report             README table, rung pages and chart from the latest results
  python -m attnclimb figures            redraw the rung pages' diagrams (docs/figures, no GPU needed)
  python -m attnclimb trace 10           measured timeline of rung 10's warpgroups (needs a Hopper GPU)
  python -m attnclimb capstone           one Wan2.1 denoising step per attention route (diffusers)
  python -m attnclimb video sample       sample videos with attnclimb and with SDPA from the same noise
  torchrun --nproc-per-node 2 -m attnclimb cp-bench
                                         ring and Ulysses attention on 2 GPUs against one (Hopper GPUs)"""


def _cmd_build(args) -> int:
    from . import rungs
    from .runtime import CompileError, compile_rung
    from .runtime.compiler import SERIALIZED_WGMMA

    selected = [rungs.get(n) for n in args.rung] if args.rung else list(rungs.RUNGS)
    if args.trace:  # the TRACE=1 builds of the instrumented rungs (attnclimb/kernels/trace.cuh)
        from .trace import instrumented, traced

        selected = [traced(r) for r in selected if instrumented(r)]
    rows, failed, serialized = [], [], []
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
            rows.append(
                (
                    r.key + ("+trace" if args.trace else ""),
                    res.kernel,
                    res.registers,
                    res.static_smem + r.smem_bytes,
                    res.stack_frame,
                    res.spill_bytes,
                    f"{c.compile_seconds:.2f}" + (" (cached)" if c.cached else ""),
                )
            )
        if SERIALIZED_WGMMA in c.log:  # ptxas C7513/C7515...: every wgmma of the kernel waits for itself
            serialized.append(r.key)
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
    if serialized:
        print(f"ptxas serialised the wgmmas of: {', '.join(serialized)} (-v prints why)", file=sys.stderr)
    if failed:
        print(f"failed to compile: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or ((spills or serialized) and args.strict) else 0


def _cmd_bench(args) -> int:
    from .bench import run

    return run.main(args)


def _cmd_report(args) -> int:
    from .bench import report

    return report.main(args)


def _cmd_figures(args) -> int:
    from . import figures

    return figures.main(args)


def _cmd_trace(args) -> int:
    from . import trace

    return trace.main(args)


def _cmd_capstone(args) -> int:
    from . import capstone

    return capstone.main(args)


def _cmd_video(args) -> int:
    from .video import cli

    return cli.main(args)


def _cmd_cp_bench(args) -> int:
    from .bench import cp

    return cp.main(args)


def _display_path(path: Path) -> str:
    """``path`` relative to the folder holding the package, the repository root in a checkout
    (``attnclimb/kernels/07_….cu``); as given when it lies elsewhere."""
    from .bench.paths import REPO_ROOT

    try:
        return Path(path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def _unified_diff(a, b) -> list:
    """Unified diff lines of two files, headed ``--- a/<path>`` / ``+++ b/<path>`` with paths relative to
    the repository root: git's (Myers) when git is installed, so the counts match the
    ``git diff --no-index --stat`` lines the rung pages quote; Python's difflib otherwise."""
    import difflib
    import shutil
    import subprocess

    from .bench.paths import REPO_ROOT

    a_name, b_name = _display_path(a), _display_path(b)
    if shutil.which("git"):
        relative = not Path(a_name).is_absolute() and not Path(b_name).is_absolute()
        opts = ["--no-index", "--no-color", "--no-ext-diff", "--no-textconv", "--diff-algorithm=myers"]
        prefixes = ["--src-prefix=a/", "--dst-prefix=b/"]  # whatever diff.noprefix etc. say in the user's config
        files = [a_name, b_name] if relative else [str(a), str(b)]
        res = subprocess.run(
            ["git", "diff", *opts, *prefixes, "--", *files],
            cwd=REPO_ROOT if relative else None,
            capture_output=True,
            text=True,
        )
        if res.returncode in (0, 1):
            lines = res.stdout.splitlines(True)
            start = next((i for i, line in enumerate(lines) if line.startswith("--- ")), len(lines))
            return lines[start:]
    a_lines, b_lines = a.read_text().splitlines(True), b.read_text().splitlines(True)
    return list(difflib.unified_diff(a_lines, b_lines, f"a/{a_name}", f"b/{b_name}"))


def _rung_entry(rung) -> dict:
    """The fields of ``rung``'s ``rungs.py`` entry as ``{label: value}`` (``extra_defines`` one per macro),
    and the shared memory they imply; ``number`` and ``name`` are left out, the diff headers name them."""
    import dataclasses

    entry = {}
    for f in dataclasses.fields(rung):
        value = getattr(rung, f.name)
        if f.name in ("number", "name"):
            continue
        if f.name == "extra_defines":
            entry.update({f"extra_defines[{k!r}]": v for k, v in sorted(value.items())})
        else:
            entry[f.name] = value
    entry["smem_bytes"] = rung.smem_bytes  # derived from smem_layout, tiles and NUM_STAGES: show it too
    return entry


def _entry_diff(lower, upper) -> tuple:
    """``(lines, changed)``: a unified diff of the two rungs' ``rungs.py`` entries with every field as
    context, and the labels of the fields that differ (``idea`` left out). No lines when equal."""
    import difflib

    from . import rungs

    a, b = _rung_entry(lower), _rung_entry(upper)
    changed = [k for k in dict.fromkeys([*a, *b]) if k != "idea" and a.get(k, ...) != b.get(k, ...)]
    a_lines = [f"{k} = {v!r}\n" for k, v in a.items()]
    b_lines = [f"{k} = {v!r}\n" for k, v in b.items()]
    path = _display_path(Path(rungs.__file__))
    lines = list(
        difflib.unified_diff(
            a_lines,
            b_lines,
            f"a/{path} ({lower.key} {lower.name})",
            f"b/{path} ({upper.key} {upper.name})",
            n=max(len(a_lines), len(b_lines)),
        )
    )
    return lines, changed


def _cmd_diff(args) -> int:
    from . import rungs

    lower, upper = rungs.get(args.lower), rungs.get(args.upper)
    diff = _unified_diff(lower.source, upper.source)
    entry, changed = _entry_diff(lower, upper)
    sys.stdout.writelines(diff)
    if entry:
        sys.stdout.write("\n" if diff else "")
        sys.stdout.writelines(entry)
    sys.stdout.flush()
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    idea = f" ({upper.idea})" if upper.number == lower.number + 1 else ""
    params = f"; rungs.py: {', '.join(changed)} changed" if changed else ""
    print(f"\n{lower.key} -> {upper.key}{idea}: {added} insertions(+), {removed} deletions(-){params}", file=sys.stderr)
    return 0


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (``... | head``): stop without a traceback, as git does, and with
    the status a shell reports for a process ended by SIGPIPE (141)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush of stdout goes nowhere
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a file descriptor
        pass
    return 128 + getattr(signal, "SIGPIPE", 13)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m attnclimb",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(
        dest="cmd", required=True, metavar="{build,diff,bench,report,figures,trace,capstone,video,cp-bench}"
    )
    b = sub.add_parser(
        "build",
        help="compile every rung (no GPU needed) and print their resources",
        description="Compile every rung with NVRTC (no GPU needed) and print registers, shared "
        "memory, stack, spills and compile time per kernel.",
    )
    b.add_argument("--rung", type=int, action="append", help="only this rung (repeatable)")
    b.add_argument("--arch", default="sm_90a", help="NVRTC target architecture (default: %(default)s)")
    b.add_argument(
        "--no-cache",
        action="store_true",
        help="compile again even when the kernel cache holds a cubin (and refresh the cache)",
    )
    b.add_argument(
        "--strict", action="store_true", help="exit non-zero on any spill or wgmmas serialised by ptxas (C7513, C7515)"
    )
    b.add_argument(
        "--trace",
        action="store_true",
        help="compile the trace builds (TRACE=1) of the instrumented rungs instead (see `trace`)",
    )
    b.add_argument("-v", "--verbose", action="store_true", help="print the ptxas log")
    from .bench import report as _report
    from .bench import run as _run

    d = sub.add_parser(
        "diff",
        help="show the one idea between two rungs (default: RUNG and the rung above)",
        description="Show what separates two rungs: the unified diff of their .cu files, then "
        "the diff of their rungs.py entries (tile sizes, threads, shared memory, ...). "
        "A summary with the .cu diff's size goes to stderr.",
    )
    d.add_argument("lower", type=int, metavar="RUNG", help="the rung to diff from")
    d.add_argument(
        "upper",
        type=int,
        nargs="?",
        metavar="UPPER",
        help="the rung to diff to (default: RUNG + 1, the rung that adds one idea to RUNG)",
    )
    _run.add_arguments(
        sub.add_parser(
            "bench", help="time every rung and peer on the H200 (needs a Hopper GPU)", description=_run.DESCRIPTION
        )
    )
    _report.add_arguments(
        sub.add_parser(
            "report", help="README results table + chart from a results JSON", description=_report.DESCRIPTION
        )
    )
    from . import figures as _figures

    _figures.add_arguments(
        sub.add_parser(
            "figures",
            help="draw the rung pages' diagrams into docs/figures (SVG, no GPU needed)",
            description=_figures.DESCRIPTION,
        )
    )
    from . import trace as _trace

    _trace.add_arguments(
        sub.add_parser(
            "trace",
            help="measured timeline of a rung's warpgroups: %%globaltimer stamps, Gantt chart (needs a Hopper GPU)",
            description=_trace.DESCRIPTION,
        )
    )
    from . import capstone as _capstone

    _capstone.add_arguments(
        sub.add_parser(
            "capstone",
            help="time a Wan2.1 denoising step per attention route (diffusers; --config tiny on a CPU)",
            description=_capstone.DESCRIPTION,
        )
    )
    from .video import cli as _video

    _video.add_arguments(
        sub.add_parser(
            "video",
            help="train a small video DiT on generated clips, sample with attnclimb and SDPA (MP4, GIF, PNG)",
            description=_video.DESCRIPTION,
        )
    )
    from .bench import cp as _cp

    _cp.add_arguments(
        sub.add_parser(
            "cp-bench",
            help="context-parallel attention (ring, Ulysses) on N GPUs against one; launch with torchrun",
            description=_cp.DESCRIPTION,
        )
    )
    args = p.parse_args(argv)
    from . import rungs

    top = max(rungs.BY_NUMBER)
    if args.cmd == "diff" and args.upper is None and args.lower in rungs.BY_NUMBER:
        if args.lower == top:
            p.error(f"rung {top} is the top rung: there is no rung above it (try: diff {top - 1} {top})")
        args.upper = args.lower + 1  # the rung above: the one idea it adds
    asked = (args.rung or []) if args.cmd == "build" else [args.lower, args.upper] if args.cmd == "diff" else []
    if args.cmd == "trace":
        asked = [args.rung]
    for n in asked:
        if n is not None and n not in rungs.BY_NUMBER:
            p.error(f"unknown rung {n}; available: {min(rungs.BY_NUMBER)}..{top} ({top} is the top rung)")
    handler = {
        "build": _cmd_build,
        "bench": _cmd_bench,
        "report": _cmd_report,
        "diff": _cmd_diff,
        "figures": _cmd_figures,
        "trace": _cmd_trace,
        "capstone": _cmd_capstone,
        "video": _cmd_video,
        "cp-bench": _cmd_cp_bench,
    }[args.cmd]
    try:
        rc = handler(args)
        sys.stdout.flush()  # a closed pipe shows up here at the latest, not in the interpreter's exit
        return rc
    except BrokenPipeError:
        return _quiet_broken_pipe()


if __name__ == "__main__":
    sys.exit(main())
