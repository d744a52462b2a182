"""The ``lround`` and ``poly`` A/B variants of rung 14 (scripts/make_variants.py: l from every rounded P;
a share of the exponentials on the FMA pipe through softmax.cuh's ``poly_exp2``) on the GPU (needs a Hopper
GPU): as exact as rung 14 on random, x30-logit and near-constant inputs and on issue 6's far-offset, tie
and fp32-limit logits, at head_dim 128 and 64, NaN-poisoned outputs; lround as exact as rung 13 on tied
maxima. A variant that is faster but fails here does not become a rung."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from test_gpu import OFFSET_CASES, TOL, _gen, make_inputs
from test_gpu_features import run_features
from test_lazy_rescale_gpu import _dominant_key_inputs, lse_rel_err
from test_variants_cpu import _inlined, _load

from attnclimb import rungs
from attnclimb.reference import (
    RESCALE_THRESHOLD,
    attention_exact,
    attention_tiled,
    far_offset_inputs,
    lse_exact,
    rel_l2,
)

pytestmark = pytest.mark.gpu
TOP = rungs.get(14)  # the variants rewrite rung 14 (make_variants.VARIANTS_OF), where they were measured


def variant_rung(name, out):
    """make_variants.py's variant ``name`` of the top rung (written under ``out``) as a rung of its own: its
    source, headers inlined, beside the kernels, as scripts/ab_rungs.py does; remove ``.source`` afterwards."""
    _load().main(str(out))
    r = dataclasses.replace(TOP, name=f"{TOP.name}_{name}")
    r.source.write_text(_inlined(Path(out) / name))
    return r


@pytest.fixture(scope="module", params=["poly2", "poly4", "poly8"])
def poly_rung(request, tmp_path_factory):
    r = variant_rung(request.param, tmp_path_factory.mktemp("ab"))
    yield r
    r.source.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def lround_rung(tmp_path_factory):
    r = variant_rung("lround", tmp_path_factory.mktemp("ab"))
    yield r
    r.source.unlink(missing_ok=True)


@pytest.mark.parametrize("ties", [1, 4])
@pytest.mark.parametrize("step", [5.3, 7.0, 7.9])  # P = 2^7.0 rounds up in bf16, 2^5.3 and 2^7.9 down
def test_lround_tied_maxima(lround_rung, step, ties):
    """lround (l from every P rounded, the model's ``round_all_p``) on rows whose ``ties`` equal dominant keys
    rose over a kept reference: its O follows its model rather than the top rung's (l fix: one P rounded), and
    is within 10 % of rung 13's error against float64 (all three rounded to bf16 as written); the LSE exact."""
    q, k, v = _dominant_key_inputs(step, ties=ties)
    kw = {"block_n": TOP.block_n, "kernel_fp32": True, "rescale_threshold": RESCALE_THRESHOLD}
    mine = attention_tiled(q, k, v, 1.0, round_all_p=True, **kw).bfloat16().float()
    top = attention_tiled(q, k, v, 1.0, round_top_p=True, **kw).bfloat16().float()
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    o, lse = run_features(qc, kc, vc, scale=1.0, with_lse=True, rung=lround_rung)
    o = o.float().cpu()
    if ties > 1:
        assert rel_l2(o, mine) < 0.5 * rel_l2(o, top)
    ref = attention_exact(q, k, v, 1.0)
    o13 = run_features(qc, kc, vc, scale=1.0, rung=rungs.get(13))[0].float().cpu()
    assert rel_l2(o, ref) < 1.1 * rel_l2(o13, ref)
    want = lse_exact(q, k, 1.0)
    assert lse_rel_err(lse, want) < 1e-5


@pytest.mark.parametrize("kind", ["normal", "logits_x30", "near_constant"])
def test_poly_variant_random(poly_rung, kind):
    q, k, v = (t.cuda() for t in make_inputs(2, 4, 1000, 1500, kind))
    ref = attention_exact(q, k, v)
    err = rel_l2(run_features(q, k, v, rung=poly_rung)[0], ref)
    top = rel_l2(run_features(q, k, v, rung=TOP)[0], ref)
    assert err <= TOL and err <= 1.1 * top + 1e-4, (err, top)


@pytest.mark.parametrize("case", list(OFFSET_CASES))
def test_poly_variant_far_offset(poly_rung, case):
    sc = 1.0 / math.sqrt(128)
    offset, ties = OFFSET_CASES[case]
    q, k, v = far_offset_inputs(1, 64, 4096, offset(sc), sc, ties=ties, generator=_gen(), device="cuda")
    ref = attention_exact(q, k, v, sc)
    err = rel_l2(run_features(q, k, v, scale=sc, rung=poly_rung)[0], ref)
    top = rel_l2(run_features(q, k, v, scale=sc, rung=TOP)[0], ref)
    assert err <= TOL and err <= 1.1 * top + 1e-4, (case, err, top)


@pytest.mark.parametrize("causal", [False, True])
def test_poly_variant_head_dim_64_causal_lse(poly_rung, causal):
    """head_dim 64 (where the exponentials weigh most), causal with its masked (−inf) scores, with the LSE."""
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(1, 4, 1100, 64, device="cuda", generator=g).bfloat16() for _ in range(3))
    o, lse = run_features(q, k, v, causal=causal, with_lse=True, rung=poly_rung)
    assert rel_l2(o, attention_exact(q, k, v, 1 / 8, causal=causal)) <= TOL
    _, lse_top = run_features(q, k, v, causal=causal, with_lse=True, rung=TOP)
    assert (lse - lse_top).abs().max().item() < 1e-3  # the l of 2^-13 accurate P: ln(1 ± 1e-4)


@pytest.mark.parametrize("name", ["lround", "poly4"])
@pytest.mark.parametrize("causal", [False, True])
def test_variants_fp16(name, causal, tmp_path):
    """The FP16 builds (lround's l from unrounded P there; poly blocks on the FMA pipe) against float64, with
    the LSE, on ordinary values and on Q scaled by 300 (fp16 P far from 1 for most keys)."""
    r = variant_rung(name, tmp_path)
    try:
        g = torch.Generator(device="cuda").manual_seed(9)
        for big in (1.0, 300.0):
            q, k, v = (torch.randn(1, 4, 1000, 128, device="cuda", generator=g).half() for _ in range(3))
            q = (q.float() * big).half()
            sc = 1 / math.sqrt(128)
            o, lse = run_features(q, k, v, scale=sc, causal=causal, with_lse=True, rung=r)
            assert rel_l2(o, attention_exact(q, k, v, sc, causal=causal)) <= TOL
            want = lse_exact(q, k, sc, causal=causal)
            assert lse_rel_err(lse, want) < 1e-4
    finally:
        r.source.unlink(missing_ok=True)
