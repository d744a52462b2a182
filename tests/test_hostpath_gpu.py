"""The host path of a repeated call on a Hopper GPU (skipped otherwise): the fast path
(``attnclimb.ops.fast_call``) and the launch with pre-packed parameters (``attnclimb/runtime/packed.py``)
give the kernel's results, per call, per stream and per thread, and under CUDA-graph capture.

Run: python -m pytest -q -m gpu tests/test_hostpath_gpu.py
"""

import os
import subprocess
import sys
import threading

import pytest
import torch

import attnclimb
from attnclimb import ops
from attnclimb.reference import attention_exact, rel_l2

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
TOL = 1e-2


def _qkv(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(*shape, generator=g, device="cuda").to(BF16) for _ in range(3)]


def test_repeats_launch_packed_and_compute_each_calls_values():
    q, k, v = _qkv((1, 4, 300, 128), 0)
    outs = []
    for seed in range(3):
        for t, n in zip((q, k, v), _qkv((1, 4, 300, 128), seed)):
            t.copy_(n)  # same addresses: the same key, new values
        outs.append((attnclimb.scaled_dot_product_attention(q, k, v), attention_exact(q, k, v)))
    entries = [e for key, e in ops._FAST.items() if key[0] == "sdpa"]
    assert entries and all(e.plan.packed is not None for e in entries)  # cuLaunchKernel, not cuda.core
    assert len({o.data_ptr() for o, _ in outs}) == 3
    for o, ref in outs:
        assert rel_l2(o, ref) < TOL


def test_repeats_on_two_streams_and_lse():
    q, k, v = _qkv((2, 2, 200, 128), 1)
    ref_o = attention_exact(q, k, v)
    for _ in range(2):
        o0, lse0 = attnclimb.attention(q, k, v, return_lse=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        o1, lse1 = attnclimb.attention(q, k, v, return_lse=True)
    s.synchronize()
    torch.cuda.synchronize()
    assert torch.equal(o0, o1) and torch.equal(lse0, lse1) and rel_l2(o0, ref_o) < TOL


def test_threads_share_one_plan():
    q, k, v = _qkv((1, 2, 256, 128), 2)
    ref = attnclimb.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()
    errors, outs = [], []

    def run():
        try:
            mine = [attnclimb.scaled_dot_product_attention(q, k, v) for _ in range(200)]
            torch.cuda.synchronize()
            outs.extend(mine)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(outs) == 800 and all(torch.equal(o, ref) for o in outs)


def test_cuda_graph_of_a_remembered_call():
    q, k, v = _qkv((1, 2, 128, 128), 3)
    for _ in range(2):
        attnclimb.scaled_dot_product_attention(q, k, v)  # remembered before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attnclimb.scaled_dot_product_attention(q, k, v)
    for seed in (4, 5):
        for t, n in zip((q, k, v), _qkv((1, 2, 128, 128), seed)):
            t.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        assert rel_l2(out, attention_exact(q, k, v)) < TOL


def test_cuda_core_launch_gives_the_same_bits(tmp_path):
    """ATTNCLIMB_LAUNCH=cuda.core (the launch before the packed one) computes the same output bit for bit."""
    code = (
        "import torch, attnclimb\n"
        "g = torch.Generator(device='cuda').manual_seed(7)\n"
        "q, k, v = (torch.randn(2, 3, 300, 128, generator=g, device='cuda').to(torch.bfloat16) for _ in range(3))\n"
        "for _ in range(2): o = attnclimb.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
        "torch.save(o.cpu(), __import__('sys').argv[1])\n"
    )
    outs = []
    for i, env in enumerate(({}, {"ATTNCLIMB_LAUNCH": "cuda.core"})):
        path = str(tmp_path / f"out{i}.pt")
        subprocess.run([sys.executable, "-c", code, path], check=True, env={**os.environ, **env})
        outs.append(torch.load(path))
    assert torch.equal(outs[0], outs[1])
