"""Everything the bench can time: our rungs and the peers (torch SDPA backends, FlashAttention-4).

Each implementation is an :class:`Impl` with a uniform protocol so the runner treats them alike:

* ``available()`` -> ``(bool, reason)``: checked once per run (e.g. FA4 not importable);
* ``unsupported(shape)`` -> reason or ``None``: a shape the implementation cannot compute (a rung without
  the causal, GQA or head_dim variant), skipped with the reason even with ``--no-limits``;
* ``for_shape(shape)`` -> the implementation set up for ``shape``'s variant (``causal``, ``gqa``): itself
  for a plain shape, else a shallow copy with those attributes set, which ``call`` reads;
* ``context()``: a context manager entered around the check and the timing (SDPA backend pinning);
* ``prepare(q, k, v)``: per-input-set preprocessing done OUTSIDE the timed region (FA4's BSHD copies);
* ``call(prepared)`` -> output: the timed work;
* ``to_bhsd(output)`` -> ``(batch, heads, seqlen_q, head_dim)`` tensor for the correctness check.

Inputs everywhere are ``(batch, heads, seqlen, head_dim)`` contiguous bf16 CUDA tensors (``shape.head_dim``:
128, or 64/256 on the feature columns; K and V with ``shape.kv_heads`` heads: grouped-query attention when
fewer); SDPA and FA4 take any of these head dims, a rung those of its compile-time variants; ``native_layout``
says which shape ``call`` takes (``"bhsd"``, or ``"bshd"`` for FA4), for the BSHD-view rows
(:mod:`attnclimb.bench.dropin`). torch and the peers are imported lazily so this module imports on
machines without them.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import ClassVar

PEER_KEYS = ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "fa4")
PEER_LABELS = {
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_flash": "SDPA flash (FA2)",
    "sdpa_efficient": "SDPA efficient",
    "fa4": "FlashAttention-4 (sm90)",
}
REFERENCE_KEY = "sdpa_cudnn"  # ratio_to_cudnn is relative to this impl on the same shape, same run
FA4_KEY = "fa4"  # ratio_to_fa4 likewise


def _one_line(exc: BaseException, limit: int = 160) -> str:
    msg = " ".join(str(exc).split()) or type(exc).__name__
    msg = f"{type(exc).__name__}: {msg}" if not msg.startswith(type(exc).__name__) else msg
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


@dataclass
class Impl:
    """Base class; see the module docstring for the protocol."""

    key: str
    label: str
    kind: str  # "rung" | "peer"
    max_bench_seqlen: int | None = None
    # the variant call() computes (set by for_shape): torch's is_causal=True, and fewer K/V heads than Q's
    causal: bool = False
    gqa: bool = False
    # the shape call() takes: "bhsd" = (batch, heads, seqlen, head_dim), "bshd" = (batch, seqlen, heads, head_dim)
    native_layout: ClassVar[str] = "bhsd"

    def available(self) -> tuple:
        return True, ""

    def unsupported(self, shape) -> str | None:
        """Why this impl cannot compute ``shape`` at all (``None`` = it can); skipped whatever the limits."""
        return None

    def for_shape(self, shape):
        """This impl set up for ``shape``: ``self`` when ``causal``/``gqa`` already match, else a shallow copy
        with them set (the copy shares everything else, e.g. a function found by ``available``)."""
        if (self.causal, self.gqa) == (shape.causal, shape.gqa):
            return self
        other = copy.copy(self)
        other.causal, other.gqa = shape.causal, shape.gqa
        return other

    def context(self):
        return contextlib.nullcontext()

    def prepare(self, q, k, v):
        return (q, k, v)

    def call(self, prepared):
        raise NotImplementedError

    def to_bhsd(self, out):
        return out

    def skip_reason(self, shape) -> str | None:
        """Why this impl is not run on ``shape`` by default (``None`` = run it)."""
        if self.max_bench_seqlen is not None and shape.seqlen > self.max_bench_seqlen:
            return f"too slow for seqlen > {self.max_bench_seqlen} (max_bench_seqlen)"
        return None


def _or_join(words: list) -> str:
    """``["a"] -> "a"``, ``["a", "b"] -> "a or b"``, ``["a", "b", "c"] -> "a, b or c"``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


class RungImpl(Impl):
    """One of our rungs through ``attnclimb.attention(q, k, v, rung=N)``.

    ``head_dims``: the head dims the rung computes, ``Rung.head_dim`` and the keys of ``Rung.head_dims`` (its
    compile-time variants), as :func:`attnclimb.support.features_of` and
    ``attnclimb.runtime.launch.feature_variant`` read them.
    """

    def __init__(self, rung):
        super().__init__(
            key=rung.key, label=f"{rung.number:02d} {rung.name}", kind="rung", max_bench_seqlen=rung.max_bench_seqlen
        )
        self.number = rung.number
        self.features = tuple(rung.features)
        self.head_dims = tuple(sorted({rung.head_dim, *rung.head_dims}))
        self._fn = None

    def skip_reason(self, shape) -> str | None:
        """:meth:`Impl.skip_reason`, and the feature columns (issue 8) only on the top rung: a lower rung with
        the same variants (rung 15 under rung 16) would double their compiles and timing for no new column."""
        from attnclimb.rungs import TOP

        if getattr(shape, "group", "main") != "main" and self.features and self.number != TOP.number:
            return f"the feature columns time the top rung only (rung {TOP.number}; --no-limits times this one too)"
        return super().skip_reason(shape)

    def missing_variants(self, shape) -> list:
        """The variants ``shape`` needs and this rung lacks, as words: ``"causal"``, ``"grouped-query"``,
        ``"head_dim 64"``; ``[]`` when it computes ``shape``."""
        missing = [f for f, on in (("causal", shape.causal), ("gqa", shape.gqa)) if on and f not in self.features]
        missing = ["grouped-query" if f == "gqa" else f for f in missing]
        if shape.head_dim not in self.head_dims:
            missing.append(f"head_dim {shape.head_dim}")
        return missing

    def unsupported(self, shape) -> str | None:
        """``None`` when the rung computes ``shape``, else the variants it lacks and which rungs have them
        (from ``attnclimb.rungs.RUNGS``): ``"no causal variant (issue 8: only the top rung has them)"``,
        ``"no causal or head_dim 256 variant (...)"``, ``"no head_dim 96 variant (no rung has it)"``."""
        missing = self.missing_variants(shape)
        if not missing:
            return None
        from attnclimb.rungs import RUNGS

        have = [r.number for r in RUNGS if not RungImpl(r).missing_variants(shape)]
        if have == [RUNGS[-1].number]:
            who = "issue 8: only the top rung has them"
        elif have:
            who = f"issue 8: rungs {', '.join(map(str, have))} have them"
        else:
            who = "no rung has it" if len(missing) == 1 else "no rung has them"
        return f"no {_or_join(missing)} variant ({who})"

    def available(self) -> tuple:
        try:
            try:
                from attnclimb import attention
            except ImportError:
                from attnclimb.api import attention
        except Exception as exc:  # api.py missing or broken: skip every rung with the reason
            return False, f"attnclimb.attention not importable ({_one_line(exc)})"
        self._fn = attention
        return True, ""

    def call(self, prepared):
        q, k, v = prepared
        if self.causal:
            return self._fn(q, k, v, rung=self.number, is_causal=True)
        return self._fn(q, k, v, rung=self.number)


class SdpaImpl(Impl):
    """``torch.nn.functional.scaled_dot_product_attention`` pinned to one backend."""

    BACKENDS: ClassVar[dict] = {
        "sdpa_cudnn": "CUDNN_ATTENTION",
        "sdpa_flash": "FLASH_ATTENTION",
        "sdpa_efficient": "EFFICIENT_ATTENTION",
    }

    def __init__(self, key: str):
        super().__init__(key=key, label=PEER_LABELS[key], kind="peer")
        self.backend_name = self.BACKENDS[key]

    def available(self) -> tuple:
        try:
            import torch
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except Exception as exc:
            return False, f"torch.nn.attention.sdpa_kernel not available ({_one_line(exc)})"
        if not hasattr(SDPBackend, self.backend_name):
            return False, f"this torch has no SDPBackend.{self.backend_name}"
        if self.key == "sdpa_cudnn" and not torch.backends.cudnn.is_available():
            return False, "cuDNN not available in this torch build"
        return True, ""

    def context(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, self.backend_name))

    def call(self, prepared):
        import torch.nn.functional as F

        q, k, v = prepared
        if self.gqa:  # torch >= 2.8: cuDNN, flash and efficient all take enable_gqa (else: a skipped row)
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class Fa4Impl(Impl):
    """FlashAttention-4's CuTe-DSL path (``flash_attn.cute.flash_attn_func``), BSHD inputs.

    ``prepare`` makes the ``(batch, seqlen, heads, head_dim)`` contiguous copies outside the timed region.
    ``flash_attn_func(q, k, v, causal=...)`` takes K/V with fewer heads natively (grouped-query attention).
    Its causal mask is bottom-right aligned when ``seqlen_q != seqlen_k`` (torch's is top-left); the bench's
    causal shapes are square, where the two agree.
    """

    native_layout: ClassVar[str] = "bshd"

    def __init__(self):
        super().__init__(key="fa4", label=PEER_LABELS["fa4"], kind="peer")
        self._fn = None

    def available(self) -> tuple:
        try:
            from flash_attn.cute import flash_attn_func
        except Exception as exc:
            return False, f"flash_attn.cute not importable ({_one_line(exc, 120)})"
        self._fn = flash_attn_func
        return True, ""

    def prepare(self, q, k, v):
        return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))

    def call(self, prepared):
        q, k, v = prepared
        return self._fn(q, k, v, causal=self.causal)

    def to_bhsd(self, out):
        if isinstance(out, (tuple, list)):  # (out, lse)
            out = out[0]
        return out.transpose(1, 2)


def make_peer(key: str) -> Impl:
    """The peer ``key`` (one of :data:`PEER_KEYS`); ``ValueError`` otherwise."""
    if key == "fa4":
        return Fa4Impl()
    if key in SdpaImpl.BACKENDS:
        return SdpaImpl(key)
    raise ValueError(f"unknown peer {key!r}; known: {', '.join(PEER_KEYS)}")


def _rung_token(tok: str) -> int | None:
    """``"4"``, ``"04"``, ``"rung4"``, ``"rung04"`` -> 4; anything else -> None."""
    t = tok.strip().lower()
    t = t[4:] if t.startswith("rung") else t
    return int(t) if t.isdigit() else None


def select_impls(rungs_spec: str | None = None, impls_spec: str | None = None, all_rungs=None) -> list:
    """Resolve ``--rungs`` / ``--impls`` into an ordered list of :class:`Impl` (our rungs first, then peers).

    Args:
        rungs_spec: ``"4,5,8"``: exactly these rungs. ``None``: the rungs named in ``impls_spec``
            (``rungNN``, or all of them for ``rungs``/``all``), or all rungs when ``impls_spec`` is None too.
        impls_spec: comma list of ``rungNN``, ``sdpa_cudnn``, ``sdpa_flash``, ``sdpa_efficient``, ``fa4`` and
            the groups ``rungs``, ``peers``, ``sdpa``, ``all``. ``None``: every peer.
        all_rungs: the ladder (default ``attnclimb.rungs.RUNGS``).

    Raises:
        ValueError: an unknown rung number or impl name.
    """
    if all_rungs is None:
        from attnclimb.rungs import RUNGS as all_rungs
    by_num = {r.number: r for r in all_rungs}
    by_key = {r.key: r for r in all_rungs}

    want_rungs: list = []
    want_peers: list = []
    if impls_spec is None:
        want_peers = list(PEER_KEYS)
        if rungs_spec is None:
            want_rungs = sorted(by_num)
    else:
        for tok in (t.strip().lower() for t in impls_spec.split(",")):
            if not tok:
                continue
            if tok == "all":
                want_rungs += sorted(by_num)
                want_peers += PEER_KEYS
            elif tok == "rungs":
                want_rungs += sorted(by_num)
            elif tok == "peers":
                want_peers += PEER_KEYS
            elif tok == "sdpa":
                want_peers += [k for k in PEER_KEYS if k.startswith("sdpa_")]
            elif tok in PEER_KEYS:
                want_peers.append(tok)
            elif _rung_token(tok) is not None and tok.startswith("rung"):
                n = _rung_token(tok)
                if n not in by_num:
                    raise ValueError(f"unknown rung {n}; available: {sorted(by_num)}")
                want_rungs.append(n)
            else:
                raise ValueError(
                    f"unknown impl {tok!r}; known: {', '.join([*by_key, *PEER_KEYS])}, rungs, peers, sdpa, all"
                )
    if rungs_spec is not None:
        want_rungs = []
        for tok in (t.strip() for t in rungs_spec.split(",")):
            if not tok:
                continue
            n = _rung_token(tok)
            if n is None or n not in by_num:
                raise ValueError(f"unknown rung {tok!r}; available: {sorted(by_num)}")
            want_rungs.append(n)

    impls = [RungImpl(by_num[n]) for n in sorted(set(want_rungs))]
    impls += [make_peer(k) for k in PEER_KEYS if k in set(want_peers)]
    return impls
