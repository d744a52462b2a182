"""Compile a rung's ``.cu`` file with NVRTC (through ``cuda.core``) and cache the cubin on disk.

The cache key is the SHA-256 of the source, every ``.cuh`` header beside it, the compile options and
the NVRTC version, so an edited kernel, a changed tile size or a new compiler never hits a stale
cubin. Entries are written to a temporary file and moved into place with ``os.replace`` (atomic on
POSIX), so two processes compiling the same rung at once both end with a whole cubin.

NVRTC needs no GPU: ``python -m attnclimb build`` compiles every rung on a CPU-only machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..rungs import KERNEL_DIR, Rung


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries the compiler log (file:line: error ...)."""


@dataclass(frozen=True)
class Resources:
    """ptxas' resource report for one kernel entry (per thread, per CTA)."""

    kernel: str
    registers: int
    static_smem: int
    stack_frame: int
    spill_stores: int
    spill_loads: int

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass(frozen=True)
class CompiledRung:
    """A compiled rung: ``cubin`` bytes for ``arch``, the ptxas ``log`` and its parsed ``resources``
    (one :class:`Resources` per entry point), ``compile_seconds`` (wall seconds of the original NVRTC
    compile), ``cached`` (served from the disk cache) and ``path`` (the cubin's file in the cache)."""

    rung: Rung
    arch: str
    cubin: bytes
    log: str
    resources: tuple
    compile_seconds: float
    cached: bool
    path: Path


def cache_dir() -> Path:
    """``$ATTNCLIMB_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnclimb``, else ``~/.cache/attnclimb``."""
    env = os.environ.get("ATTNCLIMB_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnclimb"


def nvrtc_version() -> tuple:
    """``(major, minor)`` of the NVRTC library that ``cuda.bindings`` loads; ``RuntimeError`` on failure."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcVersion failed: {err}")
    return (major, minor)


def _include_dirs() -> list:
    import cuda.pathfinder

    cudart = cuda.pathfinder.find_nvidia_header_directory("cudart")
    if cudart is None:
        raise RuntimeError("CUDA runtime headers not found; install them with pip install 'nvidia-cuda-runtime==13.*'")
    return [str(KERNEL_DIR), str(cudart)]


def _options(rung: Rung, arch: str) -> dict:
    return {
        "arch": arch,
        "std": "c++17",
        "defines": sorted(f"{k}={v}" for k, v in rung.defines().items()),
        "ptxas": ["-v"],
        "fmad": True,
    }


def _key(rung: Rung, arch: str) -> str:
    h = hashlib.sha256()
    h.update(rung.source.read_bytes())
    for hdr in sorted(KERNEL_DIR.glob("*.cuh")):
        h.update(hdr.name.encode())
        h.update(hdr.read_bytes())
    cudart = Path(_include_dirs()[1])
    headers = ("cuda_bf16.h", "cuda_bf16.hpp", "cuda_fp16.h", "cuda_fp16.hpp", "math_constants.h", "cuda_runtime_api.h")
    for hdr in headers:
        if (cudart / hdr).exists():  # a new nvidia-cuda-runtime wheel changes these: never reuse old cubins
            h.update((cudart / hdr).read_bytes())
    h.update(json.dumps(_options(rung, arch), sort_keys=True).encode())
    h.update(repr(nvrtc_version()).encode())
    return h.hexdigest()[:32]


_RE_FUNC = re.compile(r"Compiling entry function '(\w+)'")
_RE_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_REGS = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


# What ptxas prints (C7510-C7515, "Potential Performance Loss: ... due to <reason>") when it cannot prove a
# wgmma pipeline safe and makes every wgmma of the kernel wait for itself: correct, but no GEMM overlaps
# anything. `build --strict` and the build tests fail on it.
SERIALIZED_WGMMA = "wgmma.mma_async instructions are serialized"


def parse_ptxas_log(log: str) -> tuple:
    """Resources per entry function from ``ptxas -v`` output (registers, smem, stack, spills)."""
    out, cur, frame = [], None, (0, 0, 0)
    for line in log.splitlines():
        m = _RE_FUNC.search(line)
        if m:
            cur, frame = m.group(1), (0, 0, 0)
            continue
        m = _RE_FRAME.search(line)
        if m and cur:
            frame = tuple(int(x) for x in m.groups())
            continue
        m = _RE_REGS.search(line)
        if m and cur:
            smem = int(m.group(2)) if m.group(2) else 0
            out.append(Resources(cur, int(m.group(1)), smem, *frame))
            cur = None
    return tuple(out)


def _resources(log: str, cubin: bytes) -> tuple:
    """Resources from the ptxas report in ``log``; from the cubin (cuobjdump) when the log has none."""
    found = parse_ptxas_log(log)
    if found:
        return found
    from .sass import resource_usage

    return resource_usage(cubin)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def compile_rung(rung: Rung, arch: str = "sm_90a", use_cache: bool = True) -> CompiledRung:
    """Compile ``rung`` for ``arch`` (default ``sm_90a``) and return its cubin and resource report.

    Raises:
        FileNotFoundError: the rung's ``.cu`` file is missing.
        CompileError: NVRTC rejected the source; the message holds the compiler log with file and line.
        RuntimeError: the CUDA runtime headers (pip ``nvidia-cuda-runtime``) or NVRTC cannot be found.
    """
    if not rung.source.exists():
        raise FileNotFoundError(f"kernel source {rung.source} does not exist")
    key = _key(rung, arch)
    base = cache_dir() / f"{rung.source.stem}-{arch}-{key}"
    cubin_path, meta_path = base.with_suffix(".cubin"), base.with_suffix(".json")
    if use_cache and cubin_path.exists() and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            cubin = cubin_path.read_bytes()
            log, seconds = meta["log"], float(meta["compile_seconds"])
            if cubin and isinstance(log, str):
                return CompiledRung(rung, arch, cubin, log, _resources(log, cubin), seconds, True, cubin_path)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged entry is rebuilt below

    cubin, text, seconds = _nvrtc(rung, rung.source.read_text(), arch)
    try:
        _atomic_write(cubin_path, cubin)
        meta = {"log": text, "compile_seconds": seconds, "options": _options(rung, arch)}
        _atomic_write(meta_path, json.dumps(meta).encode())
    except OSError as exc:  # an unwritable cache costs a recompile next time, never the result
        warnings.warn(f"attnclimb: cannot write the kernel cache in {cubin_path.parent}: {exc}", stacklevel=2)
    return CompiledRung(rung, arch, cubin, text, _resources(text, cubin), seconds, False, cubin_path)


def compile_source(rung: Rung, source: str, arch: str = "sm_90a") -> CompiledRung:
    """Compile ``source`` (a variant of ``rung``'s ``.cu`` text) exactly as :func:`compile_rung` compiles
    ``rung.source``: the same options, macros, include path and program name; never cached.

    For checks that compare two versions of a kernel, e.g. that an untraced build is the source without
    its ``TRACE_*`` lines (``tests/test_trace_cpu.py``). ``path`` of the result is ``rung.source``.
    """
    cubin, text, seconds = _nvrtc(rung, source, arch)
    return CompiledRung(rung, arch, cubin, text, _resources(text, cubin), seconds, False, rung.source)


def _nvrtc(rung: Rung, source: str, arch: str) -> tuple:
    """``(cubin, log, seconds)`` of one NVRTC compile of ``source`` with ``rung``'s options."""
    from cuda.core import Program, ProgramOptions

    opts = _options(rung, arch)
    popts = ProgramOptions(
        name=rung.source.name,
        arch=arch,
        std=opts["std"],
        include_path=_include_dirs(),
        define_macro=[tuple(d.split("=", 1)) for d in opts["defines"]],
        ptxas_options=opts["ptxas"],
        fma=opts["fmad"],
    )
    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        prog = Program(source, "c++", popts)
        obj = prog.compile("cubin", logs=log)
    except Exception as exc:  # cuda.core raises its own error type with NVRTC's log in the message
        raise CompileError(f"NVRTC failed to compile {rung.source} for {arch}:\n{exc}\n{log.getvalue()}") from None
    return bytes(obj.code), log.getvalue(), time.perf_counter() - t0
