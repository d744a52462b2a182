"""The host path of a repeated call (issue 9's host overhead) without a GPU: the drop-in's fast path
(``attnclimb.ops.fast_key``/``fast_call``) and the launch with its parameters packed once
(``attnclimb/runtime/packed.py``), on CPU tensors with the GPU stubbed as ``scripts/host_overhead_cpu.py``
stubs it (its ``stubbed_gpu``; so these tests also keep that harness working)."""

import ctypes
import re
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scripts_loader import load_script

import attnclimb
from attnclimb import ops, rungs, sdpa
from attnclimb.runtime import launch, packed

ROOT = Path(__file__).resolve().parents[1]
BF16 = torch.bfloat16
hoc = load_script("host_overhead_cpu")


def _t(*shape, dtype=BF16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.fixture
def gpu(monkeypatch):
    """The harness's stand-ins for the GPU, with each launch recorded as ``(kernelParams address, stream,
    grid, block, smem, the packed plan)``; also counts the support checks and the plans made."""
    rec = {"launches": [], "checks": 0, "plans": 0}
    real_reason, real_plan = sdpa.unsupported_reason, launch._plan

    def reason(*a, **kw):
        rec["checks"] += 1
        return real_reason(*a, **kw)

    def plan(*a):
        rec["plans"] += 1
        return real_plan(*a)

    monkeypatch.setattr(sdpa, "unsupported_reason", reason)
    monkeypatch.setattr(launch, "_plan", plan)
    monkeypatch.setattr(launch, "_PLANS", {})
    monkeypatch.setattr(launch, "_TMAP_CACHE", {})
    with hoc.stubbed_gpu():

        def driver(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            rec["launches"].append((params, stream, (gx, gy, gz), (bx, by, bz), smem, extra, f))
            return (0,)

        packed._driver_launch = driver  # stubbed_gpu restores the real one on exit
        yield rec


def test_repeated_call_skips_the_checks_and_the_planning(gpu):
    q, k, v = _t(1, 2, 64, 128), _t(1, 2, 64, 128, seed=1), _t(1, 2, 64, 128, seed=2)
    o1 = attnclimb.scaled_dot_product_attention(q, k, v)
    assert (gpu["checks"], gpu["plans"], len(gpu["launches"])) == (1, 1, 1)
    assert sorted(key[0] for key in ops._FAST) == ["forward", "sdpa"]  # the op's body remembers its own
    o2 = attnclimb.scaled_dot_product_attention(q, k, v)
    o3 = attnclimb.scaled_dot_product_attention(q, k, v)
    assert (gpu["checks"], gpu["plans"], len(gpu["launches"])) == (1, 1, 3)
    assert o2.shape == o1.shape == (1, 2, 64, 128) and o2.dtype == BF16 and o2.is_contiguous()
    assert o2.data_ptr() != o3.data_ptr()  # each call its own O
    (p1, *rest1), (p2, *rest2) = gpu["launches"][1:]
    assert p1 == p2 and rest1 == rest2  # one packed plan, same stream, grid, block, smem


def test_the_operators_body_remembers_its_calls(gpu):
    """ops.forward (what torch.ops.attnclimb.attention_fwd and the autograd path run) plans once per key."""
    q = _t(1, 2, 64, 128)
    outs = [ops.forward(q, q, q, 0.25, rungs.TOP.number, True, True) for _ in range(3)]
    assert gpu["plans"] == 1 and len(gpu["launches"]) == 3 and [k[0] for k in ops._FAST] == ["forward"]
    assert all(o.shape == (1, 2, 64, 128) and lse.shape == (1, 2, 64) for o, lse in outs)
    ops.forward(q, q, q, 0.5, rungs.TOP.number, True, True)
    assert gpu["plans"] == 2


@pytest.mark.parametrize(
    "change",
    [
        lambda q, k, v: ((q.clone(), k, v), {}),  # another address
        lambda q, k, v: ((q[:, :, :32], k, v), {}),  # shape
        lambda q, k, v: ((q.transpose(2, 3).contiguous().transpose(2, 3), k, v), {}),  # strides (copied)
        lambda q, k, v: ((q, k, v), {"scale": 0.5}),
        lambda q, k, v: ((q, k, v), {"is_causal": True}),
        lambda q, k, v: ((q, k, v), {"enable_gqa": True}),
        lambda q, k, v: ((q, k, v), {"scale": 1}),  # an int scale: no key (True == 1 == 1.0)
        lambda q, k, v: ((q, k, v), {"is_causal": 0}),  # a non-bool flag: no key
        lambda q, k, v: (tuple(t.to(torch.float16) for t in (q, k, v)), {}),  # dtype: the FP16 variant, another plan
        lambda q, k, v: ((q.clone().requires_grad_(), k, v), {}),  # autograd: the operator
        lambda q, k, v: ((torch.nn.Parameter(q.clone()), k, v), {}),  # a subclass
    ],
)
def test_anything_the_checks_or_the_plan_read_misses(gpu, change):
    q, k, v = _t(1, 2, 64, 128), _t(1, 2, 64, 128, seed=1), _t(1, 2, 64, 128, seed=2)
    attnclimb.scaled_dot_product_attention(q, k, v)
    (q2, k2, v2), kw = change(q, k, v)
    checks = gpu["checks"]
    torch.library.register_kernel("attnclimb::attention_fwd", "cpu", ops.forward)  # the grad row's operator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attnclimb.scaled_dot_product_attention(q2, k2, v2, **kw)
    assert gpu["checks"] == checks + 1  # the full path ran


def test_attention_checks_its_flags_though_an_equal_key_was_remembered(gpu):
    q = _t(1, 1, 64, 128)
    attnclimb.attention(q, q, q, is_causal=True)
    attnclimb.attention(q, q, q, rung=1)
    attnclimb.attention(q, q, q, scale=1.0)
    with pytest.raises(TypeError, match="must be a bool"):
        attnclimb.attention(q, q, q, is_causal=1)
    with pytest.raises(TypeError, match="scale"):
        attnclimb.attention(q, q, q, scale=True)
    with pytest.raises((TypeError, ValueError)):
        attnclimb.attention(q, q, q, rung=True)
    n = len(gpu["launches"])
    attnclimb.attention(q, q, q, is_causal=True)
    assert len(gpu["launches"]) == n + 1


def test_lse_and_gqa_calls_hit_with_their_own_outputs(gpu):
    q, kv = _t(1, 4, 64, 128), _t(1, 2, 64, 128, seed=1)
    for _ in range(3):
        o, lse = sdpa.scaled_dot_product_attention_lse(q, kv, kv, enable_gqa=True, is_causal=True)
    assert gpu["checks"] == 1 and o.shape == (1, 4, 64, 128) and lse.shape == (1, 4, 64) and lse.dtype == torch.float32
    params = gpu["launches"][-1][0]
    plan = next(iter(ops._FAST.values())).plan
    n_args = 3 + 1 + len(plan.middle) + 1 + len(plan.tail)
    slots = [ctypes.c_void_p.from_address(params + 8 * i).value for i in range(n_args)]
    assert ctypes.c_uint64.from_address(slots[3]).value == o.data_ptr()
    assert ctypes.c_uint64.from_address(slots[4 + len(plan.middle)]).value == lse.data_ptr()


def test_copies_and_other_devices_take_the_full_path(gpu, monkeypatch):
    b, s, h, d = 1, 64, 2, 128
    v_buf = _t(b * h * s * d + 1)
    v = v_buf[1:].view(b, h, s, d)  # 2 bytes off 16-byte alignment: copied before the launch
    q = _t(b, h, s, d)
    attnclimb.scaled_dot_product_attention(q, q, v)
    attnclimb.scaled_dot_product_attention(q, q, v)
    assert gpu["checks"] == 2 and not ops._FAST  # a call with a copy is not remembered
    attnclimb.scaled_dot_product_attention(q, q, q)
    (key,) = (key for key in ops._FAST if key[0] == "sdpa")
    assert ops.fast_call(key, q, q, q) is not None
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
    assert ops.fast_call(key, q, q, q) is None  # current device 1, call planned on 0


def test_fast_key_is_none_where_the_operator_must_see_the_call():
    q = _t(1, 1, 4, 128)
    assert ops.fast_key(q, q, q, "sdpa", False, None, False, False) is not None
    g = q.clone().requires_grad_()
    assert ops.fast_key(g, q, q, "sdpa", False, None, False, False) is None
    with torch.no_grad():
        assert ops.fast_key(g, q, q, "sdpa", False, None, False, False) is not None
    sparse = torch.zeros(1, 1, 4, 128).to_sparse()
    assert ops.fast_key(sparse, q, q, "sdpa", False, None, False, False) is None
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        f = mode.from_tensor(q)
        assert ops.fast_key(f, f, f, "sdpa", False, None, False, False) is None

    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Seen():
        assert ops.fast_key(q, q, q, "sdpa", False, None, False, False) is None


# ---------------------------------------------------------------- the packed launch vs the kernel signature

_CTYPES = {"TmaDesc": ctypes.c_uint64, "ptr": ctypes.c_uint64, "int": ctypes.c_int32, "float": ctypes.c_float}
_CTYPES["long long"] = ctypes.c_int64
_PY = {"TmaDesc": int, "ptr": int, "int": np.int32, "float": np.float32, "long long": np.int64}


def _signature(rung) -> list:
    """``attn_fwd``'s parameters, from the rung's CUDA source: ``(kind, name)``, kind ``TmaDesc``, ``ptr``,
    ``int``, ``float`` or ``long long``."""
    params = re.search(r"attn_fwd\(([^)]*)\)", rung.source.read_text()).group(1)
    out = []
    for p in params.split(","):
        p = p.strip()
        name = re.search(r"(\w+)$", p).group(1)
        if "TmaDesc" in p:
            kind = "TmaDesc"
        elif "*" in p:
            kind = "ptr"
        else:
            kind = p[: -len(name)].replace("const ", "").strip()
        out.append((kind, name))
    return out


@pytest.mark.parametrize("number", list(range(1, rungs.TOP.number + 1)))
@pytest.mark.parametrize("lse", [False, True])
def test_packed_parameters_match_the_kernel_signature(gpu, number, lse):
    """The kernelParams array a planned launch hands cuLaunchKernel: one slot per parameter of the rung's
    attn_fwd, in its order, each holding the value the kernel expects (the tensor maps are the stubbed
    encoder's ints here; on the GPU cuda.core's packer copies the 128-byte descriptors) and packed from the
    Python type cuda.core's packer turns into that C type; O's and the LSE's addresses are the call's."""
    rung = rungs.BY_NUMBER[number]
    if lse and "lse" not in rung.features:
        pytest.skip("no LSE variant")
    b, h, sq, sk = 2, 3, 300, 200
    q, o = _t(b, h, sq, 128), torch.empty(b, h, sq, 128, dtype=BF16)
    k, v = _t(b, h, sk, 128, seed=1), _t(b, h, sk, 128, seed=2)
    out_lse = torch.empty(b, h, sq) if lse else None
    plan = launch.run_rung(rung, q, k, v, o, 0.25, lse=out_lse)
    sig = _signature(plan.lr.rung)
    kinds = [kd for kd, _ in sig]
    args = (*plan.head, o.data_ptr(), *plan.middle)  # what cuda.core.launch would get (test_dropin_cpu's ABI test)
    if plan.tail is not None:
        args += (0 if out_lse is None else out_lse.data_ptr(), *plan.tail)
    assert len(args) == len(kinds)
    assert [type(a) for a in args] == [_PY[kd] for kd in kinds]
    got = plan.packed.values([_CTYPES[kd] for kd in kinds])
    assert got == [float(a) if kd == "float" else int(a) for a, kd in zip(args, kinds)]
    # and by name, from the call itself: sizes, scale, O, the LSE and O's strides where the kernel reads them
    got = dict(zip([n for _, n in sig], got))
    assert (got["seqlen_q"], got["seqlen_k"], got["o"], got["scale"]) == (sq, sk, o.data_ptr(), 0.25)
    assert got["num_m_blocks"] == rung.num_m_blocks(sq)
    if "lse" in got:
        assert got["lse"] == (0 if out_lse is None else out_lse.data_ptr())
        assert (got["heads_q"], got["kv_group"]) == (h, 1)
        assert (got["o_stride_b"], got["o_stride_h"], got["o_stride_s"]) == o.stride()[:3]
    params, stream, grid, block, smem, extra, func = gpu["launches"][-1]
    assert params == plan.packed.params and int(stream) == 0 and extra == 0
    assert grid == tuple(plan.config.grid) and block == tuple(plan.config.block) == (rung.threads, 1, 1)
    assert smem == plan.config.shmem_size == plan.lr.smem_bytes
    assert int(func) == plan.lr.kernels["attn_fwd"].handle


def test_packed_launch_takes_each_calls_pointers_under_threads(gpu):
    """Two threads launching one plan: each launch carries its own O (the slot write and the launch happen
    under the plan's lock); a driver error raises."""
    q = _t(1, 1, 64, 128)
    o = torch.empty_like(q)
    plan = launch.run_rung(rungs.TOP, q, q, q, o, 0.25)
    seen = []

    def slow_driver(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        first = plan.packed.o_cell.value
        time.sleep(0.0005)  # another thread would overwrite the slot here without the lock
        seen.append((first, plan.packed.o_cell.value))
        return (0,)

    packed._driver_launch = slow_driver

    def worker(base):
        for i in range(50):
            plan.packed.launch(0, base + 16 * i, 0)

    threads = [threading.Thread(target=worker, args=(base,)) for base in (1 << 40, 1 << 41)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 100 and all(a == b for a, b in seen)
    packed._driver_launch = lambda *a: (700,)  # CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed"):
        plan.packed.launch(0, 1 << 40, 0)


def test_a_refused_packed_launch_falls_back_to_cuda_core(gpu, monkeypatch):
    """If the installed binding refuses an argument (nothing launched), that launch and every later plan go
    through cuda.core.launch, with one warning."""
    monkeypatch.setattr(packed, "ENABLED", True)
    old = []
    launch._cuda_launch = lambda stream, config, kernel, *args: old.append(args)  # stubbed_gpu restores it

    def refuse(*args):
        raise TypeError("Argument 'hStream' is not instance of type (expected <class 'CUstream'>)")

    packed._driver_launch = refuse
    q = _t(1, 1, 64, 128)
    o = torch.empty_like(q)
    with pytest.warns(RuntimeWarning, match="refused a pre-packed launch"):
        plan = launch.run_rung(rungs.TOP, q, q, q, o, 0.25)
    assert plan.packed is None and len(old) == 1 and old[0][3] == o.data_ptr() and not packed.ENABLED
    assert launch.run_rung(rungs.TOP, q, q, q, o, 0.5).packed is None and len(old) == 2


def test_packed_launch_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(packed, "ENABLED", False)
    assert packed.prepack(object(), (1,), (128,), 0, (1, 2), 0, None) is None


def test_prepack_refuses_what_it_cannot_pack():
    class K:
        handle = 5

    assert packed.prepack(object(), (1,), (128,), 0, (1, 2), 0, None) is None  # no kernel handle
    assert packed.prepack(K(), (1,), (128,), 0, (1, object()), 0, None) is None  # cuda.core cannot pack it
    p = packed.prepack(K(), (7,), (128,), 1024, (11, 0, np.int32(3), 0), 1, 3)
    assert p.grid == (7, 1, 1) and p.block == (128, 1, 1) and p.smem == 1024
    assert p.values([ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint64]) == [
        11,
        packed.O_MARK,
        3,
        packed.LSE_MARK,
    ]


def test_autocast_to_another_dtype_falls_back_to_torch(gpu, monkeypatch):
    """Under torch.autocast on CUDA to another dtype than the inputs', torch's SDPA (on autocast's
    lower-precision list) would compute in the autocast dtype: the drop-in falls back (reason "autocast"),
    before the fast path too; autocast to the inputs' own dtype changes nothing."""
    q = _t(1, 2, 64, 128)
    seen = []
    monkeypatch.setattr(sdpa, "_TORCH_SDPA", lambda *a, **kw: seen.append(a[0].dtype) or a[0].clone())
    sdpa.reset_fallback_warnings()
    attnclimb.scaled_dot_product_attention(q, q, q)  # remembered for the fast path
    assert len(gpu["launches"]) == 1
    on = {"value": torch.float16}
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: on["value"] is not None)
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda *a: on["value"])
    for fn in (attnclimb.scaled_dot_product_attention, sdpa.scaled_dot_product_attention_lse):
        with pytest.warns(UserWarning, match="autocast"):
            fn(q, q, q)
        sdpa.reset_fallback_warnings()
    assert len(gpu["launches"]) == 1 and seen == [BF16, BF16]
    with pytest.raises(Exception, match="autocast"):
        attnclimb.scaled_dot_product_attention(q, q, q, strict=True)
    on["value"] = BF16  # autocast to the inputs' dtype: the kernel, via the remembered call
    attnclimb.scaled_dot_product_attention(q, q, q)
    assert len(gpu["launches"]) == 2


def test_forward_ad_takes_the_operator(gpu):
    """Inside a forward-mode AD level the direct path (and so the fast path) is off: the operator sees the
    dual tensors instead of the kernel silently dropping their tangents."""
    import torch.autograd.forward_ad as fwAD

    q = _t(1, 2, 64, 128)
    assert ops.direct_call_ok(q, q, q)
    assert ops.fast_key(q, q, q, "sdpa", False, None, False, False) is not None
    with fwAD.dual_level():
        assert not ops.direct_call_ok(q, q, q)
        assert ops.fast_key(q, q, q, "sdpa", False, None, False, False) is None
    assert ops.direct_call_ok(q, q, q)


def test_prepack_finds_the_scheduler_slot_cell():
    """A kernel with a scheduler slot (``Rung.sched_slot``): its 4-byte cell is found by its mark and each launch
    would write its slot there; a pack without it has none."""

    class K:
        handle = 5

    args = (11, 0, np.int32(3), np.int64(9), 0, np.int32(0))
    p = packed.prepack(K(), (7,), (128,), 0, args, 1, 4, 5)
    c64, c32 = ctypes.c_uint64, ctypes.c_int32
    assert p.values([c64, c64, c32, ctypes.c_int64, c64, c32]) == [
        11,
        packed.O_MARK,
        3,
        9,
        packed.LSE_MARK,
        packed.SLOT_MARK,
    ]
    p.slot_cell.value = 77
    assert p.values([c64, c64, c32, ctypes.c_int64, c64, c32])[-1] == 77
    assert packed.prepack(K(), (7,), (128,), 0, args, 1, 4).slot_cell is None


def test_scheduler_slots_per_stream_and_per_captured_launch(monkeypatch):
    """``launch.sched_slot``: one slot per (device, stream), the same for every launch on it; a captured launch
    takes a fresh slot above the streams' each time; a slot is never handed on (its stream or graph may still
    run): past ``STREAM_SLOTS`` streams or ``SCHED_SLOTS - STREAM_SLOTS`` captured launches, RuntimeError."""
    monkeypatch.setattr(launch, "_stream_slots", {})
    monkeypatch.setattr(launch, "_captured_next", {})
    monkeypatch.setattr(launch, "STREAM_SLOTS", 3)
    monkeypatch.setattr(launch, "SCHED_SLOTS", 6)
    s = launch.sched_slot
    assert [s(0, h, False) for h in (100, 200, 100, 300, 200)] == [0, 1, 0, 2, 1]
    assert s(1, 100, False) == 0  # another device: its own slots
    assert [s(0, 100, True), s(0, 100, True), s(1, 100, True)] == [3, 4, 3]
    with pytest.raises(RuntimeError, match="streams"):
        s(0, 400, False)
    assert [s(0, h, False) for h in (300, 200, 100)] == [2, 1, 0]  # the streams keep theirs
    assert s(0, 9, True) == 5
    with pytest.raises(RuntimeError, match="captured"):
        s(0, 9, True)


def test_the_kernels_slot_count_is_the_launchs():
    """The dynsched header's ``DYN_SCHED_SLOTS`` (the counters' array) is ``launch.SCHED_SLOTS`` (the slots the
    launch hands out): a smaller array would let a slot index past it."""
    header = load_script("make_variants").DYN_SCHED_HEADER
    assert int(re.search(r"#define DYN_SCHED_SLOTS (\d+)", header).group(1)) == launch.SCHED_SLOTS
