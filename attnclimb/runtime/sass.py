"""Disassemble a cubin with ``cuobjdump -sass`` (from the CUDA toolkit or NVIDIA's
``nvidia-cuda-cuobjdump`` + ``nvidia-cuda-nvdisasm`` wheels) so CI can check that a rung really uses the instructions it claims."""

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
