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
