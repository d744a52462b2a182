"""Where ``bench`` writes its results and where ``report`` reads them and writes the README table: one
rule for both, decided when the command runs.

In a checkout (``pyproject.toml`` beside the package) the results live in ``<checkout>/benchmarks/results``,
next to the README generated from them. From an installed package they go to ``./benchmarks/results`` in
the working directory, and ``report`` prints the table instead of editing a README it was not given.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def in_checkout() -> bool:
    """True when the package runs from a source checkout (editable install or ``PYTHONPATH``)."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "attnclimb" / "rungs.py").is_file()


def results_dir() -> Path:
    """The default results folder of ``bench`` (written) and ``report`` (read)."""
    return (REPO_ROOT if in_checkout() else Path.cwd()) / "benchmarks" / "results"


def default_readme() -> Path | None:
    """The README whose results table ``report`` updates by default: the checkout's; ``None`` when installed."""
    return REPO_ROOT / "README.md" if in_checkout() else None
