"""The docs site (mkdocs.yml + scripts/mkdocs_hooks.py): it builds with --strict, the README is its front
page with the chart, and links that leave docs/ are rewritten. Skipped when MkDocs is not installed
(``pip install -e ".[docs]"``; .ci/run installs it)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")

REPO = Path(__file__).resolve().parents[1]


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", REPO / "scripts" / "mkdocs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING" not in res.stderr
    index = (site / "index.html").read_text()
    assert 'src="repo/benchmarks/results/ladder.png"' in index  # the README's chart, outside docs/
    assert 'href="rungs/09-softmax-overlap/"' in index  # README links docs/rungs/...: rewritten
    assert (site / "repo" / "benchmarks" / "results" / "ladder.png").is_file()
    page = (site / "rungs" / "05-tma" / "index.html").read_text()
    assert "../../figures/rung05-swizzle128.svg" in page
    assert 'href="../../repo/attnclimb/kernels/05_tma.cu/"' in page  # the kernel source, shown in the site
    assert "mbar_arrive_expect_tx" in (site / "repo" / "attnclimb" / "kernels" / "05_tma.cu" / "index.html").read_text()


def test_links_in_code_blocks_are_left_alone():
    hooks = _hooks()
    md = 'see [k](../x.cu)\n```\n[not](a link)\n```\n~~~~\n[nor](this)\n~~~~\n![img](y.png "t")\n'
    assert [t for _, _, t in hooks._links(md)] == ["../x.cu", "y.png"]
    # a link whose text wraps onto the next line (the README had one: the site build then failed on its target)
    md = "as [rung 17's\npage](docs/rungs/17.md) says;\n```\n[a\nb](c)\n```\n"
    assert [(md[a:b], t) for a, b, t in hooks._links(md)] == [("docs/rungs/17.md", "docs/rungs/17.md")]
    assert not hooks._is_relative("https://example.org/a.md")
    assert not hooks._is_relative("#anchor")
    assert hooks._is_relative("../../attnclimb/kernels/05_tma.cu")


def test_site_uri_mapping():
    hooks = _hooks()
    docs = (REPO / "docs").resolve()
    assert hooks._site_uri(docs / "rungs" / "05-tma.md", docs) == "rungs/05-tma.md"
    assert hooks._site_uri(REPO / "benchmarks/results/ladder.png", docs) == "repo/benchmarks/results/ladder.png"
    assert hooks._site_uri(REPO / "attnclimb/kernels/05_tma.cu", docs) == "repo/attnclimb/kernels/05_tma.cu.md"
    assert hooks._site_uri(REPO / "benchmarks/ab", docs) == "repo/benchmarks/ab/README.md"  # a folder: its README
    assert hooks._site_uri(REPO / "no/such/file.cu", docs) is None
