"""Write the A/B variants of the top rung that issue 13 measures next, generated from the current source
so that they never drift from it: ``python scripts/make_variants.py [OUT_DIR]`` (default ``.ab``) writes

* ``nopp/13_const_desc.cu``: without the ping-pong turns (rung 10's named barriers), now that each
  warpgroup's own softmax runs under its own P·V (rung 9, fixed in issue 13);
* ``sleep/…`` and ``sleepall/…`` + ``mbar_sleep.cuh``: the producer's mbarrier waits (or every wait) with a
  suspend-time hint.

(The file names follow the top rung, ``rungs.TOP.source.name``.) The ``desc`` variant that this script wrote
for rung 12 (its wgmma descriptors advanced by constant adds) became rung 13, ``13_const_desc.cu``; the
generator as it was is at commit 34f912e, which the committed A/B files of ``desc`` name.

Then ``python scripts/ab_rungs.py --rungs 13 --variant nopp=.ab/nopp --variant sleep=.ab/sleep``.
Raises ``SystemExit`` when a pattern it rewrites is no longer in the source.
"""

import re
import sys
from pathlib import Path

from attnclimb import rungs

SLEEP_HEADER = """// A/B variant (scripts/make_variants.py): mbarrier waits with a suspend-time hint (PTX ISA
// "mbarrier.test_wait / mbarrier.try_wait": the thread may sleep until the phase completes or the hint,
// in ns, expires). Nsight Compute on the H200 (issue 13) counted 58.5 M executions of one try_wait retry
// loop in rung 12 at 16k (the producer waiting for free slots: ~300 polls per K/V tile on one SMSP).
#pragma once
#include "hopper.cuh"

__device__ __forceinline__ bool mbar_try_wait_hint(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\\n"
        ".reg .pred p;\\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\\n"
        "selp.u32 %0, 1, 0, p;\\n"
        "}\\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity), "r"(10000000u)
        : "memory");
    return done != 0;
}

__device__ __forceinline__ void mbar_wait_sleep(uint64_t* bar, uint32_t parity) {
    while (!mbar_try_wait_hint(bar, parity)) {
    }
}
"""


def sleep(src: str) -> str:
    """The producer's waits for free slots (Q, K, V "empty" barriers) with a suspend-time hint."""
    src = _sub(src, '#include "wgmma_attn.cuh"', '#include "wgmma_attn.cuh"\n#include "mbar_sleep.cuh"', 1)
    return _sub(src, r"hop::mbar_wait\((&bar_[qkv]_empty)", r"mbar_wait_sleep(\1", regex=True)


def sleepall(src: str) -> str:
    """Every mbarrier wait of the kernel with a suspend-time hint (the consumers' too)."""
    src = _sub(src, '#include "wgmma_attn.cuh"', '#include "wgmma_attn.cuh"\n#include "mbar_sleep.cuh"', 1)
    return _sub(src, r"hop::mbar_wait\(", "mbar_wait_sleep(", regex=True)


def _sub(text, old, new, count=None, regex=False):
    n = len(re.findall(old, text)) if regex else text.count(old)
    if n == 0 or (count is not None and n != count):
        raise SystemExit(f"make_variants: expected {count or 'some'} of {old!r} in the top rung, found {n}")
    return re.sub(old, new, text) if regex else text.replace(old, new)


def nopp(src: str) -> str:
    src = _sub(src, "    if (wg == 1) hop::named_bar_arrive(1, TURN_THREADS);\n", "", 1)
    src = _sub(src, r"\n[ \t]*hop::named_bar_sync\(my_turn, TURN_THREADS\);", "", regex=True)
    src = _sub(src, r"\n[ \t]*hop::named_bar_arrive\(other_turn, TURN_THREADS\);", "", regex=True)
    last = r"\n[ \t]*if \(wg == 0 \|\| [^\n]*hop::named_bar_arrive\(other_turn, TURN_THREADS\);"
    return _sub(src, last, "", regex=True)


def main(out=".ab"):
    top = rungs.TOP
    src = top.source.read_text()
    for name, fn, extra in (
        ("nopp", nopp, {}),
        ("sleep", sleep, {"mbar_sleep.cuh": SLEEP_HEADER}),
        ("sleepall", sleepall, {"mbar_sleep.cuh": SLEEP_HEADER}),
    ):
        d = Path(out) / name
        d.mkdir(parents=True, exist_ok=True)
        (d / top.source.name).write_text(fn(src))
        for fname, text in extra.items():
            (d / fname).write_text(text)
        print(f"wrote {d}/")


if __name__ == "__main__":
    main(*sys.argv[1:])
