"""The trace command on a Hopper GPU (skipped without one): every instrumented rung's trace build gives
the untraced kernel's output bit for bit, and its decoded buffer has the phases the kernel records."""

import itertools
import json

import pytest

from attnclimb import rungs, trace

pytestmark = pytest.mark.gpu
TRACED = [r.key for r in trace.instrumented_rungs()]


def _args(*argv):
    import argparse

    p = argparse.ArgumentParser()
    trace.add_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("key", TRACED)
def test_trace_runs_and_decodes(key, tmp_path):
    r = rungs.get(int(key[4:]))
    sk = 4 * r.block_n + 5  # a ragged last tile
    assert trace.main(_args(str(r.number), "--shape", f"1x4x300x{sk}", "--out", str(tmp_path))) == 0
    doc = json.loads((tmp_path / f"rung{r.number:02d}.json").read_text())
    tiles = -(-sk // r.block_n)
    assert doc["unit"] == "ns" and doc["ctas"], doc.get("ctas")
    for cta in doc["ctas"]:
        for wg in cta["warpgroups"]:
            assert wg["dropped"] == 0
            events = wg["events"]
            assert all(e["t1"] >= e["t0"] for e in events)
            assert all(a["t1"] <= b["t0"] for a, b in itertools.pairwise(events)), "phases of one thread overlap"
            if wg["role"] == "producer":
                assert sum(e["phase"] == "tma" and e["what"] != "Q" for e in events) >= tiles
            else:
                assert sum(e["phase"] == "epilogue" for e in events) >= 1
                assert sum(e["phase"] == "wait" and e["what"] == "K full" for e in events) >= tiles
    assert (tmp_path / f"rung{r.number:02d}.svg").exists()


def test_sm_clock_trace(tmp_path):
    assert trace.main(_args("10", "--shape", "1x2x256x1024", "--clock", "sm", "--out", str(tmp_path))) == 0
    doc = json.loads((tmp_path / "rung10.json").read_text())
    assert doc["unit"] == "cycles" and doc["timer_step"] >= 1


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_top_rung_head_dim_64_trace(causal, tmp_path):
    """The top rung's head_dim 64 build (three consumer warpgroups) traced, causal and not: the output equals
    the untraced kernel's (trace.main checks it bit for bit), every consumer warpgroup of the variant that ran
    recorded its K/V tiles and an epilogue, and the files carry the variant's name."""
    top = rungs.TOP
    argv = [str(top.number), "--shape", "1x4x700x700", "--head-dim", "64", "--out", str(tmp_path)]
    assert trace.main(_args(*argv, *(["--causal"] if causal else []))) == 0
    stem = f"rung{top.number:02d}{'-causal' if causal else ''}-d64"
    doc = json.loads((tmp_path / f"{stem}.json").read_text())
    built = trace.launched_variant(trace.traced(top), 700, causal, 64)
    assert doc["shape"]["head_dim"] == 64 and bool(doc.get("causal")) == causal and doc["ctas"]
    for cta in doc["ctas"]:
        assert [wg["role"] for wg in cta["warpgroups"]] == ["producer"] + ["consumer"] * (built.threads // 128 - 1)
        for wg in cta["warpgroups"][1:]:
            assert wg["dropped"] == 0
            assert sum(e["phase"] == "epilogue" for e in wg["events"]) >= 1
            assert sum(e["phase"] == "wait" and e["what"] == "K full" for e in wg["events"]) >= 1
