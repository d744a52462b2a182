"""Bring a device call's returned files into the repository: ``python scripts/after_device.py DIR [DIR ...]``.

DIR is a folder the device tool copied ``$OUT`` into (``files_at``). For each file found there:

* a bench results JSON (``<device>-YYYYMMDD-HHMMSS.json`` with a ``rows`` list; ``latest.json`` is skipped):
  from an H200 (the card the README's table is for), copied to ``benchmarks/results/`` and, the newest of them,
  to ``benchmarks/results/latest.json``, then ``python -m attnclimb report`` (README table, rung pages, chart) and
  ``scripts/update_diff_quotes.py``; the notes that said a page's measured block or the README's table came from
  another bench (:func:`retire_notes`) go with them; from any other card, copied to ``benchmarks/ab/`` as
  ``bench-<commit>-<card>-YYYYMMDD-HHMMSS.json``, the README left alone;
* ``timelines.tgz`` (``device_job.sh trace``): its ``rungNN.json`` / ``rungNN.png`` into
  ``docs/figures/timelines/`` (the SVGs are not kept);
* ``ab_*.json`` (``scripts/ab_rungs.py``): copied to ``benchmarks/ab/`` as ``ab-<name>-<commit>-<card>-<date>.json``
  (the commit and card from the file's ``meta``: ``h200``, ``h100``);
* ``ncu_*.tgz``: unpacked into ``/tmp/ncu-<label>/`` and summarised with ``scripts/ncu_mix.py`` (the
  source pages are not committed).

It prints what it did and what is left to do by hand (the rung pages' prose, the benchmarks/ab README's
table, the commit). Nothing here needs a GPU.
"""

import datetime
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from attnclimb.bench.run import device_slug  # the bench results' own file-name slug

ROOT = Path(__file__).resolve().parents[1]


def _is_bench(path: Path) -> bool:
    if path.name == "latest.json":
        return False
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("rows"), list) and "shapes" in doc and "date" in doc


def short_commit(commit) -> str:
    """``"40ea14bcafe-dirty"`` -> ``"40ea14b-dirty"``; ``"nocommit"`` when the file has none."""
    if not commit:
        return "nocommit"
    head, dirty, _ = str(commit).partition("-dirty")
    return head[:7] + ("-dirty" if dirty else "")


def _copy_new(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst``; a ``dst`` with other contents is never overwritten (SystemExit)."""
    if dst.exists() and dst.read_bytes() != src.read_bytes():
        raise SystemExit(f"after_device: {dst} exists already with other contents; move it or rename {src}")
    shutil.copyfile(src, dst)


PAGE_NOTE = re.compile(r"\nThe table below is the H100 bench .*?\n\n", re.S)  # above a page's measured block
README_NOTE = "<!-- results-note -->\n"  # followed by a blockquote on the bench the README's table is from
PROSE_MARKER = "<!-- H200 bench of the re-cut: fill from the new latest.json -->"


def _caption(text: str, begin: str) -> str:
    """The first line of the generated block after ``begin`` (``_NVIDIA H200 · driver … · commit 8dc52f5 · …_``)."""
    return text.split(begin, 1)[1].strip().split("\n", 1)[0] if begin in text else ""


def retire_notes(root: Path) -> list[str]:
    """Once an H200 bench is the README's table and the pages' measured blocks: remove the paragraphs above the
    rung pages' blocks that say the block is another card's bench (``The table below is the H100 bench …``), on
    the pages whose block now is an H200's (``report`` refills only the pages whose rung the bench timed), and the
    blockquote under README's ``<!-- results-note -->`` that names the bench the table was, once the table names
    another commit. Returns the files that still hold :data:`PROSE_MARKER`, where the prose is to be written by
    hand (the markers stay until then)."""
    from attnclimb.bench.report import MARK_BEGIN, PAGE_BEGIN

    for page in sorted((root / "docs" / "rungs").glob("*.md")):
        text = page.read_text()
        if not _caption(text, PAGE_BEGIN).startswith("_NVIDIA H200"):
            continue
        new = PAGE_NOTE.sub("\n", text)
        if new != text:
            page.write_text(new)
            print(f"removed the other card's note from {page.relative_to(root)}")
    readme = root / "README.md"
    text = readme.read_text() if readme.exists() else ""
    if README_NOTE in text:
        head, tail = text.split(README_NOTE, 1)
        lines = tail.split("\n")
        n = 0
        while n < len(lines) and lines[n].startswith(">"):
            n += 1
        commit = re.search(r"· commit (\S+) ·", _caption(text, MARK_BEGIN))
        if n and commit and commit.group(1) not in "\n".join(lines[:n]):
            while n < len(lines) and not lines[n].strip():
                n += 1
            readme.write_text(head + README_NOTE + "\n" + "\n".join(lines[n:]))
            print("removed README's results note (the table is the new bench)")
    files = [root / "README.md", *sorted((root / "docs" / "rungs").glob("*.md"))]
    return [str(f.relative_to(root)) for f in files if f.exists() and PROSE_MARKER in f.read_text()]


def main(dirs) -> int:
    benches, todo = [], []
    today = datetime.date.today().strftime("%Y%m%d")
    for d in map(Path, dirs):
        for f in sorted(d.iterdir()):
            if f.suffix == ".json" and _is_bench(f):
                doc = json.loads(f.read_text())
                dev = device_slug(doc.get("device"))
                if dev != "h200":  # the README's table is an H200 run: keep others beside the A/Bs
                    stamp = datetime.datetime.fromisoformat(str(doc["date"])).strftime("%Y%m%d-%H%M%S")
                    name = f"bench-{short_commit(doc.get('commit'))}-{dev}-{stamp}.json"
                    dst = ROOT / "benchmarks" / "ab" / name
                    _copy_new(f, dst)
                    print(f"bench results from {doc.get('device')} -> {dst.relative_to(ROOT)} (not latest.json)")
                    todo.append(f"a line for {dst.name} in benchmarks/ab/README.md")
                    todo.append(
                        f"where rung pages have no H200 figures of their kernel: python -m attnclimb report "
                        f"{dst.relative_to(ROOT)} --pages N-M"
                    )
                    continue
                dst = ROOT / "benchmarks" / "results" / f.name
                shutil.copyfile(f, dst)
                benches.append(dst)
                print(f"bench results -> {dst.relative_to(ROOT)}")
            elif f.name == "timelines.tgz":
                out = ROOT / "docs" / "figures" / "timelines"
                with tarfile.open(f) as tar:
                    for m in tar.getmembers():
                        name = Path(m.name).name
                        if m.isfile() and name.startswith("rung") and name.endswith((".json", ".png")):
                            (out / name).write_bytes(tar.extractfile(m).read())
                            print(f"timeline -> {(out / name).relative_to(ROOT)}")
                todo.append("embed new timelines on their rung pages (see rung 9's 'Measured timeline')")
            elif f.name.startswith("ab_") and f.suffix == ".json":
                meta = json.loads(f.read_text()).get("meta", {})
                commit, dev = short_commit(meta.get("commit")), device_slug(meta.get("device"))
                dst = ROOT / "benchmarks" / "ab" / f"ab-{f.stem[3:].replace('_', '-')}-{commit}-{dev}-{today}.json"
                _copy_new(f, dst)
                print(f"A/B -> {dst.relative_to(ROOT)}  (python scripts/ab_table.py {dst.relative_to(ROOT)} A B)")
                todo.append(f"a line for {dst.name} in benchmarks/ab/README.md")
            elif f.name.startswith("ncu_") and f.name.endswith(".tgz"):
                label = f.name[4:-4]
                tmp = Path("/tmp") / f"ncu-{label}"
                tmp.mkdir(exist_ok=True)
                with tarfile.open(f) as tar:
                    tar.extractall(tmp, filter="data")
                csvs = sorted(tmp.glob("*_sass.csv"))
                if csvs:
                    subprocess.run([sys.executable, str(ROOT / "scripts" / "ncu_mix.py"), f"{label}={csvs[0]}"])
                print(f"ncu {label}: details page in {tmp}")
    if benches:
        newest = max(benches, key=lambda p: json.loads(p.read_text())["date"])
        shutil.copyfile(newest, ROOT / "benchmarks" / "results" / "latest.json")
        print(f"latest.json = {newest.name}")
        for cmd in (["-m", "attnclimb", "report", "benchmarks/results/latest.json"], ["scripts/update_diff_quotes.py"]):
            subprocess.run([sys.executable, *cmd], cwd=ROOT, check=True)
        todo.append("check the commit recorded in the bench JSON (ATTNCLIMB_GIT_COMMIT)")
        for f in retire_notes(ROOT):
            todo.append(f"write the ratios of the new bench where {f} has {PROSE_MARKER}, then remove the marker")
    for t in dict.fromkeys(todo):
        print(f"left to do: {t}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
