"""Input validation of attnclimb.attention: clear TypeError/ValueError, never a crash (no GPU needed)."""

import re

import pytest
import torch

import attnclimb
from attnclimb import rungs


def _t(*shape, dtype=torch.bfloat16, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


def test_wrong_dtype():
    with pytest.raises(TypeError, match=r"float16.*bfloat16"):
        attnclimb.attention(_t(1, 1, 4, 128, dtype=torch.float16), _t(1, 1, 4, 128), _t(1, 1, 4, 128))


def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"must be a torch\.Tensor"):
        attnclimb.attention([1, 2], _t(1, 1, 4, 128), _t(1, 1, 4, 128))


def test_wrong_rank():
    with pytest.raises(ValueError, match="rank 3"):
        attnclimb.attention(_t(1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128))


def test_wrong_head_dim():
    with pytest.raises(ValueError, match="head_dim 96"):
        attnclimb.attention(_t(1, 1, 4, 96), _t(1, 1, 4, 96), _t(1, 1, 4, 96))


@pytest.mark.parametrize("kshape,match", [((2, 1, 4, 128), "batch mismatch"), ((1, 2, 4, 128), "heads mismatch")])
def test_mismatched_batch_heads(kshape, match):
    with pytest.raises(ValueError, match=match):
        attnclimb.attention(_t(1, 1, 4, 128), _t(*kshape), _t(*kshape))


def test_mismatched_k_v_seqlen():
    with pytest.raises(ValueError, match="seqlen_k 4 but v has 5"):
        attnclimb.attention(_t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 5, 128))


def test_zero_sizes_pass_validation():
    # empty batch, heads or sequences are computed (no kernel runs for them): CPU tensors reach the device check
    for qs, ks in [
        ((1, 1, 0, 128), (1, 1, 4, 128)),
        ((1, 1, 4, 128), (1, 1, 0, 128)),
        ((0, 2, 4, 128), (0, 2, 4, 128)),
    ]:
        with pytest.raises(ValueError, match="CUDA"):
            attnclimb.attention(_t(*qs), _t(*ks), _t(*ks))


def test_one_head_of_keys_too_large_for_int32_index_math(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attnclimb import support

    monkeypatch.setitem(support._DEVICE_REASONS, 0, None)  # pretend cuda:0 is a Hopper GPU
    with FakeTensorMode():  # no memory: 2^31 elements of K in one head cannot be split into launches
        q = torch.empty(1, 1, 4, 128, dtype=torch.bfloat16, device="cuda")
        big = torch.empty(1, 1, 2**24, 128, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(ValueError, match="32-bit index math"):
            attnclimb.attention(q, big, big)


def test_cpu_tensors_refused():
    with pytest.raises(ValueError, match="CUDA"):
        attnclimb.attention(_t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128))


@pytest.mark.parametrize(
    "scale,exc",
    [
        ("0.1", TypeError),
        (float("nan"), ValueError),
        (True, TypeError),
        (10**400, ValueError),
        (1e39, ValueError),
        (-float("inf"), ValueError),
        (1 + 2j, TypeError),
    ],
)
def test_bad_scale(scale, exc):
    with pytest.raises(exc, match="scale"):
        attnclimb.attention(_t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128), scale=scale)


@pytest.mark.parametrize("rung,exc", [(99, ValueError), ("3", TypeError), (2.0, TypeError)])
def test_bad_rung(rung, exc):
    with pytest.raises(exc, match="rung"):
        attnclimb.attention(_t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128), rung=rung)


def test_numpy_scalars_pass_scale_and_rung_checks():
    import numpy as np

    # accepted types get as far as the device check (CPU tensors), not a TypeError
    with pytest.raises(ValueError, match="CUDA"):
        attnclimb.attention(
            _t(1, 1, 4, 128), _t(1, 1, 4, 128), _t(1, 1, 4, 128), scale=np.float32(0.1), rung=np.int64(2)
        )


def test_sparse_and_nested_refused():
    dense = _t(1, 1, 4, 128)
    with pytest.raises(ValueError, match="layout"):
        attnclimb.attention(dense.to_sparse(), dense, dense)
    nested = torch.nested.nested_tensor([torch.zeros(1, 4, 128, dtype=torch.bfloat16)] * 2)
    with pytest.raises(ValueError, match="nested"):
        attnclimb.attention(nested, nested, nested)


def test_requires_grad_is_accepted():
    # autograd goes through the custom op now: an input that requires grad gets as far as the device check
    q = _t(1, 1, 4, 128).requires_grad_()
    with pytest.raises(ValueError, match="CUDA"):
        attnclimb.attention(q, _t(1, 1, 4, 128), _t(1, 1, 4, 128))


def test_build_rejects_unknown_rung(capsys):
    from attnclimb.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["build", "--rung", "99"])
    assert exc.value.code == 2 and "unknown rung 99" in capsys.readouterr().err


def test_hopper_available_is_a_bool_and_the_reason_is_separate():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert attnclimb.hopper_available() is False  # a bool: `if attnclimb.hopper_available():` means what it says
    assert attnclimb.hopper_available("cuda:0") is False
    why = attnclimb.hopper_unavailable_reason()
    assert isinstance(why, str) and "GPU" in why


def test_hopper_available_agrees_with_the_reason(monkeypatch):
    from attnclimb import api

    monkeypatch.setattr(api, "_hopper_check", lambda device=None: (True, ""))
    assert attnclimb.hopper_available() is True and attnclimb.hopper_unavailable_reason() is None
    monkeypatch.setattr(api, "_hopper_check", lambda device=None: (False, "an Ampere GPU"))
    assert attnclimb.hopper_available() is False
    assert attnclimb.hopper_unavailable_reason() == "an Ampere GPU"


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
        res = subprocess.run(
            ["git", "diff", "--no-index", "--stat", "--diff-algorithm=myers", str(lower.source), str(upper.source)],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 1 and res.stdout.strip(), f"git diff failed: {res.stderr}"
        summary = res.stdout.strip().splitlines()[-1].strip()  # "1 file changed, N insertions(+), M deletions(-)"
        page = (root / upper.page).read_text()
        assert summary in page, f"{upper.page} does not quote the current diff size: {summary}"


def test_diff_command_shows_neighbours(capsys):
    from attnclimb.__main__ import main

    assert main(["diff", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[:2] == [
        "--- a/attnclimb/kernels/03_cp_async.cu",
        "+++ b/attnclimb/kernels/04_fast_softmax.cu",
    ]
    page = (rungs.KERNEL_DIR.parent.parent / rungs.get(4).page).read_text()
    quoted = re.search(r"(\d+ insertions\(\+\), \d+ deletions\(-\))", page)
    assert "rung03 -> rung04" in err and quoted and quoted.group(1) in err  # as page 04 quotes
    with pytest.raises(SystemExit) as exc:
        main(["diff", str(rungs.TOP.number)])  # nothing above the top rung: an argparse error, exit 2
    err = capsys.readouterr().err
    top = rungs.TOP.number
    assert exc.value.code == 2 and f"rung {top} is the top rung" in err and f"rung {top + 1}" not in err
