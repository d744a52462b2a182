"""``python -m attnclimb report [json]``: the README results table and the ladder chart, from a results JSON.

Nothing here needs torch or a GPU. The README table lives between ``<!-- results:begin -->`` and
``<!-- results:end -->``; only the text between the two markers is replaced. Results with feature columns
(schema 4: shapes of group ``"features"``: causal and grouped-query attention, head_dim 64 and 256, issue 8)
get a table of their own after the main one, listing the implementations that ran there; a column of
another head_dim than 128 or with fewer K/V heads gives its dimensions in its header (``8k d64 (B2 H32
S8192 D64)``). Results that carry the drop-in sections (schema 3, :mod:`attnclimb.bench.dropin`) get two
more small tables after those, BSHD views and host overhead; results without them render as they always
did.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

from . import paths
from .dropin import BSHD_SECTION, HOST_SECTION
from .peers import FA4_KEY, PEER_KEYS, PEER_LABELS, REFERENCE_KEY
from .shapes import FEATURE_GROUP, HEAD_DIM, HEADLINE_SEQLENS, MAIN_GROUP, SHAPE_NOTES, shape_detail

DESCRIPTION = (
    "Fill the README's results table (between its markers) and each rung page's measured section "
    "from a results JSON written by bench, and draw the chart. Needs neither torch nor a GPU."
)
MARK_BEGIN = "<!-- results:begin -->"
MARK_END = "<!-- results:end -->"


def load_results(path) -> dict:
    """Read a results JSON written by ``bench``. ``FileNotFoundError`` / ``ValueError`` (bad JSON or no rows)."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not doc["rows"]:
        raise ValueError(f"{path}: not an attnclimb results file (no non-empty 'rows' list)")
    for i, r in enumerate(doc["rows"]):
        ok = isinstance(r, dict) and all(isinstance(r.get(f), str) for f in ("impl", "shape", "status"))
        if ok and r["status"] == "ok":
            ok = all(isinstance(r.get(f), (int, float)) for f in ("ms", "tflops"))
        if not ok:
            raise ValueError(f"{path}: row {i} is malformed: {r!r:.200}")
    if not isinstance(doc.get("shapes", []), list):
        raise ValueError(f"{path}: 'shapes' must be a list")
    for name, label, numbers in (
        (BSHD_SECTION, "impl", ("contiguous_ms", "view_ms", "ratio")),
        (HOST_SECTION, "key", ("us_per_call",)),
    ):
        sec = doc.get(name)
        if sec is None:
            continue
        if not isinstance(sec, dict) or not isinstance(sec.get("rows"), list):
            raise ValueError(f"{path}: '{name}' must be an object with a 'rows' list")
        for i, r in enumerate(sec["rows"]):
            ok = isinstance(r, dict) and all(isinstance(r.get(f), str) for f in (label, "status"))
            if ok and r["status"] == "ok":
                ok = all(isinstance(r.get(f), (int, float)) for f in numbers)
            if not ok:
                raise ValueError(f"{path}: {name} row {i} is malformed: {r!r:.200}")
    return doc


# ------------------------------------------------------------------------------------------ table model


def _columns(doc: dict, group: str = MAIN_GROUP) -> list:
    """``[(shape_name, label), ...]`` of one group of columns in bench order (from ``doc['shapes']``, whose
    ``group`` defaults to ``"main"``; then, for the main group, shapes that only the rows name, in order of
    first appearance)."""
    shapes = doc.get("shapes", [])
    cols = [(s["name"], s.get("label", s["name"])) for s in shapes if s.get("group", MAIN_GROUP) == group]
    if group != MAIN_GROUP:
        return cols
    seen = {s["name"] for s in shapes}
    for r in doc["rows"]:
        if r["shape"] not in seen:
            seen.add(r["shape"])
            cols.append((r["shape"], r["shape"]))
    return cols


def _rung_number(impl: str) -> int | None:
    if impl.startswith("rung") and impl[4:].isdigit():
        return int(impl[4:])
    return None


def impl_order(doc: dict) -> list:
    """Impl keys as table rows: our rungs by number, then the peers in :data:`PEER_KEYS` order, then others."""
    keys = list(dict.fromkeys(r["impl"] for r in doc["rows"]))
    ours = sorted((k for k in keys if _rung_number(k) is not None), key=_rung_number)
    peers = [k for k in PEER_KEYS if k in keys]
    rest = [k for k in keys if k not in ours and k not in peers]
    return ours + peers + rest


def _labels(doc: dict) -> dict:
    out = {}
    for r in doc["rows"]:
        out.setdefault(r["impl"], r.get("label") or PEER_LABELS.get(r["impl"], r["impl"]))
    return out


def _shape_detail(doc: dict, name: str) -> str:
    """`` (B1 H40 Sq75600 Sk512)`` after a named shape's label (:func:`~attnclimb.bench.shapes.shape_detail`),
    a GQA column's or a column's of another head_dim than 128 (`` (B2 H32 S8192 D64)``); nothing after the
    other FA-paper columns, whose dimensions the caption gives."""
    for s in doc.get("shapes", []):
        gqa = s.get("heads_kv") not in (None, s["heads"])
        other_dim = s.get("head_dim", HEAD_DIM) != HEAD_DIM
        if s["name"] == name and (gqa or other_dim or not name.startswith("fa-")):
            d = shape_detail(
                s["batch"], s["heads"], s["seqlen_q"], s["seqlen_k"], s.get("heads_kv"), s.get("head_dim", HEAD_DIM)
            )
            return f" ({d})"
    return ""


def has_fa4_ratios(doc: dict) -> bool:
    """True when some row carries a ``ratio_to_fa4`` (bench writes it since schema 2, where FA4 ran);
    the table then shows it next to the ratio to cuDNN. Older results render as they always did."""
    return any(r.get("ratio_to_fa4") is not None for r in doc["rows"])


def _ok_cell(r: dict, times: str, fa4: bool) -> str:
    """``"612 (1.00×)"``, or with ``fa4`` ``"612 (1.00× / 0.93×)"`` (ratio to cuDNN / to FA4; ``—`` where
    one is missing)."""
    cudnn, to_fa4 = r.get("ratio_to_cudnn"), r.get("ratio_to_fa4")
    if not fa4:
        return f"{r['tflops']:.0f}" + (f" ({cudnn:.2f}{times})" if cudnn is not None else "")
    a = f"{cudnn:.2f}{times}" if cudnn is not None else "—"
    b = f"{to_fa4:.2f}{times}" if to_fa4 is not None else "—"
    return f"{r['tflops']:.0f} ({a} / {b})"


def format_cudnn(v) -> str:
    """``91900 -> "9.19.0"`` (cuDNN >= 9 encoding), ``8907 -> "8.9.7"``; other values as given."""
    if isinstance(v, int) and v > 0:
        if v >= 90000:
            return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
        return f"{v // 1000}.{(v % 1000) // 100}.{v % 100}"
    return str(v)


def caption(doc: dict) -> str:
    """One line naming device, driver, torch, CUDA, cuDNN, commit and date of the run."""
    commit = str(doc.get("commit") or "unknown")
    dirty = commit.endswith("-dirty")
    short = commit[: -len("-dirty")][:12] + "-dirty" if dirty else commit[:12]
    return (
        f"{doc.get('device', '?')} · driver {doc.get('driver_version', '?')} · torch {doc.get('torch_version', '?')}"
        f" · CUDA {doc.get('cuda_version', '?')} · cuDNN {format_cudnn(doc.get('cudnn_version'))}"
        f" · commit {short} · {doc.get('date', '?')}"
    )


def table_model(doc: dict, times: str = "×", group: str = MAIN_GROUP) -> tuple:
    """``(header, body, footnotes)`` for the results table of one group of columns (``"main"``, or
    ``"features"``: see :func:`feature_model`).

    header: ``["impl", <column labels>...]``; body: one list of strings per impl (label then cells, a cell
    is ``"612 (1.00×)"`` for ok rows, ``"612 (1.00× / 0.93×)"`` when the results carry ratios to FA4,
    ``"—"`` skipped, ``"error"``); footnotes: one line per (impl, non-ok status) naming the columns it
    applies to. In a group other than the main one, an impl skipped on every column of the group gets no
    row; one footnote names those impls and their reasons.
    """
    cols = _columns(doc, group)
    fa4 = has_fa4_ratios(doc)
    labels = _labels(doc)
    by = {(r["impl"], r["shape"]): r for r in doc["rows"]}
    header = ["impl"] + [lab + _shape_detail(doc, name) for name, lab in cols]
    body, notes, hidden = [], {}, {}
    for impl in impl_order(doc):
        mine = [by[(impl, name)] for name, _ in cols if (impl, name) in by]
        if group != MAIN_GROUP and all(r["status"].startswith("skipped") for r in mine):
            for r in mine:
                hidden.setdefault(impl, []).append(r["status"].removeprefix("skipped: "))
            continue
        cells = [labels[impl]]
        for name, lab in cols:
            r = by.get((impl, name))
            if r is None:
                cells.append("")
                continue
            st = r["status"]
            if st == "ok":
                cells.append(_ok_cell(r, times, fa4))
            else:
                cells.append("—" if st.startswith("skipped") else "error")
                notes.setdefault((impl, st), []).append(lab)
        body.append(cells)
    foot = [f"{impl} at {', '.join(labs)}: {st}" for (impl, st), labs in notes.items()]
    if hidden:
        foot.append(f"{_impl_ranges(list(hidden))}: not run here ({_reasons(w for ws in hidden.values() for w in ws)})")
    return header, body, foot


def _impl_ranges(impls: list) -> str:
    """``rung00–rung11, fa4``: runs of consecutive rung numbers joined by a dash (3 or more), the rest as given."""
    out, run_ = [], []
    for impl in [*impls, None]:
        n = None if impl is None else _rung_number(impl)
        if n is not None and run_ and n == _rung_number(run_[-1]) + 1:
            run_.append(impl)
            continue
        if run_:
            out += [f"{run_[0]}–{run_[-1]}"] if len(run_) >= 3 else run_
        run_ = [impl] if n is not None else []
        if n is None and impl is not None:
            out.append(impl)
    return ", ".join(out)


def _variant_rank(word: str) -> tuple:
    """Sort key of a variant's name in a reason: ``causal``, ``grouped-query``, ``head_dim N`` by ``N``, others
    (in their order: the sort is stable)."""
    if word in ("causal", "grouped-query"):
        return (0, word != "causal")
    n = word.removeprefix("head_dim ")
    return (1, int(n)) if n.isdigit() else (2, 0)


def _reasons(reasons) -> str:
    """Distinct skip reasons joined by `` / ``; a parenthesised tail they all share is said once, after a
    semicolon: ``"no causal variant / no grouped-query variant; issue 8: only the top rung has them"``.
    When they all read ``"no <variants> variant (<tail>)"`` (:meth:`~attnclimb.bench.peers.RungImpl.unsupported`),
    the variants are listed once each: ``"no causal, grouped-query or head_dim 64 variant; issue 8: ..."``."""
    reasons = list(dict.fromkeys(reasons))
    tails = {w.rpartition(" (")[2] for w in reasons}
    if len(tails) == 1 and all(" (" in w and w.endswith(")") for w in reasons):
        tail = tails.pop()
        heads = [w[: -len(tail) - 2] for w in reasons]
        if len(heads) > 1 and all(h.startswith("no ") and h.endswith(" variant") for h in heads):
            words = [x for h in heads for x in h[3 : -len(" variant")].replace(" or ", ", ").split(", ")]
            words = sorted(dict.fromkeys(words), key=_variant_rank)  # causal, grouped-query, head_dim by size
            listed = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
            return f"no {listed} variant; {tail[:-1]}"
        return " / ".join(heads) + "; " + tail[:-1]
    return " / ".join(reasons)


def _feature_head_dims(doc: dict) -> list:
    """The head dims other than 128 among the feature columns, ascending (``[64, 256]``; ``[]`` for results
    without head_dim columns)."""
    dims = {s.get("head_dim", HEAD_DIM) for s in doc.get("shapes", []) if s.get("group", MAIN_GROUP) == FEATURE_GROUP}
    return sorted(dims - {HEAD_DIM})


def feature_model(doc: dict, times: str = "×") -> tuple | None:
    """``(intro, header, body, footnotes)`` of the feature columns' table (causal and grouped-query
    attention, head_dim 64 and 256, issue 8; :data:`~attnclimb.bench.shapes.FEATURE_GROUP`), ``None`` when
    the results have none. The rows are the impls that ran (or failed) on some of these columns; those
    skipped on all of them (the rungs without the variants) are one footnote. The title and the head_dim
    phrase follow the columns the results have (results without head_dim columns read as they did)."""
    if not _columns(doc, FEATURE_GROUP):
        return None
    header, body, foot = table_model(doc, times, FEATURE_GROUP)
    ref = _ratio_legend(doc)
    dims = _feature_head_dims(doc)
    title, head_dim, sizes = "Causal and grouped-query attention", "head_dim 128", "causal columns: 16 heads, "
    if dims:  # their headers give their dimensions (B, H, S, D: _shape_detail)
        title += f", head_dim {' and '.join(map(str, dims))}"
        head_dim += (
            f" unless the column says (D{', D'.join(map(str, dims))}: heads·head_dim = 2048 as in the FA papers)"
        )
        sizes = "16 heads where the column gives no dimensions, "
    intro = (
        f"{title} (issue 8): forward TFLOP/s of the same formula, halved for causal "
        "columns (torch's is_causal=True, the FA papers' convention), counting query heads for GQA "
        f"(K/V heads after the slash), bf16, {head_dim}; {sizes}batch·seqlen = 16384"
        + (f"; {ref}" if ref else "")
        + "."
    )
    return intro, header, body, foot


def _ratio_legend(doc: dict) -> str:
    if has_fa4_ratios(doc):
        return f"× = ratio to SDPA cuDNN / to {PEER_LABELS[FA4_KEY]} in the same run"
    return "× = ratio to SDPA cuDNN in the same run" if any(r["impl"] == REFERENCE_KEY for r in doc["rows"]) else ""


def _variants(doc: dict) -> str:
    """``"head_dim 128, non-causal"`` when every shape is so (all results before issue 8), else a phrase
    that sends the reader to the column labels."""
    shapes = [s for s in doc.get("shapes", []) if s.get("group", MAIN_GROUP) == MAIN_GROUP]
    plain = all(
        s.get("head_dim", HEAD_DIM) == HEAD_DIM and not s.get("causal") and s.get("heads_kv") in (None, s["heads"])
        for s in shapes
    )
    return "head_dim 128, non-causal" if plain else "head_dim 128, non-causal, equal heads unless the column says"


def _rounds_phrase(settings: dict, times: str = "×") -> str:
    """``"; median over 3 interleaved rounds"`` for results that say how many rounds they ran, else ``""``;
    schema 5 adds how the close ones were timed (``settings.contenders``: longer rounds, or call by call with
    ``settings.interleaved``)."""
    n = settings.get("rounds")
    if not (isinstance(n, int) and n > 1):
        return ""
    span = settings.get("contest_span")
    contenders = settings.get("contenders") or {}
    # the headline implementations that were timed so (a key that matched no selected implementation is left out)
    head = [k for k in settings.get("headline") or [] if any(k in keys for keys in contenders.values())]
    close = (
        f"those within {span:g}{times} of a column's fastest" if isinstance(span, (int, float)) and span >= 1 else ""
    )
    who = " and ".join(x for x in (", ".join(head), close) if x)
    if settings.get("interleaved") and who:
        return (
            f"; {who}: calls interleaved one by one, median over {n} consecutive slices of them; the others: median "
            f"over {n} interleaved rounds"
        )
    w, r = settings.get("contest_warmup_ms"), settings.get("contest_rep_ms")
    if contenders and who and w and r:
        w0, r0 = settings.get("warmup_ms"), settings.get("rep_ms")
        others = f", the others {w0:g} + {r0:g} ms" if head and w0 is not None and r0 is not None else ""
        where = " on the main shapes" if head else ""
        return (
            f"; median over {n} interleaved rounds, in which {who} run {w:g} ms before {r:g} ms of timed calls"
            f"{where} (the power-capped clock settles){others}"
        )
    return f"; median over {n} interleaved rounds"


def _timing_phrase(doc: dict) -> str:
    """:func:`_rounds_phrase` of the settings of a results document or of one of its drop-in sections."""
    return _rounds_phrase(doc.get("settings") or {})


# ------------------------------------------------------------------------------- the drop-in sections


def _cell_for(status: str) -> str:
    return "—" if status.startswith("skipped") else "error"


def bshd_view_model(doc: dict, times: str = "×", code: str = "`") -> tuple | None:
    """``(intro, header, body, footnotes)`` of the BSHD-view table, ``None`` when the results have no
    :data:`~attnclimb.bench.dropin.BSHD_SECTION`. One row per implementation and shape: contiguous ms,
    BSHD-view ms and their ratio (``"1.070×"``); ``—``/``error`` cells and a footnote for the others."""
    sec = doc.get(BSHD_SECTION)
    if not sec:
        return None
    shapes = {s["name"]: s for s in sec.get("shapes", [])}

    def shape_cell(name):
        s = shapes.get(name)
        if s is None:
            return name
        d = shape_detail(
            s["batch"], s["heads"], s["seqlen_q"], s["seqlen_k"], s.get("heads_kv"), s.get("head_dim", HEAD_DIM)
        )
        return f"{s.get('label', name)} ({d})"

    goal = sec.get("goal_max_ratio")
    intro = (
        f"BSHD views{f' (goal ≤ {goal:.2f}{times})' if isinstance(goal, (int, float)) else ''}: median time of one "
        f"call on q, k, v held as (B, S, H, D)-contiguous tensors and passed as {code}.transpose(1, 2){code} views "
        f"(what the call does with a view, e.g. a copy, is timed) against the call on (B, H, S, D)-contiguous "
        f"tensors{_timing_phrase(sec)}."
    )
    if any(r.get("native_layout") == "bshd" for r in sec["rows"]):
        natives = ", ".join(dict.fromkeys(r["label"] for r in sec["rows"] if r.get("native_layout") == "bshd"))
        intro += (
            f" {natives} takes (B, S, H, D) natively: its view call is its ordinary call, and its contiguous call "
            f"gets {code}.transpose(1, 2){code} of the (B, H, S, D) tensors."
        )
    header = ["impl", "shape", "contiguous (ms)", "BSHD view (ms)", "view / contiguous"]
    body, notes = [], {}
    for r in sec["rows"]:
        cells = [r.get("label") or r["impl"], shape_cell(r["shape"])]
        if r["status"] == "ok":
            cells += [f"{r['contiguous_ms']:.3f}", f"{r['view_ms']:.3f}", f"{r['ratio']:.3f}{times}"]
        else:
            cells += [_cell_for(r["status"])] * 3
            notes.setdefault((r["impl"], r["status"]), []).append(cells[1].split(" (")[0])
        body.append(cells)
    foot = [f"{impl} at {', '.join(labs)}: {st}" for (impl, st), labs in notes.items()]
    return intro, header, body, foot


def host_overhead_model(doc: dict, times: str = "×", code: str = "`") -> tuple | None:
    """``(intro, header, body, footnotes)`` of the host-overhead table, ``None`` when the results have no
    :data:`~attnclimb.bench.dropin.HOST_SECTION`. One row per call path: µs per call and the ratio to SDPA
    cuDNN (``"1.43×"``)."""
    sec = doc.get(HOST_SECTION)
    if not sec:
        return None
    st = sec.get("settings") or {}
    sh = sec.get("shape") or {}
    dims = ", ".join(str(sh.get(k, "?")) for k in ("batch", "heads", "seqlen_q", "head_dim"))
    goal = sec.get("goal_max_ratio")
    ref = PEER_LABELS.get(sec.get("reference", REFERENCE_KEY), sec.get("reference", REFERENCE_KEY))
    intro = (
        "Host overhead"
        + (f" (goal ≤ {goal:.2f}{times} {ref})" if isinstance(goal, (int, float)) else "")
        + f": wall-clock µs per call on a ({dims}) {sh.get('dtype', 'bfloat16').replace('bfloat16', 'bf16')} "
        "problem, whose kernel takes a few µs, so that the host sets the pace: "
        f"{st.get('calls', '?')} back-to-back calls between two torch.cuda.synchronize after "
        f"{st.get('warmup_calls', '?')} warm-up calls, median of {st.get('reps', '?')} repetitions"
        f"{_timing_phrase(sec)}."
    )
    header = ["call", "µs per call", f"{times} {ref}"]
    body, foot = [], []
    for r in sec["rows"]:
        label = f"{code}{r['label']}{code}" if r["key"].startswith("attnclimb") else r["label"]
        if r["status"] == "ok":
            rt = r.get("ratio_to_cudnn")
            body.append([label, f"{r['us_per_call']:.1f}", f"{rt:.2f}{times}" if rt is not None else "—"])
        else:
            body.append([label, _cell_for(r["status"]), _cell_for(r["status"])])
            foot.append(f"{r['key']}: {r['status']}")
    return intro, header, body, foot


def _markdown_rows(header: list, body: list, left: int = 1) -> list:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join([":---"] * left + ["---:"] * (len(header) - left)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def _plain_rows(header: list, body: list, left: int = 1) -> list:
    rows = [header] + body
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def fmt(r):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return [fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in body]


def section_markdown(doc: dict) -> list:
    """The markdown lines of the drop-in tables (BSHD views, then host overhead); ``[]`` without them."""
    lines = []
    for model, left in ((bshd_view_model(doc), 2), (host_overhead_model(doc), 1)):
        if model is None:
            continue
        intro, header, body, foot = model
        title, _, rest = intro.partition(": ")
        lines += ["", f"**{title}**: {rest}", ""] + _markdown_rows(header, body, left)
        if foot:
            lines += [""] + [f"- {f}" for f in foot]
    return lines


def section_console(doc: dict) -> list:
    """The plain-text lines of the drop-in tables for a terminal (``x`` for ratios, the text wrapped at 110
    columns); ``[]`` without them."""
    lines = []
    for model, left in ((bshd_view_model(doc, "x", ""), 2), (host_overhead_model(doc, "x", ""), 1)):
        if model is None:
            continue
        intro, header, body, foot = model
        lines += ["", *textwrap.wrap(intro, 110)] + _plain_rows(header, body, left) + [f"  {f}" for f in foot]
    return lines


def markdown_table(doc: dict, source: str | None = None) -> str:
    """The README block: caption, a markdown table (TFLOP/s and ×cuDNN, ×FA4 when present, per column),
    then the footnotes, then the drop-in tables when the results have them (:func:`section_markdown`)."""
    header, body, foot = table_model(doc)
    ref = _ratio_legend(doc)
    shape_notes = "".join(f" {lab}: {SHAPE_NOTES[n]}." for n, lab in _columns(doc) if n in SHAPE_NOTES)
    lines = [
        f"_{caption(doc)}_",
        "",
        f"Forward TFLOP/s (4·B·H·Sq·Sk·D / median time{_timing_phrase(doc)}), bf16, {_variants(doc)}; "
        "FA-paper columns: 16 heads, batch·seqlen = 16384" + (f"; {ref}" if ref else "") + "." + shape_notes,
        "",
    ]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in body:
        lines.append("| " + " | ".join(row) + " |")
    if foot:
        lines.append("")
        lines += [f"- {f}" for f in foot]
    model = feature_model(doc)
    if model is not None:
        intro, fheader, fbody, ffoot = model
        title, _, rest = intro.partition(": ")
        lines += ["", f"**{title}**: {rest}", ""] + _markdown_rows(fheader, fbody)
        if ffoot:
            lines += [""] + [f"- {f}" for f in ffoot]
    lines += section_markdown(doc)
    lines.append("")
    lines.append(
        f"<sub>Generated by `python -m attnclimb report{(' ' + source) if source else ''}`; do not edit by hand.</sub>"
    )
    return "\n".join(lines)


def console_table(doc: dict) -> str:
    """The same table as plain aligned text for a terminal (``x`` for the cuDNN ratio), caption first, then
    the drop-in tables when the results have them (:func:`section_console`)."""
    header, body, foot = table_model(doc, times="x")
    rows = [header] + body
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def fmt(r):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    unit = "TFLOP/s (x cuDNN / x FA4)" if has_fa4_ratios(doc) else "TFLOP/s (x cuDNN)"
    out = [caption(doc), unit, fmt(header), "  ".join("-" * w for w in widths)]
    out += [fmt(r) for r in body]
    out += [f"  {f}" for f in foot]
    model = feature_model(doc, "x")
    if model is not None:
        intro, fheader, fbody, ffoot = model
        out += ["", *textwrap.wrap(intro, 110)] + _plain_rows(fheader, fbody) + [f"  {f}" for f in ffoot]
    out += section_console(doc)
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- README


def replace_between_markers(text: str, block: str, begin: str = MARK_BEGIN, end: str = MARK_END) -> str | None:
    """``text`` with everything strictly between the first ``MARK_BEGIN`` and the next ``MARK_END``
    replaced by ``"\\n" + block + "\\n"``; the markers and everything outside them are kept byte for byte.

    Returns ``None`` when either marker is missing (or the end marker precedes the begin marker).
    """
    i = text.find(begin)
    if i < 0:
        return None
    j = text.find(end, i + len(begin))
    if j < 0:
        return None
    return text[: i + len(begin)] + "\n" + block.strip("\n") + "\n" + text[j:]


def update_readme(readme, block: str) -> str | None:
    """Write ``block`` between the markers of ``readme``.

    Returns ``"updated"`` (the file changed), ``"unchanged"`` (it already held ``block``; not rewritten) or
    ``None`` (file untouched) when the file or its markers are missing.
    """
    readme = Path(readme)
    if not readme.is_file():
        return None
    text = readme.read_text()
    new = replace_between_markers(text, block)
    if new is None:
        return None
    if new == text:
        return "unchanged"
    readme.write_text(new)
    return "updated"


# ------------------------------------------------------------------------------------------- rung pages

PAGE_BEGIN, PAGE_END = "<!-- measured:begin -->", "<!-- measured:end -->"


def rung_page_block(doc: dict, number: int, names: dict | None = None) -> str | None:
    """Markdown for rung ``number``'s page: its TFLOP/s and ×cuDNN next to the rung below, per shape, and
    the gain; ``None`` when the results hold no row for this rung.

    ``names`` (``{number: rung name}``, from ``attnclimb.rungs``): a row counts for a number only where its
    label names the same kernel, so that results taken before the ladder was re-cut (issue 13: its rung 10
    was ``pingpong``, today's is ``persistent_epilogue``) never fill a page of the kernel that now has that
    number; a rung without a row of its own kernel gets no block, and a rung below without one "—"."""
    me, below = f"rung{number:02d}", f"rung{number - 1:02d}"
    labels = _labels(doc)

    def own_kernel(impl, n):  # the row label ("10 pingpong") names rung n's kernel of today, or names none
        num, _, name = labels.get(impl, "").partition(" ")
        return names is None or n not in names or not (num.isdigit() and name) or name == names[n]

    kept = {impl for impl, n in ((me, number), (below, number - 1)) if own_kernel(impl, n)}
    by = {(r["impl"], r["shape"]): r for r in doc["rows"] if r["impl"] in kept}
    if not any(impl == me for impl, _ in by):
        return None
    cols = _columns(doc)
    fa4 = has_fa4_ratios(doc)

    def cell(impl, name):
        r = by.get((impl, name))
        if r is None:
            return "—"
        if r["status"] != "ok":
            return "skipped" if r["status"].startswith("skipped") else "error"
        return _ok_cell(r, "×", fa4)

    def gain(name):
        a, b = by.get((me, name)), by.get((below, name))
        if a and b and a["status"] == b["status"] == "ok" and b["tflops"]:
            return f"{a['tflops'] / b['tflops']:.2f}×"
        return "—"

    lines = [
        f"_{caption(doc)}_",
        "",
        f"| TFLOP/s (×cuDNN{' / ×FA4' if fa4 else ''}) | " + " | ".join(lab for _, lab in cols) + " |",
        "|:---|" + "---:|" * len(cols),
    ]
    if number > 0:
        lines.append(f"| before: rung {number - 1} | " + " | ".join(cell(below, n) for n, _ in cols) + " |")
    lines.append(f"| **this rung {number}** | " + " | ".join(cell(me, n) for n, _ in cols) + " |")
    if number > 0:
        lines.append("| gain over the rung below | " + " | ".join(gain(n) for n, _ in cols) + " |")
    lines += [
        "",
        "<sub>Generated by `python -m attnclimb report` from the committed results; do not edit by hand.</sub>",
    ]
    return "\n".join(lines)


def update_rung_pages(doc: dict, pages: dict, names: dict | None = None) -> list:
    """Fill the ``<!-- measured:begin/end -->`` block of each page in ``pages`` (``{number: path}``) with the
    rows of that rung's own kernel where ``names`` (``{number: rung name}``) is given (:func:`rung_page_block`).
    Returns the paths that changed."""
    changed = []
    for number, path in pages.items():
        path = Path(path)
        block = rung_page_block(doc, number, names)
        if block is None or not path.is_file():
            continue
        text = path.read_text()
        new = replace_between_markers(text, block, PAGE_BEGIN, PAGE_END)
        if new is not None and new != text:
            path.write_text(new)
            changed.append(path)
    return changed


# ------------------------------------------------------------------------------------------------ chart


def spread_labels(ys: list, min_gap: float) -> list:
    """Nudge label heights apart so neighbours are at least ``min_gap`` apart, keeping their order and
    their mean. Returns new heights in the input order."""
    if not ys:
        return []
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    pos = [ys[i] for i in order]
    for k in range(1, len(pos)):
        pos[k] = max(pos[k], pos[k - 1] + min_gap)
    shift = (sum(pos) - sum(ys[i] for i in order)) / len(pos)
    pos = [p - shift for p in pos]
    for k in range(1, len(pos)):  # re-enforce the gap after the shift (it is uniform, so this is a no-op
        pos[k] = max(pos[k], pos[k - 1] + min_gap)  # except for float rounding)
    out = [0.0] * len(ys)
    for k, i in enumerate(order):
        out[i] = pos[k]
    return out


def _chart_columns(doc: dict) -> list:
    shapes = [s for s in doc.get("shapes") or [] if s.get("group", MAIN_GROUP) == MAIN_GROUP]
    fa = [s for s in shapes if s["name"].startswith("fa-")]
    head = [s for s in fa if s.get("headline", s["seqlen_k"] in HEADLINE_SEQLENS)]  # not causal/d64/... variants
    return [(s["name"], s.get("label", s["name"])) for s in (head or fa or shapes)]


def write_chart(doc: dict, path) -> Path | None:
    """PNG of TFLOP/s by rung (one line per headline seqlen) with the peers as labelled horizontal lines.

    Returns the path written, or ``None`` when matplotlib is not importable. Missing points (skipped or
    failed rows) leave gaps.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    by = {(r["impl"], r["shape"]): r for r in doc["rows"]}
    labels = _labels(doc)
    rungs = [k for k in impl_order(doc) if _rung_number(k) is not None]
    peers = [k for k in PEER_KEYS if any(r["impl"] == k for r in doc["rows"])]
    cols = _chart_columns(doc)
    xs = [_rung_number(k) for k in rungs]

    fig, ax = plt.subplots(figsize=(11, 6), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = {"sdpa_cudnn": "--", "sdpa_flash": ":", "sdpa_efficient": "-.", "fa4": (0, (6, 2, 1, 2))}
    ymax = 1.0
    peer_marks = []
    for ci, (name, lab) in enumerate(cols):
        color = colors[ci % len(colors)]
        ys = [
            by[(k, name)]["tflops"] if (k, name) in by and by[(k, name)]["status"] == "ok" else math.nan for k in rungs
        ]
        if rungs:
            ax.plot(xs, ys, marker="o", color=color, label=f"attnclimb, seqlen {lab}", linewidth=2)
            for y in ys:
                if y == y:
                    ymax = max(ymax, y)
        for pk in peers:
            r = by.get((pk, name))
            if r and r["status"] == "ok":
                ax.axhline(r["tflops"], color=color, linestyle=styles.get(pk, "--"), linewidth=1, alpha=0.8)
                peer_marks.append((r["tflops"], f"{PEER_LABELS.get(pk, pk)} @ {lab}: {r['tflops']:.0f}", color))
                ymax = max(ymax, r["tflops"])
    ax.set_ylim(0, ymax * 1.08)
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{_rung_number(k)}\n{labels[k].split(' ', 1)[-1]}" for k in rungs], fontsize=8)
        ax.set_xlim(min(xs) - 0.4, max(xs) + 0.4)
    ax.set_xlabel("rung")
    ax.set_ylabel("TFLOP/s (forward)")
    ax.grid(axis="y", alpha=0.3)
    if peer_marks:
        heights = spread_labels([m[0] for m in peer_marks], ymax * 1.08 * 0.028)
        for (y, text, color), yl in zip(peer_marks, heights):
            ax.annotate(
                text,
                xy=(1.0, y),
                xycoords=("axes fraction", "data"),
                xytext=(1.01, yl),
                textcoords=("axes fraction", "data"),
                fontsize=7,
                color=color,
                va="center",
                arrowprops={"arrowstyle": "-", "color": color, "lw": 0.5, "relpos": (0, 0.5)},
                annotation_clip=False,
            )
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(
        "attnclimb: attention forward, bf16, head_dim 128, non-causal, 16 heads, batch·seqlen 16384", fontsize=10
    )
    fig.text(0.01, 0.01, caption(doc), fontsize=7, color="0.35")
    fig.subplots_adjust(left=0.07, right=0.74, bottom=0.16, top=0.93)
    fig.savefig(path)
    plt.close(fig)
    return path


# -------------------------------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    """Add the ``report`` options to an argparse (sub)parser."""
    readme = paths.default_readme()
    p.add_argument(
        "json",
        nargs="?",
        default=None,
        help=f"results file (default: {paths.results_dir() / 'latest.json'}, where bench writes it)",
    )
    p.add_argument(
        "--readme",
        default=None,
        help="README to update between the markers (default: "
        + (f"{readme}" if readme else "none outside a checkout: the table is printed")
        + ")",
    )
    p.add_argument("--chart", default=None, help="chart path (default: ladder.png next to the JSON)")
    p.add_argument("--no-chart", action="store_true", help="don't write the chart")
    p.add_argument(
        "--pages",
        default=None,
        metavar="RUNGS",
        help="fill only these rungs' pages (e.g. 10-16 or 10,12) and leave the README and the chart alone: for a "
        "results file that the README's table is not drawn from (another card, such as an H100 bench)",
    )


def parse_rung_list(spec: str) -> list:
    """``"10-16"`` / ``"10,12"`` / ``"9,11-13"`` -> sorted rung numbers; ``ValueError`` on anything else."""
    out = set()
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and (not hi.isdigit() or int(hi) < int(lo))):
            raise ValueError(f"not a rung list: {spec!r} (e.g. 10-16 or 10,12)")
        out.update(range(int(lo), int(hi if dash else lo) + 1))
    return sorted(out)


def _pages_only(doc: dict, spec: str) -> int:
    """``report --pages RUNGS``: the measured blocks of those rungs' pages, nothing else (0; 1 on a bad list)."""
    from .. import rungs

    try:
        wanted = set(parse_rung_list(spec))
    except ValueError as exc:
        print(f"attnclimb report: --pages: {exc}", file=sys.stderr)
        return 1
    pages = {r.number: paths.REPO_ROOT / r.page for r in rungs.RUNGS if r.number in wanted}
    changed = update_rung_pages(doc, pages, {r.number: r.name for r in rungs.RUNGS})
    for p in changed:
        print(f"updated {_shown(p)} (measured section)")
    for n in sorted(wanted - {r.number for r in rungs.RUNGS}):
        print(f"no rung {n} in attnclimb.rungs", file=sys.stderr)
    print(f"{len(changed)} of {len(pages)} pages changed; README and chart left alone")
    return 0


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when inside it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(paths.REPO_ROOT))
    except ValueError:
        return str(path)


def main(args) -> int:
    """Run the ``report`` subcommand: 0 on success (also when README has no markers), 1 on a bad JSON."""
    path = Path(args.json) if args.json else paths.results_dir() / "latest.json"
    try:
        doc = load_results(path)
    except (OSError, ValueError) as exc:
        print(f"attnclimb report: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "pages", None) is not None:  # (an empty list is refused there, not read as "all")
        return _pages_only(doc, args.pages)
    block = markdown_table(doc, source=_shown(path))
    default_readme = paths.default_readme()
    readme = Path(args.readme) if args.readme else default_readme
    status = update_readme(readme, block) if readme is not None else None
    if status == "updated":
        print(f"updated {_shown(readme)} (between {MARK_BEGIN} and {MARK_END})")
    elif status == "unchanged":
        print(f"{_shown(readme)} unchanged: its table already matches {_shown(path)}")
    else:
        if readme is None:
            why = "no README given (--readme) outside a checkout"
        elif not readme.is_file():
            why = f"{readme} does not exist"
        else:
            why = f"{readme} has no {MARK_BEGIN} ... {MARK_END} markers"
        print(f"{why}; the table:\n")
        print(block)
    if status is not None and section_console(doc):  # the printed block above has them already
        print("\n".join(section_console(doc)[1:]))
    if readme is not None and default_readme is not None and readme.resolve() == default_readme.resolve():
        from .. import rungs

        pages = {r.number: paths.REPO_ROOT / r.page for r in rungs.RUNGS}
        for p in update_rung_pages(doc, pages, {r.number: r.name for r in rungs.RUNGS}):
            print(f"updated {_shown(p)} (measured section)")
    if not args.no_chart:
        png = write_chart(doc, Path(args.chart) if args.chart else path.parent / "ladder.png")
        print(f"wrote {png}" if png else "chart skipped: matplotlib not importable")
    return 0
