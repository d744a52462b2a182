"""Context-parallel attention on 2 to 4 Hopper GPUs over NCCL, the top rung as the local attention (skipped
without a Hopper GPU, and per world size without that many GPUs): ring and Ulysses against the top rung on
the whole sequence on one GPU and against float64 (rel-L2 <= 1e-2), full and causal, in both layouts; and
``torchrun -m attnclimb cp-bench`` on 2 GPUs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import cp_workers
import pytest
import torch

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[1]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_and_ulysses_on_gpus_match_one_gpu_and_float64(world_size, tmp_path):
    if _gpus() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {_gpus()} visible")
    results = cp_workers.spawn_cases(world_size, list(cp_workers.GPU_CASES), tmp_path, backend="nccl")
    failed = [f"{case}, rank {r}:\n{res}" for case, per in results.items() for r, res in enumerate(per) if res != "ok"]
    assert not failed, "\n".join(failed)


@pytest.mark.timeout(600)
def test_cp_bench_with_torchrun_on_two_gpus(tmp_path):
    if _gpus() < 2:
        pytest.skip(f"needs 2 GPUs, {_gpus()} visible")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "attnclimb"]
    cmd += ["cp-bench", "--seqlens", "16k", "--causal", "--warmup", "1", "--iters", "2", "--out", str(tmp_path)]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((tmp_path / "x2" / "latest.json").read_text())
    assert doc["world_size"] == 2 and doc["backend"] == "nccl" and doc["nccl_version"]
    assert len(doc["rows"]) == 4 and all(r["status"] == "ok" for r in doc["rows"]), doc["rows"]
    assert all(r["rel_l2_vs_1gpu"] <= 1e-2 and r["rel_l2_vs_float64"] <= 1e-2 for r in doc["rows"])
