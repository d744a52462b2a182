"""The command line on a CPU: help text, diff (headers, rungs.py entry), errors, a closed stdout."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnclimb import rungs
from attnclimb.__main__ import main

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "attnclimb", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120, **kw
    )


def test_diff_headers_are_repo_relative(capsys):
    assert main(["diff", "7", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["--- a/attnclimb/kernels/07_warp_specialized.cu", "+++ b/attnclimb/kernels/08_kv_pipeline.cu"]
    assert "--- a/attnclimb/rungs.py (rung07 warp_specialized)" in out
    assert "+++ b/attnclimb/rungs.py (rung08 kv_pipeline)" in out


def test_diff_shows_the_rungs_py_entry(capsys, monkeypatch):
    lower = rungs.get(7)
    upper = dataclasses.replace(lower, number=8, name="kv_pipeline", block_n=4242, extra_defines={"NUM_STAGES": 9})
    monkeypatch.setitem(rungs.BY_NUMBER, 8, upper)
    assert main(["diff", "7"]) == 0
    out, err = capsys.readouterr()
    entry = out[out.index("--- a/attnclimb/rungs.py") :].splitlines()
    assert f"-block_n = {lower.block_n!r}" in entry and "+block_n = 4242" in entry
    assert f"-extra_defines['NUM_STAGES'] = {lower.extra_defines['NUM_STAGES']!r}" in entry
    assert "+extra_defines['NUM_STAGES'] = 9" in entry
    assert f" threads = {lower.threads!r}" in entry  # unchanged fields are shown as context
    assert f" smem_layout = {lower.smem_layout!r}" in entry
    assert not any(line.startswith(("-idea", "+idea")) for line in entry)  # the same idea: not a change
    assert f"-smem_bytes = {lower.smem_bytes!r}" in entry and f"+smem_bytes = {upper.smem_bytes!r}" in entry
    assert err.rstrip().endswith("; rungs.py: block_n, extra_defines['NUM_STAGES'], smem_bytes changed")
    # the summary's counts are the .cu diff's, not the entry's
    cu = out[: out.index("--- a/attnclimb/rungs.py")].splitlines()
    added = sum(1 for line in cu if line.startswith("+") and not line.startswith("+++"))
    assert f"{added} insertions(+)" in err


def test_diff_of_the_real_rungs_7_and_8_names_every_changed_field(capsys):
    lower, upper = rungs.get(7), rungs.get(8)
    assert main(["diff", "7", "8"]) == 0
    out, err = capsys.readouterr()
    changed = [
        f.name
        for f in dataclasses.fields(rungs.Rung)
        if f.name not in ("number", "name", "idea", "extra_defines")
        and getattr(lower, f.name) != getattr(upper, f.name)
    ]
    assert changed, "rungs 7 and 8 have identical entries?"
    for name in changed:
        assert f"-{name} = {getattr(lower, name)!r}" in out.splitlines()
        assert f"+{name} = {getattr(upper, name)!r}" in out.splitlines()
        assert name in err.splitlines()[-1]


def test_diff_without_git_has_the_same_headers(capsys, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)  # no git: Python's difflib
    assert main(["diff", "3", "4"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[:2] == [
        "--- a/attnclimb/kernels/03_cp_async.cu",
        "+++ b/attnclimb/kernels/04_fast_softmax.cu",
    ]
    assert "rung03 -> rung04" in err and "--- a/attnclimb/rungs.py (rung03 cp_async)" in out


def test_diff_of_a_rung_with_itself_is_empty(capsys):
    assert main(["diff", "3", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "0 insertions(+), 0 deletions(-)" in err and "rungs.py" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["diff", "{top}"], "rung {top} is the top rung: there is no rung above it (try: diff {below} {top})"),
        (["diff", "99"], "unknown rung 99; available: 0..{top} ({top} is the top rung)"),
        (["diff", "3", "{above}"], "unknown rung {above}; available: 0..{top} ({top} is the top rung)"),
    ],
)
def test_diff_errors_say_what_is_wrong(capsys, argv, message):
    top = max(rungs.BY_NUMBER)
    names = {"top": top, "below": top - 1, "above": top + 1}
    argv = [a.format(**names) for a in argv]
    message = message.format(**names)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"python -m attnclimb: error: {message}"


def test_closed_stdout_exits_quietly():
    """The reader closes the pipe before the first write: no traceback, exit status 141 (as for git)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "attnclimb", "diff", "7", "8"],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.close()  # long before the interpreter has started, let alone written
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert err == ""


def test_piped_to_head_exits_quietly():
    p = subprocess.run(
        ["bash", "-c", f"'{sys.executable}' -m attnclimb diff 7 8 | head -n 3; echo \"status ${{PIPESTATUS[0]}}\" >&2"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.stdout.splitlines() == [
        "--- a/attnclimb/kernels/07_warp_specialized.cu",
        "+++ b/attnclimb/kernels/08_kv_pipeline.cu",
        p.stdout.splitlines()[2],
    ]
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr
    assert re.search(r"status (0|141)$", p.stderr.strip())


def test_help_is_plain_text_and_every_option_has_help():
    seen = {}
    for cmd in (
        [],
        ["build"],
        ["diff"],
        ["bench"],
        ["report"],
        ["capstone"],
        ["video", "train"],
        ["video", "sample"],
        ["cp-bench"],
    ):
        p = _cli(*cmd, "--help")
        assert p.returncode == 0, p.stderr
        assert "``" not in p.stdout and ":func:" not in p.stdout, p.stdout  # no raw reST markup
        seen[" ".join(cmd)] = p.stdout
    build = seen["build"]
    for opt in ("--arch ARCH", "--no-cache"):
        line = next(line for line in build.splitlines() if line.strip().startswith(opt))
        assert len(line.strip()) > len(opt) + 5, f"{opt} has no help text: {line!r}"
    diff = seen["diff"]
    assert re.search(r"^\s+RUNG\s+\S", diff, re.M) and re.search(r"^\s+UPPER\s+\S", diff, re.M), diff
    assert "A ladder of attention forward kernels" in seen[""]
