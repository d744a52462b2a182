"""The bench's contest on a GPU (skipped otherwise): the call-by-call timer's times follow the work and enter
the contexts; the bench loop times a top rung and cuDNN as contenders, in rounds and call by call; long calls skip
do_bench.

Run: python -m pytest -q -m gpu tests/test_bench_timing_gpu.py
"""

import contextlib

import pytest
import torch

from attnclimb import rungs
from attnclimb.bench import peers, run, shapes, timing

pytestmark = pytest.mark.gpu


def test_interleaved_times_follow_the_work():
    cycles = 2_000_000  # ~1 ms at 1.98 GHz
    entered = []

    def ctx(tag):
        @contextlib.contextmanager
        def cm():
            entered.append(tag)
            yield

        return cm

    fns = [lambda: torch.cuda._sleep(cycles), lambda: torch.cuda._sleep(2 * cycles)]
    meds = timing.interleaved_ms(fns, 5.0, 60.0, 3, contexts=[ctx("a"), ctx("b")])
    assert len(meds) == 2 and all(len(m) == 3 for m in meds)
    for one, two in zip(*meds):
        assert one > 0 and two / one == pytest.approx(2.0, rel=0.05)
    # every timed call entered its own context (plus the estimate's and warm-up's)
    assert entered.count("a") >= 3 and entered.count("b") >= 3 and set(entered) == {"a", "b"}
    assert timing.estimate_ms(fns[1]) == pytest.approx(2 * timing.estimate_ms(fns[0]), rel=0.05)


def test_bench_loop_times_top_rung_and_cudnn_together():
    impls = [peers.RungImpl(rungs.TOP), peers.make_peer("sdpa_cudnn")]
    impls = [i for i in impls if i.available()[0]]
    if len(impls) < 2:
        pytest.skip("SDPA cuDNN not available")
    shape = shapes.Shape("t-1k", "1k", 2, 4, 1024, 1024)
    for interleave in (False, True):
        rows, notes, settings = run.run_bench(
            impls, [shape], 2.0, 10.0, rounds=3, contest_span=100.0, interleave=interleave, contest_warmup_ms=20.0
        )
        assert notes == []
        assert settings["contenders"] == {"t-1k": [i.key for i in impls]}
        assert settings["interleaved"] == (settings["contenders"] if interleave else {})
        for r in rows:
            assert r["status"] == "ok" and len(r["rounds_ms"]) == 3 and r["ms"] > 0


def test_long_calls_skip_do_bench_and_time_the_work():
    """A call of timing.LONG_CALL_MS or more is timed by CUDA events around each call, in few calls: two for the
    estimate and max(1, round(rep / call)) timed ones; a short call still goes to do_bench (more calls)."""
    n = [0]

    def sleeper(cycles):
        def fn():
            n[0] += 1
            torch.cuda._sleep(cycles)

        return fn

    long_fn = sleeper(60_000_000)  # ~30-45 ms at 1.3-2 GHz
    est = timing.estimate_ms(long_fn)
    assert est >= timing.LONG_CALL_MS
    n[0] = 0
    ms = timing.median_ms(long_fn, 25.0, 100.0)
    assert ms == pytest.approx(est, rel=0.05)
    assert 3 <= n[0] <= 6  # 2 for the estimate, 0-1 warm-up, 1-3 timed (do_bench alone would make 7 or more)
    n[0] = 0
    short = timing.median_ms(sleeper(200_000), 5.0, 20.0)  # ~0.1 ms: do_bench
    assert 0 < short < timing.LONG_CALL_MS and n[0] > 20
