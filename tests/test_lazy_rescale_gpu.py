"""Rung 12's lazy rescale and its fast path for kept references on the GPU (and every rung above it, which keeps
them: rungs 12-16), tied to their float32 models (needs a Hopper GPU).

The GPU suite compares every rung with float64 at bf16's tolerance, which cannot tell the lazy rescale from
the eager one. These tests can: on inputs where the rule decides the result's last bits, the output of rungs
12-16 must follow their model (``attention_tiled(..., kernel_fp32=True, rescale_threshold=8.0,
round_top_p="thread")``: a fast path that decides on each thread's own column maxima, one vote, and each
thread's column-max P rounded in l) and rung 11's the eager one. They also check the edges of the rule on the
kernels: scale 0, a soft row whose new max lands in the hard range, and scores rising by just under and over
the threshold. (Before the re-cut the rule and the fast path were two rungs, old 14 and old 15, and old rung
14's model rounded the tile max's P in l, ``round_top_p=True``; it stays here as a model to compare with.)
"""

import math

import pytest
import torch
from test_gpu_features import run_features
from test_lazy_rescale_cpu import TAU, _rising_tiles

from attnclimb import rungs
from attnclimb.reference import LOG2E, attention_exact, attention_tiled, lse_exact, rel_l2

pytestmark = pytest.mark.gpu
EAGER = rungs.get(11)  # the rung below the lazy rescale
# Rung 12 brings the lazy rescale with its kept-reference fast path; rung 13 puts P in two buffers and rung 14 reads
# the warp index uniformly (no arithmetic changes). Rung 15 asks the kept-reference test of the computed P
# (largest P <= 2^8) instead of the scores and rounds each thread's largest P in l, the P of its column max: the
# same model; the rising-max steps 8.5 and 16 fail its vote on every tile after the first, so they run its full
# path after the speculative one. Rung 16 adds the ping-pong turns (no arithmetic changes).
KEPT_RUNGS = [rungs.get(n) for n in range(12, rungs.TOP.number + 1)]
LAZY_RUNGS = pytest.mark.parametrize("lazy", KEPT_RUNGS, ids=lambda r: r.key)


def _dominant_key_inputs(step, seed=1, ties=1):
    """The CPU test's rows dominated by one key ``step`` (log2 units) above a kept reference
    (tests/test_lazy_rescale_cpu.py, test_lazy_model_dominant_key_rounding), with 128-key tiles: the first
    max in tile 0, the dominant key in tile 1 (``ties`` equal copies of it from key 200)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.zeros(1, 2, 64, 128, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 2, 400, 128, dtype=torch.float64)
    k[..., 0] = -40.0
    k[:, :, 0, 0] = 0.0
    k[:, :, 200 : 200 + ties, 0] = round(step / LOG2E * 64) / 64
    v = torch.randn(1, 2, 400, 128, generator=g, dtype=torch.float64)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def lse_rel_err(lse, want):
    """Largest error of a kernel's LSE against float64 ``want``, relative to max(|want|, 1)."""
    return ((lse.double().cpu() - want.cpu()).abs() / want.cpu().abs().clamp(min=1.0)).max().item()


@pytest.mark.parametrize("kept", KEPT_RUNGS, ids=lambda r: r.key)
@pytest.mark.parametrize("ties", [1, 4])
@pytest.mark.parametrize("step", [2.7, 5.3])
def test_lazy_follows_its_model_and_is_as_exact_as_the_eager_rung(step, ties, kept):
    """Rungs 12-16 on the dominant-key rows (``ties`` equal copies of the key, which rose ``step`` over a kept
    reference in tile 1, where the warp takes the fast path): their O is their model's (each thread rounds its
    own column max's P in l, ``round_top_p="thread"``), not the model without the l fix (the dominant P = 2^step
    rounded in P·V only), and with 4 ties not the tile-max model either (old rung 14's: there the thread model
    rounds two of the tied P; the models differ by ~1e-3 after bf16); rung 11's O is the eager model's. Each
    kernel is within half its distance to the other model of its own (all rounded to bf16 as the kernels write
    O). Against float64, with one key the lazy rung is within 10 % of rung 11's error (the models: 1.76e-3
    against 1.72e-3 at step 2.7, 1.608e-3 against 1.605e-3 at 5.3; without the l
    fix 2.3e-3 and 2.5e-3), with four at least as exact as the tile-max model (1.93e-3 / 2.08e-3 against
    2.16e-3 / 2.15e-3); the LSE leaves the fix's roundings out (l_fix): fp32-exact, not 2^-9 off."""
    q, k, v = _dominant_key_inputs(step, ties=ties)
    kw = {"block_n": kept.block_n, "kernel_fp32": True}
    thread = attention_tiled(q, k, v, 1.0, rescale_threshold=TAU, round_top_p="thread", **kw).bfloat16().float()
    tile = attention_tiled(q, k, v, 1.0, rescale_threshold=TAU, round_top_p=True, **kw).bfloat16().float()
    unfixed = attention_tiled(q, k, v, 1.0, rescale_threshold=TAU, **kw).bfloat16().float()
    eager = attention_tiled(q, k, v, 1.0, **kw).bfloat16().float()  # as the kernels write O
    assert rel_l2(thread, unfixed) > 1e-3 and rel_l2(unfixed, eager) > 1e-3  # the inputs separate them
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    o, lse = run_features(qc, kc, vc, scale=1.0, with_lse=True, rung=kept)
    o = o.float().cpu()
    o11 = run_features(qc, kc, vc, scale=1.0, rung=EAGER)[0].float().cpu()
    assert rel_l2(o, thread) < 0.5 * rel_l2(o, unfixed)
    assert rel_l2(o11, eager) < 0.5 * rel_l2(o11, unfixed)
    if ties > 1:
        assert rel_l2(thread, tile) > 5e-4  # the inputs separate the two models
        assert rel_l2(o, thread) < 0.5 * rel_l2(o, tile)
    else:
        assert torch.equal(thread, tile)  # one dominant key: both models round the same P
    assert lse_rel_err(lse, lse_exact(q, k, 1.0)) < 1e-5
    ref = attention_exact(q, k, v, 1.0)
    if ties == 1:
        assert rel_l2(o, ref) < 1.1 * rel_l2(o11, ref) and rel_l2(o11, ref) < 4e-3
    else:
        assert rel_l2(o, ref) < 1.02 * rel_l2(tile, ref)


@LAZY_RUNGS
@pytest.mark.parametrize("step", [4.0, 7.9, 8.5, 16.0])
def test_lazy_rising_max(step, lazy):
    """Scores rising tile by tile by ``step`` (the CPU test's _rising_tiles with the rung's 128-key tiles):
    under the threshold a row keeps its reference and its P reach ~2^step; over it every tile rescales. O and
    the LSE against float64, NaN-poisoned outputs."""
    q, k, v = (t.cuda() for t in _rising_tiles(step, tiles=6, block_n=lazy.block_n, seqlen_q=64))
    o, lse = run_features(q, k, v, scale=1.0, with_lse=True, rung=lazy)
    assert rel_l2(o, attention_exact(q, k, v, 1.0)) < 5e-3
    want = lse_exact(q, k, 1.0)
    assert lse_rel_err(lse, want) < 1e-5


@LAZY_RUNGS
def test_lazy_scale_zero_rescales_on_the_first_tile(lazy):
    """Scale 0 (raised to FLT_MIN): c·FLT_MAX ≈ 5.8 <= 8, so with err starting at 0 the lazy rule would keep
    the initial −FLT_MAX "max" as the reference and give every P the same 2^5.77, rounded in bf16 alike (a
    common error of up to 2^-9 in O). Rungs 12-16 start err at +inf, so the first tile takes its own max and
    every P is 1, as in rung 11: O is the uniform average of V, bit for bit rung 11's, and the LSE ln(seqlen_k)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 128, device="cuda", generator=g).bfloat16() for _ in range(3))
    o, lse = run_features(q, k, v, scale=0.0, with_lse=True, rung=lazy)
    mean = v.double().mean(dim=2, keepdim=True).expand_as(o)
    assert rel_l2(o, mean) < 5e-3
    assert torch.allclose(lse.double(), torch.full_like(lse.double(), math.log(300)), rtol=1e-5)
    o11 = run_features(q, k, v, scale=0.0, rung=EAGER)[0]
    assert torch.equal(o, o11)
    # the model of rungs 12-16 equals the eager one here; a kept −FLT_MAX reference (err starting at 0, what the
    # +inf start prevents) would differ from it by ~1e-3 after bf16 rounding
    qc, kc, vc = (t.cpu() for t in (q, k, v))
    kw = {"block_n": lazy.block_n, "kernel_fp32": True}
    model = attention_tiled(qc, kc, vc, 0.0, rescale_threshold=TAU, round_top_p="thread", **kw)
    assert torch.equal(model, attention_tiled(qc, kc, vc, 0.0, **kw))
    assert rel_l2(o.float().cpu(), model.bfloat16().float()) < 1e-6


@LAZY_RUNGS
def test_lazy_soft_row_into_the_hard_range(lazy):
    """A soft row whose max rises into the hard range by less than 2^8 in P keeps its soft reference (the
    review's case at scale 1: m = 2^29 − 32 has exponent 28, so mul = c and err ≈ −46; the new max 2^29 is a
    hard row's, and (2^29 − m)·c + err ≈ 0 <= 8). The old max's score is built as an exact fp32 sum of bf16
    products (2^29 − 2^21 + 2^20 + ... + 2^5), the new max is 2^29, every other key 2^22 below; O is V of the
    new max (the old one weighs e^-32) against float64, whichever way the kernel's rule went."""
    q = torch.zeros(1, 1, 16, 128, dtype=torch.float64)
    q[..., :17] = 1.0
    k = torch.zeros(1, 1, 400, 128, dtype=torch.float64)
    k[..., 0] = 2.0**29 - 2.0**22
    k[0, 0, 0, 0] = 2.0**29 - 2.0**21
    k[0, 0, 0, 1:17] = torch.tensor([2.0**e for e in range(20, 4, -1)], dtype=torch.float64)
    k[0, 0, 200, 0] = 2.0**29
    v = torch.randn(1, 1, 400, 128, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    s = (q.double() @ k.double().transpose(-1, -2))[0, 0, 0]
    assert s[0].item() == 2.0**29 - 32 and s[200].item() == 2.0**29  # the inputs are what the docstring says
    o = run_features(q.cuda(), k.cuda(), v.cuda(), scale=1.0, rung=lazy)[0].float().cpu()
    assert rel_l2(o, attention_exact(q, k, v, 1.0)) < 5e-3
