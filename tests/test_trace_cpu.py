"""Measured timelines (issue 11) on a CPU: the TRACE switch leaves untraced builds alone, trace builds
compile without spills and are cached apart, the buffer decoder, and the ``trace`` command with a fake
GPU (and its refusal without one)."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnclimb import rungs, trace
from attnclimb.__main__ import main
from attnclimb.figures import timeline
from attnclimb.runtime import compile_rung, compiler
from attnclimb.runtime.compiler import compile_source
from attnclimb.runtime.sass import code_sections, find_cuobjdump, sass

REPO = Path(__file__).resolve().parents[1]
HEADER = rungs.KERNEL_DIR / "trace.cuh"
TRACED = [r.key for r in rungs.RUNGS if r.number >= 5]


def _rung(key):
    return rungs.get(int(key[4:]))


# ------------------------------------------------------------------------------------------ the switch


def test_the_tma_rungs_are_instrumented():
    assert [r.number for r in trace.instrumented_rungs()] == [r.number for r in rungs.RUNGS if r.abi == "tma"]
    assert [r.number for r in trace.instrumented_rungs()] == list(range(5, rungs.TOP.number + 1))


def test_event_codes_and_constants_match_the_header():
    text = HEADER.read_text()
    codes = {m[0]: int(m[1], 16) for m in re.findall(r"constexpr uint32_t (\w+) = (0x[0-9A-Fa-f]+)u?;", text)}
    assert codes.pop("MAGIC") == trace.MAGIC
    assert codes == {name: code for name, (code, _) in trace.EVENTS.items()}
    assert f"#define TRACE_CTAS {trace.DEFAULT_CTAS}\n" in text
    assert f"#define TRACE_EVENTS {trace.DEFAULT_EVENTS}\n" in text
    assert f"__device__ uint4 {trace.SYMBOL}[" in text
    assert set(trace.PHASE_OF.values()) == set(timeline.PHASES)


@pytest.mark.parametrize("key", TRACED)
def test_trace_statements_pair_up_and_stand_alone(key):
    """Every TRACE_* use is a statement on its own line (the SASS check below strips those lines), the
    recorder is made once, and BEGIN(x) / END(x) alternate: phases never nest (one open stamp)."""
    source = _rung(key).source.read_text()
    uses = [line.strip() for line in source.splitlines() if "TRACE" in line]
    assert all(re.fullmatch(r"TRACE_(INIT|BEGIN|END)\(\w*\);", u) for u in uses), uses
    assert uses[0] == "TRACE_INIT();" and uses.count("TRACE_INIT();") == 1
    pairs = uses[1:]
    assert len(pairs) % 2 == 0
    for begin, end in zip(pairs[::2], pairs[1::2]):
        b, e = re.fullmatch(r"TRACE_BEGIN\((\w+)\);", begin), re.fullmatch(r"TRACE_END\((\w+)\);", end)
        assert b and e and b[1] == e[1] and b[1] in trace.EVENTS, (begin, end)


def test_strip_trace_lines():
    src = '#include "hopper.cuh"\n#include "trace.cuh"\n  TRACE_INIT();\nint x;  // TRACE_ in a comment stays\n'
    src += "    TRACE_BEGIN(WAIT_K);\n    wait();\n    TRACE_END(WAIT_K);\n"
    assert trace.strip_trace_lines(src) == '#include "hopper.cuh"\nint x;  // TRACE_ in a comment stays\n    wait();\n'


@pytest.mark.parametrize("key", TRACED)
def test_untraced_build_is_the_source_without_trace_lines(key):
    """With TRACE off (the default: the host passes no TRACE macro) a rung's machine code is byte for byte
    that of its source with the TRACE_* lines and the trace.cuh include removed: code sections compared
    whole (instructions and their scheduling bits), no digests stored."""
    r = _rung(key)
    stripped = trace.strip_trace_lines(r.source.read_text())
    assert "TRACE" not in stripped and "trace.cuh" not in stripped
    assert stripped != r.source.read_text()
    built, bare = compile_rung(r), compile_source(r, stripped)
    assert code_sections(built.cubin) == code_sections(bare.cubin)
    assert code_sections(built.cubin), "no .text section found"
    assert built.resources == bare.resources
    assert trace.SYMBOL.encode() not in built.cubin


def test_explicit_trace_0_is_the_default():
    r = rungs.get(10)
    off = dataclasses.replace(r, extra_defines={**r.extra_defines, "TRACE": 0})
    assert code_sections(compile_rung(off).cubin) == code_sections(compile_rung(r).cubin)


@pytest.mark.parametrize("key", TRACED)
def test_trace_build_compiles_without_spills(key):
    c = compile_rung(trace.traced(_rung(key)))
    (res,) = c.resources
    assert res.spill_bytes == 0 and res.stack_frame == 0, f"{key} with TRACE=1 spills\n{c.log}"
    assert res.registers <= 255
    assert "serialized" not in c.log, c.log  # ptxas' "wgmma.mma_async instructions are serialized ..."
    assert trace.SYMBOL.encode() in c.cubin
    if find_cuobjdump() is not None:
        text = sass(c.cubin)
        assert "SR_GLOBALTIMER" in text and not re.search(r"\b(LDL|STL)\b", text)


def test_sm_clock_build_compiles():
    c = compile_rung(trace.traced(rungs.get(10), clock="sm"))
    assert c.resources[0].spill_bytes == 0
    if find_cuobjdump() is not None:
        text = sass(c.cubin)
        assert "SR_CLOCK" in text and "SR_GLOBALTIMER" not in text


def test_trace_builds_are_cached_apart(tmp_path, monkeypatch):
    """The macros are part of the cache key: a traced cubin is never served for the untraced rung, nor the
    other way round; the loaded-module cache keys by the Rung object, and traced() returns one per args."""
    monkeypatch.setenv("ATTNCLIMB_CACHE_DIR", str(tmp_path))
    r = rungs.get(7)
    t = trace.traced(r)
    assert t is trace.traced(r, trace.DEFAULT_CTAS, trace.DEFAULT_EVENTS) and t is not r
    assert t is not trace.traced(r, 2) and t is not trace.traced(r, clock="sm")
    assert t.number == r.number and t.source == r.source and t.smem_bytes == r.smem_bytes
    assert "TRACE" not in r.defines() and t.defines()["TRACE"] == 1
    keys = {compiler._key(x, "sm_90a") for x in (r, t, trace.traced(r, 2), trace.traced(r, clock="sm"))}
    assert len(keys) == 4
    plain = compile_rung(r)
    traced_build = compile_rung(t)
    assert not traced_build.cached and traced_build.path != plain.path
    again_plain, again_traced = compile_rung(r), compile_rung(t)
    assert again_plain.cached and again_traced.cached
    assert trace.SYMBOL.encode() not in again_plain.cubin and trace.SYMBOL.encode() in again_traced.cubin

    from attnclimb.runtime import launch

    made = []

    class FakeLoaded:
        def __init__(self, rung, device_index):
            made.append(rung)

    monkeypatch.setattr(launch, "LoadedRung", FakeLoaded)
    monkeypatch.setattr(launch, "_LOADED", {})
    a, b = launch.loaded(r, 0), launch.loaded(t, 0)
    assert a is not b and made == [r, t] and launch.loaded(t, 0) is b


def test_traced_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="rung 4 has no trace instrumentation"):
        trace.traced(rungs.get(4))
    with pytest.raises(ValueError, match="ctas"):
        trace.traced(rungs.get(9), 0)
    with pytest.raises(ValueError, match="clock"):
        trace.traced(rungs.get(9), clock="wall")
    with pytest.raises(ValueError, match="not a trace build"):
        trace.Layout.of(rungs.get(9))
    assert trace.Layout.of(trace.traced(rungs.get(9), 3)) == trace.Layout(3, 3, trace.DEFAULT_EVENTS)
    assert trace.Layout.of(trace.traced(rungs.get(5), clock="sm")) == trace.Layout(4, 1, trace.DEFAULT_EVENTS, "sm")


# ------------------------------------------------------------------------------------------ decoding


def _encode(layout, slots):
    """A buffer as trace.cuh writes it. ``slots``: {(cta, wg): (smid, [(t0, t1, code), ...], count)}."""
    words = np.zeros((layout.ctas, layout.wgs, layout.events + 1, 4), dtype="<u4")
    for (c, w), (smid, events, count) in slots.items():
        words[c, w, 0] = (count, smid, c, trace.MAGIC)
        for i, (t0, t1, code) in enumerate(events[: layout.events]):
            words[c, w, 1 + i] = (t0 & 0xFFFFFFFF, t0 >> 32, t1 & 0xFFFFFFFF, code)
    return words.tobytes()


def test_decode_a_hand_written_buffer():
    """The words spelled out, independent of any encoder: 2 CTAs x 2 warpgroups x 3 events."""
    layout = trace.Layout(ctas=2, wgs=2, events=3)
    w = np.zeros((2, 2, 4, 4), dtype="<u4")
    base = 0x17_0000_0000
    # CTA 0, WG 0 (the producer): a TMA issue, then a wait whose end crossed a 2^32 boundary of the clock
    w[0, 0, 0] = (2, 5, 0, trace.MAGIC)
    w[0, 0, 1] = (0x100, 0x17, 0x180, 0x0305)  # TMA_K, 128 ns
    w[0, 0, 2] = (0xFFFFFFF0, 0x17, 0x10, 0x0500)  # WAIT_K_EMPTY from 0x17_FFFF_FFF0 to 0x18_0000_0010
    # CTA 0, WG 1: 5 events ended, 3 recorded
    w[0, 1, 0] = (5, 5, 0, trace.MAGIC)
    w[0, 1, 1] = (0x200, 0x17, 0x300, 0x0200)  # WAIT_K
    w[0, 1, 2] = (0x300, 0x17, 0x500, 0x0001)  # S
    w[0, 1, 3] = (0x500, 0x17, 0x540, 0x0002)  # softmax
    # CTA 1 never ran (grid of one CTA): no magic
    doc = trace.decode(w.tobytes(), layout, rung=8, meta={"device": "test"})
    assert doc["device"] == "test" and doc["unit"] == "ns" and doc["t_origin"] == base + 0x100
    (cta,) = doc["ctas"]
    assert cta["cta"] == 0 and cta["sm"] == 5
    prod, cons = cta["warpgroups"]
    assert prod["role"] == "producer" and cons["role"] == "consumer"
    assert prod["events"] == [
        {"phase": "tma", "what": "K", "t0": 0, "t1": 0x80},
        {"phase": "wait", "what": "K empty", "t0": 0xFFFFFEF0, "t1": 0xFFFFFEF0 + 0x20},
    ]
    assert [(e["phase"], e["what"], e["t0"], e["t1"]) for e in cons["events"]] == [
        ("wait", "K full", 0x100, 0x200),
        ("S", "S", 0x200, 0x400),
        ("softmax", "softmax", 0x400, 0x440),
    ]
    assert prod["dropped"] == 0 and cons["dropped"] == 2 and trace.dropped_events(doc) == 2
    assert cons["phase_ns"] == {"S": 0x200, "softmax": 0x40, "wait": 0x100}
    assert doc["timer_step"] == 16  # every stamp is a multiple of 16 ns from the first
    timeline.load_trace(doc)  # the drawer accepts it


def test_decode_rejects_impossible_buffers():
    layout = trace.Layout(ctas=1, wgs=1, events=2)
    good = {(0, 0): (3, [(1000, 1100, 0x0001)], 1)}
    trace.decode(_encode(layout, good), layout, rung=6)
    with pytest.raises(ValueError, match="needs"):
        trace.decode(_encode(layout, good)[:-4], layout, rung=6)
    with pytest.raises(ValueError, match="unknown event code"):
        trace.decode(_encode(layout, {(0, 0): (3, [(1000, 1100, 0x0006)], 1)}), layout, rung=6)
    with pytest.raises(ValueError, match="no start stamp"):
        trace.decode(_encode(layout, {(0, 0): (3, [(0, 1100, 0x0001)], 1)}), layout, rung=6)
    words = np.frombuffer(_encode(layout, good), dtype="<u4").copy()
    words[2] = 7  # the header names CTA 7
    with pytest.raises(ValueError, match="header of CTA 7"):
        trace.decode(words.tobytes(), layout, rung=6)


def test_decode_sm_clock_starts_every_cta_at_zero():
    layout = trace.Layout(ctas=2, wgs=1, events=4, clock="sm")
    slots = {
        (0, 0): (1, [(5_000, 5_300, 0x0001), (5_300, 5_400, 0x0002)], 2),
        (1, 0): (2, [(90_000, 90_200, 0x0001)], 1),
    }
    doc = trace.decode(_encode(layout, slots), layout, rung=5)
    assert doc["unit"] == "cycles" and "t_origin" not in doc
    assert [c["t_origin"] for c in doc["ctas"]] == [5_000, 90_000]
    assert [c["warpgroups"][0]["events"][0]["t0"] for c in doc["ctas"]] == [0, 0]
    assert doc["ctas"][0]["warpgroups"][0]["phase_cycles"] == {"S": 300, "softmax": 100}
    assert doc["timer_step"] == 100


def test_decoded_trace_draws(tmp_path):
    layout = trace.Layout(ctas=1, wgs=3, events=8)
    slots = {
        (0, 0): (1, [(1000, 1200, 0x0105), (1200, 1300, 0x0305), (1300, 5000, 0x0500)], 3),
        (0, 1): (1, [(1100, 1500, 0x0100), (1500, 2000, 0x0001), (2000, 2600, 0x0002), (2600, 3000, 0x0003)], 4),
        (0, 2): (1, [(1100, 1600, 0x0100), (1600, 2100, 0x0800), (2100, 2500, 0x0001), (2500, 2600, 0x0004)], 4),
    }
    doc = trace.decode(_encode(layout, slots), layout, rung=16, meta={"name": "pingpong"})  # turns: the top rung
    paths = trace.write_outputs(doc, tmp_path)
    assert [p.name for p in paths] == ["rung16.json", "rung16.svg", "rung16.png"]
    assert json.loads(paths[0].read_text()) == doc
    svg = paths[1].read_text()
    assert "CTA 0, SM 1 · WG 0 (producer)" in svg and "WG 2 (consumer)" in svg
    assert "TMA issue" in svg and "Rung 16 (pingpong): measured phases per warpgroup" in svg


# ------------------------------------------------------------------------------------------ the command


class FakeBackend:
    """The GPU of :func:`attnclimb.trace.run_trace`, on the CPU: torch's attention for every launch and a
    made-up trace buffer. Records the calls so that the order (untraced, warm-up, clear, traced, read)
    can be checked."""

    device = "cpu"

    def __init__(self, perturb=False, dropped=0):
        self.calls, self.perturb, self.dropped = [], perturb, dropped

    def run(self, rung, q, k, v, o, scale, causal=False):
        import torch

        traced_build = bool(rung.defines().get("TRACE"))
        self.calls.append(("run", rung.key, traced_build))
        self.causal_runs = getattr(self, "causal_runs", 0) + bool(causal)
        s = scale * q.float() @ k.float().transpose(-1, -2)
        if causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.softmax(s, dim=-1) @ v.float()
        if traced_build and self.perturb:
            out = out * 1.01
        o.copy_(out.to(o.dtype))

    def synchronize(self):
        self.calls.append(("sync",))

    def clear_buffer(self, rung, nbytes):
        self.calls.append(("clear", nbytes))
        self.cleared = rung

    def read_buffer(self, rung, nbytes):
        self.calls.append(("read", nbytes))
        self.read = rung
        layout = trace.Layout.of(rung)
        assert layout.nbytes == nbytes
        slots = {}
        for c in range(layout.ctas):
            t = 10_000 * (c + 1)
            slots[(c, 0)] = (c, [(t, t + 100, 0x0105), (t + 100, t + 900, 0x0500)], 2)
            for w in range(1, layout.wgs):
                events = [(t, t + 300, 0x0100), (t + 300, t + 700, 0x0001), (t + 700, t + 1200, 0x0002)]
                if self.dropped and w == 1:  # a full slot, and more events ended than it holds
                    events = [(t + 10 * i, t + 10 * i + 5, 0x0002) for i in range(layout.events)]
                slots[(c, w)] = (c, events, len(events) + (self.dropped if w == 1 else 0))
        return np.frombuffer(_encode(layout, slots), dtype=np.uint32)

    def describe(self):
        return {"device": "Fake H200", "sms": 132}


def _args(*argv):
    import argparse

    p = argparse.ArgumentParser()
    trace.add_arguments(p)
    return p.parse_args(argv)


def test_trace_command_with_a_fake_gpu(tmp_path, capsys):
    fake = FakeBackend()
    assert trace.main(_args("10", "--shape", "1x2x200x300", "--out", str(tmp_path)), backend=fake) == 0
    r, t = rungs.get(10), trace.traced(rungs.get(10))
    nbytes = trace.Layout.of(t).nbytes
    runs = [c for c in fake.calls if c[0] == "run"]
    assert runs == [("run", "rung10", False), ("run", "rung10", True), ("run", "rung10", True)]
    order = [c[0] for c in fake.calls]
    assert order.index("clear") > order.index("run") + 1  # after the warm-up
    assert order.index("read") > max(i for i, c in enumerate(order) if c == "run")
    assert ("clear", nbytes) in fake.calls and ("read", nbytes) in fake.calls
    doc = json.loads((tmp_path / "rung10.json").read_text())
    assert doc["rung"] == 10 and doc["name"] == r.name and doc["device"] == "Fake H200"
    assert doc["shape"] == {"batch": 1, "heads": 2, "seqlen_q": 200, "seqlen_k": 300, "head_dim": 128}
    assert doc["command"] == "python -m attnclimb trace 10 --shape 1x2x200x300"
    assert len(doc["ctas"]) == trace.DEFAULT_CTAS and doc["ctas"][1]["sm"] == 1
    assert [wg["role"] for wg in doc["ctas"][0]["warpgroups"]] == ["producer", "consumer", "consumer"]
    assert (tmp_path / "rung10.svg").exists() and (tmp_path / "rung10.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "wrote" in out and "bit for bit" in out


def test_trace_of_a_causal_head_dim_64_call_reads_the_build_that_ran(tmp_path, capsys):
    """``--causal --head-dim 64``: the launches carry the mask, the buffer is read from the compile-time variant
    that run_rung launches (three consumer warpgroups at head_dim 64 on the top rung), and the files get their
    own names, so that such a trace never replaces a rung page's timeline."""
    top = rungs.TOP
    fake = FakeBackend()
    argv = ("--shape", "1x2x200x300", "--causal", "--head-dim", "64", "--out", str(tmp_path))
    assert trace.main(_args(str(top.number), *argv), backend=fake) == 0
    built = trace.launched_variant(trace.traced(top), 300, True, 64)
    assert built.threads == top.head_dims[64].get("threads", top.threads) and built.defines()["CAUSAL"] == 1
    assert built.defines()["TRACE"] == 1 and built.head_dim == 64
    nbytes = trace.Layout.of(built).nbytes
    assert ("clear", nbytes) in fake.calls and ("read", nbytes) in fake.calls and fake.causal_runs == 3
    assert fake.cleared is built and fake.read is built  # the module that ran, not the plain trace build
    stem = f"rung{top.number:02d}-causal-d64"
    doc = json.loads((tmp_path / f"{stem}.json").read_text())
    assert doc["causal"] is True and doc["shape"]["head_dim"] == 64
    assert len(doc["ctas"][0]["warpgroups"]) == built.threads // 128
    assert doc["command"] == f"python -m attnclimb trace {top.number} --shape 1x2x200x300 --causal --head-dim 64"
    assert (tmp_path / f"{stem}.png").exists() and not (tmp_path / f"rung{top.number:02d}.json").exists()
    # the long-K/V tiles of a non-causal call from Rung.long_kv's bound: the buffer of that build
    fake = FakeBackend()
    sk = top.long_kv[0]
    assert trace.main(_args(str(top.number), "--shape", f"1x1x64x{sk}", "--out", str(tmp_path)), backend=fake) == 0
    long = trace.launched_variant(trace.traced(top), sk)
    assert long.block_n == top.long_kv[1]["block_n"] and fake.read is long and fake.cleared is long
    # a rung without the causal feature: refused before anything runs
    assert trace.main(_args("9", "--causal", "--out", str(tmp_path)), backend=FakeBackend()) == 2
    assert "does not support causal" in capsys.readouterr().err


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("seqlen_k", [300, 2048, 6144, 40000])
def test_launched_variant_is_the_build_run_rung_launches(causal, head_dim, seqlen_k):
    """trace reads the buffer of launched_variant(...): it must be the very build (the same memoised object, so
    the same loaded module) that run_rung's own choice (launch._checked_variant) gives for such a call."""
    import torch

    from attnclimb.runtime import launch

    tr = trace.traced(rungs.TOP)
    q = torch.empty(1, 2, 64, head_dim, dtype=torch.bfloat16)
    k = torch.empty(1, 2, seqlen_k, head_dim, dtype=torch.bfloat16)
    picked, strided = launch._checked_variant(tr, q, k, k, q, causal, None)
    assert not strided and trace.launched_variant(tr, seqlen_k, causal, head_dim) is picked
    assert picked.defines()["TRACE"] == 1


def test_trace_command_refuses_a_changed_output(tmp_path, capsys):
    rc = trace.main(_args("9", "--shape", "1x1x64x64", "--out", str(tmp_path)), backend=FakeBackend(perturb=True))
    assert rc == 1 and not list(tmp_path.iterdir())
    assert "changed the output" in capsys.readouterr().err


def test_trace_command_warns_about_dropped_events(tmp_path, capsys):
    assert trace.main(_args("7", "--out", str(tmp_path), "--shape", "1x1x64x64"), backend=FakeBackend(dropped=5)) == 0
    assert "20 events did not fit" in capsys.readouterr().err  # 5 in each of the 4 CTAs' WG 1


@pytest.mark.parametrize(
    "argv, match",
    [
        (["4"], "no trace instrumentation"),
        (["9", "--shape", "1x2x3"], "BxHxSqxSk"),
        (["9", "--shape", "1x0x64x64"], "BxHxSqxSk"),
        (["9", "--ctas", "0"], "ctas"),
    ],
)
def test_trace_command_rejects_bad_arguments(argv, match, capsys, tmp_path):
    assert trace.main(_args(*argv, "--out", str(tmp_path)), backend=FakeBackend()) == 2
    assert re.search(match, capsys.readouterr().err)


def test_trace_command_without_a_gpu_exits_with_a_message(tmp_path, monkeypatch, capsys):
    import attnclimb.api

    monkeypatch.setattr(attnclimb.api, "hopper_unavailable_reason", lambda device=None: "no CUDA GPU is visible")
    assert main(["trace", "9", "--out", str(tmp_path)]) == trace.NO_HOPPER_EXIT
    err = capsys.readouterr().err
    assert "needs a Hopper GPU" in err and "no CUDA GPU is visible" in err
    assert not list(tmp_path.iterdir())


def _hopper_here():
    try:
        from attnclimb import hopper_unavailable_reason

        return hopper_unavailable_reason() is None
    except Exception:
        return False


@pytest.mark.skipif(_hopper_here(), reason="a Hopper GPU is present: the command would run")
def test_trace_cli_process_without_a_gpu(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "attnclimb", "trace", "12", "--out", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == trace.NO_HOPPER_EXIT and "needs a Hopper GPU" in res.stderr
    assert not list(tmp_path.iterdir())


def test_build_trace_flag(capsys):
    assert main(["build", "--trace", "--strict", "--rung", "4", "--rung", "9"]) == 0
    out = capsys.readouterr().out
    assert "rung09+trace" in out and "rung04" not in out  # rung 4 has no trace build


def test_cuda_backend_glue_with_a_fake_driver(monkeypatch):
    """CudaBackend's driver calls (cuLibraryGetGlobal, cuMemsetD8, cuMemcpyDtoH) and its size checks,
    against a fake driver and a fake loaded module: what can be checked of the GPU path on a CPU."""
    import torch
    from cuda.bindings import driver

    from attnclimb.runtime import launch

    t = trace.traced(rungs.get(11), 2)
    layout = trace.Layout.of(t)
    calls = []

    class Dev:
        def set_current(self):
            calls.append("set_current")

    from types import SimpleNamespace

    lr = SimpleNamespace(
        device=Dev(),
        kernels={"attn_fwd": SimpleNamespace(handle=driver.CUkernel(7))},
        module=SimpleNamespace(handle=driver.CUlibrary(0)),
    )
    loaded_for = []
    monkeypatch.setattr(launch, "loaded", lambda rung, dev: loaded_for.append((rung, dev)) or lr)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("sync"))
    ok = driver.CUresult.CUDA_SUCCESS
    size = [layout.nbytes]

    def get_global(library, name):
        calls.append(("global", type(library).__name__, name))
        return ok, driver.CUdeviceptr(0x7000), size[0]

    def memset(ptr, value, n):
        calls.append(("memset", int(ptr), value, n))
        return (ok,)

    def memcpy(host, ptr, n):
        calls.append(("memcpy", int(ptr), n))
        host[:] = np.arange(host.size, dtype=np.uint32)
        return (ok,)

    monkeypatch.setattr(driver, "cuLibraryGetGlobal", get_global)
    monkeypatch.setattr(driver, "cuMemsetD8", memset)
    monkeypatch.setattr(driver, "cuMemcpyDtoH", memcpy)
    monkeypatch.setattr(
        driver, "cuKernelGetLibrary", lambda k: calls.append(("lib of", int(k))) or (ok, driver.CUlibrary(3))
    )
    be = trace.CudaBackend()
    be.clear_buffer(t, layout.nbytes)
    assert ("memset", 0x7000, 0, layout.nbytes) in calls
    assert calls.index("sync") < calls.index(("memset", 0x7000, 0, layout.nbytes)) < len(calls) - 1  # synced around
    words = be.read_buffer(t, layout.nbytes)
    assert words.dtype == np.uint32 and words.size == layout.words and words[5] == 5
    assert ("memcpy", 0x7000, layout.nbytes) in calls
    assert ("global", "CUlibrary", b"attn_trace") in calls and loaded_for[0] == (t, 0)
    # a module handle that is not a CUlibrary: the kernel's library is asked for
    lr.module.handle = object()
    be.read_buffer(t, layout.nbytes)
    assert ("lib of", 7) in calls
    # the kernel's buffer must have the size the host decodes
    size[0] = layout.nbytes - 16
    with pytest.raises(RuntimeError, match="the host expects"):
        be.read_buffer(t, layout.nbytes)
    # a driver error is an error
    monkeypatch.setattr(driver, "cuMemsetD8", lambda *a: (driver.CUresult.CUDA_ERROR_INVALID_VALUE,))
    size[0] = layout.nbytes
    with pytest.raises(RuntimeError, match="cuMemsetD8 failed"):
        be.clear_buffer(t, layout.nbytes)
