"""GPU correctness of the causal-order A/B variants that change how work reaches the CTAs (needs a Hopper GPU):
``dynsched`` (scripts/make_variants.py: each next causal work tile from a pair of module-global counters, the
kernel's slot of them given by the launch, ``Rung.sched_slot``) and ``hwsched`` (one CTA per causal work tile,
``Rung.causal_per_tile``), against float64, launch after launch (the last CTA's reset of the counters), on two
streams at once and in a CUDA graph (each captured launch its own slot). Outputs are poisoned with NaN first."""

import math

import pytest
import torch
from scripts_loader import load_script
from test_gpu_features import randn_qkv

from attnclimb import rungs
from attnclimb.reference import attention_exact, rel_l2
from attnclimb.runtime import launch
from attnclimb.runtime.launch import run_rung

pytestmark = pytest.mark.gpu
TOP = rungs.TOP
TOL = 1e-2


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """``{"dynsched": Rung, "hwsched": Rung}``, built as ``ab_rungs.py`` builds them (its files removed after)."""
    d = tmp_path_factory.mktemp("ab")
    load_script("make_variants").main(str(d))
    ab = load_script("ab_rungs")
    try:
        specs = [f"dynsched={d}/dynsched@sched_slot=1", f"hwsched={d}/hwsched@causal_per_tile=1"]
        out = dict(ab.variants(specs, [TOP.number], carriers=(TOP.number,)))
        yield {name: out[f"{TOP.key}-{name}"] for name in ("dynsched", "hwsched")}
    finally:
        ab.cleanup()


def _inputs(b, h, sq, sk, head_dim, seed, h_kv=None):
    return randn_qkv(b, h, sq, sk, head_dim, torch.Generator(device="cuda").manual_seed(seed), h_kv)


def _check(o, q, k, v, what):
    assert not torch.isnan(o).any(), f"{what}: {int(torch.isnan(o).sum())} output elements unwritten or NaN"
    err = rel_l2(o, attention_exact(q, k, v, 1 / math.sqrt(q.shape[-1]), causal=True))
    assert err <= TOL, f"{what}: rel L2 {err:.3e}"


# each with more work tiles than a persistent grid has CTAs (so CTAs take several): a GQA group of 4, Sq < Sk, and
# K/V of all heads above CAUSAL_L2_BYTES (32 MiB) at head_dim 128 (the L2 head groups of one head)
SHAPES = [(3, 40, 700, 700, None), (2, 16, 2000, 2000, 4), (4, 40, 129, 1000, None), (1, 8, 9000, 9000, None)]


@pytest.mark.parametrize("name", ["dynsched", "hwsched"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:4])) + (f"-kv{s[4]}" if s[4] else ""))
def test_variant_matches_float64_launch_after_launch(variants, name, head_dim, shape):
    """Three launches in a row on one stream, fresh inputs each: the second and third find the counters as the
    first one's last CTA left them (reset), or the variant skips or repeats tiles."""
    b, h, sq, sk, h_kv = shape
    if head_dim == 256 and sq > 4096:
        pytest.skip("head_dim 256 at 9k: 72 work tiles, fewer than the CTAs, and the longest run of the file")
    for i in range(3):
        q, k, v = _inputs(b, h, sq, sk, head_dim, seed=i + head_dim, h_kv=h_kv)
        o = torch.full_like(q, float("nan"))
        run_rung(variants[name], q, k, v, o, 1 / math.sqrt(head_dim), causal=True)
        torch.cuda.synchronize()
        _check(o, q, k, v, f"{name} d{head_dim} {shape} launch {i}")


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dynsched_on_two_streams_at_once(variants, head_dim):
    """Launches on two streams take different slots, so where they overlap on the GPU (a launch's CTAs start as the
    other's finish) neither takes the other's tiles or resets its counters (which would leave tiles unwritten)."""
    rung = variants["dynsched"]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    runs = []
    for i in range(4):
        for s in (s1, s2):
            q, k, v = _inputs(2, 40, 2000, 2000, head_dim, seed=10 * i + (s is s2))
            o = torch.full_like(q, float("nan"))
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                run_rung(rung, q, k, v, o, 1 / math.sqrt(head_dim), causal=True)
            runs.append((o, q, k, v, s))
    torch.cuda.synchronize()
    dev = torch.cuda.current_device()
    assert launch._stream_slots[(dev, s1.cuda_stream)] != launch._stream_slots[(dev, s2.cuda_stream)]
    for n, (o, q, k, v, _) in enumerate(runs):
        _check(o, q, k, v, f"dynsched d{head_dim}, launch {n} of two streams")


def test_dynsched_in_a_cuda_graph(variants):
    """A captured launch has a slot of its own: replays on one stream, overlapping eager launches on the
    capturing stream (whose own slot the capture must not have taken), all come out right."""
    rung = variants["dynsched"]
    sc = 1 / math.sqrt(128)
    q, k, v = _inputs(2, 40, 1500, 1500, 128, seed=1)
    o = torch.full_like(q, float("nan"))
    run_rung(rung, q, k, v, o, sc, causal=True)  # compiles, loads and plans before the capture
    capture, replay = torch.cuda.Stream(), torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        run_rung(rung, q, k, v, o, sc, causal=True)
    dev = torch.cuda.current_device()
    assert launch._captured_next[dev] > launch.STREAM_SLOTS
    for i in range(3):
        q2, k2, v2 = _inputs(2, 40, 1500, 1500, 128, seed=20 + i)
        qe, ke, ve = _inputs(2, 40, 1500, 1500, 128, seed=30 + i)
        oe = torch.full_like(qe, float("nan"))
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        o.fill_(float("nan"))
        replay.wait_stream(torch.cuda.current_stream())
        capture.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(replay):
            graph.replay()
        with torch.cuda.stream(capture):  # runs beside the replay: the capture stream's slot, not the graph's
            run_rung(rung, qe, ke, ve, oe, sc, causal=True)
        torch.cuda.synchronize()
        _check(o, q, k, v, f"dynsched graph replay {i}")
        _check(oe, qe, ke, ve, f"dynsched eager launch beside replay {i}")
    assert launch._stream_slots[(dev, capture.cuda_stream)] < launch.STREAM_SLOTS
