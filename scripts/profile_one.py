"""Run one implementation a few times on one shape, for a profiler to pick a launch (no timing, no check).

``python scripts/profile_one.py IMPL BxHxS[xSk] [--causal] [--head-dim D] [--calls N]``: IMPL is ``rungNN``, ``fa4`` or
``sdpa_cudnn`` (see :mod:`attnclimb.bench.peers`). Under Nsight Compute, e.g.
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
prepared = impl.prepare(q, k, v)
with impl.context():
    for _ in range(a.calls):
        impl.call(prepared)
torch.cuda.synchronize()
print(f"{a.impl} {a.shape} head_dim={a.head_dim} causal={a.causal}: {a.calls} calls")
