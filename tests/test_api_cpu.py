"""Input validation of attnclimb.attention: clear TypeError/ValueError, never a crash (no GPU needed)."""

import pytest
import torch

import attnclimb
from attnclimb import rungs


def _t(*shape, dtype=torch.bfloat16, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


def test_wrong_dtype():
    with pytest.raises(TypeError, match="float16.*bfloat16"):
        attnclimb.attention(_t(1, 1, 4, 128, dtype=torch.float16), _t(1, 1, 4, 128), _t(1, 1, 4, 128))


def test_not_a_tensor():
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        attnclimb.attention([1, 2], _t(1, 1, 4, 128), _t(1, 1, 4, 128))


def test_wrong_rank():
    with pytest.raises(ValueError, match="rank 3"):
        attnclimb.attention(_t(1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128))


def test_wrong_head_dim():
    with pytest.raises(ValueError, match="head_dim 64"):
        attnclimb.attention(_t(1, 1, 4, 64), _t(1, 1, 4, 64), _t(1, 1, 4, 64))


@pytest.mark.parametrize("kshape,match", [((2, 1, 4, 128), "batch mismatch"), ((1, 2, 4, 128), "heads mismatch")])
def test_mismatched_batch_heads(kshape, match):
    with pytest.raises(ValueError, match=match):
        attnclimb.attention(_t(1, 1, 4, 128), _t(*kshape), _t(*kshape))


def test_mismatched_k_v_seqlen():
    with pytest.raises(ValueError, match="seqlen_k 4 but v has 5"):
        attnclimb.attention(_t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 5, 128))


def test_empty_dimension():
    with pytest.raises(ValueError, match="empty dimension"):
        attnclimb.attention(_t(1, 1, 0, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128))


def test_too_large_for_int32_index_math():
    big = torch.empty(1, 1, 2**24, 128, dtype=torch.bfloat16, device="meta")  # 2^31 elements, no memory
    small = torch.empty(1, 1, 4, 128, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="32-bit index math"):
        attnclimb.attention(big, small, small)


def test_cpu_tensors_refused():
    with pytest.raises(ValueError, match="CUDA"):
        attnclimb.attention(_t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128))


@pytest.mark.parametrize("scale,exc", [("0.1", TypeError), (float("nan"), ValueError), (True, TypeError)])
def test_bad_scale(scale, exc):
    with pytest.raises(exc):
        attnclimb.attention(_t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128), scale=scale)


@pytest.mark.parametrize("rung,exc", [(99, ValueError), ("3", TypeError), (2.0, TypeError)])
def test_bad_rung(rung, exc):
    with pytest.raises(exc):
        attnclimb.attention(_t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128), rung=rung)


def test_hopper_available_says_why_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    ok, why = attnclimb.hopper_available()
    assert ok is False and "GPU" in why


def test_ladder_is_contiguous_and_files_exist():
    numbers = [r.number for r in rungs.RUNGS]
    assert numbers == list(range(len(numbers)))
    assert rungs.get(None) is rungs.RUNGS[-1]
    for r in rungs.RUNGS:
        assert r.source.exists(), r.source
        assert (rungs.KERNEL_DIR.parent.parent / r.page).exists(), r.page
        assert r.abi in ("unfused", "pointer", "tma")


def test_rung_pages_quote_the_real_diff_size():
    """Each page's `git diff --no-index --stat` line must match the files as they are now."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    root = rungs.KERNEL_DIR.parent.parent
    for lower, upper in zip(rungs.RUNGS, rungs.RUNGS[1:]):
        res = subprocess.run(["git", "diff", "--no-index", "--stat", str(lower.source), str(upper.source)],
                             capture_output=True, text=True)
        summary = res.stdout.strip().splitlines()[-1].strip()  # "1 file changed, N insertions(+), M deletions(-)"
        page = (root / upper.page).read_text()
        assert summary in page, f"{upper.page} does not quote the current diff size: {summary}"


def test_diff_command_shows_neighbours(capsys):
    from attnclimb.__main__ import main

    assert main(["diff", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("--- 03_cp_async.cu\n+++ 04_fast_softmax.cu\n")
    assert "rung03 -> rung04" in err and "insertions(+)" in err
    with pytest.raises(ValueError, match="unknown rung"):
        main(["diff", "8"])  # there is no rung 9 above the top
