"""The numbers the figures draw, read from where the kernels get them: ``rungs.py`` (tile sizes, threads,
stages, shared memory) and the ``constexpr`` lines of the kernel sources and headers (rows per warp,
register budgets, padding, descriptor fields). Nothing a kernel can change is typed into a figure: when
a rung's tiles or constants change, the regenerated figures follow, and the CI check that compares them
with the committed files fails until they are committed again.
"""

from __future__ import annotations

import ast
import operator
import re
from functools import cache

from .. import rungs

_CONSTEXPR = re.compile(r"^constexpr\s+(?:int|uint32_t|unsigned)\s+(\w+)\s*=\s*([^;]+);", re.MULTILINE)
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,  # C integer division of non-negative values
    ast.Mod: operator.mod,
}


def _eval(expr: str, names: dict) -> int | None:
    """Value of a C integer expression of literals, known names and + - * / %; ``None`` when it has
    anything else (a call, a cast, an unknown name)."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise KeyError(node.id)
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(ast.dump(node))

    expr = re.sub(r"(\d+)u\b", r"\1", expr.strip())  # 0x..u / 16u literals
    try:
        return ev(ast.parse(expr, mode="eval").body)
    except (KeyError, ValueError, SyntaxError):
        return None


def _read_constants(text: str, names: dict) -> dict:
    out = {}
    for name, expr in _CONSTEXPR.findall(text):
        value = _eval(expr, {**names, **out})
        if value is not None:
            out[name] = value
    return out


@cache
def header_constants(header: str) -> dict:
    """File-scope ``constexpr`` integers of ``attnclimb/kernels/<header>`` (with HEAD_DIM known)."""
    return _read_constants((rungs.KERNEL_DIR / header).read_text(), {"HEAD_DIM": rungs.HEAD_DIM})


def constants(number: int) -> dict:
    """Rung ``number``'s compile-time constants: its ``-D`` macros (from ``rungs.py``), the file-scope
    ``constexpr`` integers of the headers it includes, then those of its ``.cu`` file."""
    rung = rungs.get(number)
    text = rung.source.read_text()
    names = dict(rung.defines())
    for header in re.findall(r'#include\s+"(\w+\.cuh)"', text):
        names.update(header_constants(header))
    return {**names, **_read_constants(text, names)}


def need(number: int, *keys: str):
    """The values of ``keys`` among rung ``number``'s constants; a clear error when one is missing (a
    kernel renamed it: the figure that reads it must follow)."""
    c = constants(number)
    missing = [k for k in keys if k not in c]
    if missing:
        raise KeyError(f"rung {number}: no constexpr {', '.join(missing)} in {rungs.get(number).source.name}")
    return c[keys[0]] if len(keys) == 1 else tuple(c[k] for k in keys)


def registers_at_launch(threads: int, register_file: int = 65536) -> int:
    """Registers per thread that ``__launch_bounds__(threads, 1)`` leaves (allocation in units of 8)."""
    return register_file // threads // 8 * 8


@cache
def descriptor_fields() -> dict:
    """The wgmma shared-memory descriptor as built in ``hopper.cuh``: the bit shift of each field and
    the LBO / SBO bytes of the K-major and MN-major descriptors (the MN-major LBO is the caller's panel
    stride)."""
    text = (rungs.KERNEL_DIR / "hopper.cuh").read_text()
    body = text[text.index("make_smem_desc_sw128(uint32_t") :]
    body = body[: body.index("return d;")]
    shifts = [int(s) for s in re.findall(r"<<\s*(\d+)", body)]
    if len(shifts) != 3:
        raise ValueError("hopper.cuh: make_smem_desc_sw128 no longer has the three shifted fields drawn here")
    kmajor = re.search(
        r"desc_kmajor_sw128\(uint32_t smem_addr\)\s*\{\s*return make_smem_desc_sw128\(smem_addr, (\d+), (\d+)\)", text
    )
    mnmajor = re.search(r"return make_smem_desc_sw128\(smem_addr, n_group_stride, (\d+)\)", text)
    if not kmajor or not mnmajor:
        raise ValueError("hopper.cuh: desc_kmajor_sw128 / desc_mnmajor_sw128 changed form")
    return {
        "lbo_shift": shifts[0],
        "sbo_shift": shifts[1],
        "swizzle_shift": shifts[2],
        "kmajor_lbo": int(kmajor.group(1)),
        "kmajor_sbo": int(kmajor.group(2)),
        "mnmajor_sbo": int(mnmajor.group(1)),
    }
