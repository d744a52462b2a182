"""The docs site (mkdocs.yml + scripts/mkdocs_hooks.py): it builds with --strict, the README is its front
page with the chart, and links that leave docs/ are rewritten. Skipped when MkDocs is not installed
(``pip install -e ".[docs]"``; .ci/run installs it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from scripts_loader import load_script

pytest.importorskip("mkdocs")
pytest.importorskip("material")

REPO = Path(__file__).resolve().parents[1]


def _hooks():
    return load_script("mkdocs_hooks")


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
    # the archive of the rungs before the re-cut (docs/history/before-recut/, old numbering) is part of the site
    assert (site / "history" / "before-recut" / "index.html").is_file()  # its README.md, the archive's index
    assert (site / "history" / "before-recut" / "14-lazy-rescale" / "index.html").is_file()


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


def test_history_is_in_the_navigation():
    """docs/history/ (the pages of rungs as they were before a re-cut) is a "History" section of the navigation:
    each folder's README (its index) first, and the archived rung pages titled "Old rung NN", so that the site never
    lists two different rungs under one number."""
    from types import SimpleNamespace

    nav = _hooks().on_config(SimpleNamespace(docs_dir=str(REPO / "docs"), nav=None)).nav
    history = next(entry["History"] for entry in nav if "History" in entry)
    first = history[0]
    assert list(first.values()) == ["history/before-recut/README.md"]
    titles = [title for entry in history for title in entry]
    assert "Old rung 14 — lazy rescale: keep a row's softmax reference until P would pass 2^8" in titles
    assert not any(title.startswith("Rung ") for title in titles)
    rungs = next(entry["Rungs"] for entry in nav if "Rungs" in entry)
    assert all(path.startswith("rungs/") for entry in rungs for path in entry.values())


def test_archived_pages_are_left_alone_by_the_generators():
    """The archived pages keep no <!-- measured:... --> or <!-- figures:... --> blocks (`python -m attnclimb
    report` and `figures` fill those of docs/rungs/ only, and the archive must not be refilled with the new rungs'
    numbers), link none of the figures that are redrawn for the current rungs under the same names, and link only
    files that exist (a kernel file that the re-cut deleted is named as code text at the commit that had it)."""
    import re

    pages = sorted((REPO / "docs" / "history").rglob("*.md"))
    assert pages
    link = re.compile(r"\]\(([^)\s]+)\)")
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for marker in ("measured:begin", "measured:end", "figures:begin", "figures:end"):
            assert f"<!-- {marker} -->" not in text, (page.name, marker)
        for target in link.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists(), (page.name, target)
            # the files that `figures` and `trace` write for the current rungs (rungNN-*.svg, timelines/rungNN.png)
            assert not re.search(r"figures/(rung\d\d-[a-z-]+\.svg|timelines/rung\d\d\.(png|json))$", target), target
