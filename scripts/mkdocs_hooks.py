"""MkDocs hooks of the docs site (``mkdocs.yml``): the README becomes the front page, and every link that
leaves ``docs/`` keeps working.

The README and the rung pages are written for reading on the repository: the README links to
``docs/rungs/…`` and shows ``benchmarks/results/ladder.png``, the pages link to ``../../attnclimb/kernels/…``.
None of those targets lies inside ``docs_dir``, and MkDocs (``--strict``) rejects links it cannot resolve.
Instead of copying files into ``docs/`` (two copies that drift) or rewriting the sources for the site
(links that break on the repository), this hook keeps one source and translates at build time:

* ``on_files`` adds ``index.md`` generated from ``README.md``, and walks the links of every page: each
  target outside ``docs/`` (a kernel, a header, a JSON file, the chart, a README of a folder) is added to
  the site under ``repo/<its path>``: images and other binary files as they are, text files as a page that
  shows the source, Markdown files as pages (whose own links are followed the same way).
* ``on_page_markdown`` rewrites each relative link from "relative to where the file lies in the
  repository" to "relative to where the page lies in the site"; MkDocs then validates it like any other.
* ``on_config`` builds the navigation from the rung pages themselves (their ``# `` titles, in file order),
  then the other top-level pages of ``docs/`` by title, then the archive under ``docs/history/`` (the pages of
  rungs as they were before a re-cut, old numbering), so a new page appears without editing ``mkdocs.yml``.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
PREFIX = "repo"  # where files from outside docs/ land in the site
BINARY = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".pdf", ".webp"}
LANGS = {".cu": "cpp", ".cuh": "cpp", ".py": "python", ".json": "json", ".toml": "toml", ".sh": "bash", ".yml": "yaml"}
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")

_origin: dict = {}  # site src_uri -> the repository file its Markdown comes from


def _links(markdown: str):
    """(start, end, target) of each inline link or image outside fenced code blocks (a link's text may wrap
    onto the next line: each run of lines between fences is searched as one)."""
    pos, fence, run_start = 0, None, 0

    def run(end):
        for lm in LINK.finditer(markdown, run_start, end):
            yield lm.start(2), lm.end(2), lm.group(2)

    for line in markdown.splitlines(keepends=True):
        m = FENCE.match(line)
        if m:
            mark = m.group(1)
            if fence is None:
                yield from run(pos)
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
                run_start = pos + len(line)
        pos += len(line)
    if fence is None:
        yield from run(pos)


def _is_relative(target: str) -> bool:
    return not (target.startswith(("#", "/", "mailto:")) or re.match(r"^[a-z][a-z0-9+.-]*:", target))


def _site_uri(path: Path, docs_dir: Path) -> str | None:
    """The site src_uri of repository file (or folder) ``path``: its place under docs/, else under repo/;
    ``None`` when it is outside the repository or does not exist."""
    path = path.resolve()
    if path.is_dir():
        readme = path / "README.md"
        if not readme.is_file():
            return None
        path = readme
    if not path.is_file():
        return None
    try:
        return path.relative_to(docs_dir).as_posix()
    except ValueError:
        pass
    try:
        rel = path.relative_to(REPO).as_posix()
    except ValueError:
        return None
    if path.suffix.lower() in BINARY or path.suffix == ".md":
        return f"{PREFIX}/{rel}"
    return f"{PREFIX}/{rel}.md"  # a page that shows the source


def _source_page(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(REPO).as_posix()
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"# `{rel}`\n\n{fence}{LANGS.get(path.suffix, 'text')}\n{text}\n{fence}\n"


def _nav_title(page: Path) -> str:
    """A page's navigation title: its first line, without the ``# `` and Markdown backticks."""
    return page.read_text(encoding="utf-8").splitlines()[0].lstrip("# ").strip().replace("`", "")


def on_config(config):
    docs = Path(config.docs_dir)
    rungs = [{_nav_title(page): f"rungs/{page.name}"} for page in sorted((docs / "rungs").glob("[0-9][0-9]-*.md"))]
    # Every other top-level page (the drop-in guide, the capstone, ...) by its title, in file order.
    guides = [
        {_nav_title(page): page.name}
        for page in sorted(docs.glob("*.md"))
        if page.name not in ("index.md", "kernel-abi.md")
    ]
    config.nav = [
        {"The climb": "index.md"},
        {"Rungs": rungs},
        {"The kernel contract": "kernel-abi.md"},
        *guides,
        *_history_nav(docs),
    ]
    return config


def _history_nav(docs: Path) -> list:
    """The archive under ``docs/history/``: one section per folder (its README first, by its title), then its
    other pages by title; an archived rung page (``NN-*.md``, old numbering) is listed as "Old rung NN — ...", so
    that the navigation never shows two different rungs under one number."""
    sections = []
    for folder in sorted(p for p in (docs / "history").glob("*") if p.is_dir()):
        pages = sorted(folder.glob("*.md"), key=lambda page: (page.name != "README.md", page.name))
        entries = []
        for page in pages:
            title = _nav_title(page)
            if re.match(r"[0-9][0-9]-", page.name) and title.startswith("Rung "):
                title = "Old rung " + title[len("Rung ") :]
            entries.append({title: page.relative_to(docs).as_posix()})
        if entries:
            sections.append(entries)
    return [{"History": [entry for section in sections for entry in section]}] if sections else []


def on_files(files, config):
    docs_dir = Path(config.docs_dir).resolve()
    _origin.clear()
    files.append(File.generated(config, "index.md", content=(REPO / "README.md").read_text(encoding="utf-8")))
    _origin["index.md"] = REPO / "README.md"
    todo = [(f.src_uri, Path(f.abs_src_path)) for f in files.documentation_pages() if f.abs_src_path]
    todo.append(("index.md", REPO / "README.md"))
    seen = {uri for uri, _ in todo}
    while todo:
        _, source = todo.pop()
        for _, _, target in _links(source.read_text(encoding="utf-8")):
            if not _is_relative(target):
                continue
            path = (source.parent / target.split("#")[0]).resolve()
            uri = _site_uri(path, docs_dir)
            if uri is None or uri in seen or not uri.startswith(PREFIX + "/"):
                continue
            seen.add(uri)
            real = path / "README.md" if path.is_dir() else path
            if real.suffix.lower() in BINARY:
                files.append(File.generated(config, uri, abs_src_path=str(real)))
            elif real.suffix == ".md":
                files.append(File.generated(config, uri, content=real.read_text(encoding="utf-8")))
                _origin[uri] = real
                todo.append((uri, real))
            else:
                files.append(File.generated(config, uri, content=_source_page(real)))
    return files


def on_page_markdown(markdown, page, config, files):
    docs_dir = Path(config.docs_dir).resolve()
    src_uri = page.file.src_uri
    origin = _origin.get(src_uri) or docs_dir / src_uri
    out, last = [], 0
    for start, end, target in _links(markdown):
        if not _is_relative(target):
            continue
        path_part, _, anchor = target.partition("#")
        uri = _site_uri(origin.parent / path_part, docs_dir) if path_part else None
        if uri is None:
            continue  # left as written: MkDocs reports it if it is broken
        new = posixpath.relpath(uri, posixpath.dirname(src_uri) or ".")
        out += [markdown[last:start], new + (f"#{anchor}" if anchor else "")]
        last = end
    out.append(markdown[last:])
    return "".join(out)


def on_post_build(config):
    _origin.clear()
