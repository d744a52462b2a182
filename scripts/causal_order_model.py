"""How evenly the persistent grid shares causal work among its CTAs: ``python scripts/causal_order_model.py``.

A CPU model, no GPU. A causal work tile (query head, m-block ``mb``) visits ``ceil(min(Sk, (mb+1)·BLOCK_M) /
BLOCK_N)`` K/V tiles; its cost here is that count plus ``--overhead`` tiles (the unoverlapped first S, last P·V
and the epilogue). The kernel is done when its busiest CTA is, so the figure of merit is the mean CTA load over
the busiest one (1.0: perfectly even). Three orders:

* ``kernel``: the top rung's static order, a mirror of ``tile_of`` / ``work_of`` in
  ``attnclimb/kernels/16_pingpong.cu`` (CTA ``c`` takes work ``c, c + G, c + 2G, ...``): heavy/light pairs head
  by head when all heads' K and V exceed ``CAUSAL_L2_BYTES`` (32 MiB), else the heaviest m-blocks of every head
  first, dealt in a snake.
* ``snake``: that second order at every size (``CAUSAL_L2_BYTES`` set past any K/V: what the A/B variant
  ``snake`` of ``scripts/device_calls.sh ab-causal-order`` builds); it ignores L2, whose cost this model does not
  see: the A/B measures it.
* ``pairs+tail``: the pairs for all but the last three rounds, then the rest heaviest-first in a snake: a static
  repair tried in this model only.
* ``headpairs``: heavy/light pairs inside each head (no pair across two heads when the m-block count is odd)
  and the last two rounds heaviest-first in a snake: the A/B variant ``headpairs`` of
  ``scripts/make_variants.py`` (:func:`head_pairs_then_tail`, the same arithmetic as its ``causal_order.cuh``).
* ``dynamic``: the same pairs' tiles taken heaviest-first within groups of heads whose K/V fit in 32 MiB, each
  by the first CTA to become free (an atomic tile counter, the tile scheduler of FlashAttention-3 Sec. 3 / its
  persistent kernels' "longest processing time first"; FlashAttention-4's Hopper path gets it from the hardware,
  one CTA per tile): the A/B variant ``dynsched`` of ``scripts/make_variants.py`` builds it
  (:func:`dynamic_order`).

A second table compares total times, not evenness: the kernel's busiest CTA over the busiest CTA of ``dynamic``
when each work tile also pays a fill of 0.5, 1 or 2 more K/V tiles, the Q load and first K/V tiles that a persistent
CTA issues under its previous tile's last P·V and epilogue, and a CTA launched for one tile cannot: the A/B
variant ``hwsched`` (one CTA per causal tile, the hardware handing them out, ``Rung.causal_per_tile``;
:func:`per_tile_speedups`).

Prints one row per shape. Rows of the bench's causal shapes (head_dim 64, 128 and 256; not GQA) and of
``device_calls.sh ab-causal-order``'s (head_dim 256 at 4k and 16k too) are the default.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import math

SMS = 132
L2_BYTES = 32 << 20  # CAUSAL_L2_BYTES of the kernel


def tile_cost(mb: int, block_m: int, block_n: int, seqlen_k: int, overhead: float) -> float:
    """K/V tiles visited by causal m-block ``mb`` (keys up to its last row), plus ``overhead``."""
    return overhead + math.ceil(min(seqlen_k, (mb + 1) * block_m) / block_n)


def by_pairs(heads: int, nmb: int, seqlen_k: int, head_dim: int, block_m: int, grid: int, l2_bytes: int) -> bool:
    """The kernel's choice (bf16, no GQA): pairs when all heads' K and V exceed ``l2_bytes`` and every CTA gets
    at least one pair."""
    kv_bytes = 2 * min(seqlen_k, nmb * block_m) * head_dim * 2 * heads
    return kv_bytes > l2_bytes and heads * nmb >= 2 * grid


def pair_tile(tile: int, nmb: int) -> tuple:
    """The kernel's ``work_of`` in the pair order: tile -> ``(head, mb)``, m-blocks nmb-1, 0, nmb-2, 1, ... per head."""
    bh, r = divmod(tile, nmb)
    return bh, r >> 1 if r & 1 else nmb - 1 - (r >> 1)


def snake(v: int, grid: int, count: int) -> int:
    """Slot ``v`` of ``count`` slots dealt in waves of ``grid``, every other whole wave reversed (the kernel's
    snake, and the tails of the orders below): ``v`` itself, or its mirror inside an odd whole wave. Its own
    inverse."""
    wave, c = divmod(v, grid)
    return wave * grid + (grid - 1 - c) if (wave & 1) and (wave + 1) * grid <= count else v


def head_pair_rounds(heads: int, nmb: int, grid: int, tail_rounds: int) -> int:
    """Whole rounds of in-head pairs (``grid`` pairs, two works each) before :func:`head_pairs_then_tail`'s tail."""
    return max(0, heads * (nmb // 2) // grid - tail_rounds)


def kernel_order(heads: int, nmb: int, pairs: bool, grid: int) -> list:
    """``(work, head, mb)`` for every work index a CTA visits before its first tile >= num_tiles (the kernel's
    loop): work ``w`` runs on CTA ``w % grid``."""
    n = heads * nmb
    out = []
    for c in range(grid):
        work = c
        while True:
            wave, cc = divmod(work, grid)
            if pairs:
                tile = 2 * (cc + (wave >> 1) * grid) + (wave & 1)
            else:
                tile = snake(work, grid, n)
            if tile >= n:
                break
            if pairs:
                bh, mb = pair_tile(tile, nmb)
            else:
                bh, mb = tile % heads, nmb - 1 - tile // heads
            out.append((work, bh, mb))
            work += grid
    return out


def pairs_then_snake(heads: int, nmb: int, grid: int, tail_rounds: int = 3) -> list:
    """A static repair tried in this model only (not built): the kernel's pairs for all but the last
    ``tail_rounds`` whole rounds of pairs, then the remaining tiles heaviest-first in a snake. ``(work, head, mb)``
    as :func:`kernel_order`."""
    n = heads * nmb
    rounds = max(0, (n // 2) // grid - tail_rounds)
    out, w0 = [], 2 * rounds * grid
    for c in range(grid):
        for wave in range(2 * rounds):
            tile = 2 * (c + (wave >> 1) * grid) + (wave & 1)
            out.append((c + wave * grid, *pair_tile(tile, nmb)))
    rest = []
    for tile in range(w0, n):
        rest.append(pair_tile(tile, nmb))
    rest.sort(key=lambda t: (-t[1], t[0]))
    for u, (bh, mb) in enumerate(rest):
        out.append((w0 + snake(u, grid, len(rest)), bh, mb))
    return out


def head_pairs_then_tail(work: int, grid: int, heads: int, nmb: int, tail_rounds: int = 2) -> tuple:
    """Work ``work`` (CTA ``work % grid``) -> ``(head, mb)`` in the order of the A/B variant ``headpairs``
    (``scripts/make_variants.py``'s ``causal_order.cuh``, the same arithmetic line by line): heavy/light pairs
    inside each head for all but the last ``tail_rounds`` whole rounds of pairs, the rest (with an odd ``nmb``'s
    middle m-blocks) heaviest-first in a snake."""
    half = nmb // 2
    rounds = head_pair_rounds(heads, nmb, grid, tail_rounds)
    w0 = 2 * rounds * grid
    if work < w0:
        wave, c = divmod(work, grid)
        p = (wave >> 1) * grid + c
        head, j = divmod(p, half)
        return head, j if wave & 1 else nmb - 1 - j
    u = snake(work - w0, grid, heads * nmb - w0)
    p0 = rounds * grid
    h0, j0 = divmod(p0, half) if half else (heads, 0)
    a = heads - h0 - 1  # tail tiles of an m-block without head h0 (its pair index j < j0), b: with it
    b = a + 1
    n1, n2 = (j0 * a if a > 0 else 0), ((half - j0) * b if b > 0 else 0)
    if u < n1:  # heaviest: j < j0
        return h0 + 1 + u % a, nmb - 1 - u // a
    u -= n1
    if u < n2:  # upper half, j >= j0
        return h0 + u % b, nmb - 1 - j0 - u // b
    u -= n2
    if nmb & 1:
        if u < heads:  # the middle m-block of every head
            return u, half
        u -= heads
    if u < n2:  # lower half, j >= j0
        return h0 + u % b, half - 1 - u // b
    u -= n2
    if u < n1:  # lightest: j < j0
        return h0 + 1 + u % a, j0 - 1 - u // a
    return heads, 0


def static_loads(order: list, grid: int, cost) -> list:
    loads = [0.0] * grid
    for work, _, mb in order:
        loads[work % grid] += cost(mb)
    return loads


def dynamic_order(heads: int, nmb: int, group: int) -> list:
    """``(head, mb)`` in the order a dynamic scheduler hands them out: groups of ``group`` heads, in each the
    heaviest m-block first, heads fastest (the A/B variant ``dynsched``'s ``dyn_sched::tile_of``)."""
    return [
        (h, mb)
        for g0 in range(0, heads, group)
        for mb in range(nmb - 1, -1, -1)
        for h in range(g0, min(heads, g0 + group))
    ]


def l2_group(head_dim: int, seqlen_k: int, l2_bytes: int) -> int:
    """How many heads' K and V (bf16, ``seqlen_k`` rows of ``head_dim`` each) fit in ``l2_bytes``; at least 1."""
    return max(1, l2_bytes // (2 * seqlen_k * head_dim * 2))


def dynamic_loads(heads: int, nmb: int, head_dim: int, seqlen_k: int, grid: int, cost, l2_bytes: int) -> list:
    """Greedy list scheduling of the tiles, heaviest m-block first within L2-sized groups of heads."""
    free = [(0.0, c) for c in range(grid)]
    for _, mb in dynamic_order(heads, nmb, l2_group(head_dim, seqlen_k, l2_bytes)):
        load, c = heapq.heappop(free)
        heapq.heappush(free, (load + cost(mb), c))
    return [load for load, _ in free]


def one_ahead_loads(heads: int, nmb: int, head_dim: int, seqlen_k: int, grid: int, cost, l2_bytes: int) -> list:
    """The dynamic order, but each CTA takes its next tile as it starts the current one (one whole tile ahead, so
    that the index would be known sooner): an event simulation, for comparison with :func:`dynamic_loads`."""
    tiles = dynamic_order(heads, nmb, l2_group(head_dim, seqlen_k, l2_bytes))
    loads, nxt = [0.0] * grid, min(grid, len(tiles))
    starts = [(0.0, c, c) for c in range(nxt)]  # (start time, CTA, tile index), in the order the CTAs take
    heapq.heapify(starts)
    while starts:
        t, c, i = heapq.heappop(starts)
        loads[c] = t + cost(tiles[i][1])
        if nxt < len(tiles):  # taken now, run when this one ends
            heapq.heappush(starts, (loads[c], c, nxt))
            nxt += 1
    return loads


def evenness(loads: list) -> float:
    """Mean load over the busiest CTA's."""
    return sum(loads) / (len(loads) * max(loads))


SHAPES = [  # (label, batch·heads, seqlen, head_dim, BLOCK_M, BLOCK_N): the top rung's causal tiles
    ("d64 4k (B4 H32)", 128, 4096, 64, 192, 128),
    ("d64 8k (B2 H32)", 64, 8192, 64, 192, 128),
    ("d64 16k (B1 H32)", 32, 16384, 64, 192, 128),
    ("d128 4k (B4 H16)", 64, 4096, 128, 128, 128),
    ("d128 8k (B2 H16)", 32, 8192, 128, 128, 128),
    ("d128 16k (B1 H16)", 16, 16384, 128, 128, 128),
    ("d128 1k (B16 H16)", 256, 1024, 128, 128, 128),
    ("d256 4k (B4 H8)", 32, 4096, 256, 128, 64),
    ("d256 8k (B2 H8)", 16, 8192, 256, 128, 64),
    ("d256 16k (B1 H8)", 8, 16384, 256, 128, 64),
]


def _shape(heads: int, s: int, d: int, bm: int, bn: int, overhead: float, sms: int) -> tuple:
    """``(nmb, grid, cost, pairs, kernel_loads)`` of one shape: its m-blocks per head, the persistent grid, a work
    tile's cost ``cost(mb, extra=0.0)`` (``extra`` more K/V tiles per tile), whether the kernel orders by pairs of
    heads, and each CTA's load in the kernel's order."""
    nmb = math.ceil(s / bm)
    grid = min(sms, heads * nmb)

    def cost(mb, extra=0.0):
        return tile_cost(mb, bm, bn, s, overhead + extra)

    pairs = by_pairs(heads, nmb, s, d, bm, grid, L2_BYTES)
    return nmb, grid, cost, pairs, static_loads(kernel_order(heads, nmb, pairs, grid), grid, cost)


def rows(overhead: float = 1.0, shapes=SHAPES, sms: int = SMS) -> list:
    """``(label, pairs, kernel, snake, dynamic, pairs_then_snake, headpairs)`` evenness per shape."""
    out = []
    for label, heads, s, d, bm, bn in shapes:
        nmb, grid, cost, pairs, kernel_loads = _shape(heads, s, d, bm, bn, overhead, sms)
        kernel = evenness(kernel_loads)
        snake = evenness(static_loads(kernel_order(heads, nmb, False, grid), grid, cost))
        dynamic = evenness(dynamic_loads(heads, nmb, d, s, grid, cost, L2_BYTES))
        tail = evenness(static_loads(pairs_then_snake(heads, nmb, grid), grid, cost))
        n = heads * nmb
        hp = [(w, *head_pairs_then_tail(w, grid, heads, nmb)) for w in range(n)]
        headpairs = evenness(static_loads(hp, grid, cost))
        out.append((label, pairs, kernel, snake, dynamic, tail, headpairs))
    return out


def per_tile_speedups(fills=(0.5, 1.0, 2.0), overhead: float = 1.0, shapes=SHAPES, sms: int = SMS) -> list:
    """``(label, dynsched, [hwsched per fill])``: the kernel's order's busiest CTA load over ``dynamic``'s, minus 1
    (the predicted gain), for ``dynamic`` as it is (``dynsched``, persistent) and with each work tile costing
    ``fill`` more K/V tiles (``hwsched``: one CTA per tile, whose Q and first K/V loads nothing overlaps)."""
    out = []
    for label, heads, s, d, bm, bn in shapes:
        nmb, grid, cost, _, kernel_loads = _shape(heads, s, d, bm, bn, overhead, sms)
        kernel = max(kernel_loads)
        dyn = max(dynamic_loads(heads, nmb, d, s, grid, cost, L2_BYTES))
        hw = [
            kernel / max(dynamic_loads(heads, nmb, d, s, grid, functools.partial(cost, extra=f), L2_BYTES)) - 1
            for f in fills
        ]
        out.append((label, kernel / dyn - 1, hw))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--overhead", type=float, default=1.0, help="per work tile, in K/V tiles (default 1)")
    args = ap.parse_args(argv)
    print(f"mean CTA load / busiest CTA's ({SMS} CTAs, per-tile overhead {args.overhead:g} K/V tiles)")
    head = f"{'kernel':>7s} {'snake':>7s} {'dynamic':>8s} {'pairs+tail':>11s} {'headpairs':>10s}"
    print(f"{'shape':20s} {'order':6s} {head}")
    for label, pairs, kernel, snake, dynamic, tail, hp in rows(args.overhead):
        kind = "pairs" if pairs else "snake"
        print(f"{label:20s} {kind:6s} {kernel:7.3f} {snake:7.3f} {dynamic:8.3f} {tail:11.3f} {hp:10.3f}")
    fills = (0.5, 1.0, 2.0)
    print(
        "\npredicted gain over the kernel's order: dynsched, and hwsched with a fill of 0.5 / 1 / 2 K/V tiles per tile"
    )
    for label, dyn, hw in per_tile_speedups(fills, args.overhead):
        print(f"{label:20s} {100 * dyn:+6.1f} %   " + " ".join(f"{100 * g:+6.1f} %" for g in hw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
