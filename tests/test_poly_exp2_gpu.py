"""The ``poly`` A/B variants of the top rung (scripts/make_variants.py: a share of the exponentials on the FMA
pipe through softmax.cuh's ``poly_exp2``) on the GPU (needs a Hopper GPU): as exact as the top rung on random,
x30-logit and near-constant inputs and on issue 6's far-offset, tie and fp32-limit logits, at head_dim 128 and
64, NaN-poisoned outputs. A variant that is faster but fails here does not become a rung."""

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from test_gpu import OFFSET_CASES, TOL, _gen, make_inputs
from test_gpu_features import run_features

from attnclimb import rungs
from attnclimb.reference import attention_exact, far_offset_inputs, rel_l2

pytestmark = pytest.mark.gpu
TOP = rungs.TOP


@pytest.fixture(scope="module", params=[2, 8])
def poly_rung(request):
    """make_variants.py's ``poly{N}`` of the top rung as a rung of its own (its source written beside the
    kernels, as scripts/ab_rungs.py does, and removed afterwards)."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("make_variants", root / "scripts" / "make_variants.py")
    mv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mv)
    r = dataclasses.replace(TOP, name=f"{TOP.name}_poly{request.param}")
    r.source.write_text(mv.poly(request.param)(TOP.source.read_text()))
    yield r
    r.source.unlink(missing_ok=True)


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
