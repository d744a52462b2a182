"""softmax.cuh's ``poly_exp2`` (2^x on the FMA pipe, issue 13 item 6) through its float32 mirror
``reference.poly_exp2_fp32``: the error bound the header states, its edges (the clamp, −inf, NaN, x = 0), and
that the header's coefficients are the mirror's."""

import math
import re

import torch

from attnclimb import rungs
from attnclimb.reference import POLY_EXP2_C, RESCALE_THRESHOLD, poly_exp2_fp32

HEADER = rungs.TOP.source.parent / "softmax.cuh"


def test_relative_error_bound_over_the_kernels_range():
    """Every float32 x from −126 to the largest P the kernels form (2^RESCALE_THRESHOLD, plus a margin) on a
    dense grid and at the half-integers where the range reduction switches: relative error <= 1.02e-4 (the
    header's bound; bf16 rounds P by up to 2^-9 = 2.0e-3)."""
    grid = torch.linspace(-126.0, RESCALE_THRESHOLD + 2, 3_000_001, dtype=torch.float64).float()
    halves = torch.arange(-252, 2 * int(RESCALE_THRESHOLD) + 4, dtype=torch.float64) / 2
    near = torch.cat([halves, torch.nextafter(halves, halves + 1), torch.nextafter(halves, halves - 1)]).float()
    x = torch.cat([grid, near[near >= -126]])
    rel = (poly_exp2_fp32(x).double() - torch.exp2(x.double())).abs() / torch.exp2(x.double())
    assert rel.max().item() <= 1.02e-4
    assert rel.max().item() > 5e-5  # the bound is tight: a degree-3 polynomial, not MUFU's 2^-22


def test_edges():
    """Below −127 (and −inf) +0, as ex2.approx.ftz; NaN stays NaN; P = 1 exactly at x = 0 (a key at the
    reference), and exact powers of two at the integers the threshold reaches."""
    x = torch.tensor([-math.inf, -1e30, -200.0, -127.0, math.nan, 0.0, -0.0, 1.0, 8.0, -1.0, -60.0])
    y = poly_exp2_fp32(x)
    assert torch.equal(y[:4], torch.zeros(4)) and not torch.signbit(y[:4]).any()  # +0, not −0
    assert math.isnan(y[4].item())
    assert y[5].item() == 1.0 and y[6].item() == 1.0
    assert y[7].item() == 2.0 and y[8].item() == 256.0 and y[9].item() == 0.5 and y[10].item() == 2.0**-60


def test_monotone_enough_for_ties():
    """Equal scores give equal P (a pure function), and a larger x never gives a P smaller by more than the
    error bound: the order of keys is kept up to 2e-4."""
    x = torch.linspace(-20.0, 8.0, 200_001).float()
    y = poly_exp2_fp32(x).double()
    assert (y[1:] >= y[:-1] * (1 - 2.04e-4)).all()
    assert torch.equal(poly_exp2_fp32(x), poly_exp2_fp32(x.clone()))


def test_header_coefficients_are_the_mirrors():
    src = HEADER.read_text()
    line = re.search(r"const float p = (fmaf\(.*\));", src).group(1)
    nums = [float(v.rstrip("f")) for v in re.findall(r"[0-9]+\.[0-9]*f?", line)]
    c3, c2, c1, c0 = nums
    as32 = [torch.tensor(c, dtype=torch.float32).item() for c in (c0, c1, c2, c3)]
    assert as32 == [torch.tensor(c, dtype=torch.float32).item() for c in POLY_EXP2_C]  # the same float32 values
    assert "12583039.f" in src and "0fC2FE0000" in src  # 1.5·2^23 + 127 and −127 (0xC2FE0000)
