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


def sass_body(text: str) -> list:
    """The instruction lines of ``cuobjdump -sass`` output (those that start with an address comment)."""
    import re

    return [ln for ln in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]  # 5 digits past 0xffff


def sass_instructions(cubin: bytes) -> list:
    """The instructions of ``cubin`` in order, one string each (mnemonic, operands, branch targets; without the
    address comments and the encodings' scheduling bits). Needs cuobjdump (:func:`sass`)."""
    import re

    return [re.sub(r"/\*[0-9a-f]+\*/", "", ln).split(";")[0].strip() for ln in sass_body(sass(cubin))]


def sass_digest(cubin: bytes) -> str:
    """A 12-hex-digit digest of :func:`sass_instructions` of ``cubin``: what ``scripts/sass_stats.py --hash``
    prints. Needs cuobjdump (:func:`sass`)."""
    import hashlib

    return hashlib.sha256("\n".join(sass_instructions(cubin)).encode()).hexdigest()[:12]


def code_sections(cubin: bytes) -> dict:
    """``{section name: bytes}`` of the machine code in a cubin (its ``.text.<kernel>`` ELF sections),
    control bits included: two builds whose sections are equal run the same instructions with the same
    scheduling. Reads the ELF64 section headers itself (no cuobjdump needed); ``ValueError`` for
    anything that is not a little-endian ELF64 file."""
    import struct

    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a little-endian ELF64 cubin")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)

    def header(i):
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
        return name, offset, size

    _, str_off, str_size = header(shstrndx)
    names = cubin[str_off : str_off + str_size]
    out = {}
    for i in range(shnum):
        name_off, offset, size = header(i)
        name = names[name_off : names.index(b"\0", name_off)].decode()
        if name.startswith(".text."):
            out[name] = bytes(cubin[offset : offset + size])
    return out
