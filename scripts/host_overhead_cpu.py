"""Host time per call of ``attnclimb.scaled_dot_product_attention`` without a GPU (issue 9).

Runs the real Python call path (sdpa -> support -> ops -> runtime.launch.run_rung -> the kernel launch)
on CPU tensors, with only the GPU-only parts replaced at the lowest level this script could find:

- ``torch.Tensor.device`` reads ``cuda:0`` (a Python property on ``torch.Tensor``, instead of the C getter);
- ``torch.empty`` ignores ``device=`` (a CPU allocation instead of torch's CUDA caching allocator);
- ``torch.cuda`` counts as initialised, ``torch._C._cuda_getDevice`` returns 0 and
  ``torch._C._cuda_getCurrentRawStream`` returns 0 (the C calls a CUDA build makes);
- device 0 counts as a Hopper GPU (``support._DEVICE_REASONS``);
- ``LoadedRung`` is built without cuda.core (no compile, no module load; fixed SM count and occupancy);
- ``_encode_map`` (``cuTensorMapEncodeTiled``, only on a tensor-map cache miss) returns an int;
- the launch: a plan's arguments are packed once (``attnclimb/runtime/packed.py``, with cuda.core's
  ``ParamHolder``, as on the GPU) and ``cuda.bindings.driver.cuLaunchKernel`` is replaced by a Python
  function of its 11 arguments that returns success (so the binding's own argument conversion and the
  driver are not run). With ``ATTNCLIMB_LAUNCH=cuda.core`` (the launch before that change) ``cuda.core.launch``
  is replaced by building cuda.core's ``ParamHolder`` of the kernel arguments (its argument packing); the
  rest of ``launch`` and ``cuLaunchKernelEx`` itself are not run;
- the operator ``attnclimb::attention_fwd`` gets a CPU kernel (``ops.forward``, what its CUDA kernel runs),
  for the paths through torch's dispatcher (the operator called directly, an input that requires grad).

Grad mode is on and no input requires grad (as in the bench), except in the row that says so.

So the figures exclude: the driver's launch, the binding's argument conversion (or, with
``ATTNCLIMB_LAUNCH=cuda.core``, cuda.core's stream/config handling inside ``launch``), the
CUDA caching allocator (a CPU allocation is timed instead; the ``torch.empty`` stand-in costs what a plain
CPU ``torch.empty(..., device="cpu")`` does, ~1.7 µs here) and the C ``device`` getter. They are for
comparing the Python path before and after a change on one machine; the H200 figure (``python
scripts/dropin_check.py``, ``python -m attnclimb bench``) is the one issue 9's goal is about.

    PYTHONPATH=. python scripts/host_overhead_cpu.py            # µs per call, per call path
    PYTHONPATH=. python scripts/host_overhead_cpu.py --profile  # plus a cProfile of the plain call
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import time

import torch

import attnclimb
from attnclimb import ops, rungs, support
from attnclimb.runtime import launch, packed

SHAPE = (1, 1, 128, 128)  # the bench's host-overhead shape (attnclimb.bench.shapes.HOST_OVERHEAD_SHAPE)


class _FakeDevice:
    def set_current(self):
        return None

    def create_stream(self, ref):
        return ("stream", ref.handle)


class _FakeKernel:
    handle = 0


class _StubLoadedRung(launch.LoadedRung):
    """A LoadedRung without cuda.core: the real ``launch``, ``stream_for_handle`` and ``persistent_grid``."""

    def __init__(self, rung, device_index):
        self.rung, self.device_index = rung, device_index
        self.block, self.smem_bytes = (rung.threads,), rung.smem_bytes
        self.device = _FakeDevice()
        self.kernels = {name: _FakeKernel() for name in rung.kernel_names}
        self._streams, self.num_sms, self._resident = {}, 132, 1


def _param_launch(stream, config, kernel, *args):
    """What stands in for ``cuda.core.launch``: its kernel-argument packing only."""
    from cuda.core._kernel_arg_handler import ParamHolder

    ParamHolder(args)


_SUCCESS = (0,)


def _driver_call(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
    """What stands in for ``cuda.bindings.driver.cuLaunchKernel`` (the pre-packed launch,
    ``attnclimb/runtime/packed.py``): a Python call of its arguments, returning success."""
    return _SUCCESS


_ABSENT = object()  # an attribute stubbed_gpu adds, and deletes again on exit


@contextlib.contextmanager
def stubbed_gpu():
    """The stand-ins above, undone on exit."""
    cuda0 = torch.device("cuda", 0)
    real_empty = torch.empty

    def empty(*args, device=None, **kw):
        return real_empty(*args, **kw)

    saved = [
        (torch.Tensor, "device", torch.Tensor.__dict__.get("device", _ABSENT)),
        (torch, "empty", real_empty),
        (torch.cuda, "_initialized", torch.cuda._initialized),
        (torch._C, "_cuda_getDevice", getattr(torch._C, "_cuda_getDevice", _ABSENT)),
        (torch._C, "_cuda_getCurrentRawStream", getattr(torch._C, "_cuda_getCurrentRawStream", _ABSENT)),
        (launch, "LoadedRung", launch.LoadedRung),
        (launch, "_encode_map", launch._encode_map),
        (launch, "_cuda_launch", launch._cuda_launch),
        (packed, "_driver_launch", packed._driver_launch),
        (launch, "_raw_stream_of", launch._raw_stream_of),
    ]
    torch.Tensor.device = property(lambda self: cuda0)
    torch.empty = empty
    torch.cuda._initialized = True
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    launch.LoadedRung = _StubLoadedRung
    launch._encode_map = lambda ptr, shape, strides, box, fp16=False, l2_promotion=0: (
        hash((ptr, shape, strides, box, fp16)) & 0xFFFF_FFFF
    )
    launch._cuda_launch = _param_launch
    packed._driver_launch = _driver_call
    launch._raw_stream_of = None
    had_reason = 0 in support._DEVICE_REASONS
    old_reason = support._DEVICE_REASONS.get(0)
    support._DEVICE_REASONS[0] = None
    launch._LOADED.clear()
    ops._FAST.clear()
    try:
        yield
    finally:
        launch._LOADED.clear()
        launch._TMAP_CACHE.clear()
        launch._PLANS.clear()
        ops._FAST.clear()  # remembered calls hold plans of the stand-in LoadedRung
        if had_reason:
            support._DEVICE_REASONS[0] = old_reason
        else:
            support._DEVICE_REASONS.pop(0, None)
        for obj, name, value in saved:
            if value is _ABSENT:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, value)


def call_paths() -> dict:
    """Call paths to time: name -> a no-argument function making one call."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*SHAPE, generator=g).to(torch.bfloat16) for _ in range(3))
    b, h, s, d = SHAPE
    kv2 = torch.randn(b, 1, s, d, generator=g).to(torch.bfloat16)
    q2 = torch.randn(b, 2, s, d, generator=g).to(torch.bfloat16)
    bshd = torch.randn(b, s, h, d, generator=g).to(torch.bfloat16).transpose(1, 2)  # h == 1: still contiguous
    wide = torch.randn(b, s, 2, d, generator=g).to(torch.bfloat16).transpose(1, 2)  # a BSHD view, in place
    qg = q.clone().requires_grad_()
    sdpa, attention = attnclimb.scaled_dot_product_attention, attnclimb.attention
    op, top, scale = torch.ops.attnclimb.attention_fwd.default, rungs.TOP.number, d**-0.5
    return {
        "sdpa(q, k, v)": lambda: sdpa(q, k, v),
        "attention(q, k, v)": lambda: attention(q, k, v),
        "sdpa(is_causal=True)": lambda: sdpa(q, k, v, is_causal=True),
        "sdpa(enable_gqa=True)": lambda: sdpa(q2, kv2, kv2, enable_gqa=True),
        "sdpa(BSHD views)": lambda: sdpa(wide, wide, wide),
        "sdpa(size-1 view)": lambda: sdpa(bshd, bshd, bshd),
        "torch.ops.attnclimb op": lambda: op(q, k, v, scale, top),
        "sdpa(q requires grad)": lambda: sdpa(qg, k, v),
    }


def us_per_call(fn, calls: int, reps: int, warmup: int = 200) -> tuple:
    """Median and spread (min, max) of ``reps`` timings of ``calls`` back-to-back calls, in µs per call."""
    return _summary(interleaved({"fn": fn}, calls, reps, warmup)["fn"])


def interleaved(paths: dict, calls: int, reps: int, warmup: int = 200) -> dict:
    """name -> ``reps`` timings (µs per call) of ``calls`` back-to-back calls of each path, the paths taking
    turns in every repetition (so that a slow spell of the machine hits all of them alike)."""
    for fn in paths.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in paths}
    for _ in range(reps):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    return times


def _summary(times: list) -> tuple:
    return statistics.median(times), min(times), max(times)


def reference_us(calls: int, reps: int) -> dict:
    """Torch's own per-call costs on this machine, for scale (not part of the path)."""
    x = torch.empty(SHAPE, dtype=torch.bfloat16)
    return {
        "torch.empty (CPU, same shape)": us_per_call(lambda: torch.empty(SHAPE, dtype=torch.bfloat16), calls, reps),
        "x.add_(0) (one torch op)": us_per_call(lambda: x.add_(0), calls, reps),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="cProfile the plain sdpa call, top entries by tottime")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    # The operator is registered for CUDA only: its CPU kernel here is the function its CUDA kernel runs
    # (for the two paths through torch's dispatcher; the others never reach it).
    torch.library.register_kernel("attnclimb::attention_fwd", "cpu", ops.forward)
    with stubbed_gpu():
        paths = call_paths()
        for fn in paths.values():  # each path runs once without error before anything is timed
            fn()
        for name, times in interleaved(paths, args.calls, args.reps).items():
            med, lo, hi = _summary(times)
            print(f"{name:28s} {med:7.2f} µs/call  (min {lo:.2f}, max {hi:.2f}; {args.reps} x {args.calls} calls)")
        if args.profile:
            fn = paths["sdpa(q, k, v)"]
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                fn()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    for name, (med, lo, hi) in reference_us(args.calls, args.reps).items():
        print(f"{name:28s} {med:7.2f} µs/call  (min {lo:.2f}, max {hi:.2f})")


if __name__ == "__main__":
    main()
