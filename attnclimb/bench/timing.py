"""Timing and checking helpers: median kernel time, inputs rotated beyond L2, interleaved rounds, the
reference check.

All functions here need a CUDA device except :func:`num_input_sets`, :func:`rotating`,
:func:`round_order`, :func:`call_order`, :func:`median_of_rounds`, :func:`contest`, :func:`chunk_medians`,
:func:`wall_us_per_call` given a ``sync`` and the reference helpers (which work on CPU tensors too).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time

from ..reference import rel_l2  # one definition of the error metric, shared with the tests

DEFAULT_L2_BYTES = 60 * 1024 * 1024  # H100/H200: 50 / 60 MB
REL_L2_TOL = 1e-2
# Bytes written before every timed call of the interleaved timer to push the last call's data out of L2
# (triton.testing.do_bench clears the same 256 MB before each of its calls).
FLUSH_BYTES = 256 * 1024 * 1024


def l2_cache_bytes() -> int:
    """L2 size of the current CUDA device in bytes (falls back to 60 MB when torch doesn't say)."""
    try:
        import torch

        n = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0))
        return n if n > 0 else DEFAULT_L2_BYTES
    except Exception:
        return DEFAULT_L2_BYTES


def num_input_sets(set_bytes: int, l2_bytes: int = DEFAULT_L2_BYTES, minimum: int = 3) -> int:
    """How many distinct (q, k, v) sets to cycle through so consecutive calls can't hit in L2.

    Enough sets that together they exceed ``2 * l2_bytes``, and never fewer than ``minimum``.
    """
    if set_bytes <= 0:
        raise ValueError("set_bytes must be positive")
    return max(minimum, math.ceil(2 * l2_bytes / set_bytes) + 1)


def make_inputs(shape, n_sets: int, seed: int = 0, device: str = "cuda") -> list:
    """``n_sets`` independent (q, k, v) bf16 tensors of ``shape`` on ``device`` (BHSD, contiguous, N(0, 1));
    k and v have ``shape.kv_heads`` heads."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    kv_heads = getattr(shape, "kv_heads", shape.heads)
    sets = []
    for _ in range(n_sets):
        qkv = []
        for h, s in ((shape.heads, shape.seqlen_q), (kv_heads, shape.seqlen_k), (kv_heads, shape.seqlen_k)):
            qkv.append(torch.randn(shape.batch, h, s, shape.head_dim, device=device, dtype=torch.bfloat16, generator=g))
        sets.append(tuple(qkv))
    return sets


def rotating(call, prepared_sets):
    """A zero-argument function that calls ``call(prepared_sets[i])`` with ``i`` cycling 0, 1, 2, ..."""
    n = len(prepared_sets)
    state = [0]

    def fn():
        i = state[0]
        state[0] = i + 1 if i + 1 < n else 0
        return call(prepared_sets[i])

    return fn


def round_order(n: int, round_index: int, rounds: int) -> list:
    """The order in which ``n`` implementations are timed in round ``round_index`` of ``rounds``.

    Rounds come in pairs: an even round runs the list forwards from some start (wrapping around), the odd
    round after it runs the same order backwards, so within a pair every implementation has the same
    mean position (a clock that drifts over the pair hits all alike) and a different neighbour before
    it each time. Pair ``p`` starts at implementation ``p * n // pairs`` (``pairs = ceil(rounds / 2)``),
    so with 3 rounds the last one starts half-way down the list. Returns a permutation of ``range(n)``.
    """
    if n < 0 or rounds < 1 or not 0 <= round_index < rounds:
        raise ValueError(f"need n >= 0 and 0 <= round_index < rounds, got {n}, {round_index}, {rounds}")
    pairs = (rounds + 1) // 2
    start = (round_index // 2) * n // pairs
    order = [*range(start, n), *range(start)]
    return order[::-1] if round_index % 2 else order


def call_order(n: int, rep: int) -> list:
    """The order of the ``n`` calls of repetition ``rep`` in :func:`interleaved_ms`: from ``(rep // 2) % n``
    forwards, wrapping around, on even ``rep``; the same list backwards on odd ``rep``."""
    if n < 0 or rep < 0:
        raise ValueError(f"need n >= 0 and rep >= 0, got {n}, {rep}")
    start = (rep // 2) % n if n else 0
    order = [*range(start, n), *range(start)]
    return order[::-1] if rep % 2 else order


def median_of_rounds(round_medians) -> float:
    """The reported time: the median over rounds of each round's median (the mean of the middle two for
    an even number of rounds). ``ValueError`` when empty."""
    vals = [float(v) for v in round_medians]
    if not vals:
        raise ValueError("no rounds")
    return statistics.median(vals)


def wall_us_per_call(fn, calls: int = 2000, reps: int = 5, warmup_calls: int = 200, sync=None, clock=None) -> float:
    """Host time of one ``fn()`` call in microseconds: wall clock over ``calls`` back-to-back calls.

    ``warmup_calls`` untimed calls and a ``sync()`` first; then ``reps`` times: read ``clock()``, make
    ``calls`` calls, ``sync()``, read ``clock()`` again. No CUDA events and no synchronisation between
    calls, so on a problem whose kernel takes a few microseconds the host's work per call sets the pace
    (the kernels queue behind it). Returns the median over the repetitions of (elapsed / ``calls``).

    Args:
        sync: called at the ends only; default ``torch.cuda.synchronize`` (a seam for the CPU tests).
        clock: seconds as a float; default ``time.perf_counter`` (a seam for the CPU tests).
    """
    if calls < 1 or reps < 1 or warmup_calls < 0:
        raise ValueError(f"need calls >= 1, reps >= 1, warmup_calls >= 0; got {calls}, {reps}, {warmup_calls}")
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    clock = time.perf_counter if clock is None else clock
    for _ in range(warmup_calls):
        fn()
    sync()
    per_call = []
    for _ in range(reps):
        t0 = clock()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((clock() - t0) / calls * 1e6)
    return statistics.median(per_call)


def contest(estimates_ms, span: float) -> list:
    """Indices of the implementations close enough to the fastest to be contenders (the bench's contest:
    longer rounds, or call by call with ``--interleave``).

    ``estimates_ms``: one time per implementation (ms per call, from :func:`estimate_ms`). Returns, in
    input order, the indices whose estimate is at most ``span`` times the smallest; an empty list when
    fewer than two qualify or ``span`` is below 1 (then there is no contest).
    """
    if not estimates_ms or span < 1:
        return []
    lo = min(estimates_ms)
    picked = [i for i, t in enumerate(estimates_ms) if t <= span * lo]
    return picked if len(picked) > 1 else []


def chunk_medians(times, chunks: int) -> list:
    """The medians of ``chunks`` consecutive, near-equal slices of ``times`` (at least one value each).

    ``ValueError`` when ``chunks < 1`` or there are fewer values than chunks.
    """
    if chunks < 1 or len(times) < chunks:
        raise ValueError(f"need 1 <= chunks <= len(times), got {chunks} chunks of {len(times)} values")
    n = len(times)
    return [statistics.median(times[c * n // chunks : (c + 1) * n // chunks]) for c in range(chunks)]


def estimate_ms(fn, flush=None, calls: int = 5) -> float:
    """A quick time of one ``fn()`` call in ms, for sizing and for :func:`contest`, not for reporting.

    ``flush`` (a CUDA tensor) is zeroed when given; one untimed call is queued, then ``calls`` calls back to
    back between two CUDA events, without waiting in between: the mean. The GPU is still busy with the untimed
    call when the start event is queued, and works on one call while the host launches the next, so an
    implementation's host path is not charged unless it is slower than its kernel (the first version timed
    single calls on an idle GPU, and FA4 and cuDNN fell out of a contest).
    """
    if flush is not None:
        flush.zero_()
    import torch

    fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / calls


def flush_buffer():
    """A CUDA buffer of :data:`FLUSH_BYTES`; zeroing it evicts the L2 (50-60 MB on H100/H200)."""
    import torch

    return torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")


def interleaved_ms(
    fns, warmup_ms: float, budget_ms: float, chunks: int, flush=None, contexts=None, max_reps: int = 20000
) -> list:
    """Time several implementations of one problem call by call, interleaved: per call medians in ms.

    After ~``warmup_ms`` of untimed calls of each, every repetition calls each ``fn`` once, in the order
    :func:`call_order` gives for that repetition (rotated by one every other repetition, and reversed
    every other repetition: within a pair each has the same mean position, and its neighbours change), each
    call after the L2 is cleared (``flush`` zeroed, as ``triton.testing.do_bench`` does) and bracketed by
    its own pair of CUDA events. Repetitions: enough for ~``budget_ms`` of timed calls in all (at least
    ``chunks``, at most ``max_reps``). On a power-capped card the SM clock wanders over tens to hundreds of
    ms; a median over one window of each implementation in turn (the rounds) picks up that wander as
    noise in every ratio, while here every implementation samples the same clock states.

    Args:
        fns: zero-argument callables (e.g. :func:`rotating` over prepared inputs), all of one shape.
        chunks: how many consecutive slices of the repetitions to summarise separately.
        flush: a CUDA tensor to zero before each call (default :func:`flush_buffer`).
        contexts: per ``fn``, a zero-argument context-manager factory entered around its calls (outside
            the events), e.g. an SDPA backend pin; default none.

    Returns:
        per ``fn``, ``chunks`` medians (ms per call), one per slice of the repetitions in time order.

    Raises:
        ValueError: no ``fns`` or ``chunks < 1``.
    """
    import torch

    if not fns or chunks < 1:
        raise ValueError(f"need at least one fn and chunks >= 1, got {len(fns)} fns, {chunks} chunks")
    flush = flush_buffer() if flush is None else flush
    contexts = contexts or [contextlib.nullcontext] * len(fns)
    est = []
    for f, ctx in zip(fns, contexts):
        with ctx():
            est.append(estimate_ms(f, flush))
            for _ in range(max(1, int(warmup_ms / max(est[-1], 1e-3)))):
                f()
    torch.cuda.synchronize()
    n = len(fns)
    reps = min(max_reps, max(chunks, math.ceil(budget_ms / max(sum(est), 1e-3))))
    events = [[] for _ in fns]
    for r in range(reps):
        for i in call_order(n, r):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with contexts[i]():
                s.record()
                fns[i]()
                e.record()
            events[i].append((s, e))
    torch.cuda.synchronize()
    return [chunk_medians([s.elapsed_time(e) for s, e in ev], chunks) for ev in events]


def _have_triton_do_bench():
    try:
        from triton.testing import do_bench

        return do_bench
    except Exception:
        return None


def timer_name() -> str:
    """What :func:`median_ms` uses: ``"triton.testing.do_bench"`` when triton imports, else ``"cuda-events"``,
    and for calls of :data:`LONG_CALL_MS` or more CUDA events around each call (:func:`long_call_median_ms`)."""
    short = "triton.testing.do_bench" if _have_triton_do_bench() else "cuda-events"
    return f"{short}; calls of {LONG_CALL_MS:g} ms or more: cuda-events per call"


def cuda_events_median_ms(fn, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn()`` in ms, each call bracketed by its own pair of CUDA events.

    Runs ~``warmup_ms`` of untimed calls first, then ~``rep_ms`` worth of timed calls (at least 1 each).
    """
    import torch

    est = max(estimate_ms(fn), 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    n = max(1, int(rep_ms / est))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))


# Calls at least this long (ms) are timed by :func:`long_call_median_ms`: triton's do_bench spends 5 calls on its own
# estimate before its warm-up and timed calls, which on Wan2.1-14B (0.17 s per call of the top rung, up to 0.64 s of
# the slow implementations) was 5 of 7 calls and ~80 s of a 282-s bench (issue 13's budget: 5 min).
LONG_CALL_MS = 20.0


def long_call_median_ms(fn, warmup_ms: float, rep_ms: float, est_ms: float) -> float:
    """Median of ``max(1, round(rep_ms / est_ms))`` calls of ``fn``, each between its own pair of CUDA events,
    after ``ceil(warmup_ms / est_ms) - 2`` untimed calls (the two calls of :func:`estimate_ms` that measured
    ``est_ms`` count as warm-up). For calls of :data:`LONG_CALL_MS` or more, where clearing the L2 between calls
    and do_bench's own estimate cost time without adding to what is measured."""
    import torch

    for _ in range(max(0, math.ceil(warmup_ms / est_ms) - 2)):
        fn()
    n = max(1, round(rep_ms / est_ms))
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in pairs:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs)


def median_ms(fn, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of one ``fn()`` call in milliseconds.

    A quick :func:`estimate_ms` (two calls) first: a call of :data:`LONG_CALL_MS` or more is timed by
    :func:`long_call_median_ms`; a shorter one by ``triton.testing.do_bench(fn, warmup, rep,
    return_mode="median")`` when triton imports, else :func:`cuda_events_median_ms`. ``warmup_ms``/``rep_ms``
    are time budgets in ms, not call counts.
    """
    est = estimate_ms(fn, calls=1)
    if est >= LONG_CALL_MS:
        return long_call_median_ms(fn, warmup_ms, rep_ms, est)
    do_bench = _have_triton_do_bench()
    if do_bench is not None:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return cuda_events_median_ms(fn, warmup_ms, rep_ms)


def check_heads(shape) -> list:
    """The ``(batch, head)`` pairs the reference covers: the first and the last (all query rows of each)."""
    pairs = [(0, 0), (shape.batch - 1, shape.heads - 1)]
    return list(dict.fromkeys(pairs))


def reference_slices(q, k, v, pairs, scale: float | None = None, chunk_rows: int = 2048, causal: bool = False) -> list:
    """float32 attention for the ``(b, h)`` pairs, every query row: softmax(q k^T * scale) v.

    Args:
        q, k, v: ``(batch, heads, seqlen, head_dim)`` tensors (any float dtype, CUDA or CPU); k and v may
            have fewer heads than q (grouped-query attention: query head ``h`` reads K/V head
            ``h // (heads_q // heads_kv)``).
        pairs: list of ``(b, h)`` with ``h`` a query head.
        scale: softmax scale; default ``head_dim ** -0.5``.
        chunk_rows: query rows per chunk (bounds the ``chunk_rows x seqlen_k`` float32 score matrix).
        causal: torch SDPA's ``is_causal=True`` mask: query row ``i`` sees keys ``0..i``.

    Returns:
        a list of ``(seqlen_q, head_dim)`` float32 tensors, one per pair. TF32 is disabled while computing.
    """
    import torch

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"K/V heads ({k.shape[1]}) must divide query heads ({q.shape[1]})")
    group = q.shape[1] // k.shape[1]
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        outs = []
        for b, h in pairs:
            kk = k[b, h // group].float()
            vv = v[b, h // group].float()
            qq = q[b, h].float()
            parts = []
            for r0 in range(0, qq.shape[0], chunk_rows):
                s = (qq[r0 : r0 + chunk_rows] @ kk.T) * scale
                if causal:
                    rows = torch.arange(r0, r0 + s.shape[0], device=s.device)[:, None]
                    s = s.masked_fill(torch.arange(s.shape[1], device=s.device)[None, :] > rows, float("-inf"))
                parts.append(torch.softmax(s, dim=-1) @ vv)
            outs.append(torch.cat(parts))
        return outs
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def check_output(out_bhsd, refs, pairs, shape) -> tuple:
    """Compare an implementation's output with the float32 reference.

    Args:
        out_bhsd: the implementation's output viewed as ``(batch, heads, seqlen_q, head_dim)``.
        refs / pairs: from :func:`reference_slices` / :func:`check_heads`.

    Returns:
        ``(ok, rel_l2, why)``: ``ok`` when the shape matches, the whole output is finite and the worst
        relative L2 error over the reference pairs is ``<= REL_L2_TOL``; ``why`` explains a failure.
    """
    import torch

    want = (shape.batch, shape.heads, shape.seqlen_q, shape.head_dim)
    if tuple(out_bhsd.shape) != want:
        return False, None, f"output shape {tuple(out_bhsd.shape)} != {want}"
    if not torch.isfinite(out_bhsd).all():
        return False, math.inf, "non-finite values in output"
    worst = max(rel_l2(out_bhsd[b, h], ref) for (b, h), ref in zip(pairs, refs))
    if not worst <= REL_L2_TOL:
        return False, worst, f"rel_l2 {worst:.2e} > {REL_L2_TOL:g}"
    return True, worst, ""
