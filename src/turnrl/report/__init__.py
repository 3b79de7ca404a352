"""Reports over run directories: the held-out before/after table, a self-contained HTML
file, final-value summaries.

``write_report(run_dirs, out_path)`` reads each run's ``metrics.jsonl`` and config copy
and writes one HTML file (``turnrl.report.html`` says what it shows, in which order);
``heldout_console_table(run_dir)`` is the before/after table ``turnrl train`` prints;
``summary`` / ``label_summary`` return the final values as dicts for printing tables.
"""

from __future__ import annotations

from typing import Any

from turnrl.report.heldout import heldout_console_table, heldout_table
from turnrl.report.runs import RunData, load_run, load_runs, metric_order
from turnrl.report.summary import label_summary, summary

_HTML_NAMES = ("render_report", "write_report")
"""Imported on first use (PEP 562): ``turnrl.report.html`` imports matplotlib, and every
``turnrl`` command's parser registers ``turnrl eval`` from this package, so an eager
import would put matplotlib into every command (the adapter venvs, without the ``train``
extra, run ``turnrl audit`` and ``turnrl credit``)."""


def __getattr__(name: str) -> Any:
    if name not in _HTML_NAMES:
        raise AttributeError(f"module 'turnrl.report' has no attribute {name!r}")
    from turnrl.report import html

    return getattr(html, name)


__all__ = [
    "RunData",
    "heldout_console_table",
    "heldout_table",
    "label_summary",
    "load_run",
    "load_runs",
    "metric_order",
    "render_report",
    "summary",
    "write_report",
]
