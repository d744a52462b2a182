"""Run one implementation a few times on one shape, for a profiler to pick a launch (no timing, no check).

``python scripts/profile_one.py IMPL BxHxS[xSk] [--causal] [--head-dim D] [--calls N] [--bshd]``: IMPL is ``rungNN``,
``fa4`` or ``sdpa_cudnn`` (see :mod:`attnclimb.bench.peers`); ``--bshd`` passes Q, K, V as ``.transpose(1, 2)`` views
of ``(B, S, H, D)``-contiguous tensors, as diffusers does (the top rung's ``STRIDED`` variant; FA4 takes that layout
natively). Under Nsight Compute, e.g.
``ncu --set full -k regex:attn_fwd -s 1 -c 1 python scripts/profile_one.py rung16 1x16x16384``
(``-s 1`` skips the first launch; FA4's kernel name matches ``regex:.*cutlass.*|.*flash.*``).
"""

import argparse

import torch

from attnclimb.bench.peers import select_impls
from attnclimb.bench.shapes import Shape

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("impl")
ap.add_argument("shape")
ap.add_argument("--causal", action="store_true")
ap.add_argument("--calls", type=int, default=2)
ap.add_argument("--head-dim", type=int, default=128)
ap.add_argument("--bshd", action="store_true", help="Q, K, V as BSHD views (.transpose(1, 2) of (B, S, H, D))")
a = ap.parse_args()
b, h, s, *sk = (int(x) for x in a.shape.split("x"))
shape = Shape(a.shape, a.shape, b, h, s, sk[0] if sk else s, head_dim=a.head_dim, causal=a.causal)
(impl,) = select_impls(None, a.impl)
ok, why = impl.available()
if not ok:
    raise SystemExit(f"{a.impl}: {why}")
impl = impl.for_shape(shape)
q, k, v = (
    torch.randn(b, h, n, a.head_dim, device="cuda", dtype=torch.bfloat16) for n in (s, shape.seqlen_k, shape.seqlen_k)
)
if a.bshd:
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
prepared = impl.prepare(q, k, v)
with impl.context():
    for _ in range(a.calls):
        impl.call(prepared)
torch.cuda.synchronize()
print(f"{a.impl} {a.shape} head_dim={a.head_dim} causal={a.causal} bshd={a.bshd}: {a.calls} calls")
