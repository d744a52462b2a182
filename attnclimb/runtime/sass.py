"""Disassemble a cubin with ``cuobjdump -sass`` (from the CUDA toolkit or NVIDIA's
``nvidia-cuda-cuobjdump`` + ``nvidia-cuda-nvdisasm`` wheels) so CI can check that a rung really uses the
instructions it claims."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def find_cuobjdump() -> str | None:
    """Path of a ``cuobjdump`` executable, or ``None``: $PATH first, then the pip wheel's ``nvidia/cu*/bin``."""
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    try:
        import nvidia

        for base in map(Path, nvidia.__path__):
            for cand in sorted(base.glob("cu*/bin/cuobjdump")) + sorted(base.glob("cuda_cuobjdump/bin/cuobjdump")):
                if os.access(cand, os.X_OK):
                    return str(cand)
    except ImportError:
        pass
    return None


def sass(cubin: bytes) -> str:
    """SASS text of ``cubin``; ``RuntimeError`` when no cuobjdump is installed or it fails."""
    exe = find_cuobjdump()
    if exe is None:
        raise RuntimeError("cuobjdump not found: pip install nvidia-cuda-cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        # cuobjdump delegates sm_90 disassembly to nvdisasm; the wheels install both in one bin folder.
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(exe) + os.pathsep + env.get("PATH", "")
        env.setdefault("NVDISASM_PATH", os.path.dirname(exe))
        res = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {res.stderr.strip()}")
    return res.stdout


def resource_usage(cubin: bytes) -> tuple:
    """Per-kernel resources read from the cubin itself (``cuobjdump --dump-resource-usage``).

    A fallback for NVRTC builds whose log carries no ``ptxas -v`` report (seen with the NVRTC 13.0 that
    torch's CUDA wheels bring on the H200 machines). ``LOCAL`` (local memory per thread: spills and
    stack) is reported as spill stores; the 1 KB that sm_90 reserves in every CTA's shared memory is
    subtracted from ``SHARED``. Returns ``()`` when no cuobjdump is installed.
    """
    import re

    from .compiler import Resources

    if find_cuobjdump() is None:
        return ()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([find_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True)
    out, name = [], None
    for line in res.stdout.splitlines():
        m = re.match(r"\s*Function (\w+):", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and name:
            reg, stack, shared, local = (int(x) for x in m.groups())
            out.append(Resources(name, reg, max(shared - 1024, 0), stack, local, 0))
            name = None
    return tuple(out)
