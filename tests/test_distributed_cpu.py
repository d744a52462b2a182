"""Context-parallel attention (attnclimb/distributed.py) on the CPU: the per-step masks of the ring against
the global causal mask, the LSE merge (including -inf rows), the layouts, the argument checks; then ring and
Ulysses attention over gloo in 2, 3 and 4 spawned processes with the float64 reference as the local
attention (tests/cp_workers.py), against float64 attention of the whole sequence."""

import itertools
import math

import pytest
import torch

from attnclimb import distributed as cp
from attnclimb.reference import attention_exact, lse_exact

WORLD_SIZES = (2, 3, 4)


# ------------------------------------------------------------------------------ schedule and layouts


def _global_causal(seqlen):
    return torch.ones(seqlen, seqlen, dtype=torch.bool).tril()


@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 7])
def test_ring_schedule_reproduces_the_global_causal_mask(world_size, layout):
    """For every rank and step, the block the schedule computes (rows, keys, and the kernel's top-left
    causal mask on it) is exactly the part of the global causal mask between this rank's queries and the
    held block's keys; everything outside it is masked."""
    local = 6
    mask = _global_causal(world_size * local)
    for rank in range(world_size):
        mine = cp.sequence_positions(rank, world_size, local, layout)
        steps = cp.ring_schedule(rank, world_size, local, local, is_causal=True, layout=layout)
        assert [s.step for s in steps] == list(range(world_size))
        assert sorted(s.source_rank for s in steps) == list(range(world_size))
        for s in steps:
            theirs = cp.sequence_positions(s.source_rank, world_size, local, layout)
            want = mask[mine][:, theirs]
            got = torch.zeros(local, local, dtype=torch.bool)
            (q0, q1), (k0, k1) = s.q_rows, s.kv_rows
            if not s.skip:
                block = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
                got[q0:q1, k0:k1] = block.tril() if s.is_causal else block
            assert torch.equal(got, want), (rank, s)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_load_balanced_ring_does_equal_work_on_every_rank(world_size):
    """Load-balanced causal: at every step every rank computes the same number of visible scores (the
    ring waits for the slowest rank at every step); the contiguous layout does not."""
    local = 8

    def work(layout):
        out = []
        for rank in range(world_size):
            per_step = []
            for s in cp.ring_schedule(rank, world_size, local, local, is_causal=True, layout=layout):
                rows, keys = s.q_rows[1] - s.q_rows[0], s.kv_rows[1] - s.kv_rows[0]
                per_step.append(0 if s.skip else rows * (rows + 1) // 2 if s.is_causal else rows * keys)
            out.append(per_step)
        return out

    balanced = work("load_balanced")
    assert all(row == balanced[0] for row in balanced), balanced
    contiguous = work("contiguous")
    assert len({sum(row) for row in contiguous}) == world_size  # rank r: r + 1/2 blocks' worth


def test_ring_schedule_non_causal_is_every_key_and_checks_arguments():
    steps = cp.ring_schedule(1, 3, 5, 7, is_causal=False, layout="contiguous")
    assert [(s.source_rank, s.q_rows, s.kv_rows, s.is_causal) for s in steps] == [
        (1, (0, 5), (0, 7), False),
        (0, (0, 5), (0, 7), False),
        (2, (0, 5), (0, 7), False),
    ]
    with pytest.raises(ValueError, match="seqlen_q == seqlen_k"):
        cp.ring_schedule(0, 2, 4, 6, is_causal=True, layout="contiguous")
    with pytest.raises(ValueError, match="even"):
        cp.ring_schedule(0, 2, 5, 5, is_causal=True, layout="load_balanced")
    with pytest.raises(ValueError, match="layout"):
        cp.ring_schedule(0, 2, 4, 4, is_causal=False, layout="zigzag")


@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shard_and_unshard_are_inverse(world_size, layout):
    full = torch.randn(2, 3, 2 * world_size * 4, 5)
    shards = [cp.shard_sequence(full, r, world_size, layout=layout) for r in range(world_size)]
    assert all(s.shape == (2, 3, 8, 5) for s in shards)
    assert torch.equal(cp.unshard_sequence(shards, layout=layout), full)
    positions = torch.cat([cp.sequence_positions(r, world_size, 8, layout) for r in range(world_size)])
    assert torch.equal(positions.sort().values, torch.arange(2 * world_size * 4))
    bshd = full.transpose(1, 2)
    assert torch.equal(cp.shard_sequence(bshd, 0, world_size, layout=layout, dim=1), shards[0].transpose(1, 2))


def test_load_balanced_positions_take_one_chunk_from_each_end():
    assert cp.sequence_positions(0, 2, 4, "load_balanced").tolist() == [0, 1, 6, 7]
    assert cp.sequence_positions(1, 2, 4, "load_balanced").tolist() == [2, 3, 4, 5]
    assert cp.sequence_positions(1, 3, 2, "contiguous").tolist() == [2, 3]


def test_layout_errors():
    x = torch.zeros(1, 1, 10, 4)
    with pytest.raises(ValueError, match="multiple of 3"):
        cp.shard_sequence(x, 0, 3)
    with pytest.raises(ValueError, match="multiple of 4"):
        cp.shard_sequence(x, 0, 2, layout="load_balanced")
    with pytest.raises(ValueError, match="rank"):
        cp.shard_sequence(x, 5, 2)
    with pytest.raises(ValueError, match="layout"):
        cp.sequence_positions(0, 2, 4, "striped")
    with pytest.raises(ValueError, match="even"):
        cp.sequence_positions(0, 2, 3, "load_balanced")


# -------------------------------------------------------------------------------------------- merge


def _partials(q, k, v, cuts, causal=False):
    """(O_i, LSE_i) of the key ranges between ``cuts``, with the causal mask over global key positions."""
    parts = []
    for k0, k1 in itertools.pairwise(cuts):
        s = torch.matmul(q.double(), k[:, :, k0:k1].double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if causal:
            rows = torch.arange(q.shape[2])[:, None]
            s = s.masked_fill(torch.arange(k0, k1)[None, :] > rows, -math.inf)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isneginf(lse), 0, lse)[..., None])
        parts.append((torch.matmul(p, v[:, :, k0:k1].double()), lse))
    return parts


@pytest.mark.parametrize("causal", [False, True])
def test_merge_of_partials_is_attention_over_all_keys(causal):
    """Split the keys (an empty part among them; with causal, parts that some rows cannot see at all), merge
    the partials: exact attention over all keys, in float64 to ~1e-15 and in fp32 to its rounding."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 16, generator=g) for _ in range(3))
    parts = _partials(q, k, v, [0, 2, 2, 5, 9], causal)
    assert torch.isneginf(parts[1][1]).all()  # the empty part
    if causal:
        assert torch.isneginf(parts[3][1][..., :5]).all()  # rows 0..4 see none of keys 5..8
    ref, ref_lse = attention_exact(q, k, v, causal=causal), lse_exact(q, k, causal=causal)
    out, lse = cp.merge_partials(parts, dtype=torch.float64)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-13)
    out32, lse32 = cp.merge_partials(reversed(parts))
    assert out32.dtype == lse32.dtype == torch.float32
    torch.testing.assert_close(out32, ref.float(), rtol=1e-5, atol=1e-6)


def test_merge_handles_rows_without_keys_and_huge_lse():
    """Rows whose every part is -inf stay at O = 0, LSE = -inf (no NaN); a part with a huge LSE takes all
    the weight without overflow."""
    out = torch.zeros(1, 1, 3, 2)
    lse = torch.full((1, 1, 3), -math.inf)
    cp.merge_into(out, lse, torch.zeros(1, 1, 3, 2), torch.full((1, 1, 3), -math.inf))
    assert torch.equal(out, torch.zeros(1, 1, 3, 2)) and torch.isneginf(lse).all()
    o1 = torch.tensor([[[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]]])
    cp.merge_into(out, lse, o1, torch.tensor([[[0.0, -math.inf, 1e30]]]))
    o2 = torch.tensor([[[[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]]]])
    cp.merge_into(out, lse, o2, torch.tensor([[[0.0, -math.inf, 0.0]]]))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([4.0, 5.0]))  # equal weights
    assert torch.equal(out[0, 0, 1], torch.zeros(2)) and torch.isneginf(lse[0, 0, 1])
    torch.testing.assert_close(out[0, 0, 2], torch.tensor([5.0, 6.0]))  # e^-1e30 is 0
    assert lse[0, 0, 0].item() == pytest.approx(math.log(2)) and lse[0, 0, 2] == torch.tensor(1e30)


def test_merge_into_a_view_updates_only_those_rows():
    out = torch.zeros(1, 2, 6, 4)
    lse = torch.full((1, 2, 6), -math.inf)
    o_i, lse_i = torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3)
    cp.merge_into(out[:, :, 3:], lse[:, :, 3:], o_i, lse_i)
    assert torch.equal(out[:, :, 3:], o_i) and torch.equal(out[:, :, :3], torch.zeros(1, 2, 3, 4))
    assert torch.equal(lse[:, :, 3:], lse_i) and torch.isneginf(lse[:, :, :3]).all()
    with pytest.raises(ValueError, match="at least one"):
        cp.merge_partials([])


# -------------------------------------------------------------------------------- argument checks


def test_argument_errors_come_before_any_communication():
    q = torch.zeros(1, 4, 8, 16)
    for fn in (cp.ring_attention, cp.ulysses_attention):
        with pytest.raises(ValueError, match="batch, heads, seqlen_local, head_dim"):
            fn(q[0], q, q)
        with pytest.raises(TypeError, match="must be a tensor"):
            fn(q, None, q)
        with pytest.raises(ValueError, match="must divide"):
            fn(q, q[:, :3], q[:, :3])
        with pytest.raises(ValueError, match="one shape"):
            fn(q, q, q[:, :, :4])
        with pytest.raises(TypeError, match="is_causal"):
            fn(q, q, q, is_causal=1)
        with pytest.raises(ValueError, match="layout"):
            fn(q, q, q, layout="zigzag")
        with pytest.raises(RuntimeError, match="init_process_group"):  # no process group in this process
            fn(q, q, q, local_attention=cp.exact_local_attention)
    with pytest.raises(ValueError, match="scheme"):
        cp.context_parallel_attention(q, q, q, scheme="tree")


def test_exact_local_attention_returns_float64_o_and_lse():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, 5, 8, generator=g), torch.randn(1, 2, 7, 8, generator=g)
    o, lse = cp.exact_local_attention(q, k, k, scale=0.5, is_causal=True)
    assert o.dtype == lse.dtype == torch.float64 and o.shape == (1, 4, 5, 8) and lse.shape == (1, 4, 5)
    torch.testing.assert_close(o, attention_exact(q, k, k, scale=0.5, causal=True))


# ------------------------------------------------------------------ ring and Ulysses over gloo


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """``spawned(world_size)``: every case of tests/cp_workers.py run once in ``world_size`` processes."""
    import cp_workers

    cache = {}

    def run(world_size):
        if world_size not in cache:
            tmp = tmp_path_factory.mktemp(f"cp{world_size}")
            cache[world_size] = cp_workers.spawn_cases(world_size, list(cp_workers.CASES), tmp)
        return cache[world_size]

    return run


def _case_names():
    import cp_workers

    return sorted(cp_workers.CASES)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", _case_names())
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_context_parallel_over_gloo(spawned, world_size, case):
    results = spawned(world_size)[case]
    failed = [f"rank {r}:\n{res}" for r, res in enumerate(results) if res != "ok"]
    assert not failed, "\n".join(failed)
