"""Workers of the context-parallel tests: each case runs in every rank of a process group of spawned
processes (torch.multiprocessing, one per rank; gloo on the CPU, NCCL on GPUs) and checks its own shard.

:func:`spawn_cases` starts ``world_size`` processes once for a list of cases (a process costs seconds of
imports, a case milliseconds), each rank runs every case and writes ``{case: "ok" | traceback}`` to a JSON
file, and the parent returns them. A case that fails on one rank while the others wait in a collective
ends at the process group's timeout instead of hanging the test run.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from attnclimb import distributed as cp
from attnclimb.reference import attention_exact, lse_exact, rel_l2

TIMEOUT_S = 60
TOL = 1e-5  # float64 local attention, fp32 merge: ~1e-7 in practice


def _full_inputs(batch, heads, heads_kv, seqlen, head_dim, seqlen_k=None, dtype=torch.float32, device="cpu"):
    """The whole sequence's q, k, v: the same on every rank (one seed)."""
    g = torch.Generator().manual_seed(1234)
    seqlen_k = seqlen if seqlen_k is None else seqlen_k
    q = torch.randn(batch, heads, seqlen, head_dim, generator=g)
    k = torch.randn(batch, heads_kv, seqlen_k, head_dim, generator=g)
    v = torch.randn(batch, heads_kv, seqlen_k, head_dim, generator=g)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def _check_against_exact(
    fn,
    rank,
    n,
    *,
    heads=3,
    heads_kv=None,
    local=4,
    local_k=None,
    is_causal=False,
    layout="contiguous",
    scale=None,
    dtype=torch.float32,
    group=None,
    tol=TOL,
):
    """Run ``fn`` (ring or Ulysses) on this rank's shard and compare O and LSE with the float64 attention of
    the whole sequence, sharded the same way."""
    heads_kv = heads if heads_kv is None else heads_kv
    local_k = local if local_k is None else local_k
    q, k, v = _full_inputs(2, heads, heads_kv, n * local, 16, seqlen_k=n * local_k, dtype=dtype)
    ref = attention_exact(q, k, v, scale=scale, causal=is_causal)
    ref_lse = lse_exact(q, k, scale=scale, causal=is_causal)
    qs, ks, vs = (cp.shard_sequence(t, rank, n, layout=layout) for t in (q, k, v))
    kw = {"group": group, "scale": scale, "is_causal": is_causal, "layout": layout}
    # Both calls before any assertion, so that every rank makes the same collectives even when one fails.
    out, lse = fn(qs, ks, vs, return_lse=True, local_attention=cp.exact_local_attention, **kw)
    plain = fn(qs, ks, vs, local_attention=cp.exact_local_attention, **kw)
    assert out.dtype == dtype and out.shape == qs.shape, (out.dtype, out.shape)
    assert lse.dtype == torch.float32 and lse.shape == qs.shape[:3], (lse.dtype, lse.shape)
    err = rel_l2(out, cp.shard_sequence(ref, rank, n, layout=layout))
    err_lse = rel_l2(lse, cp.shard_sequence(ref_lse, rank, n, layout=layout))
    assert err <= tol and err_lse <= 1e-6, f"rank {rank}/{n}: rel-L2 O {err:.2e}, LSE {err_lse:.2e}"
    assert torch.equal(plain, out)  # return_lse changes nothing else


def case_ring_noncausal(rank, n):
    _check_against_exact(cp.ring_attention, rank, n)


def case_ring_gqa_scale(rank, n):
    _check_against_exact(cp.ring_attention, rank, n, heads=4, heads_kv=2, scale=0.3)


def case_ring_cross_lengths(rank, n):
    """Non-causal with seqlen_k_local != seqlen_q_local (e.g. a sharded cross-attention)."""
    _check_against_exact(cp.ring_attention, rank, n, local=5, local_k=3)


def case_ring_causal_load_balanced(rank, n):
    _check_against_exact(cp.ring_attention, rank, n, local=6, is_causal=True, layout="load_balanced")


def case_ring_causal_contiguous(rank, n):
    _check_against_exact(cp.ring_attention, rank, n, local=5, is_causal=True, layout="contiguous")


def case_ring_bf16(rank, n):
    """bf16 inputs: output in bf16 (one rounding of the fp32 merge), so the bf16 tolerance."""
    _check_against_exact(
        cp.ring_attention, rank, n, local=6, is_causal=True, layout="load_balanced", dtype=torch.bfloat16, tol=1e-2
    )


def case_ring_subgroup(rank, n):
    """A process group that is not the world (ranks 1 .. n-1): the ring's peers are group ranks mapped to
    global ranks."""
    members = list(range(1, n)) if n > 2 else [0, 1]
    group = dist.new_group(members)  # every rank takes part in creating it
    try:
        if rank in members:
            _check_against_exact(
                cp.ring_attention,
                members.index(rank),
                len(members),
                local=4,
                is_causal=True,
                layout="load_balanced",
                group=group,
            )
    finally:
        dist.barrier()


def case_ulysses_noncausal_gqa(rank, n):
    _check_against_exact(cp.ulysses_attention, rank, n, heads=2 * n, heads_kv=n)


def case_ulysses_causal_contiguous(rank, n):
    _check_against_exact(cp.ulysses_attention, rank, n, heads=n, local=3, is_causal=True, layout="contiguous")


def case_ulysses_causal_load_balanced(rank, n):
    _check_against_exact(cp.ulysses_attention, rank, n, heads=2 * n, local=4, is_causal=True, layout="load_balanced")


def case_ulysses_noncausal_load_balanced(rank, n):
    _check_against_exact(cp.ulysses_attention, rank, n, heads=n, local=4, layout="load_balanced", scale=0.2)


def case_gather_sequence(rank, n):
    full = torch.arange(2 * 3 * (2 * n * 3), dtype=torch.float32).reshape(2, 3, 2 * n * 3, 1)
    for layout in cp.LAYOUTS:
        mine = cp.shard_sequence(full, rank, n, layout=layout)
        assert torch.equal(cp.gather_sequence(mine, layout=layout), full), layout


def case_ulysses_heads_error(rank, n):
    """Head counts that do not split over the ranks: a ValueError on every rank, before any communication."""
    q = torch.zeros(1, n + 1, 4, 8)
    try:
        cp.ulysses_attention(q, q, q, local_attention=cp.exact_local_attention)
    except ValueError as exc:
        assert "multiples of world_size" in str(exc)
    else:
        raise AssertionError("no ValueError")


def case_forward_only_with_requires_grad(rank, n):
    """Inputs that require grad: the same output (computed without a graph), a grad_fn whose backward raises
    NotImplementedError on every rank (it used to raise an in-place error on some ranks and return wrong K/V
    gradients on rank 0 of a contiguous causal ring), and no grad_fn under no_grad."""
    import pytest

    q, k, v = _full_inputs(1, n, n, 4 * n, 8)
    shards = [cp.shard_sequence(t, rank, n).clone().requires_grad_() for t in (q, k, v)]
    kw = {"local_attention": cp.exact_local_attention, "is_causal": True}
    for fn in (cp.ring_attention, cp.ulysses_attention):
        out, lse = fn(*shards, return_lse=True, **kw)
        with torch.no_grad():
            plain = fn(*shards, **kw)
        assert out.requires_grad and not lse.requires_grad and plain.grad_fn is None
        assert torch.equal(out.detach(), plain)
        out.mul_(1.0)  # an in-place op on the output is fine (it is not a view of an input)
        with pytest.raises(NotImplementedError, match="forward-only"):
            out.sum().backward()


def case_not_a_member_of_the_group(rank, n):
    """A process outside the group it passes gets a ValueError (the ring used to return zeros there, Ulysses
    a reshape error); the members compute as usual."""
    import pytest

    members = [0] if n == 2 else [0, 1]
    group = dist.new_group(members)
    try:
        q = torch.randn(1, 2, 4, 8)
        for fn in (cp.ring_attention, cp.ulysses_attention):
            if rank in members:
                out = fn(q, q, q, group=group, local_attention=cp.exact_local_attention)
                assert out.shape == q.shape
            else:
                with pytest.raises(ValueError, match="not a member"):
                    fn(q, q, q, group=group, local_attention=cp.exact_local_attention)
        if rank not in members:
            with pytest.raises(ValueError, match="not a member"):
                cp.gather_sequence(q, group=group)
    finally:
        dist.barrier()


def _diffusers_cp(rank, n, degree_name):
    """diffusers' context parallelism (``ring_degree`` or ``ulysses_degree`` = n) on the attnclimb backend:
    the shards' output equals the whole sequence's attention, and the local attention that ran was ours
    (here its CPU fallback, counted)."""
    import warnings

    from diffusers import ContextParallelConfig, ParallelConfig
    from diffusers.models import attention_dispatch as ad
    from torch.distributed.device_mesh import init_device_mesh

    import attnclimb
    from attnclimb import sdpa

    member = attnclimb.register_diffusers_backend()
    assert ad._AttentionBackendRegistry._is_context_parallel_available(member)
    mesh_shape = (n, 1) if degree_name == "ring_degree" else (1, n)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("ring", "ulysses"))
    config = ParallelConfig(context_parallel_config=ContextParallelConfig(**{degree_name: n}))
    config.setup(rank, n, torch.device("cpu"), mesh=mesh)
    calls = []
    for name in ("scaled_dot_product_attention", "scaled_dot_product_attention_lse"):
        original = getattr(sdpa, name)

        def counted(*a, _original=original, _name=name, **kw):
            calls.append(_name)
            return _original(*a, **kw)

        setattr(sdpa, name, counted)
    q, k, v = (t.transpose(1, 2) for t in _full_inputs(1, n, n, 4 * n, 16))  # BSHD, n heads
    qs, ks, vs = (cp.shard_sequence(t, rank, n, dim=1) for t in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", attnclimb.AttnclimbFallbackWarning)
        out = ad.dispatch_attention_fn(qs, ks, vs, backend=member, parallel_config=config)
        fn = ad._AttentionBackendRegistry._backends[member]
        out_lse, lse = fn(qs, ks, vs, return_lse=True, _parallel_config=config)
    ref = attention_exact(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    ref_lse = lse_exact(q.transpose(1, 2), k.transpose(1, 2)).transpose(1, 2)
    err = rel_l2(out, cp.shard_sequence(ref, rank, n, dim=1))
    err_lse = rel_l2(lse, cp.shard_sequence(ref_lse, rank, n, dim=1))
    assert out.shape == qs.shape and err <= TOL and rel_l2(out_lse, out) <= TOL, (out.shape, err)
    assert lse.shape == qs.shape[:3] and err_lse <= 1e-6, (lse.shape, err_lse)
    if degree_name == "ring_degree":  # every step asks for the LSE
        assert calls == ["scaled_dot_product_attention_lse"] * (2 * n), calls
    else:
        assert calls == ["scaled_dot_product_attention", "scaled_dot_product_attention_lse"], calls


def dcase_diffusers_ring(rank, n):
    _diffusers_cp(rank, n, "ring_degree")


def dcase_diffusers_ulysses(rank, n):
    _diffusers_cp(rank, n, "ulysses_degree")


def _check_on_gpu(fn, rank, n, *, heads=12, heads_kv=None, local=2048, is_causal=False, layout="contiguous"):
    """GPU: ``fn`` with the top rung as the local attention, bf16, on this rank's shard, against the top rung
    on the whole sequence (one GPU) and float64; rel-L2 <= 1e-2 for O, <= 1e-4 for the LSE."""
    import attnclimb

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    heads_kv = heads if heads_kv is None else heads_kv
    q, k, v = _full_inputs(1, heads, heads_kv, n * local, 128, dtype=torch.bfloat16, device=device)
    one_gpu, one_gpu_lse = attnclimb.attention(q, k, v, is_causal=is_causal, return_lse=True)
    exact, exact_lse = attention_exact(q, k, v, causal=is_causal), lse_exact(q, k, causal=is_causal)
    qs, ks, vs = (cp.shard_sequence(t, rank, n, layout=layout).contiguous() for t in (q, k, v))
    out, lse = fn(qs, ks, vs, is_causal=is_causal, layout=layout, return_lse=True)  # the kernel by default
    assert out.dtype == torch.bfloat16 and out.shape == qs.shape and lse.shape == qs.shape[:3]

    def mine(t):
        return cp.shard_sequence(t, rank, n, layout=layout)

    errors = {
        "O vs 1 GPU": rel_l2(out, mine(one_gpu)),
        "O vs float64": rel_l2(out, mine(exact)),
        "LSE vs 1 GPU": rel_l2(lse, mine(one_gpu_lse)),
        "LSE vs float64": rel_l2(lse, mine(exact_lse)),
    }
    limits = {"O vs 1 GPU": 1e-2, "O vs float64": 1e-2, "LSE vs 1 GPU": 1e-4, "LSE vs float64": 1e-4}
    bad = {k: f"{e:.2e}" for k, e in errors.items() if not e <= limits[k]}
    assert not bad, f"rank {rank}/{n}: {bad}"


def gcase_ring_noncausal(rank, n):
    _check_on_gpu(cp.ring_attention, rank, n)


def gcase_ring_noncausal_odd_length_gqa(rank, n):
    _check_on_gpu(cp.ring_attention, rank, n, heads=12, heads_kv=4, local=1000)


def gcase_ring_causal_load_balanced(rank, n):
    _check_on_gpu(cp.ring_attention, rank, n, local=2000, is_causal=True, layout="load_balanced")


def gcase_ring_causal_contiguous(rank, n):
    _check_on_gpu(cp.ring_attention, rank, n, local=1536, is_causal=True, layout="contiguous")


def gcase_ulysses_noncausal(rank, n):
    _check_on_gpu(cp.ulysses_attention, rank, n, local=1000)


def gcase_ulysses_causal_load_balanced(rank, n):
    _check_on_gpu(cp.ulysses_attention, rank, n, local=2048, is_causal=True, layout="load_balanced")


# Three registries with distinct keys (the workers look a name up in all of them).
CASES = {name[len("case_") :]: fn for name, fn in globals().items() if name.startswith("case_")}
DIFFUSERS_CASES = {name[len("dcase_") :]: fn for name, fn in globals().items() if name.startswith("dcase_")}
GPU_CASES = {"gpu_" + name[len("gcase_") :]: fn for name, fn in globals().items() if name.startswith("gcase_")}


def _worker(rank, world_size, init_file, out_dir, names, backend):
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    results = {}
    try:
        for name in names:
            try:
                {**CASES, **DIFFUSERS_CASES, **GPU_CASES}[name](rank, world_size)
                results[name] = "ok"
            except Exception:
                results[name] = traceback.format_exc()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        # No rank tears its group down while another may still be inside a collective of the last case.
        dist.barrier()
        dist.destroy_process_group()
    # The results are on disk; leave without the interpreter's teardown. Under load (CI: 3 ranks on 2 cores)
    # a rank's exit after diffusers' functional collectives could abort in torch's own C++ teardown ("terminate
    # called without an active exception", SIGABRT) after every case had passed. A crash *during* a case still
    # fails the test: that rank's JSON is then missing or says which case raised.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn, world_size, tmp_path, *args, backend="gloo"):
    """Run ``fn(rank, world_size, init_file, out_dir, *args, backend)`` in ``world_size`` spawned processes;
    return the per-rank JSON results (a list in rank order)."""
    import torch.multiprocessing as mp

    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    init_file = tmp_path / "init"
    if init_file.exists():
        os.remove(init_file)
    mp.start_processes(
        fn, args=(world_size, str(init_file), str(tmp_path), *args, backend), nprocs=world_size, start_method="spawn"
    )
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]


def spawn_cases(world_size, names, tmp_path, backend="gloo"):
    """Every case of ``names`` on every rank: ``{case: [result of rank 0, rank 1, ...]}``."""
    per_rank = spawn(_worker, world_size, tmp_path, list(names), backend=backend)
    return {name: [r.get(name, "not run") for r in per_rank] for name in names}
