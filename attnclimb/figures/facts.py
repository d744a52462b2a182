"""The numbers the figures draw, read from where the kernels get them: ``rungs.py`` (tile sizes, threads,
stages, shared memory) and the ``constexpr`` lines of the kernel sources and headers (rows per warp,
register budgets, padding, descriptor fields). Nothing a kernel can change is typed into a figure: when
a rung's tiles or constants change, the regenerated figures follow, and the CI check that compares them
with the committed files fails until they are committed again.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
from functools import cache

from .. import rungs

# The GPU the ladder is measured on, an H200 (the H100 SXM has the same): its number of SMs, and the most
# dynamic shared memory one CTA may opt in to on sm_90 (cudaDevAttrMaxSharedMemoryPerBlockOptin, 227 KB).
# The launch reads the SM count from the device (runtime/launch.py, persistent_grid); a figure drawn on
# a machine without a GPU cannot, so both are named here.
H200_SMS = 132
SMEM_PER_CTA_MAX = 227 * 1024
SMEM_PER_SM = 228 * 1024  # of which the system reserves 1 KB per resident CTA
SMEM_RESERVED_PER_CTA = 1024
REGISTER_FILE = 65536  # 32-bit registers per SM

_CONSTEXPR = re.compile(r"^constexpr\s+(?:int|uint32_t|unsigned)\s+(\w+)\s*=\s*([^;]+);", re.MULTILINE)
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,  # C integer division of non-negative values
    ast.Mod: operator.mod,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _eval(expr: str, names: dict, *, undefined: int | None = None) -> int | None:
    """Value of a C integer expression of literals, known names, + - * / %, comparisons, ``&&``, ``||``, ``!``
    and ``defined(NAME)``; ``None`` when it has anything else (a call, a cast, ``?:``) or an unknown name. In a
    preprocessor condition an unknown name is 0, as in C: pass ``undefined=0``."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in names:
                return names[node.id]
            if undefined is None:
                raise KeyError(node.id)
            return undefined
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            value = ev(node.operand)
            return int(not value) if isinstance(node.op, ast.Not) else -value
        if isinstance(node, ast.BoolOp):
            values = [ev(v) for v in node.values]
            return int(all(values) if isinstance(node.op, ast.And) else any(values))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            return int(_COMPARE[type(node.ops[0])](ev(node.left), ev(node.comparators[0])))
        raise ValueError(ast.dump(node))

    expr = re.sub(r"(\d+)u\b", r"\1", expr.strip())  # 0x..u / 16u literals
    expr = re.sub(r"\bdefined\s*\(\s*(\w+)\s*\)|\bdefined\s+(\w+)", lambda m: str(int((m[1] or m[2]) in names)), expr)
    expr = re.sub(r"!(?!=)", " not ", expr.replace("&&", " and ").replace("||", " or "))
    try:
        return ev(ast.parse(expr.strip(), mode="eval").body)
    except (KeyError, ValueError, SyntaxError):
        return None


_DIRECTIVE = re.compile(r"^#\s*(if|ifdef|ifndef|elif|else|endif|define)\b\s*(.*?)\s*(?://.*)?$")


def _active_text(text: str, names: dict) -> tuple:
    """``(text, names)``: ``text`` without the lines of the ``#if`` / ``#elif`` / ``#else`` branches that the
    preprocessor drops with the macros ``names``, and ``names`` with the object-like ``#define``s of the kept
    lines added (those whose value is an integer expression). A group with a condition that cannot be evaluated
    keeps all its branches (their constexpr lines are all read, and the last of a name wins)."""
    names = dict(names)
    out = []
    groups = []  # per open #if: [evaluable, a branch was taken, this branch is kept]
    for line in text.splitlines():
        m = _DIRECTIVE.match(line.strip())
        kept = all(g[2] for g in groups)
        if not m:
            if kept:
                out.append(line)
            continue
        kind, arg = m.group(1), m.group(2)
        if kind in ("if", "ifdef", "ifndef"):
            value = _eval(arg, names, undefined=0) if kind == "if" else int((arg in names) == (kind == "ifdef"))
            groups.append([value is not None, bool(value), bool(value) or value is None])
        elif kind == "elif" and groups:
            g = groups[-1]
            value = _eval(arg, names, undefined=0)
            g[0] = g[0] and value is not None
            g[2] = not g[0] or (not g[1] and bool(value))
            g[1] = g[1] or bool(value)
        elif kind == "else" and groups:
            g = groups[-1]
            g[2] = not g[0] or not g[1]
        elif kind == "endif" and groups:
            groups.pop()
        elif kind == "define" and kept:
            d = re.match(r"(\w+)(?:\s+(.*))?$", arg)  # object-like macros only (no "NAME(")
            value = _eval(d.group(2) or "1", names) if d else None
            if value is not None:
                names[d.group(1)] = value
    return "\n".join(out), names


def _read_constants(text: str, names: dict) -> dict:
    """The file-scope ``constexpr`` integers of ``text`` in the branches that the preprocessor keeps with the
    macros ``names``, and the object-like macros that ``text`` defines there (``P_DOUBLE_BUFFER``)."""
    text, names_after = _active_text(text, names)
    out = {k: v for k, v in names_after.items() if k not in names}
    for name, expr in _CONSTEXPR.findall(text):
        value = _eval(expr, {**names_after, **out})
        if value is not None:
            out[name] = value
    return out


@cache
def header_constants(header: str) -> dict:
    """File-scope ``constexpr`` integers of ``attnclimb/kernels/<header>`` (with HEAD_DIM known)."""
    return _read_constants((rungs.KERNEL_DIR / header).read_text(), {"HEAD_DIM": rungs.HEAD_DIM})


def constants(number: int, **changes) -> dict:
    """Rung ``number``'s compile-time constants: its ``-D`` macros (from ``rungs.py``), the file-scope
    ``constexpr`` integers of the headers it includes, then those of its ``.cu`` file.

    ``changes`` are fields of its :class:`~attnclimb.rungs.Rung` to replace first (``block_n=192,
    kv_box_rows=192``): the constants the same source would have in that variant (``SMEM_BYTES`` follows)."""
    rung = rungs.get(number)
    if changes:
        rung = dataclasses.replace(rung, **changes)
    text = rung.source.read_text()
    names = dict(rung.defines())
    for header in re.findall(r'#include\s+"(\w+\.cuh)"', text):
        names.update(header_constants(header))
    return {**names, **_read_constants(text, names)}


def need(number: int, *keys: str, **changes):
    """The values of ``keys`` among rung ``number``'s constants (of the variant ``changes``, see
    :func:`constants`); a clear error when one is missing (a kernel renamed it: the figure that reads it
    must follow)."""
    c = constants(number, **changes)
    missing = [k for k in keys if k not in c]
    if missing:
        raise KeyError(f"rung {number}: no constexpr {', '.join(missing)} in {rungs.get(number).source.name}")
    return c[keys[0]] if len(keys) == 1 else tuple(c[k] for k in keys)


def registers_at_launch(threads: int, register_file: int = REGISTER_FILE) -> int:
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


def static_mbarriers(number: int) -> dict:
    """The mbarriers rung ``number`` declares in static shared memory (``__shared__ __align__(8) uint64_t
    name[N]``): name -> how many (N evaluated with the rung's constants)."""
    text = rungs.get(number).source.read_text()
    names = constants(number)
    out = {}
    for name, count in re.findall(r"__shared__\s+__align__\(8\)\s+uint64_t\s+(\w+)(?:\[(\w+)\])?;", text):
        value = _eval(count, names) if count else 1
        if value is None:
            raise ValueError(f"rung {number}: cannot size the mbarrier array {name}[{count}]")
        out[name] = value
    return out


def has_turns(number: int) -> bool:
    """Whether rung ``number``'s consumer warpgroups take turns on the tensor cores (named barriers: rung 16)."""
    return "named_bar_sync(my_turn" in rungs.get(number).source.read_text()


def turn_barriers(number: int) -> dict:
    """The ping-pong protocol of rung ``number`` (16) as written in the kernel, for two consumer warpgroups:
    the named-barrier ids of warpgroups 0 and 1 (``my_turn = 1 + wg``), the thread count of each
    (``TURN_THREADS``), which warpgroup arrives once before the first turn and on which barrier, which
    warpgroup always arrives after its last turn (the other skips its last arrival), whether that skip comes only
    at the end of the kernel (the turns run on across a persistent CTA's work tiles) and how many places issue
    wgmmas behind a turn. ``rings`` has the same per warpgroup count the kernel supports (2, and 3 where it
    has the three-warpgroup ring ``other_turn = 1 + (wg + 1) % CONSUMER_WGS``): ``my_turn`` and ``other_turn``
    per warpgroup, ``pre_arrive_wg``, ``pre_arrive_bar`` and ``last_arrive_wgs``."""
    text = rungs.get(number).source.read_text()
    ids = re.search(
        r"my_turn\s*=\s*(\d+)\s*\+\s*wg,\s*other_turn\s*=\s*(?:CONSUMER_WGS == 2 \? )?(\d+)\s*-\s*wg"
        r"(?:\s*:\s*(\d+)\s*\+\s*\(wg \+ 1\) % CONSUMER_WGS)?\s*;",
        text,
    )
    threads = re.search(r"constexpr\s+uint32_t\s+TURN_THREADS\s*=\s*([^;]+);", text)
    pre = re.search(r"if \(wg == (\d|CONSUMER_WGS - 1)\) hop::named_bar_arrive\((\d), TURN_THREADS\);", text)
    last = re.search(
        r"if \(\(?(?:CONSUMER_WGS == 2 \? )?wg == (\d)(?: : (wg != CONSUMER_WGS - 1)\))?(?: \|\|[^;]*)?\)\s*"
        r"hop::named_bar_arrive\(other_turn, TURN_THREADS\);",
        text,
    )
    if not (ids and threads and pre and last):
        raise ValueError(f"{rungs.get(number).source.name}: the ping-pong turns changed form (figures/facts.py)")
    base, top = int(ids.group(1)), int(ids.group(2))

    def pre_wg(n):
        return n - 1 if pre.group(1) == "CONSUMER_WGS - 1" else int(pre.group(1))

    rings = {
        2: {
            "my_turn": (base, base + 1),
            "other_turn": (top, top - 1),
            "pre_arrive_wg": pre_wg(2),
            "pre_arrive_bar": int(pre.group(2)),
            "last_arrive_wgs": (int(last.group(1)),),
        }
    }
    if ids.group(3) and last.group(2):
        ring_base = int(ids.group(3))
        rings[3] = {
            "my_turn": tuple(base + w for w in range(3)),
            "other_turn": tuple(ring_base + (w + 1) % 3 for w in range(3)),
            "pre_arrive_wg": pre_wg(3),
            "pre_arrive_bar": int(pre.group(2)),
            "last_arrive_wgs": tuple(w for w in range(3) if w != 2),  # wg != CONSUMER_WGS - 1
        }
    two = rings[2]
    return {
        "my_turn": two["my_turn"],  # the barrier each warpgroup waits on (bar.sync) ...
        "other_turn": two["other_turn"],  # ... and the one it arrives on (bar.arrive)
        "threads": _eval(threads.group(1), {}),
        "pre_arrive_wg": two["pre_arrive_wg"],
        "pre_arrive_bar": two["pre_arrive_bar"],
        "last_arrive_wg": two["last_arrive_wgs"][0],
        # a persistent CTA: the last warpgroup skips only the last arrival of the kernel, not of each work tile
        "skips_only_at_the_end": "num_tiles" in last.group(0),
        "turn_sites": len(re.findall(r"named_bar_sync\(my_turn, TURN_THREADS\)", text)),
        "rings": rings,
    }


def mbarrier_counts(number: int) -> dict:
    """The arrival count each mbarrier of rung ``number`` is initialised with (``mbar_init(&bar, N)``):
    name -> count, evaluated with the rung's constants."""
    text = rungs.get(number).source.read_text()
    names = constants(number)
    out = {}
    for name, count in re.findall(r"mbar_init\(&(\w+)(?:\[\w+\])?,\s*(\w+)\);", text):
        value = _eval(count, names)
        if value is None:
            raise ValueError(f"rung {number}: cannot read the count of mbarrier {name}")
        out[name] = value
    return out


def ctas_per_sm(number: int) -> int:
    """How many CTAs of rung ``number`` (one of the warp-specialized rungs, 7+) fit on one SM at once: by
    registers (``__launch_bounds__(threads, 1)`` gives each thread :func:`registers_at_launch`, the cap
    that setmaxnreg redistributes) and by shared memory (dynamic + static mbarriers + the 1 KB the system
    reserves per CTA)."""
    r = rungs.get(number)
    by_regs = REGISTER_FILE // (r.threads * registers_at_launch(r.threads))
    smem = r.smem_bytes + 8 * sum(static_mbarriers(number).values()) + SMEM_RESERVED_PER_CTA
    return min(by_regs, SMEM_PER_SM // smem)
