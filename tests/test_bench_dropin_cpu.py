"""CPU tests of the bench's drop-in rows (issue 9): BSHD views against contiguous inputs and host overhead
per call, with fake implementations, a fake timer and a fake clock; their JSON sections and their tables."""

import json

import pytest

from attnclimb.bench import dropin, peers, report, run, shapes, timing

torch = pytest.importorskip("torch")
F = torch.nn.functional


class _Quiet:
    def describe(self, text):
        pass

    def advance(self, n=1):
        pass

    def log(self, text):
        pass


def _sdpa_bf16(q, k, v):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).bfloat16()


# ------------------------------------------------------------------------------------- timing


class _Clock:
    """A clock that moves only when told to (seconds)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_wall_us_per_call_uses_the_clock_and_syncs_only_at_the_ends():
    clock = _Clock()
    events = []
    costs = iter([5e-6] * 4 + [7e-6] * 50 + [9e-6] * 50 + [8e-6] * 50)  # warm-up calls, then three reps

    def fn():
        events.append("call")
        clock.t += next(costs)

    def sync():
        events.append("sync")
        clock.t += 100e-6  # the queue drains: counted once per repetition, spread over its calls

    us = timing.wall_us_per_call(fn, calls=50, reps=3, warmup_calls=4, sync=sync, clock=clock)
    # per repetition: (50 * cost + 100 µs) / 50 = cost + 2 µs -> 9, 11, 10; the median is 10
    assert us == pytest.approx(10.0)
    assert events == ["call"] * 4 + ["sync"] + (["call"] * 50 + ["sync"]) * 3
    with pytest.raises(ValueError):
        timing.wall_us_per_call(fn, calls=0, sync=sync, clock=clock)


# ---------------------------------------------------------------------------------- BSHD views


def test_operands_in_each_memory_layout():
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    # a BHSD implementation: contiguous as given, BSHD memory as .transpose(1, 2) views of it
    same = dropin.operands_in(q, k, v, "bhsd", "bhsd")
    assert all(a is b for a, b in zip(same, (q, k, v)))
    views = dropin.operands_in(q, k, v, "bshd", "bhsd")
    assert views[0].shape == (2, 3, 5, 8) and views[0].stride() == (5 * 3 * 8, 8, 3 * 8, 1)
    assert all(torch.equal(a, b) for a, b in zip(views, (q, k, v)))
    # a BSHD implementation (FA4): BSHD memory as it is, BHSD memory as .transpose(1, 2)
    native = dropin.operands_in(q, k, v, "bshd", "bshd")
    assert native[0].shape == (2, 5, 3, 8) and native[0].is_contiguous()
    strided = dropin.operands_in(q, k, v, "bhsd", "bshd")
    assert strided[0].shape == (2, 5, 3, 8) and strided[0].stride() == (3 * 5 * 8, 8, 5 * 8, 1)
    assert strided[0].data_ptr() == q.data_ptr()
    with pytest.raises(ValueError):
        dropin.operands_in(q, k, v, "sbhd", "bhsd")


def test_bshd_view_row_ratio_and_status():
    s = shapes.fa_shape(4096)
    c = run.make_row("rung16", s, "ok", rounds_ms=[0.98, 0.976, 0.97], rel_l2=2e-3)
    v = run.make_row("rung16", s, "ok", rounds_ms=[1.25, 1.247, 1.24], rel_l2=3e-3)
    r = dropin.bshd_view_row("rung16", "16 pingpong", "bhsd", s.name, c, v)
    assert set(r) == set(dropin.BSHD_ROW_FIELDS)
    assert (r["contiguous_ms"], r["view_ms"]) == (0.976, 1.247)  # the median rounds
    assert r["ratio"] == 1.278  # 1.247 / 0.976 = 1.27766, 4 significant digits
    assert r["view_rounds_ms"] == [1.25, 1.247, 1.24] and r["rel_l2"] == 3e-3 and r["status"] == "ok"

    boom = run.make_row("rung16", s, "error: RuntimeError: no views")
    r = dropin.bshd_view_row("rung16", "16", "bhsd", s.name, c, boom)
    assert r["status"] == "error: BSHD view: RuntimeError: no views"
    assert r["ratio"] is None and r["contiguous_ms"] is None and r["view_ms"] is None
    r = dropin.bshd_view_row("rung16", "16", "bhsd", s.name, run.make_row("x", s, "skipped: refused"), v)
    assert r["status"] == "skipped: contiguous: refused"
    gone = run.make_row("fa4", s, "skipped: flash_attn.cute not importable")
    r = dropin.bshd_view_row("fa4", "FA4", "bshd", s.name, gone, gone)
    assert r["status"] == "skipped: flash_attn.cute not importable"


def _layout_fakes(log):
    """A BHSD rung, a BHSD peer that refuses views, one whose views give a wrong result, one that is not
    installed, and an FA4 whose flash_attn_func is torch's SDPA on BSHD tensors. ``log`` gets
    ``(key, shape, strides)`` of every call's q."""

    class Rec(peers.Impl):
        def call(self, p):
            q, k, v = p
            log.append((self.key, tuple(q.shape), q.stride()))
            return _sdpa_bf16(q, k, v)

    class NoViews(Rec):
        def call(self, p):
            if not p[0].is_contiguous():
                log.append((self.key, tuple(p[0].shape), p[0].stride()))
                raise RuntimeError("no views")
            return super().call(p)

    class WrongOnViews(Rec):
        def call(self, p):
            out = super().call(p)
            return out if p[0].is_contiguous() else out * 1.5

    class Away(peers.Impl):
        def available(self):
            return False, "not installed here"

    class Fa4(peers.Fa4Impl):
        def available(self):
            def fn(q, k, v, causal=False):
                log.append(("fa4", tuple(q.shape), q.stride()))
                o = _sdpa_bf16(*(t.transpose(1, 2) for t in (q, k, v)))
                return o.transpose(1, 2), None

            self._fn = fn
            return True, ""

    return [
        Rec("rung16", "16 pingpong", "rung"),
        NoViews("sdpa_cudnn", "SDPA cuDNN", "peer"),
        WrongOnViews("sdpa_flash", "SDPA flash (FA2)", "peer"),
        Away("sdpa_efficient", "SDPA efficient", "peer"),
        Fa4(),
    ]


# ms of one call by (impl, whether q is contiguous): for a BHSD impl a contiguous q is the contiguous call;
# for FA4 (BSHD natively) a contiguous q is its view call
_MS = {("rung16", True): 2.0, ("rung16", False): 2.5, ("sdpa_cudnn", True): 3.0, ("sdpa_flash", True): 4.0}
_MS.update({("fa4", False): 1.5, ("fa4", True): 1.6})


def _layout_timer(log):
    def timer(fn, warmup_ms, rep_ms):
        n = len(log)
        fn()
        key, _, stride = log[n]
        contiguous = stride == tuple(sorted(stride, reverse=True))
        return _MS[(key, contiguous)]

    return timer


def test_bshd_view_rows_on_cpu(monkeypatch):
    monkeypatch.setattr(timing, "num_input_sets", lambda set_bytes, l2, minimum=3: 3)
    log = []
    sh = [shapes.Shape("t-a", "a", 2, 3, 40, 40), shapes.Shape("t-b", "b", 1, 2, 24, 24)]
    sec = dropin.run_bshd_view(
        _layout_fakes(log), sh, 1.0, 2.0, rounds=3, progress=_Quiet(), device="cpu", timer=_layout_timer(log)
    )
    rows = {(r["impl"], r["shape"]): r for r in sec["rows"]}
    assert [(r["impl"], r["shape"]) for r in sec["rows"]] == [
        (i, s) for s in ("t-a", "t-b") for i in ("rung16", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "fa4")
    ]
    for s in ("t-a", "t-b"):
        r = rows[("rung16", s)]
        assert (r["contiguous_ms"], r["view_ms"], r["ratio"], r["status"]) == (2.0, 2.5, 1.25, "ok")
        assert r["view_rounds_ms"] == [2.5, 2.5, 2.5] and r["native_layout"] == "bhsd" and r["rel_l2"] < 1e-2
        r = rows[("fa4", s)]  # view = its ordinary BSHD call (1.6 ms), contiguous = BHSD memory transposed (1.5)
        assert (r["contiguous_ms"], r["view_ms"], r["ratio"], r["native_layout"]) == (1.5, 1.6, 1.067, "bshd")
        assert rows[("sdpa_cudnn", s)]["status"] == "error: BSHD view: RuntimeError: no views"
        assert rows[("sdpa_flash", s)]["status"].startswith("error: BSHD view: wrong result (rel_l2")
        assert rows[("sdpa_efficient", s)]["status"] == "skipped: not installed here"
    # what each call received on t-a (B2 H3 S40 D128): BSHD memory as views for the rung, BHSD memory as
    # transposed views for FA4, and each layout's own memory otherwise
    seen = {(key, shape, stride) for key, shape, stride in log}
    b, h, s, d = 2, 3, 40, 128
    assert ("rung16", (b, h, s, d), (h * s * d, s * d, d, 1)) in seen
    assert ("rung16", (b, h, s, d), (s * h * d, d, h * d, 1)) in seen
    assert ("fa4", (b, s, h, d), (s * h * d, h * d, d, 1)) in seen
    assert ("fa4", (b, s, h, d), (h * s * d, d, s * d, 1)) in seen
    assert sec["settings"]["rounds"] == 3 and sec["settings"]["input_sets"] == {"t-a": 3, "t-b": 3}
    assert [s["name"] for s in sec["shapes"]] == ["t-a", "t-b"] and sec["goal_max_ratio"] == dropin.BSHD_GOAL
    assert sec["notes"] == [
        "sdpa_efficient@bhsd skipped: not installed here",
        "sdpa_efficient@bshd skipped: not installed here",
    ]


def test_default_bshd_view_impls_and_shapes():
    from attnclimb.rungs import TOP

    keys = [i.key for i in dropin.bshd_view_impls()]
    assert keys == [TOP.key, "sdpa_cudnn", "fa4"]
    assert [s.name for s in shapes.BSHD_VIEW_SHAPES] == ["wan2.1-1.3b-480p", "fa-4k"]
    s = shapes.HOST_OVERHEAD_SHAPE
    assert (s.batch, s.heads, s.seqlen_q, s.seqlen_k, s.head_dim) == (1, 1, 128, 128, 128)


# ------------------------------------------------------------------------------------- host overhead


def _host_fakes(clock, checked):
    """Call paths whose calls advance ``clock`` by a fixed cost (µs per call as in the H200 run), plus one
    that raises, one that is not installed, one that returns a wrong result and one of ours that would fall
    back to torch."""

    class Fake(dropin.HostCall):
        def __init__(self, key, us, ours=False, scale=1.0):
            super().__init__(key, key.replace("_", " "), f"{key}(q, k, v)", self._make, ours=ours)
            self.us, self.scale = us, scale

        def refusal(self, q, k, v):  # CPU tensors: the real check refuses them (see the test below)
            return None

        def _make(self, q, k, v):
            out = _sdpa_bf16(q, k, v) * self.scale

            def fn():
                clock.t += self.us * 1e-6
                return out

            fn.key = self.key
            checked.append(self.key)
            return fn

    class Boom(Fake):
        def _make(self, q, k, v):
            def fn():
                raise RuntimeError("launch failed")

            return fn

    class Away(Fake):
        def available(self):
            return False, "no such backend"

    class Refused(Fake):
        def refusal(self, q, k, v):
            return "no Hopper GPU"

    return [
        Fake("attnclimb_sdpa", 40.0, ours=True),
        Fake("attnclimb_attention", 39.0, ours=True),
        Refused("attnclimb_op", 30.0, ours=True),
        Fake("sdpa_default", 27.5),
        Fake("sdpa_cudnn", 28.0),
        Fake("sdpa_flash", 26.0),
        Boom("sdpa_boom", 1.0),
        Away("sdpa_away", 1.0),
        Fake("sdpa_wrong", 1.0, scale=2.0),
    ]


def test_host_overhead_rows_ratios_and_order(monkeypatch):
    clock, checked, measured = _Clock(), [], []
    orig = timing.wall_us_per_call

    def spy(fn, *args, **kwargs):
        measured.append(fn.key)
        return orig(fn, *args, **kwargs)

    monkeypatch.setattr(timing, "wall_us_per_call", spy)
    sec = dropin.run_host_overhead(
        _host_fakes(clock, checked),
        calls=100,
        reps=3,
        warmup_calls=10,
        rounds=3,
        device="cpu",
        clock=clock,
        progress=_Quiet(),
    )
    rows = {r["key"]: r for r in sec["rows"]}
    assert list(rows) == [
        "attnclimb_sdpa", "attnclimb_attention", "attnclimb_op", "sdpa_default", "sdpa_cudnn", "sdpa_flash",
        "sdpa_boom", "sdpa_away", "sdpa_wrong",
    ]  # fmt: skip
    want = {
        "attnclimb_sdpa": 40.0,
        "attnclimb_attention": 39.0,
        "sdpa_default": 27.5,
        "sdpa_cudnn": 28.0,
        "sdpa_flash": 26.0,
    }
    for key, us in want.items():
        r = rows[key]
        assert set(r) == set(dropin.HOST_ROW_FIELDS) and r["status"] == "ok"
        assert r["us_per_call"] == us and r["rounds_us"] == [us] * 3
    assert rows["attnclimb_sdpa"]["ratio_to_cudnn"] == 1.429  # 40 / 28
    assert rows["attnclimb_attention"]["ratio_to_cudnn"] == 1.393  # 39 / 28
    assert rows["sdpa_default"]["ratio_to_cudnn"] == 0.9821  # 27.5 / 28
    assert rows["sdpa_flash"]["ratio_to_cudnn"] == 0.9286 and rows["sdpa_cudnn"]["ratio_to_cudnn"] == 1.0
    assert rows["attnclimb_op"]["status"] == "error: RuntimeError: would fall back to torch SDPA: no Hopper GPU"
    assert rows["sdpa_boom"]["status"] == "error: RuntimeError: launch failed"
    assert rows["sdpa_away"]["status"] == "skipped: no such backend"
    assert rows["sdpa_wrong"]["status"].startswith("error: RuntimeError: wrong result (rel_l2")
    for key in ("attnclimb_op", "sdpa_boom", "sdpa_away", "sdpa_wrong"):
        assert rows[key]["us_per_call"] is None and rows[key]["ratio_to_cudnn"] is None
    # made and checked in list order (the unavailable and refused ones never get that far), then the five that passed
    # measured in the bench's round order: forwards, backwards, forwards from the third (5 * 1 // 2 = 2)
    live = ["attnclimb_sdpa", "attnclimb_attention", "sdpa_default", "sdpa_cudnn", "sdpa_flash"]
    assert checked == [*live, "sdpa_wrong"]  # sdpa_boom raises in its own make
    assert measured == [*live, *live[::-1], *live[2:], *live[:2]]
    assert sec["settings"] == {
        "calls": 100,
        "reps": 3,
        "warmup_calls": 10,
        "rounds": 3,
        "order": dropin.HOST_ORDER_NOTE,
        "clock": "custom",
        "sync": "none (cpu)",
    }
    assert sec["reference"] == "sdpa_cudnn" and sec["goal_max_ratio"] == 1.0
    assert sec["shape"]["seqlen_q"] == 128 and sec["shape"]["dtype"] == "bfloat16"


def test_host_call_refuses_what_the_kernels_would_not_take():
    """attnclimb's call paths are refused (never timed) when they would fall back to torch; torch's are not."""
    q = torch.randn(1, 1, 128, 128, dtype=torch.bfloat16)  # on the CPU: attnclimb's kernels refuse it
    ours = dropin.HostCall("attnclimb_sdpa", "a", "a()", None, ours=True)
    assert "cpu" in ours.refusal(q, q, q)
    assert dropin.HostCall("sdpa_default", "d", "d()", None).refusal(q, q, q) is None
    sec = dropin.run_host_overhead([ours], calls=1, reps=1, warmup_calls=0, rounds=1, device="cpu", progress=_Quiet())
    assert sec["rows"][0]["status"].startswith("error: RuntimeError: would fall back to torch SDPA: ")


def test_host_ratios_without_a_cudnn_row():
    c = dropin.HostCall("attnclimb_sdpa", "a", "a()", None)
    d = dropin.HostCall("sdpa_cudnn", "c", "c()", None)
    rows = dropin.fill_host_ratios([dropin.host_row(c, "ok", [30.0, 31.0, 29.0]), dropin.host_row(d, "error: x")])
    assert rows[0]["us_per_call"] == 30.0 and rows[0]["ratio_to_cudnn"] is None
    with pytest.raises(ValueError):
        dropin.host_row(c, "ok", [])
    with pytest.raises(ValueError):
        dropin.host_row(c, "meh")


# --------------------------------------------------------------------------------- JSON and report


def _sections():
    s_wan, s_4k = shapes.WAN_SHAPE, shapes.fa_shape(4096)
    mk = run.make_row
    rows = []
    for s, times in ((s_wan, {"rung16": (10.084, 10.787), "sdpa_cudnn": (11.575, 11.803)}),):
        for impl, (c, v) in times.items():
            rows += [mk(f"{impl}@bhsd", s, "ok", ms=c), mk(f"{impl}@bshd", s, "ok", ms=v)]
        rows += [mk("fa4@bhsd", s, "skipped: flash_attn.cute not importable")]
        rows += [mk("fa4@bshd", s, "skipped: flash_attn.cute not importable")]
    for impl, (c, v) in {"rung16": (0.976, 1.247), "sdpa_cudnn": (0.857, 0.854)}.items():
        rows += [mk(f"{impl}@bhsd", s_4k, "ok", ms=c), mk(f"{impl}@bshd", s_4k, "ok", ms=v)]
    rows += [mk("fa4@bhsd", s_4k, "skipped: flash_attn.cute not importable")]
    rows += [mk("fa4@bshd", s_4k, "skipped: flash_attn.cute not importable")]
    bases = [peers.Impl("rung16", "16 pingpong", "rung"), peers.make_peer("sdpa_cudnn"), peers.make_peer("fa4")]
    bshd = dropin.bshd_view_section(bases, [s_wan, s_4k], rows, [], {"rounds": 3, "warmup_ms": 25.0})

    host_rows = []
    for key, label, us in (
        ("attnclimb_sdpa", "attnclimb.scaled_dot_product_attention", 39.8),
        ("attnclimb_attention", "attnclimb.attention", 39.8),
        ("sdpa_default", "SDPA (default backend)", 27.3),
        ("sdpa_cudnn", "SDPA cuDNN", 27.8),
        ("sdpa_flash", "SDPA flash (FA2)", 26.3),
    ):
        host_rows.append(dropin.host_row(dropin.HostCall(key, label, f"{label}(q, k, v)", None), "ok", [us]))
    host_rows.append(dropin.host_row(dropin.HostCall("sdpa_x", "SDPA x", "x()", None), "error: RuntimeError: boom"))
    host = {
        "goal_max_ratio": 1.0,
        "reference": "sdpa_cudnn",
        "shape": {**run.shape_entry(shapes.HOST_OVERHEAD_SHAPE), "dtype": "bfloat16"},
        "settings": {"calls": 2000, "reps": 5, "warmup_calls": 200, "rounds": 3},
        "rows": dropin.fill_host_ratios(host_rows),
    }
    return {dropin.BSHD_SECTION: bshd, dropin.HOST_SECTION: host}


def _doc(sections=None):
    s = shapes.fa_shape(4096)
    rows = [
        run.make_row("rung16", s, "ok", ms=0.976, label="16 pingpong"),
        run.make_row("sdpa_cudnn", s, "ok", ms=0.857),
    ]
    env = {"device": "NVIDIA H200", "commit": "abc", "date": "2026-12-01T00:00:00+00:00"}
    return run.build_results(env, rows, [s], {"rounds": 3}, [], sections)


def test_results_json_with_the_sections(tmp_path):
    doc = _doc(_sections())
    assert doc["schema"] == run.SCHEMA_VERSION == 5
    assert list(doc)[-3:] == ["rows", "bshd_view", "host_overhead"]  # the sections come after the rows
    bshd, host = doc["bshd_view"], doc["host_overhead"]
    assert all(set(r) == set(dropin.BSHD_ROW_FIELDS) for r in bshd["rows"])
    assert all(set(r) == set(dropin.HOST_ROW_FIELDS) for r in host["rows"])
    by = {(r["impl"], r["shape"]): r for r in bshd["rows"]}
    assert by[("rung16", "wan2.1-1.3b-480p")]["ratio"] == 1.07  # 10.787 / 10.084 = 1.0697
    assert by[("sdpa_cudnn", "fa-4k")]["ratio"] == 0.9965  # 0.854 / 0.857
    assert by[("fa4", "fa-4k")]["status"] == "skipped: flash_attn.cute not importable"
    assert {r["key"]: r["ratio_to_cudnn"] for r in host["rows"]}["attnclimb_sdpa"] == 1.432  # 39.8 / 27.8
    _, latest = run.write_results(doc, tmp_path)
    back = report.load_results(latest)
    assert back == json.loads(json.dumps(doc))
    assert dropin.section_errors(back)  # the host row "sdpa_x" is an error
    assert not dropin.section_errors(_doc())
    with pytest.raises(ValueError):
        run.build_results({}, [], [], sections={"rows": {}})


@pytest.mark.parametrize(
    "name, bad",
    [
        ("bshd_view", []),
        ("bshd_view", {"rows": [{"impl": "x", "status": "ok", "contiguous_ms": 1.0, "view_ms": 1.0}]}),
        ("host_overhead", {"rows": [{"key": "x", "status": "ok", "us_per_call": "fast"}]}),
        ("host_overhead", {"rows": [{"status": "ok", "us_per_call": 1.0}]}),
    ],
)
def test_report_refuses_malformed_sections(tmp_path, name, bad):
    doc = _doc()
    doc[name] = bad
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=name):
        report.load_results(path)


BSHD_MD = [
    "**BSHD views (goal ≤ 1.02×)**: median time of one call on q, k, v held as (B, S, H, D)-contiguous tensors "
    "and passed as `.transpose(1, 2)` views (what the call does with a view, e.g. a copy, is timed) against the "
    "call on (B, H, S, D)-contiguous tensors; median over 3 interleaved rounds. FlashAttention-4 (sm90) takes "
    "(B, S, H, D) natively: its view call is its ordinary call, and its contiguous call gets `.transpose(1, 2)` "
    "of the (B, H, S, D) tensors.",
    "",
    "| impl | shape | contiguous (ms) | BSHD view (ms) | view / contiguous |",
    "|:---|:---|---:|---:|---:|",
    "| 16 pingpong | Wan2.1-1.3B 480p (B1 H12 S32760) | 10.084 | 10.787 | 1.070× |",
    "| SDPA cuDNN | Wan2.1-1.3B 480p (B1 H12 S32760) | 11.575 | 11.803 | 1.020× |",
    "| FlashAttention-4 (sm90) | Wan2.1-1.3B 480p (B1 H12 S32760) | — | — | — |",
    "| 16 pingpong | 4k (B4 H16 S4096) | 0.976 | 1.247 | 1.278× |",
    "| SDPA cuDNN | 4k (B4 H16 S4096) | 0.857 | 0.854 | 0.997× |",
    "| FlashAttention-4 (sm90) | 4k (B4 H16 S4096) | — | — | — |",
    "",
    "- fa4 at Wan2.1-1.3B 480p, 4k: skipped: flash_attn.cute not importable",
]
HOST_MD = [
    "**Host overhead (goal ≤ 1.00× SDPA cuDNN)**: wall-clock µs per call on a (1, 1, 128, 128) bf16 problem, "
    "whose kernel takes a few µs, so that the host sets the pace: 2000 back-to-back calls between two "
    "torch.cuda.synchronize after 200 warm-up calls, median of 5 repetitions; median over 3 interleaved rounds.",
    "",
    "| call | µs per call | × SDPA cuDNN |",
    "|:---|---:|---:|",
    "| `attnclimb.scaled_dot_product_attention` | 39.8 | 1.43× |",
    "| `attnclimb.attention` | 39.8 | 1.43× |",
    "| SDPA (default backend) | 27.3 | 0.98× |",
    "| SDPA cuDNN | 27.8 | 1.00× |",
    "| SDPA flash (FA2) | 26.3 | 0.95× |",
    "| SDPA x | error | error |",
    "",
    "- sdpa_x: error: RuntimeError: boom",
]


def test_markdown_with_and_without_the_sections():
    plain = report.markdown_table(_doc()).splitlines()
    full = report.markdown_table(_doc(_sections())).splitlines()
    # the sections go between the main table's last line and the "Generated by" line; nothing else changes
    end = len(plain) - 2
    assert plain[end:] == ["", "<sub>Generated by `python -m attnclimb report`; do not edit by hand.</sub>"]
    assert full[:end] == plain[:end] and full[-2:] == plain[-2:]
    assert full[end:-2] == ["", *BSHD_MD, "", *HOST_MD]
    assert "BSHD" not in "\n".join(plain) and "Host overhead" not in "\n".join(plain)
    only_host = _sections()
    del only_host["bshd_view"]
    assert report.markdown_table(_doc(only_host)).splitlines()[end:-2] == ["", *HOST_MD]


def test_console_with_and_without_the_sections():
    plain = report.console_table(_doc()).splitlines()
    full = report.console_table(_doc(_sections())).splitlines()
    assert full[: len(plain)] == plain
    extra = full[len(plain) :]
    assert extra[0] == "" and extra[1].startswith("BSHD views (goal ≤ 1.02x): median time of one call")
    assert all(len(line) <= 110 for line in extra if not line.startswith(("impl", "---", "16", "SDPA", "Flash")))
    i = next(i for i, line in enumerate(extra) if line.startswith("impl "))
    assert " ".join(extra[1:i]).endswith("its contiguous call gets .transpose(1, 2) of the (B, H, S, D) tensors.")
    assert extra[i : i + 3] == [
        "impl                     shape                             contiguous (ms)  BSHD view (ms)  view / contiguous",
        "-----------------------  --------------------------------  ---------------  --------------  -----------------",
        "16 pingpong              Wan2.1-1.3B 480p (B1 H12 S32760)           10.084          10.787             1.070x",
    ]
    assert "  fa4 at Wan2.1-1.3B 480p, 4k: skipped: flash_attn.cute not importable" in extra
    i = extra.index("call                                    µs per call  x SDPA cuDNN")
    assert extra[i - 3].startswith("Host overhead (goal ≤ 1.00x SDPA cuDNN): wall-clock µs per call")
    assert extra[i - 1].endswith("median over 3 interleaved rounds.")
    assert extra[i + 2] == "attnclimb.scaled_dot_product_attention         39.8         1.43x"
    assert extra[-1] == "  sdpa_x: error: RuntimeError: boom"


def test_report_cli_prints_the_section_tables(tmp_path, capsys):
    _, latest = run.write_results(_doc(_sections()), tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{report.MARK_BEGIN}\n{report.MARK_END}\nb\n")
    from attnclimb.__main__ import main

    assert main(["report", str(latest), "--readme", str(readme), "--no-chart"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("updated ") and out[1].startswith("BSHD views (goal ≤ 1.02x)")
    assert out[-9].startswith("call ") and out[-10].endswith("median over 3 interleaved rounds.")
    assert (
        "16 pingpong              4k (B4 H16 S4096)                           0.976           1.247             1.278x"
        in out
    )
    assert out[-1] == "  sdpa_x: error: RuntimeError: boom"
    text = readme.read_text()
    assert "\n".join(BSHD_MD) in text and "\n".join(HOST_MD) in text
    # old results: nothing more than before
    _, old = run.write_results(_doc(), tmp_path / "old")
    assert main(["report", str(old), "--readme", str(readme), "--no-chart"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"updated {readme} (between {report.MARK_BEGIN} and {report.MARK_END})"
    ]
